"""A plan as a readable table, as JSON, and as a figure (bytes on the busiest link, memory)."""

from __future__ import annotations

import json

from dpcost.memory import COMPONENTS
from dpcost.plan.costs import STRATEGY_NAMES
from dpcost.registry import BY_KEY
from dpcost.units import format_bytes, format_seconds

__all__ = ["format_table", "to_json", "plot", "plot_step_ratios"]

TRAFFIC_NAMES = {"dp_copy": "DP, copy path (GPU0)", "dp_nccl": "DP, NCCL path (GPU0)",
                 "ddp": "DDP rank", "hsdp": "HSDP rank"}


def _b(x) -> str:
    return format_bytes(x, digits=4)


def _buckets_line(sizes) -> str:
    if sizes is None:
        return "none (never rebuilt)"
    shown = ", ".join(_b(x) for x in sizes[:6]) + (", ..." if len(sizes) > 6 else "")
    return f"{len(sizes)}: {shown}"


def format_table(r: dict) -> str:
    """The plan in words and columns (decimal units: kB, MB, GB)."""
    s = r["settings"]
    lines = [f"Plan for {r['model']} ({r['notes']['built']})",
             f"  input per GPU: {r['notes']['input']}; {s['gpus']} x {s['gpu']} "
             f"({s['gpus_per_node']} per node), {s['precision']}, {s['optimizer']}",
             f"  parameters: {r['parameters']:,} ({r['trainable_parameters']:,} trainable); "
             "gradients "
             + ", ".join(f"{d} {_b(v['gradient_bytes'])}" for d, v in r["by_dtype"].items()),
             f"  activations: {_b(r['activation_bytes'])} per GPU ({r['notes']['activations']})",
             f"  FLOPs per GPU: forward {r['flops']['forward']:.4g}, backward "
             f"{r['flops']['backward']:.4g} ({r['flops']['source']})",
             f"  precision {s['precision']}: {s['layout']}",
             f"  compute: {r['compute']}"
             + (f"; {r['gpu_note']}" if r.get("gpu_note") else ""), "",
             "DDP buckets (bucket 0 all-reduced first)",
             f"  first iteration:  {_buckets_line(r['buckets']['construction_bytes'])}",
             f"  rebuilt (2nd on): {_buckets_line(r['buckets']['rebuilt_bytes'])}", ""]
    if "unused" in r["notes"]:
        lines.insert(-1, f"  note: {r['notes']['unused']}")
    lines.append(f"{'per step, busiest link':<26}{'sent':>11}{'received':>11}{'messages':>10}")
    for key, t in r["traffic"].items():
        lines.append(f"{TRAFFIC_NAMES[key]:<26}{_b(t['sent_bytes']):>11}"
                     f"{_b(t['received_bytes']):>11}{t['messages']:>10,}")
    if not r["dp_available"]:
        lines.append("DP: not available (DataParallel cannot span machines)")
    title = "step time" + (" (compute measured)" if s.get("step_ms") else " (modelled)")
    lines += ["", f"{title:<26}{'total':>11}{'comm.':>11}{'exposed':>11}"]
    for key, st in r["steps"].items():
        lines.append(f"{TRAFFIC_NAMES[key].split(' (')[0]:<26}"
                     f"{format_seconds(st['total_s']):>11}"
                     f"{format_seconds(st['communication_s']):>11}"
                     f"{format_seconds(st['exposed_communication_s']):>11}")
    lines += ["", f"{'memory per GPU':<18}{'states':>11}{'activ.':>11}{'total':>11}  fits "
              f"{_b(r['capacity_bytes'])}"]
    for key, parts in r["memory"].items():
        states = sum(parts[c] for c in ("parameters", "gradients", "optimizer state",
                                        "DDP bucket copy", "DP reduce buffer"))
        lines.append(f"{STRATEGY_NAMES[key]:<18}{_b(states):>11}{_b(parts['activations']):>11}"
                     f"{_b(r['memory_totals'][key]):>11}  {'yes' if r['fits'][key] else 'NO'}")
    if not s["gradient_as_bucket_view"]:
        lines.append("  (DDP and ZeRO-1 count the bucket copy of the gradients: "
                     "gradient_as_bucket_view=False)")
    lines += ["", "Recommendation: " + r["recommendation"]]
    return "\n".join(lines)


