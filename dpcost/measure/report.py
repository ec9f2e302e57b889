"""Measured bytes beside the five functions' predictions: the report's object and its table.

Predictions per rank and per iteration, from ``dpcost.core`` (P = gradient bytes, n = ranks):

- ddp: every rank sends and receives ``ddp_communication_volume(P, n)`` = 2 (n - 1) / n * P
  (gloo's ring all-reduce: reduce-scatter then all-gather).
- dp: rank 0 sends and receives ``dp_communication_volume(P, n) / 2`` = (n - 1) P (the
  parameters out to n - 1 ranks, their gradients back); every other rank sends and receives P.

Both patterns move the same total, sum over ranks of sent = 2 (n - 1) P. The busiest link is
busy n times longer under DP: DP's rank 0 sends (n - 1) P before forward and receives (n - 1) P
after backward, phases that cannot overlap, so its link is busy for sent + received = 2 (n - 1) P
bytes' worth of time; a ring rank sends and receives at the same time on a full-duplex link, so
it is busy for max(sent, received) = 2 (n - 1) / n * P. The measured remainder (measured -
predicted) is gloo's framing, a few hundred bytes per message, plus the closing barrier.
"""

from __future__ import annotations

from dpcost.core import ddp_communication_volume, dp_communication_volume
from dpcost.measure import strategy_scenarios
from dpcost.measure.shape import DEPTH
from dpcost.units import format_bytes

# The strategies beyond DDP (strategy_scenarios.NAMES) are predicted by dpcost.strategies.
SCENARIOS = ("ddp", "dp", "dataparallel-cuda") + strategy_scenarios.NAMES


def predicted_bytes(scenario: str, rank: int, param_bytes: float, world_size: int) -> tuple:
    """(sent, received) bytes per iteration that the five functions predict for ``rank``."""
    if scenario in strategy_scenarios.NAMES:
        predicted = strategy_scenarios.predictions(scenario, rank, param_bytes, world_size,
                                                   DEPTH)
        return predicted["predicted_sent_bytes"], predicted["predicted_received_bytes"]
    if scenario.startswith("ddp"):
        per_rank = ddp_communication_volume(param_bytes, world_size)
        return per_rank, per_rank
    if scenario in ("dp", "dataparallel-cuda"):
        if rank == 0:
            gpu0_each_way = dp_communication_volume(param_bytes, world_size) / 2
            return gpu0_each_way, gpu0_each_way
        return float(param_bytes), float(param_bytes)
    raise ValueError(f"scenario must be one of {SCENARIOS}, got {scenario!r}")


def scenario_rows(scenario: str, results: list, param_bytes: float, world_size: int) -> list:
    """One dict per rank: measured and predicted bytes, ratio, remainder, memory, time."""
    rows = []
    for result in results:
        sent, received = predicted_bytes(scenario, result["rank"], param_bytes, world_size)
        row = dict(result)
        row.update(
            predicted_sent_bytes=sent,
            predicted_received_bytes=received,
            sent_ratio=result["sent_bytes"] / sent,
            received_ratio=result["received_bytes"] / received,
            sent_remainder_bytes=result["sent_bytes"] - sent,
            received_remainder_bytes=result["received_bytes"] - received,
        )
        if scenario in strategy_scenarios.NAMES:  # messages and model state, predicted too
            row.update(strategy_scenarios.predictions(scenario, result["rank"], param_bytes,
                                                      world_size, DEPTH))
            row["sent_remainder_per_message_bytes"] = (row["sent_remainder_bytes"]
                                                       / max(1, result["messages"]))
        rows.append(row)
    return rows


def link_busy_bytes(scenario: str, sent: float, received: float) -> float:
    """Bytes' worth of time a rank's full-duplex link is busy: see the module docstring.

    dp: sent + received (parameters out, then gradients in: sequential phases);
    ddp: max(sent, received) (the ring sends and receives at once).
    """
    ring_like = scenario.startswith("ddp") or scenario in strategy_scenarios.NAMES
    return max(sent, received) if ring_like else sent + received


def scenario_totals(scenario: str, rows: list, param_bytes: float, world_size: int) -> dict:
    """Sums over ranks and the busiest link (the rank whose link is busy longest)."""
    busy = [link_busy_bytes(scenario, row["sent_bytes"], row["received_bytes"]) for row in rows]
    busiest = max(range(len(rows)), key=busy.__getitem__)
    return {
        "sent_bytes": sum(row["sent_bytes"] for row in rows),
        "received_bytes": sum(row["received_bytes"] for row in rows),
        # 2 (n-1) P for DP and DDP alike; the strategies' own sums otherwise
        "predicted_total_bytes": sum(row["predicted_sent_bytes"] for row in rows),
        "busiest_rank": rows[busiest]["rank"],
        "busiest_link_busy_bytes": busy[busiest],
    }


