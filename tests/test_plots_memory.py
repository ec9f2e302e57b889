"""The figures of dpcost/plots/memory.py draw exactly what the memory model computes."""

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dpcost.memory import gpu0_memory_ratio, memory_per_gpu  # noqa: E402
from dpcost.plots.memory import memory_stacked_bars, ratio_vs_batch  # noqa: E402
from dpcost.presets import MODELS  # noqa: E402


def test_stacked_bars_draw_the_model():
    model = MODELS["GPT-2 small"]
    fig, data = memory_stacked_bars(model, [(2, 8), (8, 32)])
    assert data["memory"] == [memory_per_gpu(model, 2, 8), memory_per_gpu(model, 8, 32)]
    ax = fig.axes[0]
    filled = [p for p in ax.patches if p.get_fill()]
    assert len(filled) == 2 * 3 * 8  # configs x GPUs x components
    first_bar = filled[:8]  # DP GPU0 at n = 2, batch 8, bottom to top
    assert [p.get_height() * 1e9 for p in first_bar] == pytest.approx(
        list(data["memory"][0]["dp_gpu0"].values()))
    assert ax.get_title() and ax.get_ylabel() and ax.get_legend() is not None
    plt.close(fig)
    fig, data = memory_stacked_bars(model, [(4, 16)], precision="mixed", attention="sdpa")
    assert data["memory"] == [memory_per_gpu(model, 4, 16, precision="mixed", attention="sdpa")]
    assert "mixed" in fig.axes[0].get_title() and "sdpa" in fig.axes[0].get_title()
    plt.close(fig)
    fig, data = ratio_vs_batch(model, gpu_counts=(2, 8), batch_sizes=(8, 64))
    assert data["ratios"][8] == [gpu0_memory_ratio(model, 8, 8), gpu0_memory_ratio(model, 8, 64)]
    assert fig.axes[0].get_xlabel() and fig.axes[0].get_ylabel()
    plt.close(fig)
    fig, data = ratio_vs_batch(model, gpu_counts=(4,), batch_sizes=(8,), precision="bf16",
                               attention="sdpa")
    assert data["ratios"][4] == [gpu0_memory_ratio(model, 4, 8, "adam", "bf16",
                                                   attention="sdpa")]
    plt.close(fig)


def test_a_dominant_component_gets_a_panel_without_it():
    """ResNet-50's activations dwarf the rest: a second panel shows the other seven readably."""
    model = MODELS["ResNet-50"]
    fig, data = memory_stacked_bars(model, [(2, 64), (8, 256)], precision="fp32")
    assert data["zoomed_out"] == "activations" and len(fig.axes) == 2
    main, zoom = fig.axes
    assert "attention" not in main.get_title()  # a CNN has none
    heights = [p.get_height() for p in zoom.patches if p.get_fill()]
    assert len(heights) == 2 * 3 * 7  # configs x GPUs x components, activations left out
    mem = data["memory"][0]["dp_gpu0"]
    assert heights[:7] == pytest.approx([v / 1e9 for k, v in mem.items() if k != "activations"])
    assert len(zoom.get_legend().get_texts()) == 8  # the legend still names all eight
    assert zoom.get_ylim()[1] < 0.2 * main.get_ylim()[1]  # its own, finer scale
    plt.close(fig)
    fig, data = memory_stacked_bars(MODELS["GPT-2 small"], [(8, 32)], precision="mixed",
                                    attention="sdpa")
    assert data["zoomed_out"] is None and len(fig.axes) == 1
    plt.close(fig)


def test_every_figure_gives_a_memory_component_the_same_colour():
    """Lesson 04's bars and the explorer's memory view read one table (plots/style.py)."""
    from dpcost import explorer_views
    from dpcost.memory import COMPONENTS
    from dpcost.plots import memory, style

    assert memory.COMPONENT_COLORS is explorer_views.COMPONENT_COLORS is style.COMPONENT_COLORS
    assert list(style.COMPONENT_COLORS) == list(COMPONENTS)
    assert len(set(style.COMPONENT_COLORS.values())) == len(COMPONENTS)
