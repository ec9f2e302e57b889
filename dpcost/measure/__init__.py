"""Measure it for real: DDP and the DataParallel pattern over torch.distributed (gloo).

``measure_traffic(world_size=4, model_bytes=4e6)`` starts the ranks on this machine, trains each
scenario for a few iterations, counts the bytes every rank sends and receives on its TCP
sockets and returns the report (see ``report.build_report``). The command line is
``python -m dpcost.measure``. Only the ranks import torch; this module and the launcher do not.
"""

from __future__ import annotations

import importlib.util
import math
import sys

# torch is the optional extra: say so once, here, for `import dpcost.measure` and any submodule.
# find_spec looks torch up without importing it (the launcher must not import it).
if importlib.util.find_spec("torch") is None:
    _NO_TORCH = ("dpcost.measure needs PyTorch: pip install 'dpcost[measure]' "
                 "(from a clone: pip install -e '.[measure]')")
    if sys.argv[:1] == ["-m"]:  # runpy importing us for `python -m dpcost.measure`: one line
        print(f"python -m dpcost.measure: error: {_NO_TORCH}", file=sys.stderr)
        raise SystemExit(2)
    raise ImportError(_NO_TORCH, name="torch")

from dpcost.measure import preflight  # noqa: E402 - after the check, which names the extra
from dpcost.measure.launch import MeasureError
from dpcost.measure.report import build_report, render_table
from dpcost.measure.shape import model_shape, param_bytes_of
from dpcost.measure.strategy_scenarios import NAMES as STRATEGY_SCENARIOS
from dpcost.measure.worker import MEASURABLE, RunConfig

COUNTERS = ("auto", "tcp_info", "profiler")
MIN_MODEL_BYTES = 250_000  # below this gloo's framing exceeds the 0.5 % the tests allow
__all__ = ["measure_traffic", "MeasureError", "render_table", "MIN_MODEL_BYTES", "COUNTERS"]


def measure_traffic(world_size: int = 4, model_bytes: float = 4e6, steps: int = 10,
                    scenarios=("ddp", "dp"), warmup: int = 2, timeout_s: float = 60.0,
                    fault: tuple | None = None, backend: str = "gloo",
                    counter: str = "auto", setup_timeout_s: float = 180.0) -> dict:
    """Run ``scenarios`` on ``world_size`` local gloo ranks; return the report dict.

    ``model_bytes`` is rounded to the nearest Linear stack (``param_bytes`` in the report is
    exact). ``timeout_s``: how long the ranks may all stand still while they train before the
    run is declared hung; ``setup_timeout_s`` bounds start-up and building each model.
    ``backend``: "gloo" (CPU, bytes counted on the TCP sockets) or "nccl" (one GPU per rank,
    bytes from torch.profiler's collective records). ``fault`` = (rank, kind), kind in
    ``worker.FAULTS``, injects a failure, for tests. ``counter``: "auto" (TCP_INFO on gloo,
    torch.profiler's collective records on nccl), "tcp_info" or "profiler" (message sizes x
    the algorithm's factor, also on gloo, where the report then keeps the wire reading beside
    it). Raises ValueError for bad arguments and for a run that cannot fit in the memory this
    machine has free (before any rank starts), MeasureError when a rank fails or hangs.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise ValueError(f"world_size must be an integer >= 2, got {world_size!r}")
    if not (isinstance(model_bytes, (int, float)) and math.isfinite(model_bytes)):
        raise ValueError(f"model_bytes must be a finite number of bytes, got {model_bytes!r}")
    if not model_bytes >= MIN_MODEL_BYTES:
        raise ValueError(f"model_bytes must be >= {MIN_MODEL_BYTES} (gloo's per-message framing "
                         f"would swamp a smaller model), got {model_bytes!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    known = MEASURABLE
    unknown = [s for s in scenarios if s not in known]
    if unknown or not scenarios:
        raise ValueError(f"scenarios must be among {known}, got {list(scenarios)!r}")
    if counter not in COUNTERS:
        raise ValueError(f"counter must be one of {COUNTERS}, got {counter!r}")
    from dpcost.measure.launch import launch
    from dpcost.measure.strategy_scenarios import unavailable

    skipped = {s: why for s in scenarios if s in STRATEGY_SCENARIOS
               and (why := unavailable(s, backend, world_size))}  # reported, never dropped
    scenarios = [s for s in scenarios if s not in skipped]
    if not scenarios:
        raise ValueError(f"no scenario can run here: {skipped}")
    width, depth = model_shape(model_bytes)
    # the strategies hold at most DDP's tensors plus Adam's state, 2 more bytes per P byte
    preflight.check_memory(param_bytes_of(width, depth) * (5 / 3 if set(scenarios) & set(
        STRATEGY_SCENARIOS) else 1), world_size, [s if s not in STRATEGY_SCENARIOS else "ddp"
                                                  for s in scenarios])
    config = RunConfig(world_size=world_size, width=width, depth=depth, steps=steps,
                       warmup=warmup, scenarios=list(scenarios), fault=fault, backend=backend,
                       process_group_timeout_s=max(600.0, 3 * timeout_s), counter=counter)
    run = launch(config, timeout_s=timeout_s, startup_timeout_s=setup_timeout_s)
    report = build_report(config, param_bytes_of(width, depth), run["ranks"], skipped)
    report["startup_s"], report["ranks_wall_s"] = run["startup_s"], run["wall_s"]
    return report
