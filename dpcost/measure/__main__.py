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
import os
import signal
import sys

from dpcost.core import parse_decimal, parse_whole_number
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
from dpcost.procs import OneLineErrorParser, print_out, run_cli

PROG = "python -m dpcost.measure"

CHOICES = (*PATTERNS, "dataparallel-cuda", "timeline", "all", "strategies") + STRATEGY_SCENARIOS
TIMELINE = list(TIMED)  # lesson 07's timed scenarios


MAX_WORLD_SIZE = 100_000  # bounds the digits; preflight bounds the ranks by this machine
MAX_STEPS = 10**9


def _whole(name, minimum, maximum):
    def parse(text):
        try:  # the same digits as python -m dpcost: ASCII 0-9 only
            return parse_whole_number(text, name, minimum, maximum)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    return parse


def _decimal(name, minimum, **bytes_and_why):
    def parse(text):
        try:
            return parse_decimal(text, name, minimum, **bytes_and_why)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    return parse


def _fault(text):
    rank, _, kind = text.partition(":")
    if not (rank.isascii() and rank.isdigit()) or kind not in FAULTS:
        raise argparse.ArgumentTypeError(f"expected RANK:KIND with KIND one of "
                                         f"{', '.join(FAULTS)}, got {text!r}")
    return int(rank), kind


