"""One function turns a training setting into every number the course shows for it.

``evaluate(setting)`` returns a ``Result``: for each strategy of ``dpcost.registry`` the bytes
and messages on its busiest link per optimizer step, the modelled step (phases and what is
exposed), the memory one GPU holds by component, and whether that fits. The explorer (widget
and web page), ``dpcost.plan`` and lesson 08 show views of it; none of them assembles costs.

Every formula comes from its owner, composed here:

- buckets: ``buckets.compute_bucket_assignment_by_size`` (torch's reducer) with DDP's caps;
- DataParallel's phases: ``dataparallel_traffic.dp_path_traffic`` (GPU0 on the copy and NCCL
  paths) and ``step_time.dp_step_time`` (nothing overlaps);
- DDP: ``dataparallel_traffic.ddp_step_transfers`` (one ring per bucket, the buffers'
  broadcast) and ``step_time.ddp_step_time`` (buckets under backward; the two-level
  all-reduce across nodes, ``hierarchical_allreduce_time``, or a flat ring);
- the sharded strategies: all-gathers and reduce-scatters of (s-1)/s S per rank in a ring of
  s ranks, and HSDP's all-reduce of each shard across nodes (``_fsdp_collectives.py:
  foreach_reduce``). Their step: the collectives of forward run under forward, those of
  backward under backward (FSDP prefetches the next unit), what runs past the compute is
  exposed, and ZeRO-1/2's all-gather of the updated parameters follows the optimizer. Each
  collective is issued once per DDP-sized bucket of the model (a stand-in for FSDP's units);
- memory: ``memory.model_state_bytes_per_parameter`` with the entry's sharding, plus what the
  step holds (DDP's bucket copy, DataParallel's reduce buffer on GPU0, activations, outputs,
  the loss and the outputs' gradient: ``dpcost.memory``'s table).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace
from functools import lru_cache

from dpcost.buckets import (
    compute_bucket_assignment_by_size,
    ddp_bucket_caps,
    ddp_bucket_sizes,
)
from dpcost.core import check_choice, ddp_communication_volume
from dpcost.dataparallel_traffic import (
    ddp_step_transfers,
    dp_messages,
    dp_path_traffic,
    gpu_busy_bytes,
    gpu_bytes,
)
from dpcost.gpu_time import (
    COUNTED_OPS,
    ComputeTime,
    compute_time,
    ddp_host_seconds,
    estimated_ops,
    replicate_seconds,
)
from dpcost.memory import (
    COMPONENTS,
    autocast_cast_cache_bytes,
    fits,
    model_state_bytes_per_parameter,
    optimizer_temporary_bytes,
    step_peak,
    transformer_backward_layers,
)
from dpcost.nccl_achieved import achieved_link
from dpcost.presets import MODELS, TRANSFORMER_SHAPES
from dpcost.registry import STRATEGIES, Strategy
from dpcost.setting import Setting
from dpcost.step_time import (
    Interval,
    StepTime,
    communication_hidden,
    ddp_step_time,
    dp_step_time,
    flat_ring_multinode_time,
    hierarchical_allreduce_time,
)

__all__ = ["Result", "StrategyResult", "evaluate", "peak_flops", "ddp_buckets", "dp_batch_split",
           "ddp_samples_per_rank", "memory", "busiest_bytes_curve", "ddp_hidden_from_batch",
           "smallest_gpus_that_fit", "format_table", "memory_peak", "CANNOT_SPAN"]

CANNOT_SPAN = "DataParallel cannot span machines"


@dataclass(frozen=True)
class StrategyResult:
    """One strategy under one setting; None where the course has no model for a figure.

    Bytes are per optimizer step for the busiest GPU (GPU0 under DataParallel, a rank
    otherwise): ``busiest_bytes`` sums each phase's larger direction (full duplex), and
    ``inter_node_bytes`` is the part that crosses nodes per rank. ``step``: the modelled
    step; ``alternatives``: other algorithms for the same strategy (DDP's flat ring).
    """

    key: str
    label: str
    available: bool
    reason: str = ""
    sent_bytes: float | None = None
    received_bytes: float | None = None
    busiest_bytes: float | None = None
    inter_node_bytes: float | None = None
    messages: int | None = None
    step: StepTime | None = None
    hidden: bool | None = None
    memory: dict | None = None  # by component, each at its largest during the step
    peak: float | None = None  # the step's peak (dpcost.memory.step_peak): what must fit
    fits: bool | None = None
    alternatives: dict = field(default_factory=dict)
    rows: tuple = ()  # the phases behind the bytes (dp_path_traffic / ddp_step_transfers rows)


@dataclass(frozen=True)
class Result:
    """Every number of one setting: ``strategies`` maps the registry's keys, in its order."""

    setting: Setting
    strategies: dict
    parameter_bytes: float  # P
    gradient_bytes: float  # G
    buffer_bytes: float  # B
    buckets: tuple  # DDP's buckets in use (bytes, all-reduced in this order)
    buckets_in_use: str  # "rebuilt" or "construction"
    ddp_samples_per_rank: int
    dp_split: tuple | None  # DataParallel's chunks; None beyond one node
    forward_s: float  # a rank's, without DDP's own host work
    backward_s: float
    peak_flops_per_s: float
    compute: ComputeTime  # what set them: host or device, modelled or measured

    def __getitem__(self, key: str) -> StrategyResult:
        return self.strategies[key]


# --- how the batch is split -----------------------------------------------------------------


def dp_batch_split(batch_size: int, num_gpus: int) -> list[int]:
    """Samples per GPU when DataParallel scatters a global batch of b over n GPUs.

    ``comm.cpp: scatter`` cuts the batch with ``tensor.chunk(n)``: chunks of ``ceil(b/n)``,
    the last one smaller, only as many as that takes (b = 10, n = 8: five chunks of 2), and
    ``data_parallel.py: DataParallel.forward`` replicates to ``device_ids[:len(inputs)]``.
    """
    chunk = -(-batch_size // num_gpus)
    return [chunk] * (batch_size // chunk) + ([batch_size % chunk] if batch_size % chunk else [])


def ddp_samples_per_rank(batch_size: int, num_gpus: int) -> int:
    """``ceil(b/n)``: ``DistributedSampler`` (``drop_last=False``) pads the data to n ceil(b/n)."""
    return -(-batch_size // num_gpus)


# --- compute --------------------------------------------------------------------------------


def peak_flops(gpu, precision: str) -> float:
    """The GPU's dense peak for the mode's math: bf16 tensor cores for 16-bit modes; plain
    fp32 for fp32 (``torch.backends.cuda.matmul.allow_tf32`` is False by default)."""
    return gpu.peak_flops["fp32" if precision == "fp32" else "bf16"]


def _ops(m) -> tuple[int, int | None, int]:
    """(non-view ops, forward ops or None, convolution calls) of one forward + backward:
    a trace's counts, a counted preset's, or a transformer's estimate."""
    if m.ops:
        return m.ops, m.forward_ops or None, m.convolutions
    counted = COUNTED_OPS.get(m.name, {}).get("autocast" if m.precision == "autocast"
                                               else "plain")
    if counted is not None:
        return counted
    shape = TRANSFORMER_SHAPES.get(m.name)
    if shape is not None:
        return estimated_ops(shape.layers, m.precision), None, 0
    return 0, None, 0


def _compute(setting: Setting, samples: int, replicas: int = 1,
             extra_backward_host_s: float = 0.0) -> ComputeTime:
    """One GPU's forward and backward on ``samples`` samples (``dpcost.gpu_time``): measured
    when the setting carries a measured time (scaled by the samples), modelled otherwise."""
    m = setting.model
    if setting.compute_s is not None:
        per_rank = ddp_samples_per_rank(setting.batch, setting.gpus)
        return compute_time(0.0, 0.0, 0, setting.gpu, setting.precision,
                            measured_s=setting.compute_s * samples / per_rank)
    ops, forward_ops, convolutions = _ops(m)
    return compute_time(m.per(m.forward_flops + m.backward_flops, samples),
                        m.per(m.activation_bytes, samples), ops, setting.gpu,
                        setting.precision, conv_share=m.conv_flops_share,
                        convolutions=convolutions, forward_ops=forward_ops, replicas=replicas,
                        extra_backward_host_s=extra_backward_host_s)


def _links(setting: Setting, collective: str = "all-reduce"):
    """(inside a node, across nodes) at the rates NCCL achieves for ``collective``
    (``dpcost.nccl_achieved``): DDP's all-reduce, or the rings of DataParallel's broadcast and
    reduce and of the sharded strategies' all-gathers and reduce-scatters."""
    return (achieved_link(setting.intra_link, setting.peer_to_peer, collective),
            achieved_link(setting.inter_link, collective=collective))


def _ddp_host_s(setting: Setting, buckets: tuple) -> float:
    m = setting.model
    tensors = len(m.tensor_bytes) if m.tensor_bytes is not None else 0
    return ddp_host_seconds(tensors, m.buffer_count, len(buckets))


# --- DDP's buckets --------------------------------------------------------------------------


def ddp_buckets(setting: Setting) -> dict:
    """DDP's buckets for the setting's model and cap, in the reducer's order (bucket 0
    all-reduced first): {"caps", "construction", "rebuilt" (tensor indices; None with
    ``find_unused_parameters`` or unknown tensors), "construction_bytes", "rebuilt_bytes"}.

    Construction (``distributed.py: _ddp_init_helper``): registration order with
    ``[sys.maxsize]`` unless ``find_unused_parameters``, the list reversed. Rebuilt
    (``Reducer::rebuild_buckets``, at the second forward): ready order, the caps, each dtype
    apart. A model without a tensor list is a stream cut exactly at the caps.
    """
    m = setting.model
    caps = ddp_bucket_caps(setting.bucket_cap_mb)
    if m.tensor_bytes is None:
        stream = ddp_bucket_sizes(m.gradient_bytes, caps[-1], caps[0]) or [0.0]
        return {"caps": caps, "construction": None, "rebuilt": None,
                "construction_bytes": [m.gradient_bytes], "rebuilt_bytes": stream}
    sizes, dtypes = list(m.tensor_bytes), list(m.tensor_dtypes)
    limits = caps if setting.find_unused_parameters else [sys.maxsize]
    built, _ = compute_bucket_assignment_by_size(sizes, limits, dtypes)
    construction = list(reversed(built))
    rebuilt = None
    if not setting.find_unused_parameters and m.ready_order is not None \
            and len(m.ready_order) == len(sizes):
        order = list(m.ready_order)
        rebuilt, _ = compute_bucket_assignment_by_size(
            [sizes[i] for i in order], caps, [dtypes[i] for i in order], tensor_indices=order)

    def total(buckets):
        return None if buckets is None else [sum(sizes[i] for i in b) for b in buckets]

    return {"caps": caps, "construction": construction, "rebuilt": rebuilt,
            "construction_bytes": total(construction), "rebuilt_bytes": total(rebuilt)}


def _buckets_in_use(setting: Setting) -> tuple[tuple, str]:
    return _buckets_of(setting.model, setting.bucket_cap_mb, setting.find_unused_parameters)


@lru_cache(maxsize=64)  # the explorer asks again for every control that leaves them alone
def _buckets_of(model, bucket_cap_mb, find_unused_parameters) -> tuple[tuple, str]:
    b = ddp_buckets(Setting(model, bucket_cap_mb=bucket_cap_mb,
                            find_unused_parameters=find_unused_parameters))
    if b["rebuilt_bytes"] is not None:
        return tuple(b["rebuilt_bytes"]) or (0.0,), "rebuilt"
    return tuple(b["construction_bytes"]) or (0.0,), "construction"


# --- memory ---------------------------------------------------------------------------------


def _group(setting: Setting, entry: Strategy) -> int:
    """Ranks that share one copy of the sharded states."""
    if entry.shard_group == "world":
        return setting.gpus
    if entry.shard_group == "node":
        return min(setting.gpus, setting.gpus_per_node)
    return 1


def memory(setting: Setting, key: str) -> dict:
    """Bytes one GPU holds under strategy ``key``, by ``dpcost.memory.COMPONENTS``: GPU0 for
    DataParallel (its first, largest chunk of the batch), a rank otherwise."""
    entry = next(s for s in STRATEGIES if s.key == key)
    m, n, b = setting.model, setting.gpus, setting.batch
    per = model_state_bytes_per_parameter(setting.precision, setting.optimizer)
    group = _group(setting, entry)
    states = {c: float(m.parameters * per[c]) / (group if c in entry.sharded else 1)
              for c in per}
    # frozen parameters: no gradient or optimizer state; FSDP and ZeRO-3 shard them with the
    # rest (fully_shard shards every parameter of a module, requires_grad or not)
    states["parameters"] += m.frozen_bytes / (group if "parameters" in entry.sharded else 1)
    if entry.keeps_gathered_parameters:  # every unit's, from its forward to its backward
        states["parameters"] += float(m.parameters * per["parameters"])
    grads = float(m.parameters * per["gradients"])
    if entry.gpu0_only:  # one process: GPU0 runs the first chunk and holds the whole batch's O
        samples = dp_batch_split(b, n)[0]
        outputs = m.per(m.output_bytes, b)
        extra = {"DP reduce buffer": grads,  # as memory_per_gpu, even at n = 1
                 "outputs": outputs, "loss and output grads": 2 * outputs}
    else:
        samples = ddp_samples_per_rank(b, n)
        outputs = m.per(m.output_bytes, samples)
        copy = grads if entry.bucket_copy and not setting.gradient_as_bucket_view else 0.0
        extra = {"DDP bucket copy": copy, "outputs": outputs,
                 "loss and output grads": 2 * outputs}
    held = {**states, **extra, "activations": m.per(m.activation_bytes, samples)}
    return {c: float(held.get(c, 0.0)) for c in COMPONENTS}


def memory_peak(setting: Setting, key: str, held: dict):
    """The step's peak from ``memory``'s components (``dpcost.memory.step_peak``): backward
    frees each layer's activations as its gradients appear (a preset transformer's layers; one
    layer, the sum, for other models), the optimizer's temporaries at the step, autocast's
    cast cache through forward and backward."""
    entry = next(s for s in STRATEGIES if s.key == key)
    m, p = setting.model, setting.precision
    group = _group(setting, entry)
    samples = dp_batch_split(setting.batch, setting.gpus)[0] if entry.gpu0_only else \
        ddp_samples_per_rank(setting.batch, setting.gpus)
    preset = MODELS.get(m.name)
    layers, transient = None, 0.0
    if m.name in TRANSFORMER_SHAPES and preset is not None \
            and preset.parameters == m.parameters and not m.tensor_names:
        share = 1 / group if "gradients" in entry.sharded else 1.0
        layers, transient = transformer_backward_layers(preset, samples, p, setting.attention,
                                                        gradient_share=share)
    stepped = m.parameters / (group if "optimizer state" in entry.sharded else 1)
    largest = max(m.tensor_elements) if m.tensor_elements else None
    return step_peak(held, layers=layers, layer_transient=transient,
                     optimizer_temporaries=optimizer_temporary_bytes(
                         stepped, p, setting.optimizer, largest),
                     cast_cache=autocast_cast_cache_bytes(m.parameters, p))


# --- bytes and time of the sharded strategies -----------------------------------------------


def _ring_part(size, ranks, beta, alpha, messages=1) -> float:
    """Seconds of an all-gather or reduce-scatter of ``size`` bytes over a ring of ``ranks``."""
    if ranks <= 1:
        return 0.0
    return (ranks - 1) * alpha * messages + (ranks - 1) / ranks * size / beta


def _sharded(setting: Setting, entry: Strategy, P: float, G: float, buckets: tuple,
             fwd: float, bwd: float) -> dict:
    """Bytes per rank and the step of ZeRO-1/2/3, FSDP and HSDP (see the module docstring)."""
    n, g, nodes = setting.gpus, setting.gpus_per_node, setting.nodes
    intra, inter = _links(setting, "ring")
    units = max(1, len(buckets))
    s = _group(setting, entry) if entry.shard_group else n
    # a ring of s ranks runs at the inter-node link once it leaves the node (a flat ring)
    if s > g:
        beta, alpha = inter.bandwidth_bytes_per_s, inter.latency_s
    else:
        beta, alpha = intra.bandwidth_bytes_per_s, intra.latency_s
    part = (s - 1) / s if s > 1 else 0.0
    reshard = entry.key in ("zero3", "fsdp", "hsdp")
    sharded_params = "parameters" in entry.sharded
    sharded_grads = "gradients" in entry.sharded
    fwd_comm = _ring_part(P, s, beta, alpha, units) if sharded_params else 0.0
    bwd_comm = (_ring_part(P, s, beta, alpha, units) if sharded_params and reshard else 0.0)
    if sharded_grads:
        bwd_comm += _ring_part(G, s, beta, alpha, units)
    else:  # ZeRO-1: DDP's all-reduce of every gradient
        bwd_comm += 2 * _ring_part(G, s, beta, alpha, units)
    after = 0.0 if sharded_params else _ring_part(P, s, beta, alpha, 1)  # updated params
    gathers = (2 if reshard else 1) if sharded_params else 0
    sent = part * (gathers * P + (G if sharded_grads else 2 * G)) + (
        0.0 if sharded_params else part * P)
    messages = units * (gathers + 1) + (0 if sharded_params else 1)
    inter_bytes, inter_s = 0.0, 0.0
    if entry.shard_group == "node" and nodes > 1:  # HSDP: all-reduce each shard across nodes
        shard = G / s
        inter_bytes = 2 * (nodes - 1) / nodes * shard
        inter_s = 2 * (nodes - 1) * inter.latency_s * units + inter_bytes / \
            inter.bandwidth_bytes_per_s
        messages += units
    elif s > g:
        inter_bytes = sent
    bwd_comm += inter_s
    # Nothing runs before the first unit's parameters arrive, and the last unit's gradients
    # are reduced after backward ends: those two are exposed whatever the overlap.
    first = _ring_part(P / units, s, beta, alpha) if sharded_params else 0.0
    last = (1 if sharded_grads else 2) * _ring_part(G / units, s, beta, alpha) + inter_s / units
    exposed = (first + max(0.0, fwd_comm - first - fwd)
               + last + max(0.0, bwd_comm - last - bwd) + after)
    comm = fwd_comm + bwd_comm + after
    total = fwd + bwd + exposed
    intervals = [Interval("forward", "compute", 0.0, fwd),
                 Interval("backward", "compute", fwd, fwd + bwd)]
    step = StepTime(total_s=total, compute_s=fwd + bwd, communication_s=comm,
                    exposed_communication_s=exposed, intervals=intervals)
    return {"sent_bytes": sent + inter_bytes * (entry.shard_group == "node"),
            "received_bytes": sent + inter_bytes * (entry.shard_group == "node"),
            "busiest_bytes": max(sent, inter_bytes) if entry.shard_group == "node"
            else sent, "inter_node_bytes": inter_bytes, "messages": messages, "step": step,
            "hidden": communication_hidden(fwd + bwd, comm - after) if n > 1 else None}


# --- the evaluator --------------------------------------------------------------------------


def _ddp_step(setting: Setting, buckets: tuple, fwd: float, bwd: float,
              buffer_bytes: float = 0.0) -> dict:
    """DDP's step: a ring inside a node; beyond it the two-level all-reduce, and a flat ring
    as the alternative. The buffers' broadcast (``forward_sync_buffers``) runs before forward."""
    n, g, nodes = setting.gpus, setting.gpus_per_node, setting.nodes
    intra, inter = _links(setting)
    beta, alpha = intra.bandwidth_bytes_per_s, intra.latency_s
    if n > 1 and buffer_bytes > 0:  # NCCL's broadcast, a pipelined ring (one message)
        slowest = inter if n > g else intra
        sync = buffer_bytes / slowest.bandwidth_bytes_per_s + (n - 1) * slowest.latency_s
    else:
        sync = 0.0
    if n <= g:
        return {"ring": ddp_step_time(fwd, bwd, buckets, n, beta, alpha,
                                      buffer_broadcast_s=sync)}
    links = (beta, alpha, inter.bandwidth_bytes_per_s, inter.latency_s)
    memo_two, memo_flat = {}, {}

    def two_level(x):
        if x not in memo_two:
            memo_two[x] = hierarchical_allreduce_time(x, g, nodes, *links)["total"]
        return memo_two[x]

    def flat(x):
        if x not in memo_flat:
            memo_flat[x] = flat_ring_multinode_time(x, g, nodes, *links)
        return memo_flat[x]

    return {"two-level": ddp_step_time(fwd, bwd, buckets, n, beta, alpha,
                                       allreduce_time=two_level, buffer_broadcast_s=sync),
            "flat ring": ddp_step_time(fwd, bwd, buckets, n, beta, alpha,
                                       allreduce_time=flat, buffer_broadcast_s=sync)}


def _dp(setting: Setting, entry: Strategy, P, B, G, split) -> dict:
    m, b = setting.model, setting.batch
    path = "copy" if entry.key == "dp_copy" else "nccl"
    k = len(split)
    I, O = m.per(m.input_bytes, b), m.per(m.output_bytes, b)  # noqa: E741 (course symbols)
    sizes = list(m.tensor_bytes) if m.tensor_bytes is not None and not m.frozen_bytes \
        else None
    rows = dp_path_traffic(P, B, G, I, O, k, path=path, param_sizes=sizes,
                           buffer_sizes=list(m.buffer_bytes) or None) if k > 1 else []
    sent, received = gpu_bytes(rows, 0) if rows else (0.0, 0.0)
    # k threads launch the k replicas' forwards through one interpreter; replicate's host
    # work (per tensor, per device) comes first, every step
    compute = _compute(setting, split[0], replicas=k)
    link, _ = _links(setting, "ring")
    tensors = (len(m.tensor_bytes) if m.tensor_bytes is not None else 0) + m.buffer_count
    step = dp_step_time(compute.forward_s, compute.backward_s, P, G, k,
                        link.bandwidth_bytes_per_s, link.latency_s, path=path, buffer_bytes=B,
                        input_bytes=I, output_bytes=O, param_sizes=sizes,
                        replicate_s=replicate_seconds(tensors, P + B, k))
    return {"sent_bytes": sent, "received_bytes": received,
            "busiest_bytes": gpu_busy_bytes(rows, 0) if rows else 0.0,
            "messages": dp_messages(rows)["calls"] if rows else 0, "step": step,
            "hidden": False, "rows": tuple(rows)}


def _ddp(setting: Setting, P, B, G, buckets, per_rank) -> dict:
    n = setting.gpus
    rows = ddp_step_transfers(P, B, G, 0.0, 0.0, n, bucket_sizes=list(buckets)) if n > 1 else []
    # DDP's own host work (hooks, buckets, buffers) runs during backward, in each process
    compute = _compute(setting, per_rank, extra_backward_host_s=_ddp_host_s(setting, buckets))
    fwd, bwd = compute.forward_s, compute.backward_s
    steps = _ddp_step(setting, buckets, fwd, bwd, B)
    step = next(iter(steps.values()))
    return {"sent_bytes": float(sum(r.gpu0_sent_bytes for r in rows)),
            "received_bytes": float(sum(r.gpu0_received_bytes for r in rows)),
            "busiest_bytes": float(sum(max(r.gpu0_sent_bytes, r.gpu0_received_bytes)
                                       for r in rows)),
            # the two-level all-reduce sends each GPU's 1/g of G across nodes, as a ring
            "inter_node_bytes": 2 * (setting.nodes - 1) / setting.nodes * G
            / setting.gpus_per_node if n > setting.gpus_per_node else 0.0,
            "messages": (len(buckets) + (1 if B > 0 else 0)) if n > 1 else 0,
            "step": step, "hidden": communication_hidden(bwd, step.communication_s),
            "alternatives": dict(list(steps.items())[1:]), "rows": tuple(rows)}


def evaluate(setting: Setting, keys=None) -> Result:
    """Every strategy's bytes, step and memory for ``setting`` (only ``keys`` when given).

    ``Setting`` checks its knobs when it is built; here only the arguments' kinds."""
    if not isinstance(setting, Setting):
        raise TypeError(f"setting must be a dpcost.setting.Setting, got "
                        f"{type(setting).__name__}")
    if keys is not None:
        if isinstance(keys, str) or not isinstance(keys, (list, tuple, set, frozenset)):
            raise TypeError(f"keys must be a list, tuple or set of strategy keys, got "
                            f"{type(keys).__name__}")
        for key in keys:
            check_choice(key, "keys", tuple(entry.key for entry in STRATEGIES))
    m, n, b = setting.model, setting.gpus, setting.batch
    P, G = m.parameter_bytes, m.gradient_bytes
    B = float(sum(m.buffer_bytes))
    buckets, in_use = _buckets_in_use(setting)
    per_rank = ddp_samples_per_rank(b, n)
    compute = _compute(setting, per_rank)
    fwd, bwd = compute.forward_s, compute.backward_s
    # ZeRO and FSDP hook every tensor and issue a collective per unit as DDP does per bucket:
    # DDP's measured host costs stand in for theirs
    hooked = _compute(setting, per_rank, extra_backward_host_s=_ddp_host_s(setting, buckets))
    dp_available = n <= setting.gpus_per_node
    split = tuple(dp_batch_split(b, n)) if dp_available else None
    capacity = setting.gpu.memory_bytes
    out = {}
    for entry in STRATEGIES:
        if keys is not None and entry.key not in keys:
            continue
        if entry.one_node and not dp_available:
            out[entry.key] = StrategyResult(entry.key, entry.label, False, CANNOT_SPAN)
            continue
        if entry.gpu0_only:
            figures = _dp(setting, entry, P, B, G, split)
        elif entry.key == "ddp":
            figures = _ddp(setting, P, B, G, buckets, per_rank)
        elif entry.sharded:
            figures = _sharded(setting, entry, P, G, buckets, hooked.forward_s,
                               hooked.backward_s)
        else:  # accumulation, hooks, PowerSGD: lesson 08's ladder (dpcost.strategies)
            figures = {}
        held = memory(setting, entry.key)
        peak = memory_peak(setting, entry.key, held).bytes
        out[entry.key] = StrategyResult(entry.key, entry.label, True, memory=held, peak=peak,
                                        fits=fits(peak, capacity), **figures)
    return Result(setting, out, P, G, B, buckets, in_use, per_rank, split, fwd, bwd,
                  peak_flops(setting.gpu, setting.precision), compute)


# --- views over several settings ------------------------------------------------------------


def busiest_bytes_curve(setting: Setting, key: str, gpu_counts) -> tuple:
    """Bytes on the busiest link per step for ``key`` at each n of ``gpu_counts`` ("dp_copy",
    "dp_nccl": GPU0, NaN beyond one node; "ddp": 2 (n-1)/n G, the all-reduce alone). Bytes do
    not depend on how copies are chunked, so one chunk per tensor kind keeps it fast."""
    m, b = setting.model, setting.batch
    P, G, B = m.parameter_bytes, m.gradient_bytes, float(sum(m.buffer_bytes))
    I, O = m.per(m.input_bytes, b), m.per(m.output_bytes, b)  # noqa: E741
    out = []
    for n in gpu_counts:
        if key == "ddp":
            out.append(ddp_communication_volume(G, n))
        elif n > setting.gpus_per_node:
            out.append(math.nan)
        else:
            k = len(dp_batch_split(b, n))
            path = "copy" if key == "dp_copy" else "nccl"
            rows = dp_path_traffic(P, B, G, I, O, k, path=path,
                                   chunk_bytes=max(P, B, G, 1.0)) if k > 1 else []
            out.append(gpu_busy_bytes(rows, 0) if rows else 0.0)
    return tuple(out)


def ddp_hidden_from_batch(setting: Setting, largest: int = 4096):
    """The smallest per-GPU batch, a power of 2 up to ``largest``, from which DDP's all-reduces
    take no longer than backward (``step_time.communication_hidden``); None if none does."""
    if setting.gpus <= 1:
        return None
    buckets, _ = _buckets_in_use(setting)
    k = 1
    while k <= largest:
        c = _compute(setting, k, extra_backward_host_s=_ddp_host_s(setting, buckets))
        fwd, bwd = c.forward_s, c.backward_s
        step = next(iter(_ddp_step(setting, buckets, fwd, bwd).values()))
        if communication_hidden(bwd, step.communication_s):
            return k
        k *= 2
    return None


def smallest_gpus_that_fit(setting: Setting, key: str = "zero3", limit: int = 4096):
    """The least n, a power of 2 up to ``limit``, at which a GPU under ``key`` fits, at the
    same samples per GPU as ``setting``; None if none does."""
    per_gpu = ddp_samples_per_rank(setting.batch, setting.gpus)
    n = 1
    while n <= limit:
        trial = replace(setting, gpus=n, batch=per_gpu * n,
                        gpus_per_node=max(setting.gpus_per_node, 1))
        if trial.gpus > trial.gpus_per_node and trial.gpus % trial.gpus_per_node:
            trial = replace(trial, gpus_per_node=n)
        held = memory(trial, key)
        if fits(memory_peak(trial, key, held).bytes, setting.gpu.memory_bytes):
            return n
        n *= 2
    return None





def format_table(result: Result, keys=None) -> str:
    """The Result as text, one row per strategy: bytes per rank per step inside and across
    nodes, the modelled step and its exposed communication, memory per GPU and whether it
    fits (decimal units)."""
    from dpcost.units import format_bytes, format_seconds

    s = result.setting
    head = (f"{s.model.name}, {s.precision}, {s.optimizer}: {s.gpus} x {s.gpu.name} "
            f"({s.nodes} node(s) of {min(s.gpus, s.gpus_per_node)}), global batch {s.batch}")
    lines = [head, f"{'strategy':<20}{'busiest link':>14}{'across nodes':>14}{'step':>10}"
                   f"{'exposed':>10}{'memory':>11}  fits"]
    unmodelled = []
    for key, r in result.strategies.items():
        if keys is not None and key not in keys:
            continue
        if r.available and r.busiest_bytes is None:
            unmodelled.append(r.label)
            continue
        if not r.available:
            lines.append(f"{r.label:<20}  {r.reason}")
            continue

        def b(x):
            return "-" if x is None else format_bytes(x, digits=3)

        step = "-" if r.step is None else format_seconds(r.step.total_s)
        exposed = "-" if r.step is None else format_seconds(r.step.exposed_communication_s)
        lines.append(f"{r.label:<20}{b(r.busiest_bytes):>14}{b(r.inter_node_bytes):>14}"
                     f"{step:>10}{exposed:>10}{b(r.peak):>11}  "
                     f"{'yes' if r.fits else 'NO'}")
    if unmodelled:
        lines.append(f"(no bytes or step at this level: {', '.join(unmodelled)}; "
                     "lesson 08's ladder measures them)")
    return "\n".join(lines)
