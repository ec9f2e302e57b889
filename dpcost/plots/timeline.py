"""Lesson 07's Gantt chart: one measured iteration per rank, compute and communication lanes."""

from __future__ import annotations

import matplotlib.pyplot as plt

from dpcost.plots import style
from dpcost.timeline_events import by_iteration

# Forward dark enough to see beside the white gaps; none of the three is a communication colour.
COMPUTE_COLORS = {"forward": "#566573", "backward": "#148f77", "optimizer step": "#7d3c98"}
COMM_COLORS = {"bucket": style.DDP_COLOR, "parameters out": style.DP_COLOR,
               "gradients in": "#e67e22"}


def _comm_color(name):
    return COMM_COLORS["bucket"] if name.startswith("bucket") else COMM_COLORS[name]


def pick_iteration(rank_timelines: list) -> int:
    """The measured iteration in the middle of the window (the same one for every rank)."""
    iterations = sorted(by_iteration(rank_timelines[0]))
    return iterations[len(iterations) // 2]


def gantt(timelines: dict, iteration: int | None = None):
    """One panel per scenario ({label: [rank 0's events, rank 1's, ...]}), side by side on one
    time scale (a landscape figure for a 16:9 screen): per rank a compute lane (forward,
    backward, optimizer step) and a communication lane (DDP's buckets; DP's parameters out and
    gradients in); ticks mark gradients ready.

    Times are ms from the iteration's first event on any rank. Returns (figure, drawn) with
    drawn[label] = {rank: {"compute": [(name, start_ms, end_ms)], "comm": [...],
    "grad_ms": [...]}}, exactly what was drawn.
    """
    style.apply()
    labels = list(timelines)
    ranks_most = max(len(r) for r in timelines.values())
    fig, axes = plt.subplots(1, len(labels), sharex=True, sharey=True, squeeze=False,
                             figsize=(5.4 * len(labels), 2.4 + 1.3 * ranks_most))
    drawn, seen = {}, {}
    for ax, label in zip(axes[0], labels, strict=True):
        ranks = timelines[label]
        chosen = pick_iteration(ranks) if iteration is None else iteration
        per_rank = [by_iteration(events)[chosen] for events in ranks]
        origin = min(e[2] for events in per_rank for e in events)
        drawn[label], ticks, names = {}, [], []
        for rank, events in enumerate(per_rank):
            lanes = {"compute": [], "comm": [], "grad_ms": []}
            base = 2 * (len(per_rank) - 1 - rank)
            for lane, name, start, end in events:
                start_ms, end_ms = (start - origin) / 1e6, (end - origin) / 1e6
                if lane == "grad":
                    lanes["grad_ms"].append(start_ms)
                    continue
                y = base + (1 if lane == "compute" else 0)
                color = COMPUTE_COLORS[name] if lane == "compute" else _comm_color(name)
                key = name if lane == "compute" or not name.startswith("bucket") else \
                    "bucket all-reduce"
                ax.broken_barh([(start_ms, max(end_ms - start_ms, 0.05))], (y + 0.1, 0.8),
                               facecolors=color, edgecolor="white", linewidth=0.5,
                               label=None if key in seen else key)
                seen[key] = True
                lanes[lane].append((name, start_ms, end_ms))
            if lanes["grad_ms"]:
                ax.plot(lanes["grad_ms"], [base + 1.05] * len(lanes["grad_ms"]), "|",
                        color="black", markersize=10,
                        label=None if "grad" in seen else "gradient ready")
                seen["grad"] = True
            drawn[label][rank] = lanes
            ticks += [base + 0.5, base + 1.5]
            names += [f"rank {rank} comm", f"rank {rank} compute"]
        ax.set_yticks(ticks, names)
        ax.set_ylim(-0.2, 2 * len(per_rank))
        ax.set_title(label.replace(" (", "\n("))
        ax.set_xlabel("time from the iteration's first event (ms)")
    fig.suptitle("One measured iteration per rank (the middle one of the window): gloo, CPU, fp32")
    fig.legend(loc="lower center", ncol=7, frameon=False, bbox_to_anchor=(0.5, -0.01))
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig, drawn
