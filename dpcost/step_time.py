"""Seconds per training step: alpha-beta per message, compute from FLOPs, and overlap.

alpha (``latency_s``) is paid once per message on the critical path, beta
(``bandwidth_bytes_per_s``) is one link's bandwidth per direction. What counts as a message
comes from PyTorch's code, not from one big tensor:

- DDP: one ring all-reduce per gradient bucket (``reducer.cpp: Reducer::all_reduce_bucket``),
  ``2 (n-1) alpha + 2 (n-1)/n b / beta`` for a bucket of b bytes; the buckets come from real
  parameter sizes (``buckets.ddp_buckets_from_sizes``): one bucket in the first
  iteration, then caps of 1 MiB and 25 MiB.
- DataParallel: one broadcast per 10 MiB chunk of ``broadcast_coalesced`` and one reduce per
  chunk of ``reduce_add_coalesced``, ``(n-1) alpha`` each, plus the bytes over GPU0's link:
  ``(n-1) c / beta`` per chunk of c bytes on the copy path (a star), ``c / beta`` on the NCCL
  path (a pipelined chain); scatter and gather are copies through GPU0 on both paths.

Compute: ``flops / (peak FLOP/s x utilisation)``; 6 N per token for a transformer's training
step (Kaplan et al. 2020), 3x the forward's FLOPs for ResNet-50.

Step time (``ddp_step_time``, ``dp_step_time``): DDP overlaps each bucket's all-reduce with the
rest of backward; DataParallel's phases run one after another on GPU0. Not modelled: the GIL
and the Python cost of DataParallel's threads and of ``replicate`` each step, NCCL's protocol
choice (LL/LL128/Simple), kernel launch overheads, and contention between compute and
communication for the GPU's memory bandwidth. Pure Python.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field

from dpcost import defaults
from dpcost.core import check_int, check_num_gpus, check_real

__all__ = [
    "check_sizes",
    "ring_allreduce_terms",
    "bucketed_allreduce_terms",
    "ring_allreduce_time",
    "serial_completion",
    "bucketed_allreduce_time",
    "hierarchical_allreduce_time",
    "flat_ring_multinode_time",
    "NCCL_ALGORITHM_NOTE",
    "compute_time",
    "transformer_training_flops",
    "resnet50_training_flops",
    "Interval",
    "StepTime",
    "ddp_step_time",
    "dp_step_time",
    "communication_hidden",
    "GLOO_PREAMBLE_BYTES",
    "GLOO_FRAMING_BYTES_PER_MESSAGE",
    "GLOO_MAX_SEGMENT_BYTES",
    "gloo_ring_allreduce_messages",
    "gloo_framing_bytes",
    "ddp_gloo_framing_per_step",
    "gloo_barrier_messages",
]


def _link(bandwidth_bytes_per_s, latency_s) -> tuple[float, float]:
    return (check_real(bandwidth_bytes_per_s, "bandwidth_bytes_per_s", 0.0, strict=True),
            check_real(latency_s, "latency_s", 0.0))


def check_sizes(values, name: str) -> list[float]:
    """A sequence of byte counts (buckets, tensors) as floats, each finite and >= 0: TypeError
    unless a sequence (a str is not), ValueError or TypeError naming ``name[i]`` otherwise."""
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of byte counts, got "
                        f"{type(values).__name__} {values!r}")
    return [check_real(v, f"{name}[{i}]", 0.0) for i, v in enumerate(values)]


# --- all-reduce -------------------------------------------------------------------------------


def ring_allreduce_terms(size_bytes, num_gpus, bandwidth_bytes_per_s,
                         latency_s) -> tuple[float, float]:
    """(latency, bandwidth) seconds of one ring all-reduce of S bytes on n ranks:
    ``(2 (n-1) alpha, 2 (n-1)/n S / beta)``.

    n - 1 reduce-scatter steps and n - 1 all-gather steps, each one message of S/n per rank
    (full duplex: every rank sends and receives at once). (0.0, 0.0) for n <= 1. ValueError
    when the time is past a float's range.
    """
    S = check_real(size_bytes, "size_bytes", 0.0)
    n = check_num_gpus(num_gpus)
    beta, alpha = _link(bandwidth_bytes_per_s, latency_s)
    if n <= 1:
        return 0.0, 0.0
    latency, bandwidth = 2 * (n - 1) * alpha, 2 * (n - 1) / n * S / beta
    if not math.isfinite(latency + bandwidth):
        raise ValueError(f"the all-reduce of size_bytes={S!r} at bandwidth_bytes_per_s={beta!r} "
                         "takes longer than a float can hold")
    return latency, bandwidth


def ring_allreduce_time(size_bytes, num_gpus, bandwidth_bytes_per_s, latency_s) -> float:
    """Seconds of one ring all-reduce of S bytes: ``2 (n-1) alpha + 2 (n-1)/n S / beta``, the
    sum of ``ring_allreduce_terms``. 0.0 for n <= 1."""
    latency, bandwidth = ring_allreduce_terms(size_bytes, num_gpus, bandwidth_bytes_per_s,
                                              latency_s)
    return latency + bandwidth


def bucketed_allreduce_terms(bucket_bytes, num_gpus, bandwidth_bytes_per_s,
                             latency_s) -> tuple[float, float]:
    """(latency, bandwidth) seconds of DDP's all-reduces, one ring per bucket:
    ``(2 (n-1) alpha x len(buckets), 2 (n-1)/n x sum(buckets) / beta)``.

    The latency is paid per bucket; the bandwidth term is one all-reduce of all the bytes.
    Buckets from ``dpcost.buckets.ddp_buckets_from_sizes`` (or ``ddp_bucket_sizes``).
    (0.0, 0.0) for n <= 1; ValueError when the time is past a float's range.
    """
    sizes = check_sizes(bucket_bytes, "bucket_bytes")
    n = check_num_gpus(num_gpus)
    beta, alpha = _link(bandwidth_bytes_per_s, latency_s)
    if n <= 1:
        return 0.0, 0.0
    latency, bandwidth = 2 * (n - 1) * alpha * len(sizes), 2 * (n - 1) / n * sum(sizes) / beta
    if not math.isfinite(latency + bandwidth):
        raise ValueError(f"the all-reduce of bucket_bytes adding up to {sum(sizes)!r} at "
                         f"bandwidth_bytes_per_s={beta!r} takes longer than a float can hold")
    return latency, bandwidth


def bucketed_allreduce_time(bucket_bytes, num_gpus, bandwidth_bytes_per_s, latency_s) -> float:
    """Seconds of DDP's all-reduces, one ring per bucket, back to back (one stream).

    ``sum_k (2 (n-1) alpha + 2 (n-1)/n b_k / beta)``: the latency term is paid per bucket,
    ``2 (n-1) alpha x (number of buckets)``, which one all-reduce of P would understate.
    """
    sizes = check_sizes(bucket_bytes, "bucket_bytes")
    return sum(ring_allreduce_time(b, num_gpus, bandwidth_bytes_per_s, latency_s)
               for b in sizes)


def hierarchical_allreduce_time(size_bytes, gpus_per_node, num_nodes, intra_bandwidth_bytes_per_s,
                                intra_latency_s, inter_bandwidth_bytes_per_s,
                                inter_latency_s) -> dict[str, float]:
    """Two-level all-reduce of S bytes over ``num_nodes`` nodes of g GPUs each, in seconds.

    1. reduce-scatter inside each node (ring over g GPUs): ``(g-1) a_i + (g-1)/g S / b_i``;
    2. all-reduce across nodes of each GPU's 1/g shard (ring over N nodes, the g rings in
       parallel, one per NIC): ``2 (N-1) a_e + 2 (N-1)/N (S/g) / b_e``;
    3. all-gather inside each node: as step 1.

    Returns {"intra_reduce_scatter", "inter_allreduce", "intra_all_gather", "total"}.
    """
    S = check_real(size_bytes, "size_bytes", 0.0)
    g = check_int(gpus_per_node, "gpus_per_node", 1)
    nodes = check_int(num_nodes, "num_nodes", 1)
    b_i = check_real(intra_bandwidth_bytes_per_s, "intra_bandwidth_bytes_per_s", 0.0, strict=True)
    a_i = check_real(intra_latency_s, "intra_latency_s", 0.0)
    b_e = check_real(inter_bandwidth_bytes_per_s, "inter_bandwidth_bytes_per_s", 0.0, strict=True)
    a_e = check_real(inter_latency_s, "inter_latency_s", 0.0)
    half = (g - 1) * a_i + (g - 1) / g * S / b_i
    inter = 2 * (nodes - 1) * a_e + 2 * (nodes - 1) / nodes * (S / g) / b_e
    return {"intra_reduce_scatter": half, "inter_allreduce": inter, "intra_all_gather": half,
            "total": 2 * half + inter}


def flat_ring_multinode_time(size_bytes, gpus_per_node, num_nodes, intra_bandwidth_bytes_per_s,
                             intra_latency_s, inter_bandwidth_bytes_per_s, inter_latency_s,
                             rings=1) -> float:
    """A flat ring all-reduce over all n = g N GPUs, in seconds.

    One ring: each of its 2 (n-1) steps moves S/n over every hop at once and waits for the
    slowest, a node-to-node hop through one NIC when N > 1: ``2 (n-1) (a_e + S / (n b_e))``,
    about 2 S / b_e. NCCL runs several rings in parallel (channels), over different NICs:
    ``rings`` divides the bandwidth term (at most g, one NIC per GPU), not the latency.
    With N = 1 it is the ring inside the node. Compare ``hierarchical_allreduce_time``, whose
    inter-node part pays 2 (N-1) latencies instead of 2 (n-1) and moves S/g per NIC.
    """
    S = check_real(size_bytes, "size_bytes", 0.0)
    g = check_int(gpus_per_node, "gpus_per_node", 1)
    nodes = check_int(num_nodes, "num_nodes", 1)
    if isinstance(rings, bool) or not isinstance(rings, numbers.Integral) or not 1 <= rings <= g:
        raise ValueError(f"rings must be an integer between 1 and gpus_per_node, got {rings!r}")
    r = int(rings)
    if nodes == 1:
        return ring_allreduce_time(S, g, intra_bandwidth_bytes_per_s, intra_latency_s)
    check_real(intra_bandwidth_bytes_per_s, "intra_bandwidth_bytes_per_s", 0.0, strict=True)
    check_real(intra_latency_s, "intra_latency_s", 0.0)
    b_e = check_real(inter_bandwidth_bytes_per_s, "inter_bandwidth_bytes_per_s", 0.0, strict=True)
    a_e = check_real(inter_latency_s, "inter_latency_s", 0.0)
    n = g * nodes
    return 2 * (n - 1) * (a_e + S / (n * b_e * r))


NCCL_ALGORITHM_NOTE = (
    "NCCL does not always run a ring: its tuning model picks an algorithm (Ring, Tree, and on "
    "NVSwitch systems with NVLink SHARP, NVLS/NVLSTree; CollNet with in-network reduction) and "
    "a protocol (LL, LL128, Simple) per call from the operation's size, the number of nodes and "
    "of GPUs per node, and the intra- and inter-node bandwidths; a typical sequence as the size "
    "grows is tree/LL -> ring/LL -> tree/LL128 -> ring/LL128 -> tree/Simple -> ring/Simple, with "
    "no fixed rule (S. Jeaugey, NVIDIA, github.com/NVIDIA/nccl/issues/754). The tree (double "
    "binary tree, since NCCL 2.4) is an all-reduce algorithm for many nodes, logarithmic in "
    "latency; it is often chosen between nodes (github.com/NVIDIA/nccl-tests/issues/196). "
    "NCCL_ALGO forces one (NCCL docs, Environment Variables). Broadcast and reduce, which "
    "DataParallel uses, run as pipelined rings. gloo's all-reduce is a ring (gloo/allreduce.cc: "
    "ring). The course models rings: a lower bound on what NCCL's choice achieves for large "
    "buckets and an upper bound on latency for small ones."
)


# --- compute ----------------------------------------------------------------------------------


def transformer_training_flops(parameters, tokens) -> float:
    """FLOPs of one training step of a transformer: ``6 N T`` (Kaplan et al. 2020, Sec. 2.1).

    N parameters, T tokens in the step (all GPUs together); 2 N per token forward, 4 N
    backward. Ignores attention's s^2 term (small while s << 12 d).
    """
    from dpcost.presets import TRAINING_FLOPS_PER_PARAMETER_TOKEN

    return (TRAINING_FLOPS_PER_PARAMETER_TOKEN * check_real(parameters, "parameters", 0.0)
            * check_real(tokens, "tokens", 0.0))


def resnet50_training_flops(images, image_size: int = 224) -> float:
    """FLOPs of ResNet-50's forward and backward on ``images`` images: 3 x 2 x MACs per image.

    Forward MACs counted from the architecture (``presets.resnet50_forward_macs_per_image``,
    4.09e9 at 224 x 224, as torchvision's docs list); backward is about twice the forward.
    """
    from dpcost.presets import resnet50_forward_macs_per_image

    size = check_int(image_size, "image_size", 32)
    return 3 * 2 * resnet50_forward_macs_per_image(size) * check_real(images, "images", 0.0)


def compute_time(flops, peak_flops_per_s, utilisation=defaults.UTILISATION) -> float:
    """Seconds for ``flops`` at ``peak_flops_per_s x utilisation``.

    ``utilisation`` (0 < u <= 1) is the fraction of the datasheet's dense peak a training step
    reaches (model FLOPs utilisation); 0.4 is an assumption, not a measurement: reported
    large-model runs reach about 0.3-0.5 (PaLM, Chowdhery et al. 2022, report 46.2 %).
    """
    f = check_real(flops, "flops", 0.0)
    peak = check_real(peak_flops_per_s, "peak_flops_per_s", 0.0, strict=True)
    u = check_real(utilisation, "utilisation", 0.0, strict=True)
    if u > 1:
        raise ValueError(f"utilisation must be <= 1, got {utilisation!r}")
    seconds = f / peak / u  # not f / (peak * u): that product can underflow to 0
    if not math.isfinite(seconds):
        raise ValueError(f"flops / (peak_flops_per_s x utilisation) must be finite: {f!r} / "
                         f"({peak!r} x {u!r}) overflows")
    return seconds


# --- step time --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    """One bar of a timeline: ``lane`` "compute" or "communication", seconds from step start."""

    name: str
    lane: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class StepTime:
    """A modelled step: total seconds, its parts, and the timeline that produced them.

    ``communication_s``: all communication; ``exposed_communication_s``: the part that
    lengthens the step (not hidden under compute); ``compute_s``: forward + backward + loss +
    optimizer on the critical path.
    """

    total_s: float
    compute_s: float
    communication_s: float
    exposed_communication_s: float
    intervals: list = field(default_factory=list)

    @property
    def exposed_fraction(self) -> float:
        """Exposed communication / total step time (0 for an empty step)."""
        return self.exposed_communication_s / self.total_s if self.total_s > 0 else 0.0


def serial_completion(ready, durations) -> list[tuple[float, float]]:
    """(start, end) of each all-reduce when they run one after another in bucket order: bucket
    k starts once it is ready and the one before it is done, ``c_k = max(r_k, c_{k-1}) + t_k``
    (one stream of collectives, as DDP issues them; any time unit)."""
    if len(ready) != len(durations):
        raise ValueError("ready and durations must have one entry per bucket")
    spans, done = [], None
    for r, t in zip(ready, durations, strict=True):
        start = r if done is None else max(r, done)
        done = start + t
        spans.append((start, done))
    return spans


def ddp_step_time(forward_s, backward_s, bucket_bytes, num_gpus, bandwidth_bytes_per_s,
                  latency_s, optimizer_s=0.0, allreduce_time=None,
                  buffer_broadcast_s=0.0) -> StepTime:
    """A DDP step: forward, backward with the buckets' all-reduces under it, the tail, the step.

    Backward produces gradients at a steady rate in bytes, in bucket order (reverse parameter
    order), so bucket k is ready at ``forward + backward x (b_0 + ... + b_k) / G``. All-reduces
    run one at a time on one stream: bucket k starts at ``max(ready_k, end_{k-1})`` and takes
    ``ring_allreduce_time(b_k)`` (or ``allreduce_time(b_k)`` if given, e.g. a two-level one).
    Exposed communication is what runs past the end of backward; the optimizer waits for the
    last bucket. Total: ``max(backward end, last all-reduce end) + optimizer``.
    ``buffer_broadcast_s``: the buffers' broadcast before forward (``distributed.py:
    _sync_buffers``), exposed.
    """
    fwd = check_real(forward_s, "forward_s", 0.0)
    bwd = check_real(backward_s, "backward_s", 0.0)
    opt = check_real(optimizer_s, "optimizer_s", 0.0)
    sync = check_real(buffer_broadcast_s, "buffer_broadcast_s", 0.0)
    sizes = check_sizes(bucket_bytes, "bucket_bytes")
    n = check_num_gpus(num_gpus)
    _link(bandwidth_bytes_per_s, latency_s)
    if allreduce_time is None:
        def allreduce_time(b):
            return ring_allreduce_time(b, n, bandwidth_bytes_per_s, latency_s)
    elif not callable(allreduce_time):
        raise TypeError(f"allreduce_time must be callable, got {type(allreduce_time).__name__}")
    intervals = ([Interval("broadcast buffers", "communication", 0.0, sync)] if sync else []) + [
        Interval("forward", "compute", sync, sync + fwd),
        Interval("backward", "compute", sync + fwd, sync + fwd + bwd)]
    fwd_end = sync + fwd
    total_grad = sum(sizes)
    if not math.isfinite(total_grad):
        raise ValueError("bucket_bytes must add up to a finite number of bytes, got "
                         f"{total_grad!r}")
    backward_end = fwd_end + bwd
    ready, durations, produced = [], [], 0.0
    for b in sizes if n > 1 else []:
        produced += b
        ready.append(fwd_end + (bwd * produced / total_grad if total_grad > 0 else bwd))
        durations.append(allreduce_time(b))
    done, comm = fwd_end, sync
    for k, (start, done) in enumerate(serial_completion(ready, durations)):
        comm += durations[k]
        intervals.append(Interval(f"all-reduce bucket {k}", "communication", start, done))
    end = max(backward_end, done)
    _check_finite_step(end + opt, comm)
    intervals.append(Interval("optimizer step", "compute", end, end + opt))
    return StepTime(total_s=end + opt, compute_s=fwd + bwd + opt, communication_s=comm,
                    exposed_communication_s=end - backward_end + sync, intervals=intervals)


def _check_finite_step(total_s, communication_s):
    """A step whose times overflow has no meaning (its exposed share would be inf / inf)."""
    if not (math.isfinite(total_s) and math.isfinite(communication_s)):
        raise ValueError("the step's times overflow a float: forward_s, backward_s, "
                         "optimizer_s and the transfers (bytes over bandwidth_bytes_per_s) must "
                         f"add up to a finite time, got total {total_s!r}, communication "
                         f"{communication_s!r}")


def dp_transfer_terms(rows, beta, alpha) -> tuple[float, float]:
    """(latency, bandwidth) seconds of DataParallel phases on GPU0's link, one after another:
    per phase (a row of ``dataparallel_traffic.dp_path_traffic``) ``latency_steps x alpha`` (one
    alpha per critical-path message) and its bytes on GPU0's link over beta."""
    # On the NCCL path GPU0's link carries every chunk once (a pipelined chain: P out in the
    # broadcast, G in the reduce), with n - 1 hops of latency each; on the copy path n - 1 times.
    latency = sum(row.latency_steps for row in rows) * alpha
    return latency, sum(max(row.sent[0], row.received[0]) for row in rows) / beta


