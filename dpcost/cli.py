"""Command line: ``python -m dpcost --model-size 1.5GB --gpus 8 [--json]``.

Prints the five functions' figures for one model size and GPU count. Bad arguments print a
one-line error and exit with status 2 (argparse's convention), never a traceback. So do figures
beyond a float's range (about 1.8e308 bytes), in text and JSON alike: ``--json`` always prints
valid JSON (no ``Infinity`` or ``NaN``), or nothing and an error.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys

from dpcost.core import (
    communication_reduction_factor,
    ddp_communication_volume,
    ddp_gpu0_memory_multiplier,
    dp_communication_volume,
    dp_gpu0_memory_multiplier,
    parse_whole_number,
)
from dpcost.procs import OneLineErrorParser, print_out, run_cli
from dpcost.units import format_bytes, parse_size

MAX_GPUS = 10**9  # a bound for the text, so no digit string is too long for int()
_VALUE_OPTIONS = ("--model-size", "--gpus")
_LOOKS_NEGATIVE = re.compile(r"\s*-\s*\.?[0-9]", re.ASCII)


def _size(text: str) -> float:
    try:
        return parse_size(text)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _gpus(text: str) -> int:
    try:  # ASCII digits only, as in --model-size and python -m dpcost.measure
        return parse_whole_number(text, "--gpus", 1, MAX_GPUS)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _join_negative_values(argv: list[str]) -> list[str]:
    """Rewrite ``--model-size -1GB`` as ``--model-size=-1GB``.

    argparse reads a token such as "-1GB" as an option (only plain "-8" or "-1.5" count as
    negative numbers) and would say "expected one argument"; joined, the value reaches the size
    parser, which says that a size cannot be negative. Abbreviations ("--model") count too.
    """
    joined, i = [], 0
    while i < len(argv):
        token = argv[i]
        takes_value = (len(token) > 2 and token.startswith("--") and "=" not in token
                       and sum(option.startswith(token) for option in _VALUE_OPTIONS) == 1)
        if takes_value and i + 1 < len(argv) and _LOOKS_NEGATIVE.match(argv[i + 1]):
            joined.append(f"{token}={argv[i + 1]}")
            i += 2
        else:
            joined.append(token)
            i += 1
    return joined


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
    """The command's exit status; stdout that cannot be written makes it 1 (one line)."""
    return run_cli("python -m dpcost", _main, argv)


def _main(argv) -> int:
    parser = OneLineErrorParser(
        prog="python -m dpcost",
        description="Compare DataParallel and DistributedDataParallel for one model and GPU count.",
    )
    parser.add_argument("--model-size", required=True, type=_size,
                        help="model (gradient) size: bytes, or e.g. 1.5GB, 350MB, 512MiB")
    parser.add_argument("--gpus", required=True, type=_gpus,
                        help="number of GPUs, 1 to 1,000,000,000 (digits 0-9)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(_join_negative_values(sys.argv[1:] if argv is None else argv))
    figures = comparison(args.model_size, args.gpus)
    too_large = [name for name, value in figures.items() if not math.isfinite(value)]
    if too_large:  # JSON has no inf, and "inf B" is no answer: refuse, as for a bad argument
        parser.error(
            f"{', '.join(too_large)} beyond a float's range (about 1.8e308) for --model-size "
            f"{args.model_size:g} bytes and --gpus {args.gpus}; give a smaller size or fewer GPUs"
        )
    print_out(json.dumps(figures, indent=2, allow_nan=False) if args.json
              else render_text(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
