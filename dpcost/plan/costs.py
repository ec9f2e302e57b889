"""The plan's numbers: a view of ``dpcost.evaluate`` for a traced module and the plan's knobs.

The trace (``dpcost.plan.trace``) gives a ``ModelFacts`` for the per-GPU batch; ``costs`` makes
the ``Setting`` (global batch n x that batch, the GPU's own link inside a node, InfiniBand NDR
between nodes), evaluates it, and lays the Result out as the plan's report reads it. Pure
Python; no formula lives here.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpcost import defaults
from dpcost.core import ddp_communication_volume
from dpcost.dataparallel_traffic import gpu_bytes
from dpcost.evaluate import (
    ddp_buckets,
    ddp_hidden_from_batch,
    evaluate,
    smallest_gpus_that_fit,
)
from dpcost.presets import INTERCONNECTS
from dpcost.registry import BY_KEY
from dpcost.setting import ModelFacts, Setting

__all__ = ["Settings", "costs", "setting_of", "gpus_that_fit", "STRATEGIES", "STRATEGY_NAMES",
           "TRAFFIC"]

# The memory the plan shows, one GPU each: DataParallel's GPU0, then the registry's entries.
STRATEGIES = ("dp_gpu0", "ddp", "zero1", "zero2", "zero3", "fsdp", "hsdp")
STRATEGY_NAMES = {"dp_gpu0": "DP GPU0", "ddp": "DDP rank",
                  **{k: BY_KEY[k].label for k in STRATEGIES[2:]}}
TRAFFIC = ("dp_copy", "dp_nccl", "ddp", "hsdp")  # bytes on the busiest link


@dataclass
class Settings:
    gpus: int = defaults.GPUS
    gpus_per_node: int = defaults.GPUS_PER_NODE
    gpu: object = None  # a dpcost.presets.GPUPreset
    precision: str = defaults.PRECISION
    optimizer: str = defaults.OPTIMIZER
    bucket_cap_mb: float | None = None
    find_unused_parameters: bool = False
    gradient_as_bucket_view: bool = False
    intra_link: object = None  # a dpcost.presets.InterconnectPreset; None: the GPU's own
    compute_s: float | None = None  # a measured forward + backward of one GPU's batch


def setting_of(facts: ModelFacts, s: Settings) -> Setting:
    """The evaluator's Setting: n GPUs of ``facts.batch`` samples each."""
    intra = s.intra_link or INTERCONNECTS[defaults.INTRA_LINK[s.gpu.name]]
    return Setting(facts, gpus=s.gpus, gpus_per_node=s.gpus_per_node, batch=facts.batch * s.gpus,
                   gpu=s.gpu, intra_link=intra, compute_s=s.compute_s,
                   inter_link=INTERCONNECTS[defaults.INTER_LINK], optimizer=s.optimizer,
                   bucket_cap_mb=s.bucket_cap_mb,
                   find_unused_parameters=s.find_unused_parameters,
                   gradient_as_bucket_view=s.gradient_as_bucket_view)


def _step_dict(step) -> dict:
    return {"total_s": step.total_s, "compute_s": step.compute_s,
            "communication_s": step.communication_s,
            "exposed_communication_s": step.exposed_communication_s}


def _model_rows(rows) -> list:
    """The parameters' and buffers' broadcast and the gradients' reduce alone: what
    dpcost.measure's DP patterns move (each rank reads its own data there)."""
    return [r for r in rows if "replicate" in r.action or "sum the gradients" in r.action]


