"""What DataParallel and DDP move in one training iteration, step by step, in bytes.

Symbols: n GPUs, P parameter bytes, B buffer bytes (BatchNorm running statistics, ...),
G gradient bytes (= P for ordinary training), I input bytes and O output bytes per iteration
(the whole batch, all GPUs together). GPU0 is ``device_ids[0]``, which is also DataParallel's
``output_device`` by default.

DataParallel (``torch/nn/parallel/data_parallel.py: DataParallel.forward``), per iteration:

====================  ================================================  ===================
step                  PyTorch function                                  bytes via GPU0
====================  ================================================  ===================
scatter inputs        scatter_gather.py: scatter_kwargs -> Scatter      out (n-1)/n I
replicate parameters  replicate.py: replicate -> Broadcast.forward      out (n-1) P
                      -> comm.broadcast_coalesced
replicate buffers     replicate.py: replicate -> comm.broadcast_coal.   out (n-1) B
run the replicas      parallel_apply.py: parallel_apply                 0
gather outputs        scatter_gather.py: gather -> Gather.forward       in (n-1)/n O
scatter output grads  _functions.py: Gather.backward -> Scatter         out (n-1)/n O
reduce gradients      _functions.py: Broadcast.backward ->              in (n-1) G
                      ReduceAddCoalesced -> comm.reduce_add_coalesced
optimizer step        the user's optimizer, on GPU0's parameters only   0
====================  ================================================  ===================

Sum: ``(n-1)(P + B + G) + (n-1)/n (I + 2 O)``; the seed's ``2 (n-1) P`` keeps P and G (= P).
These are the bytes GPU0 must source or sink, and what crosses its link on the path without
NCCL (``torch/csrc/cuda/comm.cpp: broadcast`` copies with ``tensor.to(device)``); with NCCL,
``broadcast`` calls ``nccl::broadcast`` and ``comm.reduce_add`` calls ``nccl.reduce``, which
pipeline along a chain, so GPU0 itself then sends or receives about P each way.

DDP (``torch/nn/parallel/distributed.py``): one broadcast of P + B from rank 0 at construction
(``_sync_module_states``); per iteration, a broadcast of B from rank 0 in ``_pre_forward``
when ``forward_sync_buffers`` (formerly ``broadcast_buffers``) is on and the model has buffers,
and one ring all-reduce per gradient bucket (``reducer.cpp: Reducer::all_reduce_bucket``),
2 (n-1)/n of each bucket sent and received by every rank.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from dpcost.core import check_num_gpus

__all__ = [
    "StepTransfer",
    "dp_step_transfers",
    "dp_full_volume",
    "ddp_bucket_sizes",
    "ddp_step_transfers",
    "gpu0_bytes",
    "total_bytes",
    "DEFAULT_BUCKET_CAP_BYTES",
    "DEFAULT_FIRST_BUCKET_BYTES",
    "resnet50_counts",
]

# torch/nn/parallel/distributed.py: _DEFAULT_BUCKET_CAP_MB = 25 (MiB), and
# torch.distributed._DEFAULT_FIRST_BUCKET_BYTES = 1 MiB (both checked in tests against torch).
DEFAULT_BUCKET_CAP_BYTES = 25 * 2**20
DEFAULT_FIRST_BUCKET_BYTES = 1 * 2**20


@dataclass(frozen=True)
class StepTransfer:
    """One step of a training iteration and the bytes it moves.

    ``gpu0_sent_bytes`` / ``gpu0_received_bytes``: bytes leaving / arriving at GPU0 (rank 0)
    over its link; ``total_bytes``: bytes over all links together.
    """

    phase: str  # "construction (once)" | "forward" | "backward" | "optimizer step"
    action: str  # what moves, in words
    pytorch_function: str  # the PyTorch code that does it
    gpu0_sent_bytes: float
    gpu0_received_bytes: float
    total_bytes: float


def _check_bytes(value, name: str) -> float:
    """``value`` as a float of bytes: a finite real number >= 0 (TypeError/ValueError naming it)."""
    if isinstance(value, bool) or type(value).__name__ == "bool_" or not isinstance(
        value, numbers.Real
    ):
        raise TypeError(f"{name} must be a number of bytes, got {type(value).__name__} {value!r}")
    try:
        value = float(value)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value


def _check_all(param_bytes, buffer_bytes, grad_bytes, input_bytes, output_bytes, num_gpus):
    return (
        _check_bytes(param_bytes, "param_bytes"),
        _check_bytes(buffer_bytes, "buffer_bytes"),
        _check_bytes(grad_bytes, "grad_bytes"),
        _check_bytes(input_bytes, "input_bytes"),
        _check_bytes(output_bytes, "output_bytes"),
        check_num_gpus(num_gpus),
    )


def dp_step_transfers(
    param_bytes, buffer_bytes, grad_bytes, input_bytes, output_bytes, num_gpus
) -> list[StepTransfer]:
    """DataParallel's training iteration as rows, in the order they run (see the module table).

    Assumes the batch starts on GPU0 (a batch on the CPU is scattered from the host instead, and
    that row leaves GPU0's link). For n <= 1 DataParallel runs the module directly (its
    ``forward`` returns ``self.module(...)`` for one device): every row moves 0 bytes.
    """
    P, B, G, I, O, n = _check_all(  # noqa: E741 (the course's symbols)
        param_bytes, buffer_bytes, grad_bytes, input_bytes, output_bytes, num_gpus)
    k = max(n - 1, 0)  # copies that leave or reach GPU0
    share = k / n if n >= 1 else 0.0  # the part of the batch not for GPU0
    base = "torch/nn/parallel/"
    rows = [
        ("forward", "scatter the input batch from GPU0, 1/n to each GPU",
         base + "data_parallel.py: DataParallel.scatter -> scatter_gather.py: scatter_kwargs"
         " -> _functions.py: Scatter.forward -> comm.py: scatter", share * I, 0.0),
        ("forward", "replicate the parameters from GPU0 to GPUs 1..n-1",
         base + "replicate.py: replicate -> _broadcast_coalesced_reshape -> _functions.py:"
         " Broadcast.forward -> comm.py: broadcast_coalesced", k * P, 0.0),
        ("forward", "replicate the buffers from GPU0 to GPUs 1..n-1",
         base + "replicate.py: replicate -> _broadcast_coalesced_reshape(detach=True)"
         " -> comm.py: broadcast_coalesced", k * B, 0.0),
        ("forward", "run the n replicas, one thread per GPU",
         base + "parallel_apply.py: parallel_apply", 0.0, 0.0),
        ("forward", "gather the outputs onto GPU0 (the loss is computed there)",
         base + "scatter_gather.py: gather -> _functions.py: Gather.forward -> comm.py: gather",
         0.0, share * O),
        ("backward", "scatter the output gradients from GPU0",
         base + "_functions.py: Gather.backward -> Scatter.apply -> comm.py: scatter",
         share * O, 0.0),
        ("backward", "sum every replica's gradients onto GPU0",
         base + "_functions.py: Broadcast.backward -> ReduceAddCoalesced.forward"
         " -> comm.py: reduce_add_coalesced -> reduce_add", 0.0, k * G),
        ("optimizer step", "update the parameters on GPU0 only",
         "torch/optim: optimizer.step() on module.parameters() (on device_ids[0])", 0.0, 0.0),
    ]
    return [StepTransfer(phase, action, where, sent, received, sent + received)
            for phase, action, where, sent, received in rows]


def dp_full_volume(
    param_bytes, buffer_bytes, grad_bytes, input_bytes, output_bytes, num_gpus
) -> float:
    """Bytes through GPU0's link per DataParallel iteration: ``(n-1)(P+B+G) + (n-1)/n (I+2O)``.

    With B = I = O = 0 and G = P this is the seed's ``2 (n-1) P``
    (``dpcost.core.dp_communication_volume``). Returns 0.0 for n <= 1. Units: bytes.
    """
    P, B, G, I, O, n = _check_all(  # noqa: E741
        param_bytes, buffer_bytes, grad_bytes, input_bytes, output_bytes, num_gpus)
    if n <= 1:
        return 0.0
    return (n - 1) * (P + B + G) + (n - 1) / n * (I + 2 * O)


def ddp_bucket_sizes(
    grad_bytes,
    bucket_cap_bytes=DEFAULT_BUCKET_CAP_BYTES,
    first_bucket_bytes=DEFAULT_FIRST_BUCKET_BYTES,
) -> list[float]:
    """Bytes in each of DDP's gradient buckets, in the order they are all-reduced.

    ``grad_bytes`` is either one number (a gradient stream cut exactly at the caps:
    ``[first, cap, cap, ..., rest]``) or a sequence of per-parameter gradient sizes in the order
    their gradients become ready. For a sequence, the reducer's rule applies
    (``reducer.cpp: compute_bucket_assignment_by_size``): parameters join the open bucket until
    its size reaches the cap (>=), so a bucket can overshoot by one parameter; the first bucket
    uses ``first_bucket_bytes``, the rest ``bucket_cap_bytes``. Defaults are DDP's: 1 MiB then
    25 MiB. DDP uses these caps from the second iteration on, once buckets are rebuilt in the
    real gradient order; the first iteration is bucketed by registration order (in torch 2.13
    as one bucket unless ``find_unused_parameters``). Passing ``bucket_cap_mb`` to DDP makes the
    first bucket as large as the others: call with ``first_bucket_bytes=bucket_cap_bytes``.
    """
    cap = _check_bytes(bucket_cap_bytes, "bucket_cap_bytes")
    first = _check_bytes(first_bucket_bytes, "first_bucket_bytes")
    if cap <= 0 or first <= 0:
        raise ValueError(
            f"bucket_cap_bytes and first_bucket_bytes must be > 0, got {cap!r} and {first!r}")
    if isinstance(grad_bytes, Sequence) and not isinstance(grad_bytes, str):
        sizes = [_check_bytes(s, f"grad_bytes[{i}]") for i, s in enumerate(grad_bytes)]
        buckets, open_bucket, open_count, limit = [], 0.0, 0, first
        for size in sizes:
            open_bucket, open_count = open_bucket + size, open_count + 1
            if open_bucket >= limit:
                buckets.append(open_bucket)
                open_bucket, open_count, limit = 0.0, 0, cap
        if open_count:
            buckets.append(open_bucket)
        return buckets
    total = _check_bytes(grad_bytes, "grad_bytes")
    if total <= first:
        return [total] if total > 0 else []
    buckets, rest = [first], total - first
    full = int(rest // cap)
    buckets += [cap] * full
    if rest - full * cap > 0:
        buckets.append(rest - full * cap)
    return buckets


def ddp_step_transfers(
    param_bytes,
    buffer_bytes,
    grad_bytes,
    input_bytes,
    output_bytes,
    num_gpus,
    bucket_cap_bytes=DEFAULT_BUCKET_CAP_BYTES,
    first_bucket_bytes=DEFAULT_FIRST_BUCKET_BYTES,
    sync_buffers: bool = True,
    include_construction: bool = False,
) -> list[StepTransfer]:
    """DDP's training iteration as rows: buffer broadcast, one ring all-reduce per bucket.

    Each rank reads its own shard of the batch and keeps its outputs and loss, so I and O never
    cross a link (they are validated and kept in the signature to mirror ``dp_step_transfers``).
    A bucket of b bytes costs every rank 2 (n-1)/n b sent and as much received, and all links
    together 2 (n-1) b. A broadcast of B costs (n-1) B over all links; rank 0 sends B with
    NCCL's pipelined chain (gloo's binomial tree sends ceil(log2 n) B from the root; the model
    counts B). ``include_construction`` adds the one-off broadcast of P + B at construction.
    Returns no rows for n <= 1 (DDP then moves nothing but still runs).
    """
    P, B, G, _, _, n = _check_all(
        param_bytes, buffer_bytes, grad_bytes, input_bytes, output_bytes, num_gpus)
    if n <= 1:
        return []
    dist = "torch/nn/parallel/distributed.py: "
    rows = []
    if include_construction:
        rows.append(StepTransfer(
            "construction (once)", "broadcast parameters and buffers from rank 0",
            dist + "DistributedDataParallel.__init__ -> torch/distributed/utils.py:"
            " _sync_module_states -> _sync_params_and_buffers -> dist._broadcast_coalesced",
            P + B, 0.0, (n - 1) * (P + B)))
    if sync_buffers and B > 0:
        rows.append(StepTransfer(
            "forward", "broadcast buffers from rank 0",
            dist + "DistributedDataParallel._pre_forward -> _sync_buffers ->"
            " _sync_module_buffers -> _default_broadcast_coalesced", B, 0.0, (n - 1) * B))
    rows.append(StepTransfer(
        "forward", "each rank runs its replica on its own shard of the batch",
        dist + "DistributedDataParallel.forward (inputs from torch/utils/data/distributed.py:"
        " DistributedSampler)", 0.0, 0.0, 0.0))
    for i, bucket in enumerate(ddp_bucket_sizes(G, bucket_cap_bytes, first_bucket_bytes)):
        per_rank = 2 * (n - 1) / n * bucket
        rows.append(StepTransfer(
            "backward", f"all-reduce gradient bucket {i} (ring)",
            "torch/csrc/distributed/c10d/reducer.cpp: Reducer::autograd_hook ->"
            " mark_variable_ready -> all_reduce_bucket -> run_comm_hook (allreduce)",
            per_rank, per_rank, 2 * (n - 1) * bucket))
    rows.append(StepTransfer(
        "optimizer step", "every rank updates its own replica with the same averaged gradients",
        "torch/optim: optimizer.step() on each rank", 0.0, 0.0, 0.0))
    return rows


def gpu0_bytes(rows: list[StepTransfer]) -> float:
    """Bytes through GPU0's link (sent + received) over ``rows``."""
    return sum(r.gpu0_sent_bytes + r.gpu0_received_bytes for r in rows)


