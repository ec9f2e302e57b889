"""Measured bytes beside the five functions' predictions: the report's object and its table.

Predictions per rank and per iteration, from ``dpcost.core`` (P = gradient bytes, n = ranks):

- ddp: every rank sends and receives ``ddp_communication_volume(P, n)`` = 2 (n - 1) / n * P
  (gloo's ring all-reduce: reduce-scatter then all-gather).
- dp: rank 0 sends and receives ``dp_communication_volume(P, n) / 2`` = (n - 1) P (the
  parameters out to n - 1 ranks, their gradients back); every other rank sends and receives P.
  This is DataParallel's copy path, the one the five functions model.
- dp-nccl: DataParallel's NCCL path, a pipelined chain (``chain.py``), from
  ``dataparallel_traffic.chain_step_bytes``: rank 0 sends and receives P; rank 1 sends 2P and
  receives P, a rank in the middle 2P and 2P, the last rank P and 2P (n >= 3; at n = 2 both
  ranks P and P).

Both patterns move the same total, sum over ranks of sent = 2 (n - 1) P. The busiest link is
busy n times longer under DP: DP's rank 0 sends (n - 1) P before forward and receives (n - 1) P
after backward, phases that cannot overlap, so its link is busy for sent + received = 2 (n - 1) P
bytes' worth of time; a ring rank sends and receives at the same time on a full-duplex link, so
it is busy for max(sent, received) = 2 (n - 1) / n * P. The measured remainder (measured -
predicted) is gloo's framing, a few hundred bytes per message, plus the closing barrier.
"""

from __future__ import annotations

from dpcost.core import ddp_communication_volume, dp_communication_volume
from dpcost.dataparallel_traffic import chain_busy_bytes, chain_messages, chain_step_bytes
from dpcost.measure import strategy_scenarios
from dpcost.measure.shape import DEPTH
from dpcost.measure.worker import PREDICTED
from dpcost.units import format_bytes

# The strategies beyond DDP (strategy_scenarios.NAMES) are predicted by dpcost.strategies.
SCENARIOS = PREDICTED  # dpcost/measure/worker.py: the one list of names


def predicted_bytes(scenario: str, rank: int, param_bytes: float, world_size: int) -> tuple:
    """(sent, received) bytes per iteration that the five functions predict for ``rank``."""
    if scenario in strategy_scenarios.NAMES:
        predicted = strategy_scenarios.predictions(scenario, rank, param_bytes, world_size,
                                                   DEPTH)
        return predicted["predicted_sent_bytes"], predicted["predicted_received_bytes"]
    if scenario.startswith("ddp"):
        per_rank = ddp_communication_volume(param_bytes, world_size)
        return per_rank, per_rank
    if scenario.startswith("dp-nccl"):  # the chain: see dpcost/measure/chain.py
        return chain_step_bytes(param_bytes, world_size)[rank]
    if scenario in ("dp", "dp-timeline", "dataparallel-cuda"):
        if rank == 0:
            gpu0_each_way = dp_communication_volume(param_bytes, world_size) / 2
            return gpu0_each_way, gpu0_each_way
        return float(param_bytes), float(param_bytes)
    raise ValueError(f"scenario must be one of {SCENARIOS}, got {scenario!r}")


def predicted_framing_bytes(scenario: str, rank: int, param_bytes: float, world_size: int,
                            steps: int, bucket_sizes=None) -> tuple | None:
    """(sent, received) bytes per iteration that gloo adds to the payload on ``rank``, or None
    where the message count is not known (dataparallel-cuda, timed scenarios).

    Framing per message from gloo's TCP transport (``dpcost.step_time.gloo_framing_bytes``:
    48-byte preambles, 2 out and 1 back per message), times the messages each pattern sends:
    ddp, gloo's ring segments of every bucket (``bucket_sizes``, from the counting hook);
    dp, one message each way per peer; dp-nccl, one per 512 KiB chunk and hop. Plus the
    barrier that closes the window, spread over its ``steps`` iterations.
    """
    from dpcost.step_time import (
        GLOO_FRAMING_BYTES_PER_MESSAGE,
        ddp_gloo_framing_per_step,
        gloo_barrier_messages,
        gloo_framing_bytes,
    )

    n = world_size
    if scenario == "ddp":
        if not bucket_sizes:
            return None
        return ddp_gloo_framing_per_step(bucket_sizes, n, steps=steps, rank=rank)
    if scenario == "dp":
        messages = n - 1 if rank == 0 else 1
        sent, received = gloo_framing_bytes(messages, messages)
    elif scenario == "dp-nccl":  # one message per slice and hop each way it goes
        hops_out, hops_in = chain_step_bytes(1, n)[rank]
        chunks = chain_messages(param_bytes)
        sent, received = gloo_framing_bytes(int(hops_out) * chunks, int(hops_in) * chunks)
    else:
        return None
    barrier = gloo_barrier_messages(n) * GLOO_FRAMING_BYTES_PER_MESSAGE / steps
    return sent + barrier, received + barrier


