"""``python -m dpcost.measure --world-size 4 --model-mb 4 --steps 10 [--scenario ddp|dp|all]``.

Spawns the local gloo ranks itself and prints the table (``--json``: one object; ``--plot
FILE``: measured against predicted per rank). Under torchrun (``torchrun --standalone
--nproc-per-node 2 -m dpcost.measure --backend gloo``) every process is one rank and rank 0
prints. Bad arguments, and runs that cannot fit in this machine's free memory, print one line
and exit with status 2 before any rank starts; a failed run exits with 1 and names the rank and
its cause; SIGINT (Ctrl-C) and SIGTERM end every rank, print one line and exit with 130 and 143.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import math
import os
import signal
import sys

from dpcost.measure import (
    COUNTERS,
    MIN_MODEL_BYTES,
    MeasureError,
    measure_traffic,
    preflight,
    render_table,
)
from dpcost.measure.launch import Interrupted, Terminated
from dpcost.measure.strategy_scenarios import NAMES as STRATEGY_SCENARIOS
from dpcost.measure.strategy_scenarios import unavailable
from dpcost.measure.worker import FAULTS, PATTERNS, TIMED

PROG = "python -m dpcost.measure"

CHOICES = (*PATTERNS, "dataparallel-cuda", "timeline", "all", "strategies") + STRATEGY_SCENARIOS
TIMELINE = list(TIMED)  # lesson 07's timed scenarios


class _OneLineErrorParser(argparse.ArgumentParser):
    def error(self, message):  # argparse's default prints the usage too: keep one line
        self.exit(2, f"{self.prog}: error: {message}\n")


def _at_least(minimum, kind=int, what=""):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if not value >= minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}{what}, got {text}")
        return value
    return parse


def _fault(text):
    rank, _, kind = text.partition(":")
    if not (rank.isascii() and rank.isdigit()) or kind not in FAULTS:
        raise argparse.ArgumentTypeError(f"expected RANK:KIND with KIND one of "
                                         f"{', '.join(FAULTS)}, got {text!r}")
    return int(rank), kind


def parse_args(argv=None):
    parser = _OneLineErrorParser(prog=PROG,
                                 description="Count the bytes DDP and the DataParallel pattern "
                                             "move per rank, beside the five functions.")
    parser.add_argument("--world-size", type=_at_least(2), default=4,
                        help="number of local ranks to spawn (default 4; torchrun sets its own)")
    parser.add_argument("--model-mb", type=_at_least(MIN_MODEL_BYTES / 1e6, float,
                                                     " (a smaller model is too small to matter)"),
                        default=4.0, help="model size in MB, 10^6 bytes (default 4)")
    parser.add_argument("--steps", type=_at_least(1), default=10,
                        help="measured iterations after 2 warm-up ones (default 10)")
    parser.add_argument("--scenario", choices=CHOICES, default="all",
                        help="what to measure (default all: ddp, dp (DataParallel's copy "
                             "path, a star), dp-nccl (its NCCL path, a pipelined chain), and "
                             "dataparallel-cuda when 2 or more GPUs are present; timeline: "
                             "lesson 07's timed scenarios; strategies: every scenario beyond "
                             "DDP, or one of them by name)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--counter", choices=COUNTERS, default="auto",
                        help="auto: TCP_INFO on gloo, torch.profiler's collective records on nccl")
    parser.add_argument("--timeout", type=_at_least(1.0, float), default=60.0,
                        help="seconds all ranks may stand still while they train before the "
                             "run is ended as hung (default 60; set-up has --setup-timeout)")
    parser.add_argument("--setup-timeout", type=_at_least(1.0, float), default=180.0,
                        help="seconds for start-up (import torch, join the process group) and "
                             "for building each scenario's model (default 180)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plot", metavar="FILE", help="save measured vs predicted to FILE")
    parser.add_argument("--trace", metavar="FILE",
                        help="with --scenario timeline: write the per-rank timeline to FILE as "
                             "Chrome trace JSON (open it in ui.perfetto.dev or chrome://tracing)")
    parser.add_argument("--inject-fault", type=_fault, help=argparse.SUPPRESS)  # tests only
    return parser.parse_args(argv)


def _gpu_count():
    if not os.path.exists("/dev/nvidiactl"):  # no driver: do not pay torch's import for nothing
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _under_torchrun():
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def _torchrun_main(args, distributed):
    """One rank under torchrun: every rank measures, rank 0 prints the gathered report."""
    import dpcost.measure.warm  # noqa: F401 - torch imported and frozen, as a forked rank has it
    from dpcost.measure.report import build_report
    from dpcost.measure.shape import model_shape, param_bytes_of
    from dpcost.measure.worker import RunConfig, run_rank

    width, depth = model_shape(args.model_mb * 1e6)
    config = RunConfig(world_size=int(os.environ["WORLD_SIZE"]), width=width, depth=depth,
                       steps=args.steps, scenarios=distributed, backend=args.backend,
                       fault=args.inject_fault, counter=args.counter)
    rank = int(os.environ["RANK"])
    everyone = run_rank(rank, config, gather=True)
    if rank != 0:
        return None
    return build_report(config, param_bytes_of(width, depth), everyone)


def _refuse(message) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def _preflight(args, distributed) -> str | None:
    """What makes the run impossible, in one line, or None; checked before any rank starts."""
    from dpcost.measure.shape import model_shape, param_bytes_of

    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", args.world_size)) if _under_torchrun() \
        else args.world_size
    try:
        if distributed:
            preflight.check_memory(param_bytes_of(*model_shape(args.model_mb * 1e6)), ranks,
                                   distributed)
        if args.plot:
            preflight.check_plot_path(args.plot)
        if args.trace:
            if args.scenario != "timeline":
                raise ValueError("--trace needs --scenario timeline (the timed scenarios)")
            preflight.check_writable(args.trace, "--trace")
    except ValueError as error:
        return str(error)
    return None


def _raise_terminated(signum, frame):
    raise Terminated(signum)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return _main(args)
    except Interrupted as interrupted:
        print(f"{PROG}: {interrupted}", file=sys.stderr)
        return interrupted.exit_status
    except KeyboardInterrupt:  # before or after the ranks ran: nothing of ours is left
        print(f"{PROG}: interrupted by SIGINT", file=sys.stderr)
        return 128 + signal.SIGINT
    except Terminated as stop:
        print(f"{PROG}: interrupted by {signal.Signals(stop.signum).name}", file=sys.stderr)
        return 128 + stop.signum


def _main(args) -> int:
    wanted = {"all": ["ddp", "dp", "dp-nccl", "dataparallel-cuda"], "timeline": TIMELINE,
              "strategies": list(STRATEGY_SCENARIOS)}.get(args.scenario, [args.scenario])
    skipped = {s: why for s in wanted if s in STRATEGY_SCENARIOS
               and (why := unavailable(s, args.backend))}  # reported under "skipped"
    distributed = [s for s in wanted if s != "dataparallel-cuda" and s not in skipped]
    # the preflight's estimate knows ddp and dp; a strategy holds about what DDP does
    problem = _preflight(args, [s if s not in STRATEGY_SCENARIOS else "ddp" for s in distributed])
    if problem:
        return _refuse(problem)
    if not _under_torchrun():  # torchrun's agent signals its workers itself
        signal.signal(signal.SIGTERM, _raise_terminated)
    extra = {}
    if "dataparallel-cuda" in wanted:
        gpus = _gpu_count()
        if gpus >= 2:
            from dpcost.measure.scenarios import dataparallel_cuda
            from dpcost.measure.shape import model_shape

            extra["dataparallel-cuda"] = dataparallel_cuda(*model_shape(args.model_mb * 1e6),
                                                           steps=args.steps)
        else:
            skipped["dataparallel-cuda"] = (f"needs 2 or more CUDA GPUs for torch.nn.DataParallel,"
                                            f" found {gpus}")
    try:
        if _under_torchrun():
            report = _torchrun_main(args, distributed)
            if report is None:  # not rank 0
                return 0
        elif distributed:
            report = measure_traffic(args.world_size, args.model_mb * 1e6, args.steps,
                                     distributed, timeout_s=args.timeout,
                                     setup_timeout_s=args.setup_timeout,
                                     fault=args.inject_fault, backend=args.backend,
                                     counter=args.counter)
        else:
            print("\n".join(f"{name} skipped: {why}" for name, why in skipped.items()))
            return 0
    except Interrupted:
        raise
    except MeasureError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    if extra:
        from dpcost.measure.report import scenario_rows, scenario_totals

        for name, results in extra.items():
            rows = scenario_rows(name, results, report["param_bytes"], len(results))
            report["scenarios"][name] = rows
            report["totals"][name] = scenario_totals(name, rows, report["param_bytes"],
                                                     len(results))
    report["skipped"].update(skipped)
    print(json.dumps(report) if args.json else render_table(report))
    if args.trace:
        from dpcost.measure.timeline import write_chrome_trace

        write_chrome_trace(args.trace, {name: [row["timeline"] for row in rows]
                                        for name, rows in report["scenarios"].items()
                                        if name in TIMELINE})
    if args.plot:
        from dpcost.plots.measure import measured_vs_predicted

        fig, _ = measured_vs_predicted(report)
        fig.savefig(args.plot)
    return 0


if __name__ == "__main__":
    # As a program (not main() called in a process of yours): `kill -USR1 PID` prints where every
    # thread of a stuck run is, to stderr, and the run carries on.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    sys.exit(main())
