"""From what the trace found to the plan's numbers: buckets, bytes, step time, memory, verdicts.

Pure Python: every formula comes from its owner module, composed here, none copied.

- buckets: ``buckets.compute_bucket_assignment_by_size`` (torch's
  ``dist._compute_bucket_assignment_by_size``, ``reducer.cpp``) with the caps of
  ``buckets.ddp_bucket_caps``. Construction (``distributed.py: _ddp_init_helper``): the
  parameters in registration order with ``BucketCapacityConfig.compute_bucket_size_limits``'s
  limits, ``[sys.maxsize]`` unless ``find_unused_parameters`` (then the caps), and the list of
  buckets reversed. Rebuilt (``Reducer::rebuild_buckets``, at the second forward, never with
  ``find_unused_parameters``): the gradients in the order they became ready, the caps, each
  dtype apart.
- bytes and messages on the busiest link: ``dataparallel_traffic.dp_path_traffic`` (GPU0,
  copy and NCCL paths, 10 MiB chunks) and ``ddp_step_transfers`` (rank 0, one ring all-reduce
  per rebuilt bucket, plus the buffers' broadcast).
- time: ``step_time.compute_time`` of the traced FLOPs (forward and backward apart), then
  ``ddp_step_time`` / ``dp_step_time`` (``hierarchical_allreduce_time`` across nodes).
- memory: ``memory.memory_per_gpu`` and ``rank_memory`` (ZeRO-1/2/3) with the traced
  activations in place of the presets' formula, and ``strategies.fsdp``'s peak model state.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from dpcost.buckets import compute_bucket_assignment_by_size, ddp_bucket_caps
from dpcost.core import ddp_communication_volume
from dpcost.dataparallel_traffic import (
    ddp_step_transfers,
    dp_messages,
    dp_path_traffic,
    gpu_busy_bytes,
    gpu_bytes,
)
from dpcost.explorer_model import peak_flops
from dpcost.memory import fits, memory_per_gpu, rank_memory, total_bytes
from dpcost.presets import INTERCONNECTS, custom_model
from dpcost.step_time import (
    communication_hidden,
    compute_time,
    ddp_step_time,
    dp_step_time,
    hierarchical_allreduce_time,
    transformer_training_flops,
)
from dpcost.strategies import fsdp

__all__ = ["ModuleFacts", "Settings", "ddp_buckets", "costs", "smallest_gpus_that_fit",
           "INTRA_LINK", "INTER_LINK", "STRATEGIES", "STRATEGY_NAMES"]

# The link inside a node for each GPU preset, and between nodes (explorer's defaults).
INTRA_LINK = {"A100 SXM 80GB": "NVLink 3 (A100)", "H100 SXM 80GB": "NVLink 4 (H100)"}
INTER_LINK = "InfiniBand NDR"
STRATEGIES = ("dp_gpu0", "ddp", "zero1", "zero2", "zero3", "fsdp")
STRATEGY_NAMES = {"dp_gpu0": "DP GPU0", "ddp": "DDP rank", "zero1": "ZeRO-1", "zero2": "ZeRO-2",
                  "zero3": "ZeRO-3", "fsdp": "FSDP full shard"}


@dataclass
class ModuleFacts:
    """A module as the plan sees it: DDP's parameter list and what one traced step found."""

    name: str
    param_names: list  # trainable, in DDP's order (named_parameters, shared ones once)
    param_numel: list
    param_dtype: list  # "float32", "bfloat16", ...
    param_bytes: list
    frozen_elements: int
    frozen_bytes: int
    buffer_bytes: list
    ready_order: list  # indices into param_names, in the order their gradients were ready
    forward_flops: float
    backward_flops: float
    saved_bytes: float  # per GPU, for ``batch`` samples
    batch: int  # samples per GPU
    tokens_per_sample: int  # 0 for a non-token input
    input_bytes: float  # per GPU
    output_elements: int  # per GPU
    output_bytes: float  # per GPU
    notes: dict = field(default_factory=dict)  # where each figure comes from, in words


