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

DataParallel's two paths (``dp_path_traffic``). The rows above, and the five functions of
``dpcost.core``, are the **copy path**: without NCCL, ``torch/csrc/cuda/comm.cpp: broadcast``
copies to each GPU with ``tensor.to(device)``/``copy_`` and ``comm.py: reduce_add`` adds
``other.to(destination)`` for each replica, so GPU0's link carries every copy: a star. On every
Linux CUDA build the **NCCL path** is taken instead (``torch/cuda/nccl.py: is_available`` is true
for contiguous dense CUDA tensors on distinct devices): ``comm.cpp: broadcast`` ->
``_broadcast_out_impl`` -> ``nccl::broadcast`` and ``comm.py: reduce_add`` -> ``nccl.reduce``,
which run as pipelined rings (a chain from the root): GPU0 sends S once in the broadcast and
receives S once in the reduce. On both paths ``comm.cpp: scatter`` (inputs, and output gradients
in ``Gather.backward``) and ``comm.cpp: gather`` (outputs) are plain copies through GPU0: a star.
``broadcast_coalesced`` and ``reduce_add_coalesced`` move the tensors in chunks of at most about
``buffer_size = 10485760`` bytes (10 MiB, ``comm.py``): one copy or one NCCL call per chunk.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dpcost.buckets import DEFAULT_BUCKET_CAP_BYTES, DEFAULT_FIRST_BUCKET_BYTES, ddp_bucket_sizes
from dpcost.core import check_choice, check_num_gpus, check_real, ddp_communication_volume
from dpcost.presets import resnet50_layers

__all__ = [
    "StepTransfer",
    "dp_step_transfers",
    "dp_full_volume",
    "ddp_step_transfers",
    "resnet50_counts",
    "DP_CHUNK_BYTES",
    "DP_PATHS",
    "coalesced_chunk_sizes",
    "chain_broadcast_bytes",
    "chain_reduce_bytes",
    "NCCL_SLICE_BYTES",
    "chain_messages",
    "chain_step_bytes",
    "chain_busy_bytes",
    "PhaseTraffic",
    "dp_path_traffic",
    "gpu_bytes",
    "gpu_busy_bytes",
    "dp_messages",
    "busy_time_ratio",
    "resnet50_parameter_bytes",
    "resnet50_ready_order_bytes",
]


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


