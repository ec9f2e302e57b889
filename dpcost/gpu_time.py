"""Seconds of one GPU's forward and backward, from what GPUs measurably do.

A step is the later of two clocks that run side by side (CUDA launches are asynchronous):

- the host's: Python, autograd and the dispatcher issue every op of the step, one after another.
  ``HOST_STEP_S`` per step (loss, autograd's start), ``HOST_OP_S`` per non-view aten op (each a
  kernel launch) and ``HOST_CONVOLUTION_S`` more per convolution call (cuDNN's plan lookup).
  Small models and small batches are **launch-bound**: the GPU waits for the host.
- the device's: kernels run one after another, so their times add. Matrix products and
  convolutions take their FLOPs over an achievable rate (``EFFICIENCY`` x the datasheet's dense
  peak: bf16/fp16 for 16-bit modes; for fp32 the plain fp32 peak for matmuls
  (``torch.backends.cuda.matmul.allow_tf32`` is False) and the TF32 peak for convolutions
  (``torch.backends.cudnn.allow_tf32`` is True, ``torch/backends/cudnn/__init__.py``)); the
  memory-bound rest (norms, activations, softmax, the optimizer's reads) moves the saved
  activations ``ACTIVATION_PASSES`` times over the memory bandwidth: written in forward, read
  in backward, their gradients written and read.

The constants were fitted on one NVIDIA H200 (torch 2.11, ``benchmarks/results/``): the rates on
the largest batch of each model (GPU-bound), the host's on the smallest (launch-bound), by
``fit_constants``; ``benchmarks/gpu_time_fit.py`` prints the residuals on the rows that did not
fit them, and ``docs/gpu.md`` lists them. The host's cost belongs to the host: another CPU
runs the same step up to 1.7x slower or faster (two H200 machines measured 20 and 34 ms).

DDP's own costs (``ddp_host_seconds``) and DataParallel's (``replicate_seconds``, forward
launched through one interpreter) are host costs too: they lengthen a step only where the host
is the later clock. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HOST_STEP_S", "HOST_OP_S", "HOST_CONVOLUTION_S", "EFFICIENCY", "ACTIVATION_PASSES",
           "DDP_TENSOR_S", "DDP_BUFFER_S", "DDP_BUCKET_S", "REPLICATE_S", "REPLICATE_TENSOR_S",
           "REPLICATE_BYTE_S", "FORWARD_OP_SHARE", "CALIBRATION", "COUNTED_OPS",
           "CONV_FLOPS_SHARE", "ComputeTime", "compute_time", "ddp_host_seconds",
           "replicate_seconds", "replicate_call_seconds", "estimated_ops", "rates", "fit_constants"]

CALIBRATION = ("fitted on one NVIDIA H200 (torch 2.11.0+cu130, 2026-12-04, "
               "benchmarks/results/h200_calibration_run1.json and _run2.json; "
               "benchmarks/gpu_time_fit.py)")

# --- fitted (fit_constants reproduces them from benchmarks/results/) ------------------------
HOST_STEP_S = 0.8e-3
HOST_OP_S = 20e-6
HOST_CONVOLUTION_S = 70e-6
EFFICIENCY = {("matmul", "fp32"): 0.734, ("matmul", "16-bit"): 0.321,
              ("convolution", "fp32"): 0.124, ("convolution", "16-bit"): 0.067}
# DDP at world size 1 (NCCL): per parameter tensor (its autograd hook and its copy into the
# bucket, reducer.cpp: autograd_hook, mark_variable_ready), per buffer (broadcast each forward,
# distributed.py: _sync_buffers, flattened and copied back) and per bucket (one collective
# launch, its flatten and copy-back: Reducer::all_reduce_bucket, finalize_bucket_dense).
DDP_TENSOR_S = 19.4e-6
DDP_BUFFER_S = 34.9e-6
DDP_BUCKET_S = 0.186e-3
# DataParallel's replicate (torch/nn/parallel/replicate.py): a fixed part, then per device a
# cost per tensor (parameters and buffers: the modules' copies) and per byte
# (broadcast_coalesced flattens, copies and unflattens them).
REPLICATE_S = 1.75e-3
REPLICATE_TENSOR_S = 8.5e-6
REPLICATE_BYTE_S = 5.93e-12

# --- derived ----------------------------------------------------------------------------
ACTIVATION_PASSES = 4  # saved activations: written, read; their gradients: written, read
FORWARD_OP_SHARE = 0.55  # of a step's ops, when a trace did not count them (0.48-0.61 counted)
_OPS_PER_TRANSFORMER_LAYER = {"fp32": 66, "16-bit": 97}  # GPT-2 small's count / 12 layers
# (non-view ops, forward ops, convolution calls) of the presets' modules (dpcost.torch_models),
# counted by benchmarks/gpu_time_counts.py (torch 2.13, CPU): "plain" runs the model in one
# dtype, "autocast" adds autocast's casts
COUNTED_OPS = {"ResNet-50": {"plain": (458, 281, 106), "autocast": (571, 338, 106)},
               "GPT-2 small": {"plain": (813, 444, 0), "autocast": (1191, 627, 0)}}
CONV_FLOPS_SHARE = {"ResNet-50": 0.9995}  # the fc layer is the rest (FlopCounterMode)


@dataclass(frozen=True)
class ComputeTime:
    """One GPU's forward and backward, with the parts of the model behind them."""

    forward_s: float
    backward_s: float
    host_s: float  # the host's clock (forward + backward)
    device_s: float  # the device's clock
    matmul_s: float
    convolution_s: float
    memory_s: float
    source: str  # "modelled" or "measured"

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s

    @property
    def bound(self) -> str:
        """Which clock sets the step: "host" (launch-bound), "device", or "measured"."""
        if self.source == "measured":
            return "measured"
        return "host" if self.host_s >= self.device_s else "device"