def build_report(config, param_bytes: int, per_rank: list, skipped: dict | None = None) -> dict:
    """The ``--json`` object: run settings, per-scenario rows and totals, skipped scenarios.

    ``per_rank[r][scenario]`` is rank r's result for that scenario.
    """
    n = config.world_size
    scenarios, totals = {}, {}
    for name in config.scenarios:
        rows = scenario_rows(name, [rank_results[name] for rank_results in per_rank],
                             param_bytes, n)
        scenarios[name], totals[name] = rows, scenario_totals(name, rows, param_bytes, n)
    report = {
        "world_size": n,
        "param_bytes": param_bytes,
        "steps": config.steps,
        "warmup": config.warmup,
        "backend": config.backend,
        "model": {"layers": config.depth, "width": config.width, "dtype": "float32"},
        "scenarios": scenarios,
        "totals": totals,
        "skipped": dict(skipped or {}),
        "remainder_explained": "gloo frames every message with a header of a few hundred "
                               "bytes, and the barrier that closes the window adds a few more",
    }
    if "ddp" in totals and "dp" in totals:
        report["busiest_link_ratio_dp_over_ddp"] = (
            totals["dp"]["busiest_link_busy_bytes"] / totals["ddp"]["busiest_link_busy_bytes"])
    return report


def render_table(report: dict) -> str:
    """The report for people: one table per scenario, bytes in decimal MB per iteration."""
    n, p = report["world_size"], report["param_bytes"]
    lines = [f"{n} ranks, model P = {format_bytes(p)} of float32 gradients "
             f"({report['model']['layers']} x Linear({report['model']['width']})), "
             f"{report['steps']} measured iterations after {report['warmup']} warm-up, "
             f"backend {report['backend']}. Bytes per iteration; MB = 10^6 B, MiB = 2^20 B."]
    for name, rows in report["scenarios"].items():
        lines += ["", f"{name}: counter {rows[0]['counter']}; memory: {rows[0]['memory_reading']}",
                  f"{'rank':>4} {'sent MB':>9} {'predicted':>9} {'ratio':>7} {'extra B':>8}"
                  f" {'recv MB':>9} {'predicted':>9} {'ratio':>7} {'extra B':>8}"
                  f" {'peak MiB':>8} {'step ms':>8}"]
        for row in rows:
            memory = row["peak_memory_bytes"]
            lines.append(
                f"{row['rank']:>4} {row['sent_bytes'] / 1e6:>9.4f}"
                f" {row['predicted_sent_bytes'] / 1e6:>9.4f} {row['sent_ratio']:>7.4f}"
                f" {row['sent_remainder_bytes']:>8.0f}"
                f" {row['received_bytes'] / 1e6:>9.4f}"
                f" {row['predicted_received_bytes'] / 1e6:>9.4f} {row['received_ratio']:>7.4f}"
                f" {row['received_remainder_bytes']:>8.0f}"
                f" {'-' if memory is None else f'{memory / 2**20:.1f}':>8}"
                f" {row['step_time_s'] * 1e3:>8.1f}")
        total = report["totals"][name]
        if name in strategy_scenarios.NAMES:
            row = rows[0]
            lines.append(f"{row['formula']} ({row['source']}); messages per step: "
                         f"{row['messages']:g} measured, {row['predicted_messages']} predicted; "
                         f"model state {row['state_census_bytes'] / 1e6:.4f} MB read, "
                         f"{row['predicted_state_census_bytes'] / 1e6:.4f} MB predicted")
        label = "predicted" if name in strategy_scenarios.NAMES else "2(n-1)P ="
        lines.append(f"total sent {total['sent_bytes'] / 1e6:.4f} MB ({label} "
                     f"{total['predicted_total_bytes'] / 1e6:.4f} MB); busiest link: rank "
                     f"{total['busiest_rank']}, busy for "
                     f"{total['busiest_link_busy_bytes'] / 1e6:.4f} MB")
        if "hook_bytes" in rows[0]:
            where = rows[0].get("hook_window", "the timed iterations")
            lines.append(f"DDP hook: {rows[0]['hook_bytes']:.0f} B all-reduced per iteration in "
                         f"{rows[0]['hook_buckets']:.0f} bucket(s) (P = {p} B), counted over "
                         f"{where}")
    if "busiest_link_ratio_dp_over_ddp" in report:
        ratio = report["busiest_link_ratio_dp_over_ddp"]
        lines += ["", f"DP's busiest link is busy {ratio:.3f}x as long as DDP's (the five "
                      f"functions say n = {n}): dp rank 0's sent + received (sequential phases) "
                      "against a ring rank's max(sent, received) (full duplex)."]
    lines.append("Extra B = measured - predicted: " + report["remainder_explained"] + ".")
    for name, why in report["skipped"].items():
        lines.append(f"{name} skipped: {why}")
    return "\n".join(lines)
