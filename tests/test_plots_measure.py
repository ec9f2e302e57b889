"""dpcost.plots.measure: the measured-vs-predicted figure draws exactly the report's numbers."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dpcost.plots.measure import busiest_link_vs_n, measured_vs_predicted  # noqa: E402


def test_bars_and_ticks_are_the_reports_bytes():
    rows = [{"rank": r, "sent_bytes": 10.0 + r, "received_bytes": 20.0 + r,
             "predicted_sent_bytes": 10.0, "predicted_received_bytes": 20.0} for r in range(3)]
    report = {"world_size": 3, "param_bytes": 1e6, "scenarios": {"ddp": rows, "dp": rows}}
    fig, data = measured_vs_predicted(report)
    assert data["dp"]["sent"] == [10.0, 11.0, 12.0]
    assert data["ddp"]["predicted_received"] == [20.0] * 3
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == ["ddp", "dp"]
    heights = sorted(round(p.get_height() * 1e6, 6) for p in axes[0].patches)
    assert heights == [10.0, 11.0, 12.0, 20.0, 21.0, 22.0]
    assert axes[0].get_ylabel() and axes[0].get_legend() is not None
    plt.close(fig)


def test_the_shared_axis_holds_the_tallest_panel_not_the_last():
    """With sharey, each panel's own set_ylim overwrote the others': the last panel's limit
    clipped a taller one (FSDP's bars beside PowerSGD's)."""
    def rows(size):
        return [{"rank": r, "sent_bytes": size, "received_bytes": size,
                 "predicted_sent_bytes": size, "predicted_received_bytes": size}
                for r in range(2)]

    fig, _ = measured_vs_predicted({"world_size": 2, "param_bytes": 1e6,
                                    "scenarios": {"fsdp": rows(5e5), "powersgd": rows(5e3)}})
    assert all(ax.get_ylim()[1] >= 0.5 for ax in fig.axes)
    plt.close(fig)


def test_every_scenario_the_cli_runs_has_a_colour_and_a_model():
    """`python -m dpcost.measure --scenario timeline|strategies --plot F` drew nothing before: a
    KeyError on "ddp-timeline" and "ddp-adam", as a traceback."""
    from dpcost.measure.__main__ import CHOICES, TIMELINE
    from dpcost.measure.strategy_scenarios import NAMES
    from dpcost.plots import style

    rows = [{"rank": r, "sent_bytes": 1.0, "received_bytes": 1.0, "predicted_sent_bytes": 1.0,
             "predicted_received_bytes": 1.0} for r in range(2)]
    names = [c for c in CHOICES if c not in ("timeline", "all", "strategies")] + TIMELINE
    fig, _ = measured_vs_predicted({"world_size": 2, "param_bytes": 1e6,
                                    "scenarios": {name: rows for name in names}})
    drawn = {ax.get_title(): (ax.patches[0].get_facecolor(),
                              ax.get_legend_handles_labels()[1]) for ax in fig.axes}
    assert set(drawn) == set(names) and set(NAMES) <= set(names)
    for name, (color, labels) in drawn.items():
        family = ("dp-nccl" if name.startswith("dp-nccl") else
                  "dp" if name in ("dp", "dp-timeline", "dataparallel-cuda") else "ddp")
        assert matplotlib.colors.to_hex(color) == {
            "dp-nccl": style.DP_NCCL_COLOR, "dp": style.DP_COLOR, "ddp": style.DDP_COLOR}[family]
        model = ("chain" if family == "dp-nccl" else
                 "dpcost.strategies" if name in NAMES else "five functions")
        assert f"predicted ({model})" in labels, (name, labels)
    plt.close(fig)


def test_busiest_link_figure_uses_the_five_functions_as_lines():
    p = 1e6

    def report(n):
        totals = {name: {"busiest_link_busy_bytes": busy, "sent_bytes": 2 * (n - 1) * p,
                         "predicted_total_bytes": 2 * (n - 1) * p}
                  for name, busy in (("dp", 2 * (n - 1) * p), ("ddp", 2 * (n - 1) / n * p))}
        return {"param_bytes": p, "totals": totals}

    fig, data = busiest_link_vs_n({n: report(n) for n in (2, 3, 4)})
    assert data["dp"]["predicted_busy"] == [2e6, 4e6, 6e6]
    assert data["ddp"]["predicted_busy"][2] == 1.5e6  # 2 * 3 / 4 * P
    assert data["dp"]["predicted_total"] == [2e6, 4e6, 6e6]
    assert len(fig.axes) == 2 and all(ax.get_legend() for ax in fig.axes)
    plt.close(fig)


def test_busiest_link_vs_n_draws_dataparallels_nccl_path_when_measured():
    p = 1e6

    def report(n):
        busy = {"dp": 2 * (n - 1) * p, "dp-nccl": 2 * p, "ddp": 2 * (n - 1) / n * p}
        totals = {name: {"busiest_link_busy_bytes": b, "sent_bytes": 2 * (n - 1) * p,
                         "predicted_total_bytes": 2 * (n - 1) * p} for name, b in busy.items()}
        return {"param_bytes": p, "totals": totals}

    fig, data = busiest_link_vs_n({n: report(n) for n in (2, 3, 4)})
    assert data["dp-nccl"]["predicted_busy"] == [2e6, 2e6, 2e6]  # the chain: 2P for every n
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert "DP NCCL path (chain): measured" in labels
    plt.close(fig)