def parse_args(argv=None):
    parser = OneLineErrorParser(prog=PROG,
                                description="Count the bytes DDP and the DataParallel pattern "
                                            "move per rank, beside the five functions.")
    parser.add_argument("--world-size", type=_whole("--world-size", 2, MAX_WORLD_SIZE),
                        default=4,
                        help="number of local ranks to spawn (default 4; torchrun sets its own)")
    parser.add_argument("--model-mb", type=_decimal(
                            "--model-mb", MIN_MODEL_BYTES / 1e6, scale=1e6, unit="bytes",
                            minimum_why=" (a smaller model is too small to matter)"),
                        default=4.0, help="model size in MB, 10^6 bytes (default 4)")
    parser.add_argument("--steps", type=_whole("--steps", 1, MAX_STEPS), default=10,
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
    parser.add_argument("--timeout", type=_decimal("--timeout", 1.0), default=60.0,
                        help="seconds all ranks may stand still while they train before the "
                             "run is ended as hung (default 60; set-up has --setup-timeout)")
    parser.add_argument("--setup-timeout", type=_decimal("--setup-timeout", 1.0),
                        default=180.0,
                        help="seconds for start-up (import torch, join the process group) and "
                             "for building each scenario's model (default 180)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plot", metavar="FILE", help="save measured vs predicted to FILE")
    parser.add_argument("--trace", metavar="FILE",
                        help="with --scenario timeline: write the per-rank timeline to FILE as "
                             "Chrome trace JSON (open it in ui.perfetto.dev or chrome://tracing)")
    parser.add_argument("--model", metavar="SPEC",
                        help="measure a module of your own instead of the Linear stack: a "
                             "preset name or package.module:callable (imported and called: "
                             "it runs that code); ddp, dp and dp-nccl, per rank "
                             "(dpcost/measure/model_traffic.py); compare with python -m "
                             "dpcost.plan")
    parser.add_argument("--input-shape", help="with --model: each rank's float input, batch "
                                              "first, e.g. 2,16,256")
    parser.add_argument("--batch", type=_whole("--batch", 1, MAX_STEPS),
                        help="with --model and --seq: token ids (batch, seq) per rank")
    parser.add_argument("--seq", type=_whole("--seq", 1, MAX_STEPS), help="see --batch")
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
        if args.backend == "nccl":
            preflight.check_gpus(_gpu_count(), ranks)
        if distributed:
            preflight.check_memory(param_bytes_of(*model_shape(args.model_mb * 1e6)), ranks,
                                   distributed, forked=not _under_torchrun())
        if args.plot is not None:
            preflight.check_plot_path(args.plot)
        if args.trace is not None:
            if args.scenario != "timeline":
                raise ValueError("--trace needs --scenario timeline (the timed scenarios)")
            preflight.check_writable(args.trace, "--trace")
    except ValueError as error:
        return str(error)
    return None


def _save(fig, path):
    """``fig.savefig(path)``, but a failed write raises: ``savefig("/dev/full")`` returned
    without an error here (matplotlib 3.11.2, Pillow 13.0.0, PNG), the plot lost; so render
    into memory and write the bytes ourselves."""
    import io

    import matplotlib

    extension = os.path.splitext(path)[1][1:].lower()
    buffer = io.BytesIO()
    fig.savefig(buffer, format=extension or matplotlib.rcParams["savefig.format"])
    with open(path, "wb") as file:
        file.write(buffer.getvalue())


def _raise_terminated(signum, frame):
    raise Terminated(signum)


def main(argv=None) -> int:
    """The command's exit status; stdout that cannot be written makes it 1 (one line)."""
    return run_cli(PROG, _parse_and_run, argv)


def _parse_and_run(argv) -> int:
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


def _model_main(args) -> int:
    """``--model SPEC``: the three patterns on the user's module (model_traffic.py)."""
    from dpcost.measure.model_traffic import (
        PATTERNS,
        format_table,
        measure,
        model_bytes,
        model_input,
        predicted_framing,
    )

    try:  # before any rank: a module that does not build, or does not fit, in one line
        size = model_bytes(args.model)
        shape, vocab = model_input(args.model, args.input_shape, args.batch, args.seq)
        if size is not None:
            preflight.check_memory(size, args.world_size, PATTERNS, option="--model")
    except ValueError as error:
        return _refuse(str(error))
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        results = measure(args.model, shape, vocab, args.world_size, args.steps,
                          timeout_s=args.setup_timeout)
    except RuntimeError as error:
        print(f"{PROG}: error: {' '.join(str(error).split())[:300]}", file=sys.stderr)
        return 1
    print_out(json.dumps({"model": args.model, "input_shape": list(shape), "vocab": vocab,
                          "steps": args.steps, "ranks": results,
                          "predicted_framing": predicted_framing(results, args.steps)})
              if args.json else format_table(results, args.steps))
    return 0


def _main(args) -> int:
    if args.model is not None:
        return _model_main(args)
    wanted = {"all": ["ddp", "dp", "dp-nccl", "dataparallel-cuda"], "timeline": TIMELINE,
              "strategies": list(STRATEGY_SCENARIOS)}.get(args.scenario, [args.scenario])
    ranks = int(os.environ["WORLD_SIZE"]) if _under_torchrun() else args.world_size
    skipped = {s: why for s in wanted if s in STRATEGY_SCENARIOS
               and (why := unavailable(s, args.backend, ranks))}  # reported under "skipped"
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
        else:  # nothing left to run: say why, in the form asked for
            print_out(json.dumps({"scenarios": {}, "totals": {}, "skipped": skipped}) if args.json
                  else "\n".join(f"{name} skipped: {why}" for name, why in skipped.items()))
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
    print_out(json.dumps(report) if args.json else render_table(report))
    if args.trace is not None:
        from dpcost.measure.timeline import write_chrome_trace

        try:
            write_chrome_trace(args.trace, {name: [row["timeline"] for row in rows]
                                            for name, rows in report["scenarios"].items()
                                            if name in TIMELINE})
        except OSError as error:  # the report above is complete: keep it, say what failed
            print(f"{PROG}: error: --trace: could not write {args.trace}: {error.strerror}",
                  file=sys.stderr)
            return 1
    if args.plot is not None:  # checked before the run; a disk can still fill up
        from dpcost.plots.measure import measured_vs_predicted

        fig, _ = measured_vs_predicted(report)
        try:
            _save(fig, args.plot)
        except Exception as error:  # the report above is complete: keep it, say what failed
            print(f"{PROG}: error: --plot: could not save {args.plot}: "
                  f"{type(error).__name__}: {error}".splitlines()[0], file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    # As a program (not main() called in a process of yours): `kill -USR1 PID` prints where every
    # thread of a stuck run is, to stderr, and the run carries on.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    sys.exit(main())
