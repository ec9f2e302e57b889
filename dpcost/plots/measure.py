"""Measured bytes per rank against the five functions' prediction, DDP beside the DP pattern."""

from __future__ import annotations

import matplotlib.pyplot as plt

from dpcost.plots import style

COLORS = {"ddp": style.DDP_COLOR, "dp": style.DP_COLOR, "dataparallel-cuda": style.DP_COLOR,
          "dp-nccl": style.DP_NCCL_COLOR}


def _color_and_model(name: str) -> tuple[str, str]:
    """The bar colour and what predicted the ticks, for any scenario ``python -m dpcost.measure``
    runs: the three patterns and their timed versions ("ddp-timeline", ...: the same bytes,
    ``predicted_bytes`` in dpcost/measure/report.py), and the strategies beyond DDP (ZeRO, FSDP,
    the comm hooks: DDP's colour, predicted by dpcost.strategies)."""
    if name.startswith("dp-nccl"):
        return COLORS["dp-nccl"], "chain"
    if name in ("dp", "dp-timeline", "dataparallel-cuda"):
        return COLORS["dp"], "five functions"
    return COLORS["ddp"], ("five functions" if name in ("ddp", "ddp-timeline")
                           else "dpcost.strategies")


def measured_vs_predicted(report: dict):
    """Bars: bytes each rank sent and received per iteration (MB, decimal), one panel per
    scenario, four to a row; black ticks: the prediction (the five functions; the chain for
    DataParallel's NCCL path; dpcost.strategies for the strategies beyond DDP).

    ``report`` is ``dpcost.measure.measure_traffic``'s (or ``--json``'s) object. Returns
    (figure, data) with data[scenario] = {"ranks", "sent", "received", "predicted_sent",
    "predicted_received"} in bytes, exactly what was drawn.
    """
    style.apply()
    names = list(report["scenarios"])
    cols = min(len(names), 4)  # the ten strategies wrap into rows, still readable when projected
    rows_of_panels = -(-len(names) // cols)
    fig, axes = plt.subplots(rows_of_panels, cols, sharey=True, squeeze=False,
                             figsize=(5.2 * cols + 1, 5.6 * rows_of_panels))
    panels = [ax for row in axes for ax in row]
    for unused in panels[len(names):]:
        fig.delaxes(unused)
    data = {}
    for ax, name in zip(panels, names, strict=False):
        rows = report["scenarios"][name]
        drawn = {"ranks": [row["rank"] for row in rows]}
        for key in ("sent", "received"):
            drawn[key] = [row[f"{key}_bytes"] for row in rows]
            drawn[f"predicted_{key}"] = [row[f"predicted_{key}_bytes"] for row in rows]
        data[name] = drawn
        color, model = _color_and_model(name)
        for offset, key, hatch in ((-0.2, "sent", None), (0.2, "received", "//")):
            xs = [rank + offset for rank in drawn["ranks"]]
            ax.bar(xs, [b / 1e6 for b in drawn[key]], width=0.38, color=color,
                   hatch=hatch, edgecolor="white", label=f"measured {key}")
            ax.scatter(xs, [b / 1e6 for b in drawn[f"predicted_{key}"]], marker="_", s=900,
                       linewidths=3, color="black", zorder=3,
                       label=f"predicted ({model})" if key == "sent" else None)
        ax.set_xticks(drawn["ranks"])
        ax.set_title(name)
        ax.set_xlabel("rank")
        ax.legend(loc="upper right")
    tallest = max(max(d["sent"] + d["received"] + d["predicted_sent"]) for d in data.values())
    panels[0].set_ylim(0, 1.4 * tallest / 1e6)  # shared by all; room for the legend on top
    for row in axes:
        row[0].set_ylabel("bytes per iteration (MB, decimal)")
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
        ax.legend(loc="upper left", fontsize=13)
    fig.tight_layout()
    return fig, data
