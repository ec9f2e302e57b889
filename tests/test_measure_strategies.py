"""The strategies beyond DDP, measured over gloo at world size 2, against dpcost.strategies.

One process group runs every strategy scenario (start-up costs seconds); the tests read its
report. Expected values are recomputed here by hand from the model's shape, not taken from
dpcost.strategies, and the report's predictions must equal them.
"""

import pytest

from dpcost.measure import measure_traffic
from dpcost.measure.strategy_scenarios import NAMES

TOLERANCE = 0.01  # |measured / predicted - 1|: gloo's framing is the only difference
N = 2


@pytest.fixture(scope="module")
def run():
    return measure_traffic(world_size=N, model_bytes=1e6, steps=2, warmup=2, scenarios=NAMES)


def shape(report):
    w, depth = report["model"]["width"], report["model"]["layers"]
    assert report["param_bytes"] == 4 * depth * (w * w + w)
    return w, depth


def expected_bytes(name, report):
    """Bytes per rank per step at n = 2, by hand: a ring all-reduce of S moves 2(n-1)/n S = S,
    an all-gather (n-1)/n S = S/2; gloo's reduce-scatter is an all-reduce."""
    p = report["param_bytes"]
    w, depth = shape(report)
    return {
        "ddp-adam": p, "accumulation": p, "bucket-cap": p,
        "fp16-hook": p / 2, "bf16-cast": p / 2,
        # rank 1: per layer P (w x 1) and Q (w x 1) of the weight, the bias uncompressed
        "powersgd": 4 * depth * (w + w + w),
        "zero1": p + p / 2,  # the all-reduce, then each rank's half sent to the other
        "fsdp": 2 * (p / 2) + p,  # two all-gathers + a reduce-scatter run as an all-reduce
        "fsdp-no-reshard": p / 2 + p,
        # a (1, 2) mesh at n = 2: FSDP's bytes; the replicate group's all-reduce has one rank
        # (4 ranks: tests/test_measure_hsdp.py)
        "hsdp": 2 * (p / 2) + p,
    }[name]


def test_every_strategy_ran_or_says_why_it_was_skipped(run):
    assert set(run["scenarios"]) | set(run["skipped"]) == set(NAMES)
    # a CPU build of torch cannot register bf16_compress_hook; the report says so
    assert "_check_comm_hook" in run["skipped"]["bf16-hook"]
    assert set(run["skipped"]) == {"bf16-hook"}


@pytest.mark.parametrize("name", [n for n in NAMES if n != "bf16-hook"])
def test_measured_bytes_match_the_model(run, name):
    want = expected_bytes(name, run)
    for row in run["scenarios"][name]:
        assert row["counter"] == "tcp_info"
        assert row["predicted_sent_bytes"] == pytest.approx(want)
        assert row["predicted_received_bytes"] == pytest.approx(want)
        for direction in ("sent", "received"):
            measured = row[f"{direction}_bytes"]
            assert measured >= want  # framing adds, never removes
            if name == "powersgd":  # 12 KB of payload: framing is a few hundred B a message
                assert (measured - want) / row["messages"] < 1000
            else:
                assert abs(measured / want - 1) < TOLERANCE, (name, direction)


def test_collective_calls_match_the_model(run):
    w, depth = shape(run)
    want = {"ddp-adam": 1, "accumulation": 1, "fp16-hook": 1, "bf16-cast": 1,
            "powersgd": 3, "bucket-cap": 2, "zero1": 1 + 2 * depth, "fsdp": 3 * depth,
            "fsdp-no-reshard": 2 * depth, "hsdp": 4 * depth}
    for name, calls in want.items():
        for row in run["scenarios"][name]:
            assert row["messages"] == row["predicted_messages"] == calls, name
    fsdp = run["scenarios"]["fsdp"][0]["collective_calls"]
    assert fsdp == {"all_gather_single": 2 * depth, "reduce_scatter_single": depth}
    assert run["scenarios"]["zero1"][0]["collective_calls"] == {"broadcast": 2 * depth}


def test_the_tensors_handed_to_the_collectives(run):
    p = run["param_bytes"]
    w, depth = shape(run)
    sizes = {name: run["scenarios"][name][0]["collective_tensor_bytes"] for name in
             ("powersgd", "zero1", "fsdp", "fsdp-no-reshard", "fp16-hook", "bucket-cap")}
    assert sizes["powersgd"] == {"all_reduce": 4 * depth * 3 * w}
    assert sizes["zero1"] == {"broadcast": p}
    assert sizes["fsdp"] == {"all_gather_single": 2 * p, "reduce_scatter_single": p}
    assert sizes["fsdp-no-reshard"] == {"all_gather_single": p, "reduce_scatter_single": p}
    assert sizes["fp16-hook"] == {"all_reduce": p / 2}
    assert sizes["bucket-cap"] == {"all_reduce": p}


def test_bucket_cap_buckets_match_torchs_assignment(run):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from dpcost.measure.strategy_scenarios import BUCKET_CAP_MB

    w, depth = shape(run)
    # gradients become ready last layer first, each bias before its weight
    numels = [w, w * w] * depth
    cap = int(BUCKET_CAP_MB * 2**20)
    buckets, _ = dist._compute_bucket_assignment_by_size(
        [torch.empty(k) for k in numels], [cap], [False] * len(numels), list(range(len(numels))))
    want = [4 * sum(numels[i] for i in bucket) for bucket in buckets]
    for row in run["scenarios"]["bucket-cap"]:
        assert row["bucket_sizes"] == want
        assert len(want) == row["messages"]


