"""python -m dpcost.plan --model SPEC: DDP's buckets, bytes, step time and memory for a model.

Exit status 0 on success; 2 with one line naming the parameter on bad input; 1 with one line when
the plan cannot be written to stdout (``>/dev/full``, a closed stdout), as the course's other
commands (``dpcost.procs.run_cli``).
"""

from __future__ import annotations

import sys

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
                                                 "(default H100)")
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
    p.add_argument("--plot", default=None, metavar="FILE", help="draw the plan to FILE (.png)")
    return p


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
        result = plan(args.model, gpus=args.gpus, gpus_per_node=args.gpus_per_node,
                      gpu=args.gpu, precision=args.precision, optimizer=args.optimizer,
                      bucket_cap_mb=args.bucket_cap_mb, input_shape=args.input_shape,
                      batch=args.batch, seq=args.seq,
                      find_unused_parameters=args.find_unused_parameters,
                      gradient_as_bucket_view=args.gradient_as_bucket_view)
    except PlanError as error:
        sys.stderr.write(f"{PROG}: error: {error}\n")
        return 2
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
