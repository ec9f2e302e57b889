"""dpcost.measure.report: predictions per rank, ratios, remainders, totals and the table."""

import pytest

from dpcost.measure.report import (
    link_busy_bytes,
    predicted_bytes,
    render_table,
    scenario_rows,
    scenario_totals,
)

P = 4_000_000


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_predictions_per_rank(n):
    for rank in range(n):
        assert predicted_bytes("ddp", rank, P, n) == pytest.approx((2 * (n - 1) * P / n,) * 2)
    assert predicted_bytes("dp", 0, P, n) == pytest.approx(((n - 1) * P,) * 2)
    assert predicted_bytes("dp", n - 1, P, n) == (P, P)
    # the totals over ranks are equal, 2(n-1)P, in both patterns
    ddp_total = sum(predicted_bytes("ddp", r, P, n)[0] for r in range(n))
    dp_total = sum(predicted_bytes("dp", r, P, n)[0] for r in range(n))
    assert ddp_total == pytest.approx(2 * (n - 1) * P) == dp_total


def test_unknown_scenario_is_refused():
    with pytest.raises(ValueError, match="scenario"):
        predicted_bytes("ring", 0, P, 2)


def test_busy_link_is_sequential_for_dp_and_full_duplex_for_ddp():
    assert link_busy_bytes("dp", 3.0, 5.0) == 8.0
    assert link_busy_bytes("ddp", 3.0, 5.0) == 5.0


def fake_results(n, extra):
    return [{"rank": r, "sent_bytes": (n - 1) * P + extra if r == 0 else P + extra,
             "received_bytes": (n - 1) * P if r == 0 else P, "counter": "tcp_info",
             "memory_reading": "test", "peak_memory_bytes": 2**20, "step_time_s": 0.01}
            for r in range(n)]


def test_rows_ratio_and_remainder_and_totals():
    rows = scenario_rows("dp", fake_results(4, 400), P, 4)
    assert rows[0]["sent_ratio"] == pytest.approx((3 * P + 400) / (3 * P))
    assert rows[1]["sent_remainder_bytes"] == pytest.approx(400)
    assert rows[2]["received_ratio"] == 1.0
    totals = scenario_totals("dp", rows, P, 4)
    assert totals["busiest_rank"] == 0
    assert totals["predicted_total_bytes"] == 6 * P
    assert totals["busiest_link_busy_bytes"] == pytest.approx(6 * P + 400)


def test_table_names_the_counter_and_the_remainder():
    rows = scenario_rows("dp", fake_results(2, 158), P, 2)
    report = {"world_size": 2, "param_bytes": P, "steps": 5, "warmup": 2, "backend": "gloo",
              "model": {"layers": 4, "width": 500}, "scenarios": {"dp": rows},
              "totals": {"dp": scenario_totals("dp", rows, P, 2)}, "skipped": {"x": "why"},
              "remainder_explained": "framing"}
    text = render_table(report)
    assert "dp: counter tcp_info" in text
    assert "     158" in text  # the extra bytes column
    assert "x skipped: why" in text


def test_the_nccl_path_chain_predicts_each_rank_as_nccl_runs_it():
    from dpcost.measure.report import link_busy_bytes, predicted_bytes

    # By hand, ring 0 -> 1 -> 2 -> 3 -> 0: the broadcast leaves rank 0 and stops at rank 3; the
    # reduce starts at rank 1 (the rank after the root) and ends at rank 0 (NCCL reduce.h).
    p, n = 1e6, 4
    assert [predicted_bytes("dp-nccl", r, p, n) for r in range(n)] == [
        (p, p), (2 * p, p), (2 * p, 2 * p), (p, 2 * p)]
    assert [predicted_bytes("dp-nccl", r, p, 3) for r in range(3)] == [
        (p, p), (2 * p, p), (p, 2 * p)]
    assert predicted_bytes("dp-nccl-timeline", 1, p, 2) == (p, p)
    # every rank's link is busy 2P: the ends in two serial phases, the middle full duplex
    assert [link_busy_bytes("dp-nccl", *predicted_bytes("dp-nccl", r, p, n), r, n)
            for r in range(n)] == [2 * p] * n
    # against a DDP rank's 2(n-1)/n P: n/(n-1)
    ddp = link_busy_bytes("ddp", *predicted_bytes("ddp", 0, p, n))
    assert 2 * p / ddp == pytest.approx(n / (n - 1))


def test_predicted_framing_counts_messages_by_hand():
    from dpcost.measure.report import predicted_framing_bytes

    # n = 2, one step: the closing barrier is 1 message each way, 144 B (3 preambles of 48 B).
    # dp: rank 0 sends 1 message and receives 1: 2 x 48 + 48 out, the same in: 144 + 144.
    assert predicted_framing_bytes("dp", 0, 4e6, 2, steps=1) == (288.0, 288.0)
    # dp-nccl, 4 MB = 8 chunks of 512 KiB rounded up... 4,000,000 / 524,288 -> 8 chunks per hop
    assert predicted_framing_bytes("dp-nccl", 0, 4e6, 2, steps=1) == (8 * 144 + 144,) * 2
    # n = 3: rank 1 forwards the broadcast and starts the reduce: 16 messages out, 8 in. A
    # message costs its sender 2 preambles out and 1 back in; 2 barrier messages at n = 3.
    barrier = 2 * 144
    assert predicted_framing_bytes("dp-nccl", 1, 4e6, 3, steps=1) == (
        16 * 96 + 8 * 48 + barrier, 8 * 96 + 16 * 48 + barrier)
    # ddp, one bucket of 1 MB at n = 2: gloo's ring cuts it into 4 segments, 2 sent per rank
    # in each phase -> 4 messages out and 4 in, 144 B each direction per message
    assert predicted_framing_bytes("ddp", 0, 1e6, 2, steps=1, bucket_sizes=[1_000_000]) == (
        4 * 144 + 144, 4 * 144 + 144)
    assert predicted_framing_bytes("ddp", 0, 1e6, 2, steps=1) is None  # no bucket sizes
    assert predicted_framing_bytes("dataparallel-cuda", 0, 1e6, 2, steps=1) is None
