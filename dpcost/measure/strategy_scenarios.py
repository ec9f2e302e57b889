"""The strategies beyond plain DDP, as measured scenarios (gloo on CPU, or NCCL on GPUs).

Every scenario trains the Linear stack of ``scenarios.build_model`` with ``torch.optim.Adam``
(fp32: 4 + 4 + 8 bytes per parameter of model state) on a small regression task: fit
``tanh(x T)`` for a fixed random T (seed 1), mean-squared error, on a fixed training set of
``DATASET_BATCHES`` batches per rank (``scenarios._batch``), cycled, the same on every
scenario. One ``step`` is one optimizer step.

- ``ddp-adam``: plain DDP (the ladder's DDP rung, with Adam's state to compare memory with).
- ``accumulation``: k = ``MICRO_STEPS`` micro-batches per step, the first k - 1 under
  ``DistributedDataParallel.no_sync()`` (no all-reduce), the last one synchronised.
- ``fp16-hook`` / ``bf16-hook``: ``default_hooks.fp16_compress_hook`` / ``bf16_compress_hook``;
  DDP refuses the bf16 hook on a torch built without CUDA and NCCL (``unavailable``), so
  ``bf16-cast`` registers its body, ``default_hooks._compress_hook(torch.bfloat16, ...)``, under
  another name (``bf16_cast_hook``): gloo all-reduces bfloat16 on CPU.
- ``powersgd``: ``powerSGD_hook.powerSGD_hook`` with ``PowerSGDState(matrix_approximation_rank=
  POWERSGD_RANK, start_powerSGD_iter=POWERSGD_START)``; the warm-up iterations run before it
  starts compressing, so the measured window is compressed.
- ``bucket-cap``: DDP with ``bucket_cap_mb=BUCKET_CAP_MB`` and ``default_hooks.allreduce_hook``
  (the same arithmetic as DDP's built-in path, but its all-reduce goes through Python, where it
  is counted).
- ``zero1``: DDP + ``torch.distributed.optim.ZeroRedundancyOptimizer(Adam)``.
- ``fsdp`` / ``fsdp-no-reshard``: FSDP2, ``torch.distributed.fsdp.fully_shard`` on every Linear
  and on the root, with ``reshard_after_forward`` True / False. FSDP2 (not FSDP1): it runs on
  CPU tensors with gloo in torch 2.13 (FSDP1 wants a CUDA device by default), and it is the
  API PyTorch recommends.

Collective calls are counted by wrapping ``torch.distributed.all_reduce``, ``broadcast``,
``all_gather_single`` and ``reduce_scatter_single`` (the functions the hooks, ZeRO and FSDP2
call by attribute at call time) while a scenario steps; DDP's built-in reducer calls the
process group from C++, which is why ``bucket-cap`` registers ``allreduce_hook``.

Model state is measured under both of ``dpcost.strategies``' definitions. After the step: a
census of the local bytes of parameters, gradients and optimizer state (DTensor shards by
``to_local``) once ``optimizer.step()`` has returned. Peak: that plus what a strategy holds
beside them, read where it is held: PowerSGD's error feedback (``PowerSGDState.error_dict``,
after the step) and, for FSDP, the parameters left unsharded between forward and backward
(read after forward). The worker's peak-RSS reading is reported beside them.
"""

from __future__ import annotations

import collections
import contextlib
import math

from dpcost import strategies as st
from dpcost.buckets import bucket_assignment, ddp_bucket_caps

# torch is imported inside the functions that need it: the launcher and the report import
# this module for the scenario names and the predictions, without torch.

MICRO_STEPS = 4
POWERSGD_RANK = 1
POWERSGD_START = 2  # the smallest start PowerSGDState allows with error feedback
BUCKET_CAP_MB = 0.5  # MiB: several buckets for a model of a few MB
POWERSGD_BUCKET_CAP_MB = 1024  # MiB: one bucket (see StrategyScenario._wrap)
LEARNING_RATE = 1e-3
TEACHER_SEED = 1
DATASET_BATCHES = 4  # batches per rank in the training set (cycled): the loss can fall
COUNTED = ("all_reduce", "broadcast", "all_gather_single", "reduce_scatter_single")
BUILT_IN_ALLREDUCE = ("ddp-adam", "accumulation", "zero1")  # DDP without a comm hook
NAMES = ("ddp-adam", "accumulation", "fp16-hook", "bf16-hook", "bf16-cast", "powersgd",
         "bucket-cap", "zero1", "fsdp", "fsdp-no-reshard")