@dataclass
class Settings:
    gpus: int = 8
    gpus_per_node: int = 8
    gpu: object = None  # a dpcost.presets.GPUPreset
    precision: str = "mixed"
    optimizer: str = "adam"
    bucket_cap_mb: float | None = None
    find_unused_parameters: bool = False
    gradient_as_bucket_view: bool = False
    utilisation: float = 0.4


def ddp_buckets(facts: ModuleFacts, bucket_cap_mb=None, find_unused_parameters=False) -> dict:
    """DDP's buckets as indices into ``facts.param_names`` and their bytes, in the reducer's
    bucket order (bucket 0 all-reduced first): {"construction", "rebuilt" (None with
    ``find_unused_parameters``), "construction_bytes", "rebuilt_bytes", "caps"}."""
    caps = ddp_bucket_caps(bucket_cap_mb)
    limits = caps if find_unused_parameters else [sys.maxsize]
    built, _ = compute_bucket_assignment_by_size(facts.param_bytes, limits, facts.param_dtype)
    construction = list(reversed(built))
    rebuilt = None
    if not find_unused_parameters and len(facts.ready_order) == len(facts.param_names):
        order = facts.ready_order
        rebuilt, _ = compute_bucket_assignment_by_size(
            [facts.param_bytes[i] for i in order], caps, [facts.param_dtype[i] for i in order],
            tensor_indices=order)

    def sizes(buckets):
        return None if buckets is None else [sum(facts.param_bytes[i] for i in b)
                                             for b in buckets]

    return {"caps": caps, "construction": construction, "rebuilt": rebuilt,
            "construction_bytes": sizes(construction), "rebuilt_bytes": sizes(rebuilt)}


def _busy(rows_sent_received) -> float:
    return float(sum(max(s, r) for s, r in rows_sent_received))


def _step_dict(step) -> dict:
    return {"total_s": step.total_s, "compute_s": step.compute_s,
            "communication_s": step.communication_s,
            "exposed_communication_s": step.exposed_communication_s}