def _dp_transfer_time(row, beta, alpha) -> float:
    """Seconds of one DataParallel phase on GPU0's link."""
    return sum(dp_transfer_terms([row], beta, alpha))


def dp_step_time(forward_s, backward_s, param_bytes, grad_bytes, num_gpus,
                 bandwidth_bytes_per_s, latency_s, path="nccl", buffer_bytes=0, input_bytes=0,
                 output_bytes=0, loss_s=0.0, optimizer_s=0.0, param_sizes=None,
                 replicate_s=0.0) -> StepTime:
    """A DataParallel step on GPU0, every phase after the one before:

    scatter inputs + broadcast P and B + forward + gather outputs + loss (on GPU0) + scatter
    output gradients + backward + reduce G onto GPU0 + optimizer step (on GPU0).

    ``forward_s``/``backward_s`` are one replica's compute on its 1/n of the batch (the
    replicas run in parallel). Transfers: ``dataparallel_traffic.dp_path_traffic`` on ``path``
    ("copy" or "nccl"), each phase ``latency_steps x alpha`` plus its bytes on GPU0's link over
    beta (the chain's bytes per link on the NCCL path). Nothing overlaps: the reduce starts
    after backward (``Broadcast.backward`` runs once all replicas' gradients exist).
    ``replicate_s``: ``replicate``'s host work each step (``dpcost.gpu_time.replicate_seconds``).
    """
    from dpcost.dataparallel_traffic import dp_path_traffic

    fwd = check_real(forward_s, "forward_s", 0.0)
    bwd = check_real(backward_s, "backward_s", 0.0)
    loss = check_real(loss_s, "loss_s", 0.0)
    opt = check_real(optimizer_s, "optimizer_s", 0.0)
    rep = check_real(replicate_s, "replicate_s", 0.0)
    beta, alpha = _link(bandwidth_bytes_per_s, latency_s)
    n = check_num_gpus(num_gpus)
    rows = dp_path_traffic(param_bytes, buffer_bytes, grad_bytes, input_bytes, output_bytes,
                           n, path=path, param_sizes=param_sizes)
    comm_of = {}
    for row in rows:
        key = ("scatter inputs" if "scatter the inputs" in row.action else
               "broadcast" if "replicate" in row.action else
               "gather outputs" if "gather the outputs" in row.action else
               "scatter output grads" if "output gradients" in row.action else "reduce")
        comm_of[key] = _dp_transfer_time(row, beta, alpha)
    order = [("replicate (host)", "compute"), ("scatter inputs", "communication"),
             ("broadcast", "communication"),
             ("forward", "compute"), ("gather outputs", "communication"),
             ("loss", "compute"), ("scatter output grads", "communication"),
             ("backward", "compute"), ("reduce", "communication"),
             ("optimizer step", "compute")]
    durations = {"forward": fwd, "loss": loss, "backward": bwd, "optimizer step": opt}
    if rep:
        durations["replicate (host)"] = rep
    durations.update(comm_of)
    t, intervals = 0.0, []
    for name, lane in order:
        d = durations.get(name, 0.0)
        if name in durations:
            intervals.append(Interval(name, lane, t, t + d))
        t += d
    comm = sum(comm_of.values())
    _check_finite_step(t, comm)
    return StepTime(total_s=t, compute_s=fwd + bwd + loss + opt + rep, communication_s=comm,
                    exposed_communication_s=comm, intervals=intervals)


