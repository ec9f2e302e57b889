"""A modelled step as a timeline: compute and communication lanes for DDP and DataParallel."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from dpcost.plots import style

_LANE_COLORS = {"compute": "#7f8c8d", "communication": None}


def modelled_timeline(steps: dict, title: str):
    """Gantt chart of ``steps`` ({label: dpcost.step_time.StepTime}): one row per (label, lane),
    bars in milliseconds from the step's start; communication in the label's colour (red for
    labels starting "DP", blue otherwise), compute in grey. Exposed communication is printed
    beside each step.

    Returns (figure, data): data[label] = {"total_ms", "exposed_ms", "bars": [(name, lane,
    start_ms, end_ms)]}.
    """
    style.apply()
    fig = Figure(figsize=(10.0, 2.0 + 0.5 * 2 * len(steps)),  # a slide shows it near full size
                 layout="constrained")
    ax = fig.subplots()
    data, yticks, ylabels, row = {}, [], [], 0
    for label, step in steps.items():
        color = style.DP_COLOR if label.startswith("DP") else style.DDP_COLOR
        bars = [(i.name, i.lane, i.start_s * 1e3, i.end_s * 1e3) for i in step.intervals]
        for lane in ("compute", "communication"):
            y = row
            for _name, bar_lane, start, end in bars:
                if bar_lane != lane or end <= start:
                    continue
                ax.barh(y, end - start, left=start, height=0.7,
                        color=_LANE_COLORS[lane] or color, ec="white", lw=0.8)
            yticks.append(y)
            ylabels.append(label if lane == "compute" else "its communication")
            row += 1
        ax.text(step.total_s * 1e3, row - 1.5,
                f"  {step.total_s * 1e3:.2f} ms, exposed comm. "
                f"{step.exposed_communication_s * 1e3:.2f} ms", va="center", fontsize=13)
        data[label] = {"total_ms": step.total_s * 1e3,
                       "exposed_ms": step.exposed_communication_s * 1e3, "bars": bars}
    ax.set_yticks(yticks, ylabels)
    ax.invert_yaxis()
    ax.set_xlabel("time from the start of the step (ms)")
    ax.set_title(title)
    fig.legend(handles=[
        Patch(color="#7f8c8d", label="compute and host work (DataParallel's replicate)"),
        Patch(color=style.DP_COLOR, label="DataParallel communication"),
        Patch(color=style.DDP_COLOR, label="DDP all-reduce, one bar per bucket")],
        loc="outside lower center", ncol=2, fontsize=13)
    longest = max((s.total_s for s in steps.values()), default=0) * 1e3
    ax.set_xlim(0, longest * 1.6 if longest > 0 else 1)
    return fig, data
