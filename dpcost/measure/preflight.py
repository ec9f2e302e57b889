"""Checks made before any rank starts: a run that cannot succeed is refused in one line.

- the model size is a finite number (``--model-mb inf`` would fail deep inside the ranks);
- the ranks and their tensors fit in the memory this machine has free (``/proc/meminfo``:
  MemAvailable), a rank's own baseline (``RANK_BASELINE_BYTES``) included, so a huge
  ``--world-size`` is refused by name;
- ``--backend nccl`` has a CUDA GPU for every local rank;
- the ``--plot`` file can be written (found out only after the whole run otherwise).

Memory a run needs at least, in bytes, for P parameter bytes on n ranks of this machine:

- ``ddp``: each rank holds its parameters, its gradients and DDP's gradient buckets (a copy,
  with the default ``gradient_as_bucket_view=False``): 3P per rank, 3nP in all;
- ``dp``: rank 0 holds parameters, gradients and one landing buffer per other rank, (n + 1)P;
  every other rank 2P: (3n - 1)P in all.

The scenarios run one after the other, so the run needs the largest of them. On top of the
tensors come the ranks themselves (``RANK_BASELINE_BYTES`` each, measured, and the warm process
that imported torch once for the forked ranks); activations and allocator slack come on top of
that (a measured DDP rank at 4 MB grew by about
4P, tests/test_measure_preflight.py). So the estimate is a lower bound, and a run it refuses
would certainly not fit.
"""

from __future__ import annotations

import math
import os
import sys

# What a rank holds before any tensor of the model: its private memory (USS, psutil's
# memory_full_info) at its peak, measured here with torch 2.13.0 on gloo, CPU, at 0.25 MB:
# a rank forked from the warm process 18.4-19.1 MB (n = 4 and 16); a rank under torchrun, which
# imports torch itself, 226 MB (n = 2). Rounded down, so the estimate stays a lower bound.
# The forked ranks also need the warm process that imported torch for them once: 304 MB under
# python -m dpcost.measure, 220 MB under measure_traffic() called from pytest.
# tests/test_measure_preflight.py samples a real run and checks both figures stay below it.
RANK_BASELINE_BYTES = {"forked": 18e6, "torchrun": 220e6}
LAUNCHER_BYTES = {"forked": 200e6, "torchrun": 0.0}  # torchrun's agent runs already
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


def check_gpus(found: int, ranks: int) -> None:
    """``--backend nccl`` puts each rank on a GPU of its own: refuse it without enough."""
    if found == 0:
        raise ValueError(f"--backend nccl needs CUDA GPUs; found {found}")
    if found < ranks:
        raise ValueError(f"--backend nccl needs one CUDA GPU per local rank: {ranks} ranks, "
                         f"found {found} GPUs")


def check_memory(param_bytes: float, ranks: int, scenarios, available: float | None = None,
                 forked: bool = True, option: str = "--model-mb"):
    """Raise ValueError if the run cannot fit in MemAvailable: naming ``--world-size`` when the
    ranks' own baseline (``RANK_BASELINE_BYTES``) alone is too much, else ``option`` (the
    model's: ``--model-mb``, or ``--model`` for a module of one's own)."""
    from dpcost.units import format_bytes

    how = "forked" if forked else "torchrun"
    per_rank = RANK_BASELINE_BYTES[how]
    baseline = LAUNCHER_BYTES[how] + ranks * per_rank
    needed = baseline + estimated_memory_bytes(float(param_bytes), ranks, scenarios)
    available = memory_available_bytes() if available is None else available
    if available is None or needed <= available:
        return
    free = f"this machine has {format_bytes(available)} available (MemAvailable in /proc/meminfo)"
    if baseline > available:
        raise ValueError(
            f"--world-size: {ranks} local ranks need at least {format_bytes(baseline)} of memory "
            f"before any tensor ({format_bytes(per_rank)} each), but {free}; at most "
            f"{max(0, int((available - LAUNCHER_BYTES[how]) // per_rank))} ranks fit")
    raise ValueError(
        f"{option}: a model of {_human(float(param_bytes), format_bytes)} needs "
        f"{_at_least(needed, format_bytes)} of memory on {ranks} local ranks "
        f"({', '.join(scenarios)}), but {free}")


def _at_least(value, format_bytes):
    if value == math.inf:  # the estimate itself is beyond a float
        return f"more than {sys.float_info.max:.3g} B"
    return f"at least {_human(value, format_bytes)}"


def _human(value, format_bytes):
    return format_bytes(value) if value < 1e30 else f"{value:.3g} B"


def check_writable(path: str, option: str) -> None:
    """Raise ValueError naming ``option`` if a file could not be written at ``path``: a folder,
    no such folder, or no write permission. Creates nothing."""
    if not path:
        raise ValueError(f"{option} needs a file name, got ''")
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