def communication_hidden(compute_s, communication_s) -> bool:
    """The scaling book's criterion: communication can hide under compute when the compute it
    overlaps takes at least as long (``compute_s >= communication_s``).

    For DDP pass backward's time and the buckets' all-reduce time (``bucketed_allreduce_time``);
    even then the last bucket, ready when backward ends, stays exposed (``ddp_step_time``).
    Austin et al. 2025, "How to Scale Your Model" (jax-ml.github.io/scaling-book), data
    parallelism: compute-bound when T_math > T_comms.
    """
    return (check_real(compute_s, "compute_s", 0.0)
            >= check_real(communication_s, "communication_s", 0.0))


# --- gloo's framing: bytes on the wire beyond the payload ---------------------------------

# gloo/transport/tcp/pair.h: struct Op { struct { size_t nbytes, opcode, slot, offset, length,
# roffset; } preamble; }: 6 x 8 bytes in front of every operation on a TCP pair.
GLOO_PREAMBLE_BYTES = 48
# An unbound-buffer send (gloo/transport/tcp/pair.cc: Pair::send, Pair::recv) costs three
# operations: the sender's NOTIFY_SEND_READY, the receiver's NOTIFY_RECV_READY, and the
# sender's SEND_UNBOUND_BUFFER (preamble + payload): 2 preambles from the sender, 1 back.
GLOO_FRAMING_BYTES_PER_MESSAGE = 3 * GLOO_PREAMBLE_BYTES
# gloo/allreduce.h: AllreduceOptionsImpl::kMaxSegmentSize = 1024 * 1024
GLOO_MAX_SEGMENT_BYTES = 1024 * 1024


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def gloo_ring_allreduce_messages(size_bytes, num_gpus, element_bytes=4,
                                 max_segment_bytes=GLOO_MAX_SEGMENT_BYTES, rank=0) -> int:
    """Messages ``rank`` sends in gloo's ring all-reduce of S bytes (it receives as many as
    rank + 1 sends).

    ``gloo/allreduce.cc: ring``: the buffer is cut into ``numSegments = roundUp(max(ceil(S /
    maxSegmentBytes), 2 n), n)`` segments of ``roundUp(ceil(S / numSegments), element)``
    bytes; reduce-scatter and all-gather each send ``numSegments - numSegments / n`` of them,
    skipping segments that start past the end of the buffer (only tiny buffers have any).
    """
    S = int(check_real(size_bytes, "size_bytes", 0.0))
    n = check_num_gpus(num_gpus)
    e = check_int(element_bytes, "element_bytes", 1)
    max_seg = check_real(max_segment_bytes, "max_segment_bytes", 0.0, strict=True)
    max_seg = e * max(1, int(max_seg) // e)
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or not 0 <= rank < max(
            n, 1):
        raise ValueError(f"rank must be an integer in [0, num_gpus), got {rank!r}")
    if n <= 1 or S == 0:
        return 0
    segments = _ceil_div(max(_ceil_div(S, max_seg), 2 * n), n) * n
    per_rank = segments // n
    seg_bytes = _ceil_div(_ceil_div(S, segments), e) * e

    inside = _ceil_div(S, seg_bytes)  # segments 0 .. inside-1 start inside the buffer

    def below(lo, hi):  # segments in [lo, hi) that start inside the buffer
        return max(0, min(hi, inside) - min(lo, inside))

    def sent(first):  # segments first, first+1, ... (mod segments), segments - per_rank of them
        start, count = first % segments, segments - per_rank
        if start + count <= segments:
            return below(start, start + count)
        return below(start, segments) + below(0, start + count - segments)

    return sent((rank + 1) * per_rank) + sent(rank * per_rank)


def gloo_framing_bytes(messages_sent, messages_received) -> tuple[float, float]:
    """(sent, received) framing bytes of a rank that sends and receives these many messages.

    Per message sent: 2 preambles out (notify + data), 1 in (the receiver's notify); per
    message received, the mirror: 2 in, 1 out.
    """
    s = check_real(messages_sent, "messages_sent", 0.0)
    r = check_real(messages_received, "messages_received", 0.0)
    p = GLOO_PREAMBLE_BYTES
    return 2 * p * s + p * r, 2 * p * r + p * s


def gloo_barrier_messages(num_gpus) -> int:
    """Messages per rank in one gloo barrier: ceil(log2 n) rounds (a dissemination barrier),
    one empty message sent and one received per round; consistent with the measured
    remainders (lesson 06: 144 B per window at n = 2, 288 B at n = 3 and 4)."""
    n = check_num_gpus(num_gpus)
    return math.ceil(math.log2(n)) if n > 1 else 0


def ddp_gloo_framing_per_step(bucket_bytes, num_gpus, steps=1, element_bytes=4,
                              rank=0) -> tuple[float, float]:
    """Predicted (sent, received) wire bytes beyond the payload per DDP step on ``rank``.

    144 B per ring message of every bucket (``gloo_framing_bytes`` over the messages that
    ``gloo_ring_allreduce_messages`` counts), plus the barrier that closes each measured
    window of ``steps`` steps (dpcost.measure snapshots the counters after a barrier), spread
    over them. Lesson 06's measured remainders (n = 2, rebuilt buckets, 5 steps): 1 MB: 4
    messages -> 576 + 144/5 = 604.8 (measured 605); 4 MB: 8 -> 1,180.8 (1,181); 16 MB: 16 ->
    2,332.8 (2,333).
    """
    sizes = check_sizes(bucket_bytes, "bucket_bytes")
    n = check_num_gpus(num_gpus)
    steps = check_real(steps, "steps", 0.0, strict=True)
    if n <= 1:
        return 0.0, 0.0
    out = sum(gloo_ring_allreduce_messages(b, n, element_bytes, rank=rank) for b in sizes)
    into = sum(gloo_ring_allreduce_messages(b, n, element_bytes, rank=(rank + 1) % n)
               for b in sizes)
    sent, received = gloo_framing_bytes(out, into)
    barrier = gloo_barrier_messages(n) * GLOO_FRAMING_BYTES_PER_MESSAGE / steps
    return sent + barrier, received + barrier
