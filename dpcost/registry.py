"""The strategies, in the course's order: one entry each, which every other module iterates.

An entry says what a strategy is called and drawn as, where its model states live (which of
parameters, gradients and optimizer state it divides, and over which group of ranks), which
extra buffers a GPU holds, whether it can span machines, the scenario of ``dpcost.measure``
that measures it, and the PyTorch code it comes from. ``dpcost.evaluate`` computes each
entry's bytes, messages, step time and memory for a setting from these facts; the lesson's
ladder (``dpcost.strategies.LADDER``) and the measured scenarios are read from here too.

Adding a strategy is adding an entry here and, when its bytes or time follow a new rule, a
branch in ``dpcost.evaluate``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Strategy", "STRATEGIES", "BY_KEY", "MODEL_STATES", "strategy", "keys", "labels",
           "colors", "ladder"]

MODEL_STATES = ("parameters", "gradients", "optimizer state")
DP_COLOR = "#c0392b"  # DataParallel: red throughout the course
DP_NCCL_COLOR = "#e59866"  # DataParallel's NCCL path (the pipelined chain): light orange
DDP_COLOR = "#2471a3"  # DistributedDataParallel: blue throughout the course


@dataclass(frozen=True)
class Strategy:
    """One way of training data-parallel, as the course models it.

    ``sharded``: the model-state components divided among the ranks of ``shard_group``:
    "world" (all n ranks), "node" (the GPUs of one node, replicated across nodes) or "" (none).
    ``gpu0_only``: DataParallel's layout, one process whose GPU0 holds the optimizer, the
    summed gradients and the whole batch's outputs. ``bucket_copy``: DDP's reducer copies the
    gradients into flat buckets (unless ``gradient_as_bucket_view=True``). ``ladder``: the
    rung's name in lesson 08's ladder (None: not a rung). ``keeps_gathered_parameters``: FSDP
    without resharding keeps every unit's gathered parameters from its forward to its backward.
    ``scenario``: what ``dpcost.measure`` runs to measure it over gloo (None: not measurable on
    a CPU).
    """

    key: str
    label: str
    color: str
    sharded: tuple = ()
    shard_group: str = ""
    gpu0_only: bool = False
    bucket_copy: bool = False
    one_node: bool = False
    keeps_gathered_parameters: bool = False  # FSDP without resharding after forward
    ladder: str | None = None
    scenario: str | None = None
    source: str = ""


STRATEGIES = (
    Strategy("dp_copy", "DP, copy path", DP_COLOR, gpu0_only=True, one_node=True,
             ladder="DP (copy path)", scenario="dp",
             source="torch/nn/parallel/data_parallel.py with comm.py's copies (no NCCL)"),
    Strategy("dp_nccl", "DP, NCCL path", DP_NCCL_COLOR, gpu0_only=True, one_node=True,
             ladder="DP (NCCL path)", scenario=None,
             source="torch/nn/parallel/data_parallel.py; comm.cpp: broadcast -> "
                    "nccl::broadcast, comm.py: reduce_add -> nccl.reduce"),
    Strategy("ddp", "DDP", DDP_COLOR, bucket_copy=True, ladder="DDP", scenario="ddp-adam",
             source="torch/nn/parallel/distributed.py, reducer.cpp"),
    Strategy("accumulation", "DDP + accumulation", "#5dade2", bucket_copy=True,
             ladder="+ accumulation", scenario="accumulation",
             source="DistributedDataParallel.no_sync"),
    Strategy("bf16_hook", "DDP + bf16 hook", "#48c9b0", bucket_copy=True,
             ladder="+ bf16 hook", scenario="bf16-cast",
             source="torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py: "
                    "bf16_compress_hook"),
    Strategy("powersgd", "PowerSGD", "#17a589", bucket_copy=True, ladder="PowerSGD",
             scenario="powersgd",
             source="torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py"),
    Strategy("zero1", "ZeRO-1", "#8e44ad", sharded=("optimizer state",), shard_group="world",
             bucket_copy=True, ladder="ZeRO-1", scenario="zero1",
             source="torch/distributed/optim/zero_redundancy_optimizer.py under DDP"),
    Strategy("zero2", "ZeRO-2", "#a569bd", sharded=("gradients", "optimizer state"),
             shard_group="world",
             source="ZeRO paper Sec. 5 (P_os+g); FSDP's SHARD_GRAD_OP"),
    Strategy("fsdp_no_reshard", "FSDP no reshard", "#d7bde2", sharded=MODEL_STATES,
             shard_group="world", keeps_gathered_parameters=True, ladder="FSDP no reshard",
             scenario="fsdp-no-reshard",
             source="torch.distributed.fsdp.fully_shard(reshard_after_forward=False)"),
    Strategy("zero3", "ZeRO-3", "#6c3483", sharded=MODEL_STATES, shard_group="world",
             source="ZeRO paper Sec. 5 (P_os+g+p)"),
    Strategy("fsdp", "FSDP full shard", "#4a235a", sharded=MODEL_STATES, shard_group="world",
             ladder="FSDP full sharding", scenario="fsdp",
             source="torch.distributed.fsdp.fully_shard (reshard_after_forward=True)"),
    Strategy("hsdp", "HSDP", "#b9770e", sharded=MODEL_STATES, shard_group="node",
             ladder="HSDP", scenario="hsdp",
             source="fully_shard on a 2-D DeviceMesh (replicate, shard): "
                    "_fsdp_collectives.py: foreach_reduce reduce-scatters in the shard group, "
                    "then all-reduces the shard in the replicate group"),
)
BY_KEY = {s.key: s for s in STRATEGIES}


def strategy(key: str) -> Strategy:
    """The entry for ``key``; ValueError naming the known keys otherwise."""
    if key not in BY_KEY:
        raise ValueError(f"strategy must be one of {list(BY_KEY)}, got {key!r}")
    return BY_KEY[key]


def keys(*wanted: str) -> tuple:
    """The keys of the registry in its order, only those in ``wanted`` when given."""
    return tuple(s.key for s in STRATEGIES if not wanted or s.key in wanted)


def labels(*wanted: str) -> dict:
    return {s.key: s.label for s in STRATEGIES if not wanted or s.key in wanted}


def colors(*wanted: str) -> dict:
    return {s.key: s.color for s in STRATEGIES if not wanted or s.key in wanted}


def ladder() -> tuple:
    """Lesson 08's rungs, in order."""
    return tuple(s for s in STRATEGIES if s.ladder is not None)
