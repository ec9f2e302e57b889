"""One look for every figure: readable when projected at 1280x720 (fonts >= 12 pt)."""

from __future__ import annotations

import matplotlib as mpl

DP_COLOR = "#c0392b"  # DataParallel: red throughout the course
DDP_COLOR = "#2471a3"  # DistributedDataParallel: blue throughout the course

RC = {
    "figure.figsize": (10.0, 5.6),
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "font.size": 13,
    "axes.titlesize": 15,
    "axes.labelsize": 14,
    "xtick.labelsize": 12,
    "ytick.labelsize": 12,
    "legend.fontsize": 12,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "svg.hashsalt": "dpcost",  # deterministic SVG ids
}


def apply() -> None:
    """Set the course's matplotlib defaults (call once per notebook or figure function)."""
    mpl.rcParams.update(RC)