@contextlib.contextmanager
def counting_collectives(counts: collections.Counter):
    """Count calls of the ``COUNTED`` torch.distributed functions (by name) inside the block."""
    import torch.distributed as dist

    originals = {name: getattr(dist, name) for name in COUNTED}

    def wrap(name, function):
        def counted(*args, **kwargs):
            counts[name] += 1
            counts[name + " bytes"] += _collective_size(name, args, kwargs)
            return function(*args, **kwargs)
        return counted

    for name, function in originals.items():
        setattr(dist, name, wrap(name, function))
    try:
        yield counts
    finally:
        for name, function in originals.items():
            setattr(dist, name, function)


def _collective_size(name, args, kwargs) -> int:
    """S, the bytes of the whole tensor a collective works on: the all-reduced or broadcast
    tensor, the all-gather's output, the reduce-scatter's input."""
    if name in ("all_reduce", "broadcast"):
        tensor = args[0] if args else kwargs["tensor"]
    elif name == "all_gather_single":
        tensor = args[0] if args else kwargs["output_tensor"]
    else:
        tensor = args[1] if len(args) > 1 else kwargs["input"]
    return tensor.numel() * tensor.element_size()


def _local_bytes(tensor) -> int:
    if tensor is None:
        return 0
    if not hasattr(tensor, "numel"):
        return 0
    if hasattr(tensor, "to_local"):  # a DTensor: this rank's shard
        tensor = tensor.to_local()
    return tensor.numel() * tensor.element_size()


def state_census(model, optimizer) -> dict:
    """Bytes this rank holds of parameters, gradients and optimizer state (local shards): the
    model state after the step when read after ``optimizer.step()``."""
    import torch

    params = list(model.parameters())
    local = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer wraps its shard's
    state = sum(_local_bytes(value) for per_param in local.state.values()
                for value in per_param.values() if torch.is_tensor(value) and value.dim() > 0)
    return {"parameters": sum(_local_bytes(p) for p in params),
            "gradients": sum(_local_bytes(p.grad) for p in params),
            "optimizer state": state}


def unsharded_parameter_bytes(model) -> int:
    """Bytes of the parameters ``model`` exposes whole (not DTensor shards). Read after an
    FSDP2 forward: without resharding every unit's parameters stay unsharded until its
    backward (p Psi); with resharding none do."""
    return sum(_local_bytes(p) for p in model.parameters() if not hasattr(p, "to_local"))


def _teacher(width: int):
    import torch

    generator = torch.Generator().manual_seed(TEACHER_SEED)
    return torch.randn(width, width, generator=generator) / math.sqrt(width)


