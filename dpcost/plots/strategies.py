"""Lesson 08's figures: the ladder (bytes, messages, model state per rank), what fits on an
80 GB GPU, and each comm hook's loss curve against plain DDP."""

from __future__ import annotations

import matplotlib.pyplot as plt

from dpcost.plots import style

MODELLED_COLOR = "#7f8c8d"
MEASURED_COLOR = style.DDP_COLOR
# Where a rung has no measured bar (DataParallel's NCCL path): gloo has no NCCL, and this
# machine no GPU; lesson 06 measures a gloo stand-in of the chain that NCCL would run.
UNMEASURED_NOTE = "not measured: no NCCL here (lesson 06: a gloo chain)"


def ladder_figure(rows: list, title: str = ""):
    """Two panels, one bar pair per rung: bytes sent per rank per optimizer step (MB) and
    model state per rank after the step (MB), modelled (grey) beside measured (blue; where the
    rung did not run here, a note on the figure says why); a dashed outline marks the modelled
    peak where it is larger (``dpcost.strategies`` defines both). Messages per step are written
    at the end of each bytes bar.

    ``rows``: ``dpcost.measure.strategy_scenarios.ladder_rows``. Returns (figure, data) with
    data[key] the lists drawn, in bytes.
    """
    style.apply()
    rungs = [row["rung"] for row in rows]
    data = {"rungs": rungs}
    for key in ("modelled_sent_bytes", "measured_sent_bytes", "modelled_state_after_step_bytes",
                "measured_state_after_step_bytes", "modelled_peak_state_bytes",
                "modelled_messages", "measured_messages"):
        data[key] = [row[key] for row in rows]
    fig, (left, right) = plt.subplots(1, 2, sharey=True, figsize=(12.8, 6.4))
    ys = list(range(len(rows)))
    for ax, kind in ((left, "sent"), (right, "state_after_step")):
        for offset, source, color in ((-0.2, "modelled", MODELLED_COLOR),
                                      (0.2, "measured", MEASURED_COLOR)):
            values = data[f"{source}_{kind}_bytes"]
            drawn = [(y + offset, v / 1e6) for y, v in zip(ys, values, strict=True)
                     if v is not None]
            ax.barh([d[0] for d in drawn], [d[1] for d in drawn], height=0.38, color=color,
                    label=source + (" (gloo, this CPU)" if source == "measured" else ""))
    peaks = [(y - 0.2, peak / 1e6) for y, peak, after in zip(
        ys, data["modelled_peak_state_bytes"], data["modelled_state_after_step_bytes"],
        strict=True) if peak is not None and peak > after]
    right.barh([p[0] for p in peaks], [p[1] for p in peaks], height=0.38, fill=False,
               edgecolor="black", linestyle="--", label="modelled peak")
    for y, row in zip(ys, rows, strict=True):
        if row["measured_sent_bytes"] is None:  # said on the figure, not only in the code
            for ax in (left, right):
                ax.text(0.01, y + 0.2, UNMEASURED_NOTE, va="center", fontsize=13,
                        style="italic", color=MEASURED_COLOR,
                        transform=ax.get_yaxis_transform())  # x: fraction of the panel
        label = f"{row['modelled_messages']} msg"
        left.text(row["modelled_sent_bytes"] / 1e6, y - 0.2, " " + label, va="center",
                  fontsize=13)
    widest = max(v for v in data["modelled_sent_bytes"] + data["measured_sent_bytes"] if v)
    left.set_xlim(0, 1.2 * widest / 1e6)  # room for the message counts
    left.set_yticks(ys, rungs)
    left.invert_yaxis()
    left.set_xlabel("bytes sent per rank per optimizer step (MB = 10^6 B)")
    right.set_xlabel("model state per rank: params + grads + Adam (MB)")
    left.set_title("communication")
    right.set_title("memory after the optimizer step (dashed: peak)")
    most = max(v for v in data["modelled_state_after_step_bytes"] + data[
        "measured_state_after_step_bytes"] + data["modelled_peak_state_bytes"] if v)
    right.set_xlim(0, 1.15 * most / 1e6)
    right.legend(loc="lower right", framealpha=1)  # the memory panel's lower right is empty
    fig.suptitle(title or "The ladder from DataParallel to FSDP, per rank")
    fig.tight_layout()
    return fig, data


def fits_figure(states: dict, capacity_bytes: float, title: str = "", capacity_label=""):
    """Horizontal bars: model-state bytes per GPU per rung (GB), one group per model
    (``states[model_label][rung]``, e.g. ``dpcost.strategies.ladder_model_states``; the title
    should say which definition), and the GPU's capacity as a vertical line. Returns
    (figure, data) with data[model_label][rung] in bytes."""
    style.apply()
    models = list(states)
    rungs = list(next(iter(states.values())))
    fig, ax = plt.subplots(figsize=(12.8, 6.4))
    height = 0.8 / len(models)
    colors = [style.DDP_COLOR, style.DP_COLOR, "#27ae60", "#8e44ad"]
    for i, model in enumerate(models):
        ys = [r + (i - (len(models) - 1) / 2) * height for r in range(len(rungs))]
        ax.barh(ys, [states[model][rung] / 1e9 for rung in rungs], height=height,
                color=colors[i % len(colors)], label=model)
    ax.axvline(capacity_bytes / 1e9, color="black", linestyle="--",
               label=capacity_label or f"GPU memory {capacity_bytes / 1e9:g} GB")
    ax.set_yticks(range(len(rungs)), rungs)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("model state per GPU, GB = 10^9 B (log scale; activations come on top)")
    ax.set_title(title or "Which rungs fit on one GPU")
    ax.legend(loc="lower right")
    fig.tight_layout()
    return fig, {model: dict(states[model]) for model in models}


def loss_curves_figure(curves: dict, start_powersgd: int | None = None, title: str = ""):
    """Training loss per optimizer step for each hook (``curves[label]`` = losses), plain DDP
    first; a dotted line where PowerSGD starts compressing. Returns (figure, data)."""
    style.apply()
    fig, ax = plt.subplots()
    for label, losses in curves.items():
        ax.plot(range(len(losses)), losses, label=label, linewidth=2,
                linestyle="-" if "DDP" in label else "--")
    if start_powersgd is not None:
        ax.axvline(start_powersgd, color="grey", linestyle=":",
                   label=f"PowerSGD starts compressing (step {start_powersgd})")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (MSE, rank 0's batch)")
    ax.set_title(title or "Compressed gradients against plain DDP, same seed")
    ax.legend()
    fig.tight_layout()
    return fig, {label: list(losses) for label, losses in curves.items()}
