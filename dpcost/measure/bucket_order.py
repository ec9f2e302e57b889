"""Which bucket DDP all-reduces last, and how big it is: DDP's rebuilt buckets, measured on gloo.

After the first iteration DDP rebuilds its buckets from the order the gradients became ready
(``reducer.cpp: Reducer::rebuild_buckets``), with the caps ``[first_bucket_bytes_cap_,
bucket_bytes_cap_]`` = [1 MiB, 25 MiB] by default (``distributed.py: _BucketCapacityConfig``).
The buckets are filled in ready order, so the 1 MiB cap goes to bucket 0: the first bucket
all-reduced, holding the last layers' gradients. The bucket all-reduced last, handed over when
backward ends, takes a 25 MiB cap, and no compute is left to hide it.

``DDP_SET_LAST_BUCKET_CAP=1`` (read by ``rebuild_buckets`` through ``getCvarString``) is the
opt-in: the rebuild fills the buckets in *reverse* ready order and then reverses the buckets, so
the 1 MiB cap lands on the bucket reduced last. Tensors are never split, so a bucket holds at
least one whole tensor: on the lesson's model (4 x Linear(1000, 1000), fp32) neither order has a
1 MiB bucket.

:func:`measure` runs both settings on 2 gloo ranks forked from the launcher's warm process
(``launch.warm_context``): each rank builds the model, records the order its gradients become
ready (``register_post_accumulate_grad_hook``) and, through a comm hook that all-reduces as DDP
does, each bucket in the order DDP hands it over, with its bytes and its parameters' names.
``_get_ddp_logging_data()["rebuilt_bucket_sizes"]`` is kept beside them as DDP's own account.
"""

from __future__ import annotations

import os

from dpcost.measure.rank_answers import RankError, gather

WIDTH, DEPTH = 1000, 4  # lesson 07's model: P = 16,016,000 B in fp32 (scenarios.build_model)
WORLD_SIZE = 2
ITERATIONS = 3  # the rebuild happens at the 2nd forward; the 3rd shows the rebuilt buckets
ENV = "DDP_SET_LAST_BUCKET_CAP"


class BucketOrderError(RankError):
    """A rank failed or the ranks did not answer in time; the message says which."""


def measure(timeout_s: float = 120.0) -> list[dict]:
    """Both settings, measured on 2 gloo ranks; one dict per setting: DDP's default, then
    ``DDP_SET_LAST_BUCKET_CAP=1``.

    Keys: ``small_last_bucket`` (bool: was ``DDP_SET_LAST_BUCKET_CAP=1`` set),
    ``ready`` (parameter names in the order their gradients became ready in the first
    backward), ``param_bytes`` ({name: bytes}), ``buckets`` (in the order DDP handed them to
    the all-reduce in the last iteration: {"index", "bytes", "params"}) and
    ``rebuilt_bucket_sizes`` (bytes per bucket index, from ``_get_ddp_logging_data``). Both
    ranks must agree (rank 0 broadcasts the rebuilt buckets: ``sync_bucket_indices``); rank 0's
    are returned. Raises ``ValueError`` for a bad ``timeout_s``, ``BucketOrderError`` when a
    rank fails or does not answer within ``timeout_s`` seconds; no rank outlives the call.
    """
    return [_as_order_result(result) for result in _measure(("default", "small last bucket"),
                                                            timeout_s)]


def measure_find_unused(timeout_s: float = 120.0) -> dict[str, dict]:
    """DDP's buckets in the first and the last of ``ITERATIONS`` iterations, by default and with
    ``find_unused_parameters=True``, measured on 2 gloo ranks: {setting: {"first", "last": bytes
    of each bucket in the order DDP handed them over; "rebuilt_bucket_sizes"}}.

    By default the first iteration has one bucket (``compute_bucket_size_limits`` returns
    ``[sys.maxsize]``) and the second rebuilds them in ready order. With
    ``find_unused_parameters=True`` the caps [1 MiB, 25 MiB] apply from the first iteration,
    filled over the parameters in registration order and then reversed (``distributed.py:
    _ddp_init_helper``), so the 1 MiB cap goes to the first layers' bucket, reduced last; and
    the buckets are never rebuilt (``reducer.cpp: Reducer::should_rebuild_buckets`` is false
    when unused parameters are searched for), so DDP logs no rebuilt sizes.
    """
    results = _measure(("default", "find unused"), timeout_s)
    return {result["setting"]: {"first": result["first_buckets"],
                                "last": [b["bytes"] for b in result["buckets"]],
                                "rebuilt_bucket_sizes": result["rebuilt_bucket_sizes"]}
            for result in results}