def costs(facts: ModuleFacts, settings: Settings) -> dict:
    """Every number of the plan, for ``facts`` under ``settings`` (see the module docstring)."""
    s, n, g = settings, settings.gpus, settings.gpus_per_node
    b = facts.batch
    G = float(sum(facts.param_bytes))
    P = G + facts.frozen_bytes
    B = float(sum(facts.buffer_bytes))
    N = sum(facts.param_numel)
    by_dtype: dict = {}
    for dtype, size, numel in zip(facts.param_dtype, facts.param_bytes, facts.param_numel,
                                  strict=True):
        entry = by_dtype.setdefault(dtype, {"parameters": 0, "gradient_bytes": 0})
        entry["parameters"] += numel
        entry["gradient_bytes"] += size
    buckets = ddp_buckets(facts, s.bucket_cap_mb, s.find_unused_parameters)
    in_use = buckets["rebuilt_bytes"] or buckets["construction_bytes"]
    dp_available = n <= g
    I_all, O_all = facts.input_bytes * n, facts.output_bytes * n  # noqa: E741

    # --- bytes on the busiest link, per step ------------------------------------------------
    traffic = {}
    if dp_available and n > 1:
        for path in ("copy", "nccl"):
            rows = dp_path_traffic(P, B, G, I_all, O_all, n, path=path,
                                   param_sizes=[*facts.param_bytes] if not facts.frozen_bytes
                                   else None,
                                   buffer_sizes=list(facts.buffer_bytes) or None)
            sent, received = gpu_bytes(rows, 0)
            # The parameters' and buffers' broadcast and the gradients' reduce alone, per GPU:
            # what dpcost.measure's DP patterns move (each rank reads its own data there).
            model_rows = [r for r in rows if "replicate" in r.action
                          or "sum the gradients" in r.action]
            traffic[f"dp_{path}"] = {"busy_bytes": gpu_busy_bytes(rows, 0), "sent_bytes": sent,
                                     "received_bytes": received,
                                     "messages": dp_messages(rows)["calls"],
                                     "model_bytes_per_gpu": [list(gpu_bytes(model_rows, i))
                                                             for i in range(n)]}
    rows = ddp_step_transfers(P, B, G, I_all, O_all, n, bucket_sizes=in_use) if n > 1 else []
    ring = ddp_communication_volume(G, n)
    traffic["ddp"] = {"busy_bytes": _busy((r.gpu0_sent_bytes, r.gpu0_received_bytes)
                                          for r in rows),
                      "sent_bytes": sum(r.gpu0_sent_bytes for r in rows),
                      "received_bytes": sum(r.gpu0_received_bytes for r in rows),
                      "allreduce_bytes": ring,
                      "messages": (len(in_use) + (1 if B > 0 else 0)) if n > 1 else 0,
                      # every rank all-reduces 2(n-1)/n G; the buffers' broadcast from rank 0
                      # reaches each other rank once (rank 0 sends B: NCCL's chain, gloo's
                      # tree at n = 2)
                      "model_bytes_per_gpu": [[ring + (B if i == 0 else 0.0),
                                               ring + (B if i > 0 else 0.0)]
                                              for i in range(n)] if n > 1 else [[0.0, 0.0]]}

    # --- step time ----------------------------------------------------------------------------
    peak = peak_flops(s.gpu, s.precision)
    flops = facts.forward_flops + facts.backward_flops
    if flops > 0:
        fwd_flops, bwd_flops = facts.forward_flops, facts.backward_flops
        flops_source = "FlopCounterMode on the traced forward and backward"
    else:
        tokens = b * (facts.tokens_per_sample or 1)
        total = transformer_training_flops(N, tokens)
        fwd_flops, bwd_flops = total / 3, 2 * total / 3
        flops_source = f"6 N x {'tokens' if facts.tokens_per_sample else 'samples'} " \
                       "(FlopCounterMode found no FLOPs)"

    def seconds(f, scale=1.0):
        return compute_time(f * scale, peak, s.utilisation)

    intra = INTERCONNECTS[INTRA_LINK[s.gpu.name]]
    inter = INTERCONNECTS[INTER_LINK]
    beta, alpha = intra.bandwidth_bytes_per_s, intra.latency_s
    nodes = max(1, n // g)

    def ddp_step(scale=1.0):
        fwd, bwd = seconds(fwd_flops, scale), seconds(bwd_flops, scale)
        if n <= g:
            return ddp_step_time(fwd, bwd, in_use, n, beta, alpha)
        cache = {}

        def two_level(x):
            if x not in cache:
                cache[x] = hierarchical_allreduce_time(
                    x, g, nodes, beta, alpha, inter.bandwidth_bytes_per_s,
                    inter.latency_s)["total"]
            return cache[x]
        return ddp_step_time(fwd, bwd, in_use, n, beta, alpha, allreduce_time=two_level)

    steps = {"ddp": _step_dict(ddp_step())}
    if dp_available:
        for path in ("copy", "nccl"):
            steps[f"dp_{path}"] = _step_dict(dp_step_time(
                seconds(fwd_flops), seconds(bwd_flops), P, G, n, beta, alpha, path=path,
                buffer_bytes=B, input_bytes=I_all, output_bytes=O_all))
    # The smallest per-GPU batch (a power of 2) from which DDP's all-reduces take no longer
    # than backward (step_time.communication_hidden); compute scales with the batch.
    hidden_from = None
    for k in range(13):
        scale = 2 ** k / b
        step = ddp_step(scale)
        if n > 1 and communication_hidden(seconds(bwd_flops, scale), step.communication_s):
            hidden_from = 2 ** k
            break

    # --- memory per GPU -----------------------------------------------------------------------
    model = _model(facts)

    def with_trace(parts):
        return _with_trace(facts, parts)

    memory = {}
    if dp_available:
        memory["dp_gpu0"] = with_trace(memory_per_gpu(
            model, n, b * n, s.optimizer, s.precision)["dp_gpu0"])
    memory["ddp"] = with_trace(memory_per_gpu(
        model, n, b * n, s.optimizer, s.precision,
        gradient_as_bucket_view=s.gradient_as_bucket_view)["ddp_rank"])
    for strategy in ("zero1", "zero2", "zero3"):
        memory[strategy] = with_trace(rank_memory(
            model, n, b * n, strategy, s.optimizer, s.precision,
            gradient_as_bucket_view=s.gradient_as_bucket_view))
    # FSDP full sharding (fully_shard, reshard after forward) holds ZeRO-3's shards: its peak
    # model state (strategies.fsdp) is the three sharded components; the one unit it gathers
    # while computing is a communication buffer, not counted.
    sharded = fsdp(G, n, reshard_after_forward=True, num_params=N, precision=s.precision,
                   optimizer=s.optimizer)
    memory["fsdp"] = dict(memory["zero3"])
    totals = {k: total_bytes(v) for k, v in memory.items()}
    verdicts = {k: fits(v, s.gpu.memory_bytes) for k, v in totals.items()}
    return {
        "parameters": N + facts.frozen_elements, "trainable_parameters": N,
        "frozen_parameters": facts.frozen_elements, "by_dtype": by_dtype,
        "parameter_bytes": P, "gradient_bytes": G, "buffer_bytes": B,
        "buckets": buckets, "buckets_in_use": "rebuilt" if buckets["rebuilt"] else "construction",
        "traffic": traffic, "dp_available": dp_available, "nodes": nodes,
        "links": {"intra": intra.name, "inter": INTER_LINK if n > g else None},
        "flops": {"forward": fwd_flops, "backward": bwd_flops, "source": flops_source,
                  "peak_flops_per_s": peak, "utilisation": s.utilisation},
        "steps": steps, "ddp_hidden_from_batch": hidden_from,
        "memory": memory, "memory_totals": totals, "fits": verdicts,
        "capacity_bytes": s.gpu.memory_bytes,
        "fsdp_state_bytes": sharded.peak_state_bytes,
        "fsdp_note": "FSDP full sharding holds ZeRO-3's shards (strategies.fsdp); the one unit "
                     "it gathers while computing is not counted",
    }


def smallest_gpus_that_fit(facts: ModuleFacts, settings: Settings, strategy: str = "zero3",
                           limit: int = 4096):
    """The least n, a power of 2 up to ``limit``, at which a rank under ``strategy`` ("ddp",
    "zero1", "zero2", "zero3"; FSDP full sharding holds what ZeRO-3 holds) fits the GPU at the
    same per-GPU batch; None if none does."""
    n = 1
    while n <= limit:
        parts = _with_trace(facts, rank_memory(
            _model(facts), n, facts.batch * n, strategy, settings.optimizer, settings.precision,
            gradient_as_bucket_view=settings.gradient_as_bucket_view))
        if fits(total_bytes(parts), settings.gpu.memory_bytes):
            return n
        n *= 2
    return None


def _model(facts: ModuleFacts):
    """The module as ``dpcost.memory`` sees it: its trainable count and outputs per sample
    (activations come from the trace, ``_with_trace``)."""
    return custom_model(sum(facts.param_numel),
                        output_elements_per_sample=max(1, round(facts.output_elements
                                                                / facts.batch)),
                        name=facts.name)


def _with_trace(facts: ModuleFacts, parts: dict) -> dict:
    """A rank's components with the traced activations, and the frozen parameters (held, no
    gradient or optimizer state) added to "parameters"."""
    parts = dict(parts)
    parts["activations"] = float(facts.saved_bytes)
    parts["parameters"] += facts.frozen_bytes
    return parts
