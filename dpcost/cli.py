"""Command line: ``python -m dpcost --model-size 1.5GB --gpus 8 [--json]``.

Prints the five functions' figures for one model size and GPU count. Bad arguments print a
one-line error and exit with status 2 (argparse's convention), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

from dpcost.core import (
    communication_reduction_factor,
    ddp_communication_volume,
    ddp_gpu0_memory_multiplier,
    dp_communication_volume,
    dp_gpu0_memory_multiplier,
)
from dpcost.units import format_bytes, parse_size


class _OneLineErrorParser(argparse.ArgumentParser):
    def error(self, message):  # argparse's default prints the usage too: keep one line
        self.exit(2, f"{self.prog}: error: {message}\n")


def _size(text: str) -> float:
    try:
        return parse_size(text)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _gpus(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gpus must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--gpus must be at least 1, got {value}")
    return value


def comparison(model_size_bytes: float, num_gpus: int) -> dict:
    """The figures the command prints, bytes as numbers (the --json object)."""
    return {
        "model_size_bytes": model_size_bytes,
        "num_gpus": num_gpus,
        "dp_communication_volume_bytes": dp_communication_volume(model_size_bytes, num_gpus),
        "ddp_communication_volume_bytes": ddp_communication_volume(model_size_bytes, num_gpus),
        "communication_reduction_factor": communication_reduction_factor(
            model_size_bytes, num_gpus
        ),
        "dp_gpu0_memory_multiplier": dp_gpu0_memory_multiplier(num_gpus),
        "ddp_gpu0_memory_multiplier": ddp_gpu0_memory_multiplier(num_gpus),
    }


def render_text(figures: dict) -> str:
    n = figures["num_gpus"]
    return "\n".join([
        f"Model of {format_bytes(figures['model_size_bytes'])} on {n} GPU(s), per training step:",
        f"  DP  volume through GPU0's link, 2(n-1)P  : "
        f"{format_bytes(figures['dp_communication_volume_bytes'])}",
        f"  DDP volume sent by each rank, 2(n-1)/n P: "
        f"{format_bytes(figures['ddp_communication_volume_bytes'])}",
        f"  reduction factor DP / DDP               : "
        f"{figures['communication_reduction_factor']:g}x",
        f"  GPU0 memory multiplier                  : "
        f"DP {figures['dp_gpu0_memory_multiplier']:g}x, "
        f"DDP {figures['ddp_gpu0_memory_multiplier']:g}x",
    ])


def main(argv=None) -> int:
    parser = _OneLineErrorParser(
        prog="python -m dpcost",
        description="Compare DataParallel and DistributedDataParallel for one model and GPU count.",
    )
    parser.add_argument("--model-size", required=True, type=_size,
                        help="model (gradient) size: bytes, or e.g. 1.5GB, 350MB, 512MiB")
    parser.add_argument("--gpus", required=True, type=_gpus, help="number of GPUs (>= 1)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    figures = comparison(args.model_size, args.gpus)
    print(json.dumps(figures, indent=2) if args.json else render_text(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
