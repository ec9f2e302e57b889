"""One look for every figure: readable when projected at 1280x720.

A deck shows a 10-inch figure (1,000 px at 100 dpi) at about 0.8 of its size, so the smallest
text, the ticks at 14 pt (19 px), stays above 14 px on the screen.
"""

from __future__ import annotations

import matplotlib as mpl

from dpcost.registry import DDP_COLOR, DP_COLOR, DP_NCCL_COLOR  # noqa: F401 (the strategies')

# Memory components, bottom to top, one colour each in every figure: lesson 04's bars and the
# explorer's memory view (dpcost.memory's keys, in its order).
COMPONENT_COLORS = {
    "parameters": "#4c72b0",
    "gradients": "#55a868",
    "optimizer state": "#8172b2",
    "DDP bucket copy": "#64b5cd",
    "DP reduce buffer": "#8c8c8c",
    "activations": "#ccb974",
    "outputs": "#dd8452",
    "loss and output grads": "#c44e52",
}

RC = {
    "figure.figsize": (10.0, 5.6),
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "font.size": 14,
    "axes.titlesize": 17,
    "axes.labelsize": 15,
    "xtick.labelsize": 14,
    "ytick.labelsize": 14,
    "legend.fontsize": 13,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "svg.hashsalt": "dpcost",  # deterministic SVG ids
}


def apply() -> None:
    """Set the course's matplotlib defaults (call once per notebook or figure function)."""
    mpl.rcParams.update(RC)
