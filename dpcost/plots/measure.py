"""Measured bytes per rank against the five functions' prediction, DDP beside the DP pattern."""

from __future__ import annotations

import matplotlib.pyplot as plt

from dpcost.plots import style

COLORS = {"ddp": style.DDP_COLOR, "dp": style.DP_COLOR, "dataparallel-cuda": style.DP_COLOR,
          "dp-nccl": style.DP_NCCL_COLOR}


def measured_vs_predicted(report: dict):
    """Bars: bytes each rank sent and received per iteration (MB, decimal), one panel per
    scenario; black ticks: the prediction from the five functions.

    ``report`` is ``dpcost.measure.measure_traffic``'s (or ``--json``'s) object. Returns
    (figure, data) with data[scenario] = {"ranks", "sent", "received", "predicted_sent",
    "predicted_received"} in bytes, exactly what was drawn.
    """
    style.apply()
    names = list(report["scenarios"])
    fig, axes = plt.subplots(1, len(names), sharey=True, squeeze=False,
                             figsize=(5.2 * len(names) + 1, 5.6))
    data = {}
    for ax, name in zip(axes[0], names, strict=True):
        rows = report["scenarios"][name]
        drawn = {"ranks": [row["rank"] for row in rows]}
        for key in ("sent", "received"):
            drawn[key] = [row[f"{key}_bytes"] for row in rows]
            drawn[f"predicted_{key}"] = [row[f"predicted_{key}_bytes"] for row in rows]
        data[name] = drawn
        for offset, key, hatch in ((-0.2, "sent", None), (0.2, "received", "//")):
            xs = [rank + offset for rank in drawn["ranks"]]
            ax.bar(xs, [b / 1e6 for b in drawn[key]], width=0.38, color=COLORS[name],
                   hatch=hatch, edgecolor="white", label=f"measured {key}")
            ax.scatter(xs, [b / 1e6 for b in drawn[f"predicted_{key}"]], marker="_", s=900,
                       linewidths=3, color="black", zorder=3,
                       label=("predicted (five functions)" if name != "dp-nccl" else
                              "predicted (chain)") if key == "sent" else None)
        ax.set_xticks(drawn["ranks"])
        tallest = max(drawn["sent"] + drawn["received"] + drawn["predicted_sent"])
        ax.set_ylim(0, 1.4 * tallest / 1e6)  # room for the legend above the bars
        ax.set_title(name)
        ax.set_xlabel("rank")
        ax.legend(loc="upper right")
    axes[0][0].set_ylabel("bytes per iteration (MB, decimal)")
    fig.suptitle(f"Measured vs predicted, n = {report['world_size']}, "
                 f"P = {report['param_bytes'] / 1e6:.2f} MB")
    fig.tight_layout()
    return fig, data


def busiest_link_vs_n(reports: dict):
    """Two panels against n, measured (markers) over the model (lines), MB decimal.

    Left: the busiest link's busy bytes per iteration: DP's copy path (the star), rank 0's sent
    + received (sequential phases), predicted by ``dp_communication_volume`` = 2 (n - 1) P;
    DP's NCCL path (the chain, when the reports hold "dp-nccl"), predicted 2P for every n; DDP,
    a ring rank's max(sent, received) (full duplex), predicted by ``ddp_communication_volume``
    = 2 (n - 1) / n P. Right: bytes sent summed over all ranks, predicted 2 (n - 1) P for all.
    ``reports`` maps n to a ``measure_traffic`` report holding "ddp" and "dp". Returns (figure,
    data) with data[scenario] = {"n", "busy", "predicted_busy", "total", "predicted_total"}.
    """
    from dpcost.core import ddp_communication_volume, dp_communication_volume
    from dpcost.dataparallel_traffic import chain_busy_bytes

    style.apply()
    ns = sorted(reports)
    predict = {"dp": dp_communication_volume, "ddp": ddp_communication_volume,
               "dp-nccl": lambda p, n: max(chain_busy_bytes(p, n))}
    names = [name for name in ("dp", "dp-nccl", "ddp")
             if all(name in reports[n]["totals"] for n in ns)]
    data = {}
    for name in names:
        totals = [reports[n]["totals"][name] for n in ns]
        data[name] = {
            "n": ns,
            "busy": [t["busiest_link_busy_bytes"] for t in totals],
            "predicted_busy": [predict[name](reports[n]["param_bytes"], n) for n in ns],
            "total": [t["sent_bytes"] for t in totals],
            "predicted_total": [t["predicted_total_bytes"] for t in totals],
        }
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.6))
    labels = {"dp": "DP copy path (star)", "dp-nccl": "DP NCCL path (chain)", "ddp": "DDP"}
    markers = {"dp": "o", "dp-nccl": "s", "ddp": "x"}
    for name in names:
        drawn, color = data[name], COLORS[name]
        left.plot(ns, [b / 1e6 for b in drawn["predicted_busy"]], "-", color=color,
                  label=f"{labels[name]}: predicted")
        left.plot(ns, [b / 1e6 for b in drawn["busy"]], markers[name], color=color, ms=10,
                  mew=2, label=f"{labels[name]}: measured")
        right.plot(ns, [b / 1e6 for b in drawn["total"]], markers[name], color=color, ms=10,
                   mew=2, label=f"{labels[name]}: measured")
    right.plot(ns, [b / 1e6 for b in data["dp"]["predicted_total"]], "-", color="black",
               label="2(n-1)P, all")
    left.set_title("Busiest link: busy bytes per iteration")
    right.set_title("All ranks: bytes sent per iteration")
    for ax in (left, right):
        ax.set_xlabel("number of ranks, n")
        ax.set_xticks(ns)
        ax.set_ylabel("MB per iteration (decimal)")
        ax.legend(loc="upper left", fontsize=10)
    fig.tight_layout()
    return fig, data