def scenario_rows(scenario: str, results: list, param_bytes: float, world_size: int,
                  steps: int | None = None) -> list:
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
        framing = (predicted_framing_bytes(scenario, result["rank"], param_bytes, world_size,
                                           steps, result.get("bucket_sizes"))
                   if steps and result.get("counter") == "tcp_info" else None)
        if framing is not None:
            row.update(predicted_framing_sent_bytes=framing[0],
                       predicted_framing_received_bytes=framing[1],
                       unexplained_sent_bytes=row["sent_remainder_bytes"] - framing[0],
                       unexplained_received_bytes=row["received_remainder_bytes"] - framing[1])
        if scenario in strategy_scenarios.NAMES:  # messages and model state, predicted too
            row.update(strategy_scenarios.predictions(scenario, result["rank"], param_bytes,
                                                      world_size, DEPTH))
            row["sent_remainder_per_message_bytes"] = (row["sent_remainder_bytes"]
                                                       / max(1, result["messages"]))
        rows.append(row)
    return rows


def link_busy_bytes(scenario: str, sent: float, received: float, rank: int = 0,
                    world_size: int = 2) -> float:
    """Bytes' worth of time a rank's full-duplex link is busy: see the module docstring.

    dp: sent + received (parameters out, then gradients in: sequential phases);
    ddp: max(sent, received) (the ring sends and receives at once);
    dp-nccl: in each phase of the chain a rank receives and forwards at once, so its link is
    busy the larger of the two per phase (``dataparallel_traffic.chain_busy_bytes``); the
    measured bytes are split between the phases as the model splits them (2P for every rank).
    """
    if scenario.startswith("ddp") or scenario in strategy_scenarios.NAMES:  # ring-like
        return max(sent, received)
    if scenario.startswith("dp-nccl"):
        return (sent + received) * chain_busy_bytes(1, world_size)[rank] / sum(
            chain_step_bytes(1, world_size)[rank])
    return sent + received


def scenario_totals(scenario: str, rows: list, param_bytes: float, world_size: int) -> dict:
    """Sums over ranks and the busiest link (the rank whose link is busy longest)."""
    busy = [link_busy_bytes(scenario, row["sent_bytes"], row["received_bytes"], row["rank"],
                            world_size) for row in rows]
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
                             param_bytes, n, config.steps)
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
    for dp, key in (("dp", "busiest_link_ratio_dp_over_ddp"),
                    ("dp-nccl", "busiest_link_ratio_dp_nccl_over_ddp")):
        if "ddp" in totals and dp in totals:
            report[key] = (totals[dp]["busiest_link_busy_bytes"]
                           / totals["ddp"]["busiest_link_busy_bytes"])
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
        if "predicted_framing_sent_bytes" in rows[0]:
            worst = max(abs(row[f"unexplained_{d}_bytes"]) for row in rows
                        for d in ("sent", "received"))
            predicted = ", ".join(f"{row['predicted_framing_sent_bytes']:.0f}" for row in rows)
            lines.append(f"extra B predicted from the messages gloo sends (48-byte preambles): "
                         f"{predicted} sent per rank; largest difference from the measured "
                         f"extra {worst:.0f} B per iteration")
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
    if "busiest_link_ratio_dp_nccl_over_ddp" in report:
        ratio = report["busiest_link_ratio_dp_nccl_over_ddp"]
        lines += [f"On DataParallel's NCCL path (dp-nccl, a pipelined chain) the busiest link is "
                  f"busy {ratio:.3f}x as long as DDP's: n/(n-1) = {n / (n - 1):.3f}."]
    lines.append("Extra B = measured - predicted: " + report["remainder_explained"] + ".")
    for name, why in report["skipped"].items():
        lines.append(f"{name} skipped: {why}")
    return "\n".join(lines)
