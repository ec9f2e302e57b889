"""python -m dpcost.plan --model SPEC: DDP's buckets, bytes, step time and memory for a model.

Exit status 0 on success; 2 with one line naming the parameter on bad input (a module that
fails, calls ``sys.exit`` or outlives ``--timeout`` included); 1 with one line when the plan
cannot be written to stdout (``>/dev/full``, a closed stdout), as the course's other commands
(``dpcost.procs.run_cli``). Whatever the user's module prints goes to stderr, so that stdout
holds the plan alone (``--json``).
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager

from dpcost.plan import GPU_NAMES, OPTIMIZERS, PRECISIONS, PlanError, plan
from dpcost.procs import OneLineErrorParser, print_out, run_cli

PROG = "python -m dpcost.plan"

DESCRIPTION = (
    "Plan data-parallel training for a model: DDP's real buckets (first iteration and rebuilt), "
    "bytes per step on the busiest link for DataParallel (copy and NCCL paths) and a DDP rank, "
    "modelled step times, memory per GPU under DP, DDP, ZeRO-1/2/3 and FSDP, and whether each "
    "fits. The model is built on PyTorch's meta device (CPU if it cannot be) and traced once. "
    "WARNING: --model package.module:callable imports that module and calls the callable, so "
    "it RUNS THAT CODE: plan only code you trust.")


def _parser():
    p = OneLineErrorParser(prog=PROG, description=DESCRIPTION)
    p.add_argument("--model", required=True,
                   help="a preset name (e.g. 'Llama-2 70B', 'ResNet-50') or "
                        "package.module:callable returning an nn.Module (runs that code)")
    p.add_argument("--gpus", type=int, default=8, help="data-parallel GPUs (default 8)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--gpu", default="H100", help=f"GPU preset: {', '.join(GPU_NAMES)} "
                                                 "(default H100); the figures below replace "
                                                 "its own")
    p.add_argument("--gpu-tflops", type=float, default=None,
                   help="the GPU's dense 16-bit matrix peak, TFLOP/s (TF32 taken as half, "
                        "fp32 at the preset's ratio)")
    p.add_argument("--gpu-tflops-fp32", type=float, default=None,
                   help="the GPU's fp32 peak, TFLOP/s")
    p.add_argument("--gpu-memory-gb", type=float, default=None,
                   help="the GPU's memory, GB (10^9 B)")
    p.add_argument("--gpu-bandwidth", type=float, default=None,
                   help="the GPU's memory bandwidth, GB/s")
    p.add_argument("--step-ms", type=float, default=None,
                   help="a measured forward + backward of one GPU's batch, ms: used instead "
                        "of the modelled compute")
    p.add_argument("--precision", default="mixed", help=f"{', '.join(PRECISIONS)} "
                                                        "(default mixed)")
    p.add_argument("--optimizer", default="adam", help=f"{', '.join(OPTIMIZERS)} (default adam)")
    p.add_argument("--bucket-cap-mb", type=float, default=None,
                   help="DDP's bucket_cap_mb (sets both caps; default: 1 MiB then 25 MiB)")
    p.add_argument("--input-shape", default=None,
                   help="the per-GPU batch of one float input, batch first: 4,3,224,224")
    p.add_argument("--batch", type=int, default=None, help="samples per GPU")
    p.add_argument("--seq", type=int, default=None, help="tokens per sample (integer input)")
    p.add_argument("--find-unused-parameters", action="store_true",
                   help="DDP(find_unused_parameters=True): capped buckets, never rebuilt")
    p.add_argument("--gradient-as-bucket-view", action="store_true",
                   help="DDP(gradient_as_bucket_view=True): no second copy of the gradients")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--plot", default=None, metavar="FILE",
                   help=f"draw the plan to FILE ({', '.join(PLOT_SUFFIXES)})")
    p.add_argument("--timeout", type=float, default=TIMEOUT_S,
                   help=f"stop importing, building and tracing the module after this many "
                        f"seconds (default {TIMEOUT_S:g})")
    return p


PLOT_SUFFIXES = (".png", ".pdf", ".svg")
TIMEOUT_S = 120.0
# After --timeout, the alarm stops Python code; code stuck in C is ended this much later.
HARD_STOP_GRACE_S = 30.0


def _plot_path(path: str) -> str:
    """``path`` if a figure can be written there: a file name with a known suffix (matplotlib
    would add ".png" to one without, and write beside it) in an existing folder."""
    if os.path.isdir(path):
        raise ValueError(f"{path!r} is a folder; give a file name ending in "
                         f"{', '.join(PLOT_SUFFIXES)}")
    if not path.lower().endswith(PLOT_SUFFIXES):
        raise ValueError(f"{path!r} must end in {', '.join(PLOT_SUFFIXES)}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"no folder {folder!r} to write {os.path.basename(path)!r} in")
    return path


@contextmanager
def _user_output_to_stderr():
    """What the user's module prints, from Python or C, goes to stderr while it runs."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no file descriptors to move: Python's own prints only
        saved = None
    stdout, sys.stdout = sys.stdout, sys.stderr
    try:
        yield
    finally:
        sys.stdout = stdout
        if saved is not None:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os.dup2(saved, 1)
            os.close(saved)


def _hard_stop(seconds: float, model: str):
    """A daemon timer that ends the process when code stuck in C outlives the alarm."""
    def stop():
        os.write(2, f"{PROG}: error: --timeout: {model} did not stop {seconds:g} s after "
                    "its time limit; ended\n".encode())
        os._exit(2)

    timer = threading.Timer(seconds, stop)
    timer.daemon = True
    timer.start()
    return timer


def main(argv=None) -> int:
    return run_cli(PROG, _main, argv)


def _main(argv) -> int:
    args = _parser().parse_args(argv)
    try:
        import torch  # noqa: F401 - the plan builds and traces the module with it
    except ImportError:
        sys.stderr.write(f"{PROG}: error: needs PyTorch: pip install 'dpcost[measure]' "
                         "(from a clone: pip install -e '.[measure]')\n")
        return 2
    try:
        if args.plot:
            _plot_path(args.plot)
    except ValueError as error:
        sys.stderr.write(f"{PROG}: error: --plot: {error}\n")
        return 2
    timer = None
    if args.timeout is not None and 0 < args.timeout <= 86_400:
        timer = _hard_stop(args.timeout + HARD_STOP_GRACE_S, args.model)
    try:
        with _user_output_to_stderr():
            result = plan(args.model, gpus=args.gpus, gpus_per_node=args.gpus_per_node,
                          gpu=args.gpu, precision=args.precision, optimizer=args.optimizer,
                          bucket_cap_mb=args.bucket_cap_mb, input_shape=args.input_shape,
                          batch=args.batch, seq=args.seq,
                          find_unused_parameters=args.find_unused_parameters,
                          gradient_as_bucket_view=args.gradient_as_bucket_view,
                          gpu_tflops=args.gpu_tflops, gpu_tflops_fp32=args.gpu_tflops_fp32,
                          gpu_memory_gb=args.gpu_memory_gb, gpu_bandwidth=args.gpu_bandwidth,
                          step_ms=args.step_ms, timeout=args.timeout)
    except PlanError as error:
        sys.stderr.write(f"{PROG}: error: {error}\n")
        return 2
    finally:
        if timer is not None:
            timer.cancel()
    from dpcost.plan.report import format_table, plot, to_json

    if args.plot:
        try:
            plot(result, args.plot)
        except (OSError, ValueError) as error:
            sys.stderr.write(f"{PROG}: error: --plot: {' '.join(str(error).split())}\n")
            return 2
    print_out(to_json(result) if args.json else format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