def total_bytes(rows: list[StepTransfer]) -> float:
    """Bytes over all links together over ``rows``."""
    return sum(r.total_bytes for r in rows)


# ResNet-50 as in torchvision (He et al. 2016; v1.5): (width, blocks) per stage, expansion 4.
_RESNET50_STAGES = [(64, 3), (128, 4), (256, 6), (512, 3)]


def resnet50_counts(num_classes: int = 1000) -> dict[str, int]:
    """ResNet-50's parameters and BatchNorm buffers, counted from its architecture.

    Returns {"parameters", "batchnorm_layers", "batchnorm_channels", "buffer_elements",
    "buffer_bytes"}. Each BatchNorm2d holds running_mean and running_var (one fp32 per channel
    each) and num_batches_tracked (one int64), so buffer_bytes = 4 * 2 * channels + 8 * layers.
    With 1000 classes: 25,557,032 parameters (torchvision's docs give the same number).
    """
    params, bn_layers, bn_channels = 0, 0, 0

    def conv(c_in, c_out, k):
        nonlocal params
        params += c_in * c_out * k * k  # torchvision's convs have no bias

    def bn(c):
        nonlocal params, bn_layers, bn_channels
        params += 2 * c  # weight and bias
        bn_layers += 1
        bn_channels += c

    conv(3, 64, 7)
    bn(64)
    c_in = 64
    for width, blocks in _RESNET50_STAGES:
        for block in range(blocks):
            conv(c_in, width, 1)
            bn(width)
            conv(width, width, 3)
            bn(width)
            conv(width, 4 * width, 1)
            bn(4 * width)
            if block == 0:  # the downsample shortcut: 1x1 conv + BatchNorm
                conv(c_in, 4 * width, 1)
                bn(4 * width)
            c_in = 4 * width
    params += c_in * num_classes + num_classes  # fc
    return {
        "parameters": params,
        "batchnorm_layers": bn_layers,
        "batchnorm_channels": bn_channels,
        "buffer_elements": 2 * bn_channels + bn_layers,
        "buffer_bytes": 4 * 2 * bn_channels + 8 * bn_layers,
    }