def _mode(precision: str) -> str:
    return "fp32" if precision == "fp32" else "16-bit"


def rates(gpu, precision: str) -> dict:
    """Achievable FLOP/s of matmuls and convolutions on ``gpu`` in ``precision``."""
    peaks = gpu.peak_flops
    if precision == "fp32":
        matmul = EFFICIENCY[("matmul", "fp32")] * peaks["fp32"]
        if peaks.get("tf32", 0.0) <= peaks["fp32"]:  # no TF32 tensor cores (V100): fp32 cores
            return {"matmul": matmul, "convolution": matmul}
        return {"matmul": matmul,
                "convolution": EFFICIENCY[("convolution", "fp32")] * peaks["tf32"]}
    half = peaks.get("fp16" if precision == "fp16" else "bf16") or peaks["fp16"]
    return {"matmul": EFFICIENCY[("matmul", "16-bit")] * half,
            "convolution": EFFICIENCY[("convolution", "16-bit")] * half}


def estimated_ops(layers: int, precision: str) -> int:
    """Non-view aten ops of a transformer's forward + backward without a trace: GPT-2 small's
    count per layer (``benchmarks/results/h200_model_counts.json``) times ``layers``."""
    return _OPS_PER_TRANSFORMER_LAYER[_mode(precision)] * layers


def compute_time(flops: float, activation_bytes: float, ops: int, gpu, precision: str, *,
                 conv_share: float = 0.0, convolutions: int = 0, forward_ops: int | None = None,
                 replicas: int = 1, extra_backward_host_s: float = 0.0,
                 measured_s: float | None = None) -> ComputeTime:
    """Forward and backward of one GPU running ``flops`` (its samples' forward + backward) that
    saves ``activation_bytes``, launched as ``ops`` non-view aten ops.

    ``replicas`` > 1: DataParallel's forward, whose n replicas' ops are launched by n threads
    through one interpreter (``parallel_apply.py``; the GIL serialises them); its backward runs
    on autograd's C++ thread per device (``engine.cpp``), in parallel. ``extra_backward_host_s``:
    host work added to backward (DDP's hooks and buckets). ``measured_s``: a measured forward +
    backward, split 1:2 as the FLOPs are.
    """
    if measured_s is not None:
        return ComputeTime(measured_s / 3, 2 * measured_s / 3, measured_s, measured_s, 0.0,
                           0.0, 0.0, "measured")
    r = rates(gpu, precision)
    matmul_s = flops * (1 - conv_share) / r["matmul"]
    convolution_s = flops * conv_share / r["convolution"]
    memory_s = ACTIVATION_PASSES * activation_bytes / gpu.memory_bandwidth_bytes_per_s
    device = matmul_s + convolution_s + memory_s
    f_ops = forward_ops if forward_ops is not None else FORWARD_OP_SHARE * ops
    convs_f = convolutions / 2  # one forward call, one backward call each
    host_f = HOST_STEP_S / 2 + replicas * (f_ops * HOST_OP_S + convs_f * HOST_CONVOLUTION_S)
    host_b = (HOST_STEP_S / 2 + (ops - f_ops) * HOST_OP_S + convs_f * HOST_CONVOLUTION_S
              + extra_backward_host_s)
    # each pass ends when its later clock does (backward waits for forward's last kernel)
    forward_s = max(host_f, device / 3)
    backward_s = max(host_b, 2 * device / 3)
    return ComputeTime(forward_s, backward_s, host_f + host_b, device, matmul_s, convolution_s,
                       memory_s, "modelled")


def ddp_host_seconds(tensors: int, buffers: int, buckets: int,
                     sync_buffers: bool = True) -> float:
    """DDP's own host work per step beyond the plain model's (measured with no peer: world
    size 1 on NCCL): each trainable tensor's hook, each buffer's broadcast, each bucket."""
    return (tensors * DDP_TENSOR_S + (buffers * DDP_BUFFER_S if sync_buffers else 0.0)
            + buckets * DDP_BUCKET_S)