def _check_all(param_bytes, buffer_bytes, grad_bytes, input_bytes, output_bytes, num_gpus):
    return (
        check_real(param_bytes, "param_bytes", 0.0),
        check_real(buffer_bytes, "buffer_bytes", 0.0),
        check_real(grad_bytes, "grad_bytes", 0.0),
        check_real(input_bytes, "input_bytes", 0.0),
        check_real(output_bytes, "output_bytes", 0.0),
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
    bucket_sizes=None,
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
    if bucket_sizes is None:
        buckets = ddp_bucket_sizes(G, bucket_cap_bytes, first_bucket_bytes)
    else:
        buckets = [check_real(b, f"bucket_sizes[{i}]", 0.0) for i, b in enumerate(bucket_sizes)]
        if not math.isclose(sum(buckets), G, rel_tol=1e-9, abs_tol=1e-6):
            raise ValueError(f"bucket_sizes must add up to grad_bytes ({sum(buckets)!r} != {G!r})")
    for i, bucket in enumerate(buckets):
        per_rank = ddp_communication_volume(bucket, n)
        rows.append(StepTransfer(
            "backward", f"all-reduce gradient bucket {i} (ring)",
            "torch/csrc/distributed/c10d/reducer.cpp: Reducer::autograd_hook ->"
            " mark_variable_ready -> all_reduce_bucket -> run_comm_hook (allreduce)",
            per_rank, per_rank, 2 * (n - 1) * bucket))
    rows.append(StepTransfer(
        "optimizer step", "every rank updates its own replica with the same averaged gradients",
        "torch/optim: optimizer.step() on each rank", 0.0, 0.0, 0.0))
    return rows


def resnet50_counts(num_classes: int = 1000) -> dict[str, int]:
    """ResNet-50's parameters and BatchNorm buffers, counted from its architecture
    (``presets.resnet50_layers``).

    Returns {"parameters", "batchnorm_layers", "batchnorm_channels", "buffer_elements",
    "buffer_bytes"}. Each BatchNorm2d holds running_mean and running_var (one fp32 per channel
    each) and num_batches_tracked (one int64), so buffer_bytes = 4 * 2 * channels + 8 * layers.
    With 1000 classes: 25,557,032 parameters (torchvision's docs give the same number).
    """
    params = sum(size for _, size in resnet50_parameter_bytes(1, num_classes))
    norms = [layer.c_out for layer in resnet50_layers(num_classes=num_classes)
             if layer.kind == "bn"]
    return {
        "parameters": params,
        "batchnorm_layers": len(norms),
        "batchnorm_channels": sum(norms),
        "buffer_elements": 2 * sum(norms) + len(norms),
        "buffer_bytes": 4 * 2 * sum(norms) + 8 * len(norms),
    }


# --- DataParallel's two paths: bytes and messages per GPU ----------------------------------

# torch/nn/parallel/comm.py: broadcast_coalesced(..., buffer_size=10485760) and
# reduce_add_coalesced(..., buffer_size=10485760): tensors are coalesced in 10 MiB chunks.
DP_CHUNK_BYTES = 10_485_760

DP_PATHS = ("copy", "nccl")


def coalesced_chunk_sizes(tensor_bytes, buffer_size=DP_CHUNK_BYTES, rule="broadcast"):
    """Bytes of each chunk that DataParallel's coalesced copies move, in order.

    ``tensor_bytes`` is a sequence of tensor sizes (one dtype; the order given) or one number
    (a stream of small tensors, cut at ``buffer_size``). Two rules, both from PyTorch:

    - ``"broadcast"``: ``torch/csrc/utils/tensor_flatten.cpp: take_tensors``, which
      ``comm.cpp: broadcast_coalesced`` uses: a chunk closes once its size reaches
      ``buffer_size`` (>=), so it can overshoot by the tensor that crossed it.
    - ``"reduce"``: ``torch/_utils.py: _take_tensors``, which ``comm.py: reduce_add_coalesced``
      uses: a tensor that would take a non-empty chunk past ``buffer_size`` starts a new one.

    A tensor is never split, so a tensor above ``buffer_size`` is a chunk of its own. For one
    number both rules give ``[buffer_size] * k + [rest]``. Units: bytes.
    """
    limit = check_real(buffer_size, "buffer_size", 0.0, strict=True)
    check_choice(rule, "rule", ("broadcast", "reduce"))
    if not (isinstance(tensor_bytes, Sequence) and not isinstance(tensor_bytes, str)):
        total = check_real(tensor_bytes, "tensor_bytes", 0.0)
        full = int(total // limit)
        rest = total - full * limit
        return [limit] * full + ([rest] if rest > 0 else [])
    sizes = [check_real(s, f"tensor_bytes[{i}]", 0.0) for i, s in enumerate(tensor_bytes)]
    chunks, open_size, open_count = [], 0.0, 0
    for size in sizes:
        if rule == "reduce" and open_count and open_size + size > limit:
            chunks.append(open_size)
            open_size, open_count = 0.0, 0
        open_size, open_count = open_size + size, open_count + 1
        if rule == "broadcast" and open_size >= limit:
            chunks.append(open_size)
            open_size, open_count = 0.0, 0
    if open_count:
        chunks.append(open_size)
    return chunks


def chain_broadcast_bytes(size_bytes, num_gpus) -> list[tuple[float, float]]:
    """(sent, received) bytes of each GPU in a pipelined chain broadcast of S from GPU0.

    NCCL's ring broadcast (``nccl::broadcast``) runs along the ring 0 -> 1 -> ... -> n-1 and
    stops before returning to the root: GPU0 sends S, GPUs 1..n-2 receive S and forward it
    (sending and receiving at the same time, in pipelined slices), GPU n-1 only receives S.
    Index = GPU. Empty for n <= 0; [(0, 0)] for n = 1.
    """
    S = check_real(size_bytes, "size_bytes", 0.0)
    n = check_num_gpus(num_gpus)
    if n <= 1:
        return [(0.0, 0.0)] * max(n, 0)
    return [(S, 0.0)] + [(S, S)] * (n - 2) + [(0.0, S)]


def chain_reduce_bytes(size_bytes, num_gpus) -> list[tuple[float, float]]:
    """(sent, received) bytes of each GPU in a pipelined chain reduce of S onto GPU0.

    ``nccl.reduce`` with ``root=0`` runs NCCL's ring reduce (``src/device/reduce.h: runRing``)
    on the same ring as the broadcast, in the same direction: the GPU after the root
    (``prevRank == root``) only sends, each GPU after it receives a partial sum, adds its own
    and sends S on (``recvReduceSend``), and the root only receives (``recvReduceCopy``). On the
    ring 0 -> 1 -> ... -> n-1 -> 0: GPU 1 sends S; GPUs 2..n-1 receive and send S; GPU0
    receives S. Index = GPU.
    """
    S = check_real(size_bytes, "size_bytes", 0.0)
    n = check_num_gpus(num_gpus)
    if n <= 1:
        return [(0.0, 0.0)] * max(n, 0)
    return [(0.0, S), (S, 0.0)] + [(S, S)] * (n - 2)


# NCCL pipelines a chain in slices: its buffer (NCCL_BUFFSIZE, 4 MiB by default) over NCCL_STEPS
# = 8 steps. The course's emulation on gloo (dpcost/measure/chain.py) sends one message a slice.
NCCL_SLICE_BYTES = 4 * 2**20 // 8


def chain_messages(size_bytes, slice_bytes=NCCL_SLICE_BYTES) -> int:
    """Messages one hop of the chain carries for S bytes: ceil(S / slice_bytes), at least 1."""
    S = check_real(size_bytes, "size_bytes", 0.0)
    limit = check_real(slice_bytes, "slice_bytes", 0.0, strict=True)
    return max(1, math.ceil(S / limit))


def chain_step_bytes(size_bytes, num_gpus) -> list[tuple[float, float]]:
    """(sent, received) bytes of each GPU in one chain broadcast of S from GPU0 and one chain
    reduce of S onto it: DataParallel's NCCL path per step with S = P = G. Index = GPU.

    GPU0 (S, S); for n >= 3, GPU 1 (2S, S), GPUs 2..n-2 (2S, 2S), GPU n-1 (S, 2S); for n = 2,
    GPU 1 (S, S). Every GPU's link is busy 2S (``chain_busy_bytes``).
    """
    return [(b[0] + r[0], b[1] + r[1]) for b, r in
            zip(chain_broadcast_bytes(size_bytes, num_gpus),
                chain_reduce_bytes(size_bytes, num_gpus), strict=True)]


def chain_busy_bytes(size_bytes, num_gpus) -> list[float]:
    """Bytes' worth of time each GPU's full-duplex link is busy in one chain broadcast and one
    chain reduce of S: per phase the larger of what it sends and receives (it forwards while it
    receives, pipelined), the two phases one after the other. 2S on every GPU for n >= 2."""
    return [max(b) + max(r) for b, r in zip(chain_broadcast_bytes(size_bytes, num_gpus),
                                            chain_reduce_bytes(size_bytes, num_gpus),
                                            strict=True)]


@dataclass(frozen=True)
class PhaseTraffic:
    """One communication phase of a DataParallel iteration, per GPU (index = GPU).

    ``sent``/``received``: bytes each GPU sends/receives in this phase. ``calls``: copies
    (copy path) or NCCL calls (NCCL path), one per 10 MiB chunk and destination as PyTorch
    issues them. ``latency_steps``: messages on the critical path, each paying one alpha:
    n - 1 per chunk on both paths (n - 1 serial copies through GPU0's link on the copy path;
    n - 1 hops of the chain on the NCCL path).
    """

    phase: str  # "forward" | "backward"
    action: str
    pytorch_function: str
    sent: tuple[float, ...]
    received: tuple[float, ...]
    calls: int
    latency_steps: int
    chunk_bytes: tuple[float, ...] = ()  # the chunks when per-tensor sizes were given


def _star_out(S, n):
    """GPU0 sends S/n to each other GPU: (sent, received) per GPU."""
    return [((n - 1) / n * S, 0.0)] + [(0.0, S / n)] * (n - 1)


def _star_in(S, n):
    return [(0.0, (n - 1) / n * S)] + [(S / n, 0.0)] * (n - 1)


def _copy_broadcast(S, n):
    return [((n - 1) * S, 0.0)] + [(0.0, S)] * (n - 1)


def _copy_reduce(S, n):
    return [(0.0, (n - 1) * S)] + [(S, 0.0)] * (n - 1)


def dp_path_traffic(param_bytes, buffer_bytes, grad_bytes, input_bytes, output_bytes, num_gpus,
                    path="nccl", param_sizes=None, buffer_sizes=None,
                    chunk_bytes=DP_CHUNK_BYTES) -> list[PhaseTraffic]:
    """DataParallel's communication phases for one iteration on ``path`` "copy" or "nccl".

    Per GPU (index = GPU), in bytes, with P, B, G, I, O as in the module table:

    ============================  =========================  ==============================
    phase (PyTorch function)      copy path                  NCCL path
    ============================  =========================  ==============================
    scatter inputs (comm.scatter) GPU0 out (n-1)/n I         the same (plain copies)
    broadcast P + B               GPU0 out (n-1)(P+B);       chain: GPU0 out P+B; 1..n-2
    (comm.broadcast_coalesced)    others in P+B              in and out P+B; n-1 in P+B
    gather outputs (comm.gather)  GPU0 in (n-1)/n O          the same (plain copies)
    scatter output gradients      GPU0 out (n-1)/n O         the same (plain copies)
    reduce G (reduce_add_coal.)   GPU0 in (n-1) G;           chain: GPU0 in G; 2..n-1 in
                                  others out G               and out G; GPU 1 out G
    ============================  =========================  ==============================

    ``param_sizes``/``buffer_sizes`` (per-tensor bytes, optional) make the 10 MiB chunks
    exact (``coalesced_chunk_sizes``); without them P, B and G are cut at ``chunk_bytes``.
    Parameters and buffers are broadcast by two separate ``broadcast_coalesced`` calls
    (``replicate.py: replicate``). For n <= 1 DataParallel runs the module itself: no phases.
    """
    P, B, G, I, O, n = _check_all(  # noqa: E741 (the course's symbols)
        param_bytes, buffer_bytes, grad_bytes, input_bytes, output_bytes, num_gpus)
    check_choice(path, "path", DP_PATHS)
    limit = check_real(chunk_bytes, "chunk_bytes", 0.0, strict=True)
    if n <= 1:
        return []

    def chunks(sizes, total, rule, name):
        """(the chunks, or () for a total: [limit] * k + [rest], counted in closed form; their
        number; their bytes)."""
        if sizes is None:
            full = int(total // limit)
            return (), full + (1 if total - full * limit > 0 else 0), total
        got = coalesced_chunk_sizes(sizes, limit, rule)
        if not math.isclose(sum(got), total, rel_tol=1e-9, abs_tol=1e-6):
            raise ValueError(f"{name} must add up to the total given ({sum(got)!r} != {total!r})")
        return tuple(got), len(got), sum(got)

    p_chunks, p_count, p_bytes = chunks(param_sizes, P, "broadcast", "param_sizes")
    b_chunks, b_count, b_bytes = chunks(buffer_sizes, B, "broadcast", "buffer_sizes")
    # reduce_add_coalesced chunks the gradients, which have the parameters' sizes
    g_chunks, g_count, g_bytes = chunks(param_sizes if param_sizes is not None and G == P else None,
                                        G, "reduce", "param_sizes")
    k = n - 1
    base, cpp = "torch/nn/parallel/", "torch/csrc/cuda/comm.cpp: "
    nccl = path == "nccl"
    bcast = chain_broadcast_bytes if nccl else _copy_broadcast
    reduce = chain_reduce_bytes if nccl else _copy_reduce
    bcast_fn = cpp + ("broadcast -> _broadcast_out_impl -> nccl::broadcast" if nccl
                      else "broadcast -> _broadcast_out_impl -> copy_ per GPU")
    reduce_fn = base + "comm.py: reduce_add -> " + (
        "torch/cuda/nccl.py: reduce" if nccl else "other.to(destination) per replica")
    calls_per_chunk = 1 if nccl else k

    def row(phase, action, fn, pairs, n_chunks, calls, sizes=()):
        return PhaseTraffic(phase, action, fn, tuple(s for s, _ in pairs),
                            tuple(r for _, r in pairs), calls, n_chunks * k, tuple(sizes))

    def add(a, b):
        return [(x[0] + y[0], x[1] + y[1]) for x, y in zip(a, b, strict=True)]

    rows = []
    if I > 0:
        rows.append(row("forward", "scatter the inputs from GPU0 (copies)",
                        base + "scatter_gather.py: scatter_kwargs -> _functions.py: Scatter"
                        " -> " + cpp + "scatter", _star_out(I, n), 1, k))
    # Per-GPU bytes are linear in the bytes moved, so the chunks add up to one call on their
    # sum: closed form, not a loop over chunks and GPUs (1 TB on 1,024 GPUs: 95,000 chunks).
    pb = add(bcast(p_bytes, n), bcast(b_bytes, n))
    rows.append(row("forward", "replicate parameters and buffers (broadcast_coalesced, "
                    f"{p_count + b_count} chunks of <= 10 MiB)",
                    base + "replicate.py: replicate -> comm.py: broadcast_coalesced -> "
                    + bcast_fn, pb, p_count + b_count,
                    (p_count + b_count) * calls_per_chunk, p_chunks + b_chunks))
    if O > 0:
        rows.append(row("forward", "gather the outputs onto GPU0 (copies)",
                        base + "_functions.py: Gather.forward -> comm.py: gather -> " + cpp
                        + "gather", _star_in(O, n), 1, k))
        rows.append(row("backward", "scatter the output gradients from GPU0 (copies)",
                        base + "_functions.py: Gather.backward -> Scatter -> " + cpp
                        + "scatter", _star_out(O, n), 1, k))
    g = reduce(g_bytes, n)
    rows.append(row("backward", f"sum the gradients onto GPU0 ({g_count} chunks)",
                    base + "_functions.py: Broadcast.backward -> ReduceAddCoalesced -> "
                    "comm.py: reduce_add_coalesced -> " + reduce_fn, g, g_count,
                    g_count * calls_per_chunk, g_chunks))
    return rows


def gpu_bytes(rows: list[PhaseTraffic], gpu: int = 0) -> tuple[float, float]:
    """(sent, received) bytes of GPU ``gpu`` over ``rows``."""
    return (sum(r.sent[gpu] for r in rows), sum(r.received[gpu] for r in rows))


def gpu_busy_bytes(rows: list[PhaseTraffic], gpu: int = 0) -> float:
    """Bytes that set GPU ``gpu``'s link busy time: sum over phases of max(sent, received).

    DataParallel's phases run one after another; within a phase a link sends and receives at
    the same time (full duplex), so each phase costs its larger direction.
    """
    return sum(max(r.sent[gpu], r.received[gpu]) for r in rows)


def dp_messages(rows: list[PhaseTraffic]) -> dict[str, int]:
    """{"calls": copies or NCCL calls, "latency_steps": alphas on the critical path}."""
    return {"calls": sum(r.calls for r in rows),
            "latency_steps": sum(r.latency_steps for r in rows)}


def busy_time_ratio(num_gpus, path="nccl") -> float:
    """GPU0's busy bytes under DataParallel / a DDP rank's, for P = G and B = I = O = 0.

    Copy path: 2 (n-1) P / (2 (n-1)/n P) = n (the five functions' factor). NCCL path: GPU0
    sends P in forward and receives P in backward, 2P in series, against a ring rank's
    2 (n-1)/n P: n / (n-1) (8/7 = 1.14 at n = 8). Returns 1.0 for n <= 1.
    """
    n = check_num_gpus(num_gpus)
    check_choice(path, "path", DP_PATHS)
    if n <= 1:
        return 1.0
    return float(n) if path == "copy" else n / (n - 1)


def resnet50_parameter_bytes(dtype_bytes: int = 4, num_classes: int = 1000):
    """ResNet-50's parameters as (name, bytes) in registration order (torch's named_parameters
    for torchvision's layout, as ``tests/torch_resnet50.py`` builds it: a Sequential): a conv's
    weight (no bias), a batch norm's weight and bias, the fc layer's weight and bias."""
    out = []
    for layer in resnet50_layers(num_classes=num_classes):
        if layer.kind == "conv":
            out.append((layer.name + ".weight", layer.c_in * layer.c_out * layer.kernel ** 2))
        elif layer.kind == "bn":
            out += [(layer.name + ".weight", layer.c_out), (layer.name + ".bias", layer.c_out)]
        else:
            out += [(layer.name + ".weight", layer.c_in * layer.c_out),
                    (layer.name + ".bias", layer.c_out)]
    return [(name, elements * dtype_bytes) for name, elements in out]


def resnet50_ready_order_bytes(downsample_first: bool = True, dtype_bytes: int = 4):
    """ResNet-50's gradient bytes in the order backward produces them.

    Autograd runs the nodes created last first, so the gradients arrive in reverse
    registration order, block by block. Within a bottleneck block that computes the shortcut
    (``downsample(x)``) after the main branch, as torchvision's ``Bottleneck.forward`` and
    ``tests/torch_resnet50.py`` do, the shortcut's gradients come first
    (``downsample_first=True``; recorded with hooks and by DDP's rebuild on this machine); a
    block that computes it before the main branch delivers them last (``False``).
    """
    named = resnet50_parameter_bytes(dtype_bytes)
    blocks: dict[str, list] = {}
    for name, size in named:
        blocks.setdefault(name.split(".")[0], []).append((name, size))
    order = []
    for key in reversed(list(blocks)):
        items = blocks[key][::-1]
        shortcut = [x for x in items if ".downsample." in x[0]]
        main = [x for x in items if ".downsample." not in x[0]]
        order += shortcut + main if downsample_first else main + shortcut
    return [size for _, size in order]