def costs(facts: ModelFacts, settings: Settings) -> dict:
    """Every number of the plan, for ``facts`` under ``settings``."""
    setting = setting_of(facts, settings)
    r = evaluate(setting, keys=("dp_copy", "dp_nccl", *STRATEGIES[1:]))
    n, B = settings.gpus, r.buffer_bytes
    by_dtype: dict = {}
    for dtype, size, numel in zip(facts.tensor_dtypes, facts.tensor_bytes,
                                  facts.tensor_elements, strict=True):
        entry = by_dtype.setdefault(dtype, {"parameters": 0, "gradient_bytes": 0})
        entry["parameters"] += numel
        entry["gradient_bytes"] += size
    dp_available = r["dp_copy"].available
    traffic, steps = {}, {"ddp": _step_dict(r["ddp"].step)}
    for key in ("dp_copy", "dp_nccl"):
        if dp_available:
            steps[key] = _step_dict(r[key].step)
        if dp_available and n > 1:
            x, model_rows = r[key], _model_rows(r[key].rows)
            traffic[key] = {"busy_bytes": x.busiest_bytes, "sent_bytes": x.sent_bytes,
                            "received_bytes": x.received_bytes, "messages": x.messages,
                            "model_bytes_per_gpu": [list(gpu_bytes(model_rows, i))
                                                    for i in range(n)]}
    ddp = r["ddp"]
    ring = ddp_communication_volume(r.gradient_bytes, n)
    traffic["ddp"] = {"busy_bytes": ddp.busiest_bytes, "sent_bytes": ddp.sent_bytes,
                      "received_bytes": ddp.received_bytes, "allreduce_bytes": ring,
                      "messages": ddp.messages,
                      # every rank all-reduces 2(n-1)/n G; the buffers' broadcast from rank 0
                      # reaches each other rank once
                      "model_bytes_per_gpu": [[ring + (B if i == 0 else 0.0),
                                               ring + (B if i > 0 else 0.0)]
                                              for i in range(n)] if n > 1 else [[0.0, 0.0]]}
    hsdp = r["hsdp"]
    traffic["hsdp"] = {"busy_bytes": hsdp.busiest_bytes, "sent_bytes": hsdp.sent_bytes,
                       "received_bytes": hsdp.received_bytes,
                       "inter_node_bytes": hsdp.inter_node_bytes, "messages": hsdp.messages}
    steps["hsdp"] = _step_dict(hsdp.step)
    memory = {"dp_gpu0": r["dp_copy"].memory} if dp_available else {}
    memory.update({k: r[k].memory for k in STRATEGIES[1:]})
    totals = {k: float(sum(v.values())) for k, v in memory.items()}
    verdicts = {k: (r["dp_copy"] if k == "dp_gpu0" else r[k]).fits for k in memory}
    flops_source = facts.notes.get("flops", "FlopCounterMode on the traced forward and backward")
    return {
        "parameters": facts.parameters + facts.frozen_elements,
        "trainable_parameters": facts.parameters, "frozen_parameters": facts.frozen_elements,
        "by_dtype": by_dtype, "parameter_bytes": r.parameter_bytes,
        "gradient_bytes": r.gradient_bytes, "buffer_bytes": B,
        "buckets": ddp_buckets(setting), "buckets_in_use": r.buckets_in_use,
        "traffic": traffic, "dp_available": dp_available, "nodes": setting.nodes,
        "links": {"intra": setting.intra_link.name,
                  "inter": setting.inter_link.name if n > settings.gpus_per_node else None},
        "flops": {"forward": facts.forward_flops, "backward": facts.backward_flops,
                  "source": flops_source, "peak_flops_per_s": r.peak_flops_per_s,
                  "compute": {"source": r.compute.source, "bound": r.compute.bound,
                              "host_s": r.compute.host_s, "device_s": r.compute.device_s}},
        "steps": steps, "ddp_hidden_from_batch": ddp_hidden_from_batch(setting),
        "memory": memory, "memory_totals": totals, "fits": verdicts,
        "capacity_bytes": settings.gpu.memory_bytes,
        "fsdp_note": "FSDP full sharding holds ZeRO-3's shards; the one unit it gathers while "
                     "computing is not counted; HSDP shards inside a node of "
                     f"{min(n, settings.gpus_per_node)} and replicates across nodes",
    }


def gpus_that_fit(facts: ModelFacts, settings: Settings, strategy: str = "zero3",
                  limit: int = 4096):
    """The least n, a power of 2 up to ``limit``, at which a GPU under ``strategy`` fits at the
    same per-GPU batch; None if none does."""
    return smallest_gpus_that_fit(setting_of(facts, settings), strategy, limit)
