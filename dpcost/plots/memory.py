"""What each GPU holds under DP and DDP: stacked bars per component, and GPU0's ratio."""

from __future__ import annotations

import matplotlib.pyplot as plt

from dpcost import defaults
from dpcost.memory import (
    COMPONENTS,
    DEFAULT_PRECISION,
    gpu0_memory_ratio,
    memory_per_gpu,
    total_bytes,
)
from dpcost.plots import style

COMPONENT_COLORS = style.COMPONENT_COLORS  # one colour per component, in every figure
GPU_LABELS = {"dp_gpu0": "DP\nGPU0", "dp_other": "DP\nother", "ddp_rank": "DDP\nrank"}


def _stack(ax, memory, configs, components, label_totals: bool):
    """One group of three stacked bars (DP GPU0, DP other, DDP rank) per config, in GB."""
    width, ticks, labels = 0.8, [], []
    tallest = max(sum(gpu[c] for c in components) for mem in memory for gpu in mem.values()) / 1e9
    for i, ((n, b), mem) in enumerate(zip(configs, memory, strict=True)):
        for j, gpu in enumerate(GPU_LABELS):
            x = 4 * i + j
            bottom = 0.0
            for component in components:
                height = mem[gpu][component] / 1e9
                ax.bar(x, height, width, bottom=bottom, color=COMPONENT_COLORS[component],
                       edgecolor="white", linewidth=0.5,
                       label=component if (i, j) == (0, 0) else None)
                bottom += height
            edge = style.DDP_COLOR if gpu == "ddp_rank" else style.DP_COLOR
            ax.bar(x, bottom, width, fill=False, edgecolor=edge, linewidth=2)
            ax.text(x, bottom + 0.01 * tallest, f"{bottom:.3g}", ha="center", va="bottom",
                    fontsize=13)
            ticks.append(x)
            labels.append(GPU_LABELS[gpu])
        if label_totals:
            ratio = total_bytes(mem["dp_gpu0"]) / total_bytes(mem["ddp_rank"])
            ax.text(4 * i + 1, -0.2 * tallest, f"n = {n}, batch {b}\nGPU0 / DDP = {ratio:.2f}x",
                    ha="center", va="top", fontsize=13)
    ax.set_xticks(ticks, labels, fontsize=13)
    ax.set_ylim(0, 1.12 * tallest)
    ax.grid(axis="x", visible=False)


def memory_stacked_bars(model, configs, optimizer: str = "adam",
                        precision: str = DEFAULT_PRECISION, attention: str = defaults.ATTENTION,
                        dominant_share: float = 0.6):
    """Stacked bars in GB (decimal): DP GPU0, DP other GPU, DDP rank for each (n, batch) config.

    ``configs`` is a list of (num_gpus, global batch size); ``precision`` and ``attention`` as
    in ``dpcost.memory.memory_per_gpu`` (DDP with its default bucket copy; attention is named
    only for a language model). When one component fills more than ``dominant_share`` of the
    tallest bar (ResNet-50's activations), the others would be slivers: a second panel draws
    them alone, on their own scale. Returns (figure, data); data maps "configs" to the list
    given, "memory" to one ``memory_per_gpu`` result per config, and "zoomed_out" to the
    component left out of the second panel (None without one).
    """
    style.apply()
    configs = [(int(n), int(b)) for n, b in configs]
    memory = [memory_per_gpu(model, n, b, optimizer, precision, attention=attention)
              for n, b in configs]
    tallest = max((gpu for mem in memory for gpu in mem.values()), key=total_bytes)
    biggest = max(COMPONENTS, key=lambda c: tallest[c])
    zoomed_out = biggest if tallest[biggest] > dominant_share * total_bytes(tallest) else None
    width = max(10.0, 3.2 * len(configs))
    if zoomed_out:
        fig, (ax, zoom) = plt.subplots(1, 2, figsize=(max(16.0, 1.5 * width), 6.2))
    else:
        fig, ax = plt.subplots(figsize=(width, 6.2))
    _stack(ax, memory, configs, COMPONENTS, label_totals=True)
    ax.set_ylabel("bytes held during one step (GB, decimal)")
    setting = f"{precision}, {optimizer}" + (f", {attention} attention"
                                             if model.kind == "language" else "")
    ax.set_title(f"{model.name}: memory per GPU, {setting}\n(bar top: total GB)")
    if zoomed_out:
        _stack(zoom, memory, configs, [c for c in COMPONENTS if c != zoomed_out],
               label_totals=False)
        zoom.set_ylabel("GB (decimal)")
        zoom.set_title(f"The same bars without {zoomed_out}:\nthe components they hide")
        zoom.legend(*ax.get_legend_handles_labels(), loc="upper left", bbox_to_anchor=(1.0, 1.0),
                    title="component")  # every component, the one left out too
    else:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), title="component")
    fig.tight_layout()
    return fig, {"configs": configs, "memory": memory, "zoomed_out": zoomed_out}


def ratio_vs_batch(model, gpu_counts=(2, 4, 8), batch_sizes=(8, 16, 32, 64, 128, 256, 512),
                   optimizer: str = "adam", precision: str = DEFAULT_PRECISION,
                   attention: str = defaults.ATTENTION):
    """Lines: total(DP GPU0) / total(DDP rank) against the global batch, one line per n.

    Dotted lines mark n, the five functions' GPU0 multiplier. Returns (figure, data) with
    "batch_sizes" and "ratios" (a dict n -> list of ratios, one per batch size).
    """
    style.apply()
    batches = [int(b) for b in batch_sizes]
    ratios = {int(n): [gpu0_memory_ratio(model, int(n), b, optimizer, precision,
                                         attention=attention) for b in batches]
              for n in gpu_counts}
    fig, ax = plt.subplots()
    shades = plt.get_cmap("Reds")
    for k, (n, values) in enumerate(ratios.items()):
        color = shades(0.45 + 0.5 * k / max(1, len(ratios) - 1))
        ax.plot(batches, values, "o-", color=color, label=f"n = {n}: DP GPU0 / DDP rank")
        ax.axhline(n, color=color, ls=":", lw=1.5)
    ax.axhline(1, color=style.DDP_COLOR, lw=1.5, label="DDP: every rank the same (1x)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("global batch size (samples)")
    ax.set_ylabel("GPU0's memory / a DDP rank's (x)")
    ax.set_title(f"{model.name}, {precision}, {attention} attention: GPU0's extra memory "
                 "under DP (dotted: n x)")
    ax.legend(loc="upper left")
    fig.tight_layout()
    return fig, {"batch_sizes": batches, "ratios": ratios}
