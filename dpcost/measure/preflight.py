"""Checks made before any rank starts: a run that cannot succeed is refused in one line.

- the model size is a finite number (``--model-mb inf`` would fail deep inside the ranks);
- the ranks' tensors fit in the memory this machine has free (``/proc/meminfo``: MemAvailable);
- the ``--plot`` file can be written (found out only after the whole run otherwise).

Memory a run needs at least, in bytes, for P parameter bytes on n ranks of this machine:

- ``ddp``: each rank holds its parameters, its gradients and DDP's gradient buckets (a copy,
  with the default ``gradient_as_bucket_view=False``): 3P per rank, 3nP in all;
- ``dp``: rank 0 holds parameters, gradients and one landing buffer per other rank, (n + 1)P;
  every other rank 2P: (3n - 1)P in all.

The scenarios run one after the other, so the run needs the largest of them. This counts only
the tensors that must exist; torch itself (imported once by the helper, shared by the forked
ranks), activations and allocator slack come on top (a measured DDP rank at 4 MB grew by about
4P, tests/test_measure_preflight.py). So the estimate is a lower bound, and a run it refuses
would certainly not fit.
"""

from __future__ import annotations

import math
import os

BYTES_PER_PARAM_BYTE = {"ddp": lambda n: 3 * n, "dp": lambda n: 3 * n - 1}


def estimated_memory_bytes(param_bytes: float, ranks: int, scenarios) -> float:
    """Bytes of tensors that ``ranks`` local ranks hold at the peak of the largest scenario."""
    factors = [BYTES_PER_PARAM_BYTE["ddp" if s.startswith("ddp") else "dp"](ranks)
               for s in scenarios]
    return max(factors, default=0) * param_bytes


def memory_available_bytes(meminfo: str = "/proc/meminfo") -> float | None:
    """MemAvailable from ``/proc/meminfo`` in bytes (the kernel's estimate of what can be
    allocated without swapping), or None where it cannot be read."""
    try:
        with open(meminfo) as lines:
            for line in lines:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the file says kB; it means KiB
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_model_mb(model_mb: float) -> None:
    """Refuse a size that is not a finite number (inf, nan)."""
    if not math.isfinite(model_mb):
        raise ValueError(f"--model-mb must be a finite number of MB, got {model_mb}")


def check_memory(param_bytes: float, ranks: int, scenarios, available: float | None = None):
    """Raise ValueError naming the estimate and MemAvailable if the run cannot fit here."""
    from dpcost.units import format_bytes

    needed = estimated_memory_bytes(param_bytes, ranks, scenarios)
    available = memory_available_bytes() if available is None else available
    if available is not None and needed > available:
        raise ValueError(
            f"--model-mb: a model of {format_bytes(param_bytes)} needs at least "
            f"{_human(needed, format_bytes)} of memory on {ranks} local ranks "
            f"({', '.join(scenarios)}), but this machine has {format_bytes(available)} "
            f"available (MemAvailable in /proc/meminfo)")


def _human(value, format_bytes):
    return format_bytes(value) if value < 1e30 else f"{value:.3g} B"


def check_writable(path: str, option: str) -> None:
    """Raise ValueError naming ``option`` if a file could not be written at ``path``: a folder,
    no such folder, or no write permission. Creates nothing."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"{option}: {path} is a folder, not a file")
    if not os.path.isdir(folder):
        raise ValueError(f"{option}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ValueError(f"{option}: {path} is not writable")


def check_plot_path(path: str) -> None:
    """Raise ValueError if matplotlib could not save a figure at ``path``: no such folder, no
    write permission, or a file type matplotlib does not know. Creates nothing."""
    check_writable(path, "--plot")
    extension = os.path.splitext(path)[1][1:].lower()
    if extension:
        from matplotlib.backend_bases import FigureCanvasBase

        known = FigureCanvasBase.get_supported_filetypes()
        if extension not in known:
            raise ValueError(f"--plot: matplotlib cannot write .{extension} files; use one of "
                             f"{', '.join(sorted(known))}")