class StrategyScenario:
    """One optimizer step per ``step``; counts collective calls, records loss and census."""

    kind = ""

    def __init__(self, kind, width, depth, rank, world_size, device="cpu"):
        from dpcost.measure.scenarios import build_model

        self.kind, self.width, self.rank, self.device = kind, width, rank, device
        self.world_size = world_size
        self.teacher = _teacher(width).to(device)
        self.calls = collections.Counter()
        self.losses = []
        self.logical_sent = self.logical_received = 0  # bytes come from the wire counters
        base = build_model(width, depth).to(device)
        self.model = self._wrap(base)
        self.optimizer = self._optimizer()
        self.census = {}
        self.unsharded_after_forward = 0  # FSDP: parameter bytes left whole after forward

    # -- set-up per kind --------------------------------------------------------------------
    def _wrap(self, base):
        from torch import nn

        ddp = nn.parallel.DistributedDataParallel
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        if self.kind in ("fsdp", "fsdp-no-reshard"):
            from torch.distributed.fsdp import fully_shard

            reshard = self.kind == "fsdp"
            for layer in base:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer, reshard_after_forward=reshard)
            return fully_shard(base, reshard_after_forward=reshard)
        if self.kind == "bucket-cap":
            model = ddp(base, bucket_cap_mb=BUCKET_CAP_MB)
            model.register_comm_hook(None, default_hooks.allreduce_hook)
            return model
        # PowerSGD in one bucket: its hook waits for the P and Q all-reduces inside future
        # callbacks, which run on gloo's worker threads; with several buckets the workers all
        # end up waiting (a hang), or, given more workers, the ranks issue their calls in
        # different orders and gloo sums mismatched tensors (dpcost/measure/powersgd_gloo.py).
        model = ddp(base, bucket_cap_mb=POWERSGD_BUCKET_CAP_MB) if self.kind == "powersgd" \
            else ddp(base)
        if self.kind == "fp16-hook":
            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif self.kind == "bf16-hook":
            model.register_comm_hook(None, default_hooks.bf16_compress_hook)
        elif self.kind == "bf16-cast":
            model.register_comm_hook(None, bf16_cast_hook)
        elif self.kind == "powersgd":
            self.powersgd_state = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=POWERSGD_RANK,
                start_powerSGD_iter=POWERSGD_START)
            model.register_comm_hook(self.powersgd_state, powerSGD_hook.powerSGD_hook)
        return model

    def _optimizer(self):
        import torch

        if self.kind == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            return ZeroRedundancyOptimizer(self.model.parameters(),
                                           optimizer_class=torch.optim.Adam, lr=LEARNING_RATE)
        return torch.optim.Adam(self.model.parameters(), lr=LEARNING_RATE)

    # -- one optimizer step -----------------------------------------------------------------
    def _loss(self, iteration, micro=0):
        import torch

        from dpcost.measure.scenarios import _batch

        # a small fixed data set: each rank cycles through DATASET_BATCHES batches
        x = _batch(self.width, self.rank, 100 * (iteration % DATASET_BATCHES) + micro,
                   self.device)
        return (self.model(x) - torch.tanh(x @ self.teacher)).square().mean()

    def step(self, iteration, progress):
        with counting_collectives(self.calls):
            self.optimizer.zero_grad()
            if self.kind == "accumulation":
                total = 0.0
                for micro in range(MICRO_STEPS):
                    progress(iteration, "forward")
                    last = micro == MICRO_STEPS - 1
                    with contextlib.nullcontext() if last else self.model.no_sync():
                        loss = self._loss(iteration, micro) / MICRO_STEPS
                        progress(iteration, "backward")
                        loss.backward()
                    total += float(loss.detach())
                self.losses.append(total)
            else:
                progress(iteration, "forward")
                loss = self._loss(iteration)
                if self.kind.startswith("fsdp"):
                    self.unsharded_after_forward = unsharded_parameter_bytes(self.model)
                progress(iteration, "backward")
                loss.backward()
                self.losses.append(float(loss.detach()))
            progress(iteration, "optimizer step")
            self.optimizer.step()
        self.census = state_census(self.model, self.optimizer)

    # -- what the worker adds to the result ---------------------------------------------------
    def snapshot(self):
        return dict(self.calls), len(self.losses)

    def window_result(self, before, steps) -> dict:
        calls_before, losses_before = before
        def per_step(key):
            return (self.calls[key] - calls_before.get(key, 0)) / steps

        calls = {name: per_step(name) for name in COUNTED if per_step(name)}
        sizes = {name: per_step(name + " bytes") for name in calls}
        result = {"collective_calls": calls, "collective_tensor_bytes": sizes,
                  "messages": sum(calls.values()),
                  "messages_reading": "calls of torch.distributed collectives, counted",
                  "losses": list(self.losses[:]), "window_losses": self.losses[losses_before:],
                  "state_census": dict(self.census),
                  "state_census_bytes": sum(self.census.values())}
        # the peak adds what the strategy holds beside the census (dpcost.strategies)
        beside = 0
        if self.kind == "powersgd":
            beside = sum(_local_bytes(t) for t in self.powersgd_state.error_dict.values())
            result["error_feedback_bytes"] = beside
        if self.kind.startswith("fsdp"):
            beside = self.unsharded_after_forward
            result["unsharded_after_forward_bytes"] = beside
        result["peak_state_bytes"] = result["state_census_bytes"] + beside
        if not self.kind.startswith("fsdp"):  # a DDP model
            data = self.model._get_ddp_logging_data()
            result["bucket_sizes"] = [int(s) for s in str(data.get(
                "rebuilt_bucket_sizes", data.get("bucket_sizes", ""))).split(", ") if s]
        if self.kind in BUILT_IN_ALLREDUCE:  # DDP's reducer all-reduces from C++: not counted
            result["messages"] += len(result["bucket_sizes"])
            result["messages_reading"] += (" + DDP's rebuilt buckets (_get_ddp_logging_data), "
                                           "one all-reduce each (reducer.cpp)")
        if self.kind == "powersgd":
            result["powersgd_iter"] = self.powersgd_state.iter
        return result

    def param_sum(self) -> float:
        return sum(float(_full(p).detach().double().sum()) for p in self.model.parameters())