def to_json(r: dict) -> str:
    """The plan as JSON (no NaN or infinity)."""
    return json.dumps(r, indent=1, allow_nan=False, default=str)


def _unit(largest: float) -> tuple[float, str]:
    """(divisor, name) of the decimal unit that shows ``largest`` bytes readably."""
    for divisor, name in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if largest >= divisor:
            return divisor, name
    return 1.0, "B"


def plot(r: dict, path=None):
    """Two panels: bytes per step on the busiest link, memory per GPU by component with the
    GPU's capacity (decimal units picked for the sizes; the capacity is written in the title
    when the bars are too small beside it). Saved to ``path`` when given; returns the figure."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from dpcost.plots.style import COMPONENT_COLORS

    fig, (left, right) = plt.subplots(1, 2, figsize=(12.8, 5.4))
    names = [TRAFFIC_NAMES[k] for k in r["traffic"]]
    busy = [t["busy_bytes"] for t in r["traffic"].values()]
    divisor, unit = _unit(max(busy))
    values = [v / divisor for v in busy]
    bars = left.bar(names, values, color=[BY_KEY[k].color for k in r["traffic"]])
    left.bar_label(bars, labels=[f"{v:.3g}" for v in values], fontsize=11)
    left.set_ylabel(f"bytes per step on the busiest link ({unit})", fontsize=12)
    left.set_title(f"{r['model']}: traffic per step, {r['settings']['gpus']} GPUs", fontsize=13)
    left.tick_params(axis="x", labelsize=10, rotation=10)
    keys = list(r["memory"])
    capacity = r["capacity_bytes"]
    largest = max(r["memory_totals"].values())
    on_scale = largest >= 0.1 * capacity
    divisor, unit = _unit(max(largest, capacity) if on_scale else largest)
    bottom = [0.0] * len(keys)
    for component in COMPONENTS:
        heights = [r["memory"][k][component] / divisor for k in keys]
        if any(heights):
            right.bar([STRATEGY_NAMES[k] for k in keys], heights, bottom=bottom, label=component,
                      color=COMPONENT_COLORS[component])
            bottom = [a + h for a, h in zip(bottom, heights, strict=True)]
    gpu = f"{r['settings']['gpu']} ({capacity / 1e9:.0f} GB)"
    if on_scale:
        right.axhline(capacity / divisor, color="black", linestyle="--", label=gpu)
    right.set_ylabel(f"memory per GPU ({unit})", fontsize=12)
    right.set_title(f"memory per GPU, {r['settings']['precision']}, "
                    f"{r['settings']['optimizer']}"
                    + ("" if on_scale else f"\n(capacity {gpu}: far above the bars)"),
                    fontsize=13)
    right.tick_params(axis="x", labelsize=10, rotation=10)
    right.legend(fontsize=9)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=100)
        plt.close(fig)
    return fig


def plot_step_ratios(rows, tolerance: float = 0.1, title: str = ""):
    """DataParallel's modelled step time over DDP's against the per-GPU batch (log x), both
    paths, with the ``1 + tolerance`` line below which DP counts as acceptable."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12.8, 5.4))
    batches = [r["batch"] for r in rows]
    ax.plot(batches, [r["copy"] for r in rows], "o-", label="DP, copy path / DDP")
    ax.plot(batches, [r["nccl"] for r in rows], "s-", label="DP, NCCL path / DDP")
    ax.axhline(1 + tolerance, color="black", linestyle="--",
               label=f"DDP + {tolerance:.0%}: DP acceptable below")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("samples per GPU (per-GPU batch)", fontsize=12)
    ax.set_ylabel("step time, DP / DDP (ratio)", fontsize=12)
    ax.set_title(title or "DataParallel's step over DDP's, modelled", fontsize=13)
    ax.legend(fontsize=11)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig
