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