def bf16_cast_hook(process_group, bucket):
    """The body of ``bf16_compress_hook`` under another name: ``default_hooks._compress_hook``
    with ``torch.bfloat16`` (cast the bucket to bf16, divide by n, all-reduce, cast back).

    ``DistributedDataParallel._check_comm_hook`` refuses the hooks *named*
    ``bf16_compress_hook`` / ``bf16_compress_wrapper_hook`` on builds without CUDA and NCCL
    2.10+; gloo itself all-reduces bfloat16 on CPU, so this runs the same arithmetic here.
    """
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks._compress_hook(torch.bfloat16, process_group, bucket)


def _full(tensor):
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def build(kind, config, rank, device="cpu") -> StrategyScenario:
    """The scenario ``kind`` (one of ``NAMES``) for ``config``'s model on this rank."""
    if kind not in NAMES:
        raise ValueError(f"strategy scenario must be one of {NAMES}, got {kind!r}")
    return StrategyScenario(kind, config.width, config.depth, rank, config.world_size, device)


def _torch_has_cuda() -> bool:
    """Whether the installed torch is a CUDA build (``libtorch_cuda`` beside ``libtorch``),
    found without importing torch: ``find_spec`` of a top-level package does not import it."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return False
    return any((Path(spec.origin).parent / "lib").glob("libtorch_cuda*"))


def unavailable(kind: str, backend: str) -> str | None:
    """Why scenario ``kind`` cannot run with ``backend`` and this torch build, or None.

    Checked before any rank starts, so that the report lists the scenario under "skipped"
    with this reason. ``bf16-hook``: ``DistributedDataParallel._check_comm_hook`` refuses
    ``bf16_compress_hook`` unless torch is built with CUDA 11+ and NCCL 2.10+ (or XPU and
    XCCL), whatever the backend; a CPU build cannot register it.
    """
    if kind not in NAMES:
        raise ValueError(f"strategy scenario must be one of {NAMES}, got {kind!r}")
    if kind == "bf16-hook" and not _torch_has_cuda():
        return ("DistributedDataParallel._check_comm_hook refuses bf16_compress_hook unless "
                "torch is built with CUDA 11+ and NCCL 2.10+ (or XPU and XCCL); this torch is "
                f"a CPU build (backend {backend}); scenario bf16-cast runs the same code "
                "(default_hooks._compress_hook with torch.bfloat16) under another name")
    return None


# --- predictions (torch-free: the report computes them from dpcost.strategies) ---------------

def linear_stack_shapes(param_bytes: int, depth: int):
    """Parameter shapes of ``scenarios.build_model`` (registration order) from its P and depth:
    w^2 + w = P / (4 depth)."""
    width = round((-1 + math.sqrt(1 + param_bytes / depth)) / 2)
    if 4 * depth * (width * width + width) != param_bytes:
        raise ValueError(f"param_bytes {param_bytes} is not a Linear stack of depth {depth}")
    return [(width, width), (width,)] * depth


def ready_order_bytes(shapes) -> list:
    """Gradient bytes in the order they become ready in backward, as DDP rebuilds its buckets:
    last layer first, each layer's bias before its weight (read from the rebuilt bucket sizes
    of ``_get_ddp_logging_data``: 2 layers make the first bucket at the 1 MiB cap, which only
    this order gives for 1 MB layers)."""
    layers = [shapes[i:i + 2] for i in range(0, len(shapes), 2)]
    return [4 * math.prod(shape) for weight, bias in reversed(layers) for shape in (bias, weight)]


def predictions(name: str, rank: int, param_bytes: int, world_size: int, depth: int,
                backend: str = "gloo", warmup: int = 2) -> dict:
    """What ``dpcost.strategies`` predicts for scenario ``name`` on ``rank``, per step:
    predicted sent/received bytes, messages and model state (fp32 Adam) after the step (what
    the census reads) and at its peak."""

    if name not in NAMES:
        raise ValueError(f"strategy scenario must be one of {NAMES}, got {name!r}")
    n, p = world_size, param_bytes
    shapes = linear_stack_shapes(param_bytes, depth)
    numels = [math.prod(s) for s in shapes]
    psi = sum(numels)
    ready = ready_order_bytes(shapes)
    buckets = len(bucket_assignment(ready, ddp_bucket_caps()))
    common = dict(num_params=psi, precision="fp32", optimizer="adam")
    if name == "ddp-adam":
        cost = st.ddp(p, n, buckets, **common)
    elif name == "accumulation":
        cost = st.accumulation(p, n, MICRO_STEPS, buckets, **common)
    elif name in ("fp16-hook", "bf16-hook", "bf16-cast"):
        cost = st.compress_hook(p, n, name[:4], num_buckets=buckets, **common)
    elif name == "powersgd":
        cost = st.powersgd(shapes, n, POWERSGD_RANK, iteration=warmup,
                           start_powersgd_iter=POWERSGD_START, **common)
    elif name == "bucket-cap":
        capped = len(bucket_assignment(ready, ddp_bucket_caps(BUCKET_CAP_MB)))
        cost = st.ddp(p, n, capped, **common)
    elif name == "zero1":
        cost = st.zero1(numels, n, rank, 4, backend, num_buckets=buckets)
    else:  # shards padded to ceil(rows / n) rows (FSDP2), so P grows unless n divides w
        cost = st.fsdp(st.fsdp_padded_param_bytes(shapes, n), n, name == "fsdp", backend,
                       depth, **common, local_numel=st.fsdp_local_numel(shapes, n, rank))
    return {"predicted_sent_bytes": cost.sent_bytes,
            "predicted_received_bytes": cost.received_bytes,
            "predicted_messages": cost.messages,
            "predicted_state_census_bytes": cost.state_after_step_bytes,
            "predicted_peak_state_bytes": cost.peak_state_bytes,
            "formula": cost.formula, "source": cost.source}


# The lesson's ladder (dpcost.strategies.LADDER) and the scenario that measures each rung here;
# None: not measurable on this CPU (the NCCL path needs GPUs and NCCL).
LADDER_SCENARIOS = {
    "DP (copy path)": "dp", "DP (NCCL path)": None, "DDP": "ddp-adam",
    "+ accumulation": "accumulation", "+ bf16 hook": "bf16-cast", "PowerSGD": "powersgd",
    "ZeRO-1": "zero1", "FSDP no reshard": "fsdp-no-reshard", "FSDP full sharding": "fsdp",
}


def ladder_rows(report: dict, rank: int = 0) -> list:
    """One dict per rung for ``rank``: modelled bytes sent per optimizer step, messages and
    model-state bytes (``dpcost.strategies.ladder`` for the measured model, fp32 Adam, on the
    report's backend) beside the measured ones, None where the rung did not run.

    Model state under ``dpcost.strategies``' two definitions: ``*_state_after_step_bytes``,
    once the optimizer has stepped (measured: the census); ``*_peak_state_bytes``, that plus
    PowerSGD's error feedback (g Psi) or FSDP-without-resharding's unsharded parameters
    (p Psi) (measured: the census plus those tensors, read where they are held).
    """
    from dpcost.measure.shape import DEPTH

    n, p = report["world_size"], report["param_bytes"]
    shapes = linear_stack_shapes(p, DEPTH)
    buckets = len(bucket_assignment(ready_order_bytes(shapes), ddp_bucket_caps()))
    modelled = st.ladder(shapes, n, rank, report["backend"], MICRO_STEPS, POWERSGD_RANK,
                         buckets, DEPTH)
    rows = []
    for rung, cost in zip(st.LADDER, modelled, strict=True):
        scenario = LADDER_SCENARIOS[rung]
        measured = None
        if scenario in report["scenarios"]:
            measured = next(r for r in report["scenarios"][scenario] if r["rank"] == rank)
        rows.append({
            "rung": rung, "scenario": scenario,
            "modelled_sent_bytes": cost.sent_bytes, "modelled_received_bytes":
                cost.received_bytes, "modelled_messages": cost.messages,
            "modelled_state_after_step_bytes": cost.state_after_step_bytes,
            "modelled_peak_state_bytes": cost.peak_state_bytes,
            "measured_sent_bytes": measured["sent_bytes"] if measured else None,
            "measured_received_bytes": measured["received_bytes"] if measured else None,
            "measured_messages": measured.get("messages") if measured else None,
            "measured_state_after_step_bytes": measured.get("state_census_bytes")
                if measured else None,
            "measured_peak_state_bytes": measured.get("peak_state_bytes") if measured else None,
            "peak_rss_growth_bytes": measured["peak_memory_bytes"] if measured else None,
            "why_not_measured": None if measured else (
                "needs GPUs and NCCL" if scenario is None else report["skipped"].get(
                    scenario, f"scenario {scenario} was not run")),
        })
    return rows


def bytes_excess(report: dict) -> dict:
    """Per rung measured in ``report``: the largest |measured / modelled - 1| of the bytes over
    every rank and both directions (sent, received). Gloo's framing is the only difference,
    so it grows with the messages per byte (``docs/measurement.md``)."""
    excess = {}
    for rank in range(report["world_size"]):
        for row in ladder_rows(report, rank):
            if row["measured_sent_bytes"] is None:
                continue
            for direction in ("sent", "received"):
                ratio = row[f"measured_{direction}_bytes"] / row[f"modelled_{direction}_bytes"]
                excess[row["rung"]] = max(excess.get(row["rung"], 0.0), abs(ratio - 1))
    return excess


def format_ladder_table(rows: list) -> str:
    """``ladder_rows`` as a text table: MB (10^6 B) per rank per optimizer step, messages and
    model state after the step and at its peak, modelled beside measured ("-" where the rung
    did not run here)."""
    def mb(value):
        return "-" if value is None else f"{value / 1e6:.4f}"

    def count(value):
        return "-" if value is None else f"{value:g}"

    lines = [f"{'':<20} {'sent MB':^19} {'messages':^17} {'state after step MB':^19} "
             f"{'peak state MB':^19}".rstrip(),
             f"{'rung':<20} {'model':>9} {'measured':>9} {'model':>8} {'measured':>8} "
             f"{'model':>9} {'measured':>9} {'model':>9} {'measured':>9}"]
    for row in rows:
        lines.append(f"{row['rung']:<20} {mb(row['modelled_sent_bytes']):>9} "
                     f"{mb(row['measured_sent_bytes']):>9} {count(row['modelled_messages']):>8} "
                     f"{count(row['measured_messages']):>8} "
                     f"{mb(row['modelled_state_after_step_bytes']):>9} "
                     f"{mb(row['measured_state_after_step_bytes']):>9} "
                     f"{mb(row['modelled_peak_state_bytes']):>9} "
                     f"{mb(row['measured_peak_state_bytes']):>9}")
    return "\n".join(lines)