def replicate_call_seconds(tensors: int, tensor_bytes: float, devices: int) -> float:
    """One ``torch.nn.parallel.replicate`` of a module with ``tensors`` parameters and buffers
    of ``tensor_bytes`` to ``devices`` replicas on ONE device, as the H200 timed it (``[0]``,
    ``[0, 0]``): every replica's copies queue on the same GPU."""
    return REPLICATE_S + devices * (tensors * REPLICATE_TENSOR_S + tensor_bytes * REPLICATE_BYTE_S)


def replicate_seconds(tensors: int, tensor_bytes: float, devices: int) -> float:
    """What DataParallel pays for ``replicate`` every forward on ``devices`` GPUs
    (``data_parallel.py: DataParallel.forward``): the host's work per tensor per device, and the
    flatten-and-copy of the bytes once (each GPU unflattens its copy in parallel; the bytes on the
    links are the broadcast's, timed apart). Nothing on one GPU, where it calls the module."""
    if devices <= 1:
        return 0.0
    return REPLICATE_S + devices * tensors * REPLICATE_TENSOR_S + tensor_bytes * REPLICATE_BYTE_S


# --- fitting ------------------------------------------------------------------------------


def fit_constants(compute_rows: list, ddp_rows: list, replicate_rows: list) -> dict:
    """The constants above from the H200's rows (``benchmarks/gpu_time_fit.py`` loads them).

    ``compute_rows``: dicts with model, batch, amp, seconds, flops, ops, convolutions,
    conv_share, activation_bytes, role ("rate" rows fit the efficiencies, "host" rows the host,
    others are held out). Efficiencies: each "rate" row's FLOPs over its seconds less the
    memory-bound part; host: the least log-squared error of s0 + h ops + c convolutions on
    the "host" rows (a grid of 0.1 ms, 0.5 us and 5 us steps). ``ddp_rows``: (tensors, buffers,
    buckets at cap 1 MiB and 100 MiB, seconds over the plain step at each); ``replicate_rows``:
    (tensors, seconds to one device, seconds to two).
    """
    import math

    from dpcost.presets import GPUS

    gpu = GPUS["H200 SXM 141GB"]
    eff = {}
    for row in compute_rows:
        if row["role"] != "rate":
            continue
        mode = "16-bit" if row["amp"] else "fp32"
        kind = "convolution" if row["conv_share"] > 0.5 else "matmul"
        peak = gpu.peak_flops["bf16"] if row["amp"] else gpu.peak_flops[
            "tf32" if kind == "convolution" else "fp32"]
        memory = ACTIVATION_PASSES * row["activation_bytes"] / gpu.memory_bandwidth_bytes_per_s
        eff[(kind, mode)] = round(row["flops"] / (row["seconds"] - memory) / peak, 3)
    host_rows = [r for r in compute_rows if r["role"] == "host"]
    best = None
    for i in range(31):
        for j in range(10, 70):
            for k in range(31):
                s0, h, c = i * 1e-4, j * 0.5e-6, k * 5e-6
                err = sum(math.log(r["seconds"] / (s0 + h * r["ops"] + c * r["convolutions"]))
                          ** 2 for r in host_rows)
                if best is None or err < best[0] - 1e-15:
                    best = (err, s0, h, c)
    # DDP: the per-bucket cost from 1 MiB against 100 MiB caps, then the per-step rest over
    # a model without buffers (tensors) and one with them (buffers)
    per_bucket = sum((r["cap1_s"] - r["cap100_s"]) / (r["cap1_buckets"] - r["cap100_buckets"])
                     for r in ddp_rows) / len(ddp_rows)
    rest = {r["model"]: r["cap100_s"] - r["cap100_buckets"] * per_bucket for r in ddp_rows}
    plain = next(r for r in ddp_rows if r["buffers"] <= 1)
    hook = rest[plain["model"]] / plain["tensors"]
    buffered = next(r for r in ddp_rows if r["buffers"] > 1)
    per_buffer = (rest[buffered["model"]] - buffered["tensors"] * hook) / buffered["buffers"]
    # replicate: two devices less one is the per-device part, one device less that the fixed
    (a, b), (c, d) = [(r["tensors"], r["bytes"]) for r in replicate_rows[:2]]
    y1, y2 = [r["two_s"] - r["one_s"] for r in replicate_rows[:2]]
    per_byte = (y2 - c * y1 / a) / (d - c * b / a)
    per_tensor = (y1 - b * per_byte) / a
    fixed = [r["one_s"] - (r["two_s"] - r["one_s"]) for r in replicate_rows]
    return {"EFFICIENCY": eff, "HOST_STEP_S": best[1], "HOST_OP_S": best[2],
            "HOST_CONVOLUTION_S": best[3], "DDP_BUCKET_S": per_bucket,
            "DDP_TENSOR_S": hook, "DDP_BUFFER_S": per_buffer,
            "REPLICATE_TENSOR_S": per_tensor, "REPLICATE_BYTE_S": per_byte,
            "REPLICATE_S": sum(fixed) / len(fixed)}
