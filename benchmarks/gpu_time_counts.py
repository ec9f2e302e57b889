"""Count, on this CPU, what the H200 calibration runs' models dispatch in one forward + backward:
non-view aten ops (the host's work: each is a kernel launch on a GPU), the share of FLOPs in
convolutions, and the bytes autograd saves for backward. The GPU time model
(``dpcost.gpu_time``) is fitted on these counts and the H200's measured times.

    .venv/bin/python benchmarks/gpu_time_counts.py \
        [--json benchmarks/results/h200_model_counts.json]

The models and batches are those of ``benchmarks/results/calibrate_h200.py`` (torch_models,
``y.float().sum()`` as the loss); "amp" runs under ``torch.autocast(bfloat16)`` (on the CPU here,
on CUDA there: the same casts). Counts do not depend on the batch: one batch each is counted.
"""

from __future__ import annotations

import argparse
import json
import sys

MODELS = ("ResNet-50", "GPT-2 small", "small CNN", "encoder d256x4")


def _build(name):
    import torch

    from dpcost import torch_models as tm

    if name == "ResNet-50":
        return tm.resnet50(), torch.randn(2, 3, 224, 224)
    if name == "GPT-2 small":
        return tm.GPT2(tm.GPT2_CONFIGS["GPT-2 small"]), torch.randint(0, 50257, (1, 1024))
    if name == "small CNN":
        return tm.small_cnn(), torch.randn(2, 3, 32, 32)
    return tm.transformer_encoder(256, 4), torch.randn(1, 512, 256)


def count(name: str, amp: bool) -> dict:
    """{"ops", "views", "forward_ops", "convolutions", "conv_flops_share",
    "saved_bytes_per_sample"} of one forward + backward."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = self.views = self.convolutions = 0
            self.forward_ops = None

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            schema = func._schema
            if not schema.is_mutable and any(r.alias_info is not None for r in schema.returns):
                self.views += 1  # a view: host work, no kernel
            else:
                self.ops += 1
                self.convolutions += "convolution" in func.__name__
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model, x = _build(name)
    samples = x.shape[0]
    saved: dict = {}

    def pack(t):
        storage = t.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return t

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    counter, ops = FlopCounterMode(display=False), Ops()
    with counter, ops, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", torch.bfloat16, enabled=amp):
            loss = model(x).float().sum()
        ops.forward_ops = ops.ops
        loss.backward()
    conv = sum(v for k, v in counter.get_flop_counts()["Global"].items()
               if "convolution" in str(k))
    activation = sum(b for ptr, b in saved.items() if ptr not in params)
    return {"ops": ops.ops, "views": ops.views, "forward_ops": ops.forward_ops,
            "convolutions": ops.convolutions,
            "conv_flops_share": conv / counter.get_total_flops(),
            "saved_bytes_per_sample": activation / samples}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="benchmarks/results/h200_model_counts.json")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    out = {}
    for name in MODELS:
        for amp in (False, True):
            key = f"{name} | {'amp' if amp else 'fp32'}"
            out[key] = count(name, amp)
            print(key, out[key], flush=True)
    out["_provenance"] = (f"benchmarks/gpu_time_counts.py, torch {torch.__version__}, CPU "
                          "(non-view aten ops of one forward + backward)")
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