def _as_order_result(result: dict) -> dict:
    result = dict(result, small_last_bucket=result["setting"] == "small last bucket")
    for key in ("setting", "first_buckets"):
        result.pop(key)
    return result


def _measure(settings, timeout_s):
    """Run ``settings`` ("default", "small last bucket", "find unused") one after the other on
    the same 2 ranks; rank 0's results, one dict per setting."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
            or not 0 < timeout_s < float("inf"):
        raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {timeout_s!r}")
    # stderr quiet: with find_unused_parameters=True on a model that uses every parameter DDP
    # warns, with a timestamp, into the notebook ("did not find any unused parameters": the
    # point of the run); errors travel through the pipe
    answers = gather(_run_rank, (settings,), WORLD_SIZE, timeout_s, quiet_stderr=True,
                     error=BucketOrderError)
    if answers[0] != answers[1]:
        raise BucketOrderError(f"the ranks disagree on DDP's buckets: {answers}")
    return answers[0]


def _run_rank(rank: int, port: int, settings) -> list[dict]:
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from dpcost.measure.scenarios import _batch, build_model

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, WORLD_SIZE, rank == 0,
                          timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD_SIZE)
    results = []
    for setting in settings:
        if setting == "small last bucket":
            os.environ[ENV] = "1"
        else:
            os.environ.pop(ENV, None)
        results.append(_one_setting(torch, dist, default_hooks, build_model, _batch, rank,
                                    setting))
        dist.barrier()
    os.environ.pop(ENV, None)
    dist.destroy_process_group()
    return results


def _one_setting(torch, dist, default_hooks, build_model, batch, rank, setting):
    model = build_model(WIDTH, DEPTH)
    names = {id(p): name for name, p in model.named_parameters()}
    ready, launched = [], []
    handles = [p.register_post_accumulate_grad_hook(lambda p: ready.append(names[id(p)]))
               for p in model.parameters()]
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, find_unused_parameters=setting == "find unused")

    def recording_hook(state, bucket):
        buffer = bucket.buffer()
        launched.append({"index": bucket.index(),
                         "bytes": buffer.numel() * buffer.element_size(),
                         "params": [names[id(p)] for p in bucket.parameters()]})
        return default_hooks.allreduce_hook(state, bucket)  # divides by n, as DDP does

    ddp.register_comm_hook(dist.group.WORLD, recording_hook)
    for iteration in range(ITERATIONS):
        launched.clear()
        ddp(batch(WIDTH, rank, iteration)).square().mean().backward()
        if iteration == 0:
            first_ready = list(ready)
            first_buckets = [bucket["bytes"] for bucket in launched]
            for handle in handles:
                handle.remove()
    logged = ddp._get_ddp_logging_data().get("rebuilt_bucket_sizes", "")
    return {"setting": setting, "first_buckets": first_buckets, "ready": first_ready,
            "param_bytes": {name: p.numel() * p.element_size()
                            for name, p in model.named_parameters()},
            "buckets": list(launched),
            "rebuilt_bucket_sizes": [int(size) for size in str(logged).split(",") if size.strip()]}


def predicted(result: dict) -> list[list[str]]:
    """The buckets ``dpcost.buckets.ddp_rebuilt_buckets`` predicts from the measured ready
    order, as parameter names, in the order they are all-reduced."""
    from dpcost.buckets import ddp_rebuilt_buckets

    sizes = [result["param_bytes"][name] for name in result["ready"]]
    buckets = ddp_rebuilt_buckets(sizes, small_last_bucket=result["small_last_bucket"])
    return [[result["ready"][i] for i in bucket] for bucket in buckets]


def layers_of(params) -> str:
    """Parameter names as the lesson prints them: "2.weight, 2.bias" -> "layer 2 (w, b)"."""
    by_layer = {}
    for name in params:
        layer, kind = name.split(".")
        by_layer.setdefault(int(layer) // 2, []).append(kind[0])
    return " + ".join(f"layer {layer} ({', '.join(kinds)})" for layer, kinds in by_layer.items())


def format_table(results) -> str:
    """One line per bucket, in the order DDP all-reduced them, for each setting; a bucket's
    parameters in the order their gradients became ready."""
    lines = [f"{'setting':<28}{'order':>6}{'bytes':>13}  parameters"]
    for result in results:
        setting = f"{ENV}=1" if result["small_last_bucket"] else "default"
        for order, bucket in enumerate(result["buckets"]):
            params = sorted(bucket["params"], key=result["ready"].index)
            last = " (last: exposed)" if order == len(result["buckets"]) - 1 else ""
            lines.append(f"{setting if order == 0 else '':<28}{order + 1:>6}"
                         f"{bucket['bytes']:>13,}  {layers_of(params)}{last}")
    return "\n".join(lines)
