"""dpcost.plots.strategies: the figures draw exactly the data they are given."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from dpcost import strategies as st  # noqa: E402
from dpcost.plots.strategies import (  # noqa: E402
    UNMEASURED_NOTE,
    fits_figure,
    ladder_figure,
    loss_curves_figure,
)


def fake_rows():
    rows = []
    for i, cost in enumerate(st.ladder([(8, 8), (8,)] * 2, 2)):
        measured = None if i == 1 else cost.sent_bytes * 1.001
        rows.append({"rung": st.LADDER[i], "modelled_sent_bytes": cost.sent_bytes,
                     "measured_sent_bytes": measured, "modelled_messages": cost.messages,
                     "measured_messages": None if measured is None else cost.messages,
                     "modelled_state_after_step_bytes": cost.state_after_step_bytes,
                     "modelled_peak_state_bytes": cost.peak_state_bytes,
                     "measured_state_after_step_bytes": None if measured is None else
                     cost.state_after_step_bytes})
    return rows


def test_ladder_figure_draws_every_rung_and_skips_the_unmeasured():
    rows = fake_rows()
    fig, data = ladder_figure(rows)
    assert data["rungs"] == list(st.LADDER)
    left, right = fig.axes
    assert [t.get_text() for t in left.get_yticklabels()] == list(st.LADDER)
    # modelled bars for all 10 rungs, measured for the 9 that ran, in both panels; on the
    # right, dashed outlines for the 2 rungs whose peak exceeds the state after the step
    assert len(left.patches) == 10 + 9
    assert len(right.patches) == 10 + 9 + 2
    outlines = [bar for bar in right.patches if not bar.get_fill()]
    assert [round(bar.get_width() * 1e6) for bar in outlines] == [
        row["modelled_peak_state_bytes"] for row in rows
        if row["rung"] in ("PowerSGD", "FSDP no reshard")]
    unmeasured = [row["rung"] for row in rows if row["measured_sent_bytes"] is None]
    for ax in (left, right):  # the missing bar is explained on the figure itself
        assert [t.get_text().strip() for t in ax.texts].count(UNMEASURED_NOTE) == len(unmeasured)
    assert left.get_xlabel().startswith("bytes sent per rank")
    assert right.get_legend() is not None and fig._suptitle.get_text()
    plt.close(fig)


def test_fits_figure_and_the_capacity_line():
    states = {"Llama-2 7B, n = 8": st.ladder_model_states(6.7e9, 8, "mixed")}
    fig, data = fits_figure(states, 80e9)
    ax = fig.axes[0]
    assert data == states and len(ax.patches) == len(st.LADDER)
    assert ax.lines[0].get_xdata()[0] == 80.0  # GB
    assert "GB" in ax.get_xlabel() and ax.get_title()
    plt.close(fig)


def test_loss_curves_figure():
    curves = {"plain DDP": [1.0, 0.8, 0.6], "PowerSGD": [1.0, 0.9, 0.85]}
    fig, data = loss_curves_figure(curves, start_powersgd=1)
    ax = fig.axes[0]
    assert data == curves
    assert [list(line.get_ydata()) for line in ax.lines[:2]] == list(curves.values())
    assert ax.get_xlabel() == "optimizer step" and ax.get_legend() is not None
    plt.close(fig)
