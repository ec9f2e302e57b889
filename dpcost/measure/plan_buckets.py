"""DDP's own buckets for a few modules, on 2 gloo ranks: the oracle for ``dpcost.plan``'s.

``measure(cases)`` forks 2 ranks from the launcher's warm process (``launch.warm_context``,
as ``bucket_order`` does). Each rank builds every case's module on the CPU (seed 0), wraps it
in ``DistributedDataParallel`` (default settings), reads ``_get_ddp_logging_data()
["bucket_sizes"]`` (the construction buckets), runs three forwards and backwards (the rebuild
happens at the second forward, ``reducer.cpp: Reducer::rebuild_buckets``; the logged rebuilt
fields appear after the third) and reads ``rebuilt_bucket_sizes``,
``rebuilt_per_bucket_param_indices`` and ``prev_iteration_grad_ready_order_indices``. All cases
run in one process group, so a test pays for the ranks once.

A case is (name, "package.module:callable", input shape, vocabulary): a float input of that
shape, or integer tokens below the vocabulary when it is > 0.
"""

from __future__ import annotations

from dpcost.measure.bucket_order import BucketOrderError
from dpcost.measure.rank_answers import gather

WORLD_SIZE = 2
ITERATIONS = 3
CASES = (
    ("ResNet-50", "dpcost.torch_models:resnet50", (2, 3, 32, 32), 0),
    ("TransformerEncoder", "dpcost.torch_models:transformer_encoder", (2, 16, 256), 0),
    ("frozen parameter", "dpcost.torch_models:frozen_mlp", (4, 512), 0),
    ("tied weights", "dpcost.torch_models:tied_lm", (2, 16), 1000),
)


def measure(cases=CASES, timeout_s: float = 180.0) -> dict:
    """{case name: {"bucket_sizes", "rebuilt_bucket_sizes": bytes per bucket in the reducer's
    order; "rebuilt_indices": parameter indices per rebuilt bucket; "ready_order": parameter
    indices in the order DDP saw them ready}}, from rank 0 (both ranks must agree)."""
    answers = gather(_run_rank, (tuple(cases),), WORLD_SIZE, timeout_s, quiet_stderr=True,
                     error=BucketOrderError)
    if answers[0] != answers[1]:
        raise BucketOrderError(f"the ranks disagree on DDP's buckets: {answers}")
    return answers[0]


def _ints(text) -> list:
    return [int(x) for x in str(text).replace(",", " ").split()]


def _run_rank(rank, port, cases):
    import importlib
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, WORLD_SIZE, rank == 0,
                          timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD_SIZE)
    results = {}
    for name, spec, shape, vocab in cases:
        module_name, _, attr = spec.partition(":")
        torch.manual_seed(0)
        module = getattr(importlib.import_module(module_name), attr)()
        ddp = torch.nn.parallel.DistributedDataParallel(module)
        construction = _ints(ddp._get_ddp_logging_data().get("bucket_sizes", ""))
        generator = torch.Generator().manual_seed(rank)
        for _ in range(ITERATIONS):
            x = (torch.randint(vocab, shape, generator=generator) if vocab
                 else torch.randn(shape, generator=generator))
            ddp(x).float().sum().backward()
        logged = ddp._get_ddp_logging_data()
        # "160 159, 157 158 ...": buckets apart by commas, indices by spaces
        rebuilt_indices = [[int(x) for x in bucket.split()] for bucket in
                           str(logged.get("rebuilt_per_bucket_param_indices", "")).split(",")
                           if bucket.strip()]
        results[name] = {
            "bucket_sizes": construction,
            "rebuilt_bucket_sizes": _ints(logged.get("rebuilt_bucket_sizes", "")),
            "rebuilt_indices": rebuilt_indices,
            "ready_order": _ints(logged.get("prev_iteration_grad_ready_order_indices", "")),
        }
        del ddp, module
        dist.barrier()
    dist.destroy_process_group()
    return results