def test_model_state_census_matches_the_zero_formulas(run):
    w, depth = shape(run)
    psi = depth * (w * w + w)
    want = {"ddp-adam": 16 * psi, "zero1": 8 * psi + 8 * psi / N, "fsdp": 16 * psi / N,
            "fsdp-no-reshard": 16 * psi / N, "powersgd": 16 * psi}
    for name, state in want.items():
        for row in run["scenarios"][name]:
            assert row["state_census_bytes"] == row["predicted_state_census_bytes"] == state


def test_the_peak_adds_error_feedback_and_unsharded_parameters(run):
    w, depth = shape(run)
    psi = depth * (w * w + w)
    for row in run["scenarios"]["powersgd"]:  # PowerSGDState.error_dict: one fp32 bucket
        assert row["error_feedback_bytes"] == 4 * psi
    for row in run["scenarios"]["fsdp-no-reshard"]:  # whole parameters, forward to backward
        assert row["unsharded_after_forward_bytes"] == 4 * psi
    for row in run["scenarios"]["fsdp"]:  # resharded after each unit's forward
        assert row["unsharded_after_forward_bytes"] == 0
    for name in ("ddp-adam", "zero1", "powersgd", "fsdp", "fsdp-no-reshard"):
        for row in run["scenarios"][name]:
            assert row["peak_state_bytes"] == row["predicted_peak_state_bytes"], name


def test_the_same_training_where_the_arithmetic_is_the_same(run):
    plain = run["scenarios"]["ddp-adam"]
    for name in ("bucket-cap", "zero1", "fsdp", "fsdp-no-reshard"):
        for mine, ref in zip(run["scenarios"][name], plain, strict=True):
            assert mine["losses"] == pytest.approx(ref["losses"], rel=1e-5), name
    for name in ("fp16-hook", "bf16-cast"):  # 16-bit gradients: close, not equal
        for mine, ref in zip(run["scenarios"][name], plain, strict=True):
            assert mine["losses"] == pytest.approx(ref["losses"], rel=1e-2), name
    # PowerSGDState.iter counts DDP iterations (maybe_increase_iter on the last bucket): the 2
    # warm-up ones ran plain all-reduces, the 2 measured ones compressed (the bytes above)
    assert run["scenarios"]["powersgd"][0]["powersgd_iter"] == run["warmup"] + run["steps"]


def test_the_ladder_rows_join_model_and_measurement(run):
    from dpcost.measure.strategy_scenarios import format_ladder_table, ladder_rows

    rows = ladder_rows(run)
    assert [row["rung"] for row in rows][:3] == ["DP (copy path)", "DP (NCCL path)", "DDP"]
    nccl = rows[1]
    assert nccl["measured_sent_bytes"] is None and nccl["why_not_measured"] == "needs GPUs and NCCL"
    for row in rows:
        if row["measured_sent_bytes"] is not None and row["rung"] != "PowerSGD":
            assert abs(row["measured_sent_bytes"] / row["modelled_sent_bytes"] - 1) < TOLERANCE
    assert len(format_ladder_table(rows).splitlines()) == 2 + len(rows)


def test_bytes_excess_is_the_worst_rank_and_direction(run):
    from dpcost.measure.strategy_scenarios import bytes_excess

    p = run["param_bytes"]
    excess = bytes_excess(run)
    assert "DP (NCCL path)" not in excess  # not measured here
    ddp = run["scenarios"]["ddp-adam"]
    assert excess["DDP"] == max(abs(row[f"{d}_bytes"] / p - 1)
                                for row in ddp for d in ("sent", "received"))
    for rung, value in excess.items():
        assert 0 < value < (1 if rung == "PowerSGD" else TOLERANCE), rung


def test_unavailable_says_why_and_rejects_unknown_names():
    from dpcost.measure.strategy_scenarios import _torch_has_cuda, unavailable

    for name in NAMES:
        why = unavailable(name, "gloo")
        if name == "bf16-hook" and not _torch_has_cuda():
            assert "CPU build" in why and "bf16-cast" in why
        else:
            assert why is None, name
    with pytest.raises(ValueError, match="strategy scenario"):
        unavailable("zero4", "gloo")


def test_shapes_from_param_bytes_and_bad_input():
    from dpcost.measure.strategy_scenarios import linear_stack_shapes, predictions

    assert linear_stack_shapes(4 * 4 * (250 * 250 + 250), 4) == [(250, 250), (250,)] * 4
    with pytest.raises(ValueError, match="param_bytes"):
        linear_stack_shapes(1_000_001, 4)
    with pytest.raises(ValueError, match="strategy scenario"):
        predictions("ddp", 0, 1_004_000, 2, 4)


def test_the_cli_reports_a_scenario_that_cannot_run_without_starting_ranks(capsys):
    from dpcost.measure.__main__ import main
    from dpcost.measure.strategy_scenarios import unavailable

    if unavailable("bf16-hook", "gloo") is None:
        pytest.skip("this torch can register bf16_compress_hook")
    assert main(["--scenario", "bf16-hook"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("bf16-hook skipped: ") and "_check_comm_hook" in out
