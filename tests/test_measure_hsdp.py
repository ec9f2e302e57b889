"""HSDP measured over gloo on 4 ranks, a 2 x 2 DeviceMesh (replicate, shard), against its model.

One launch of 4 ranks runs the hsdp scenario and, beside it, flat FSDP on the same 4 ranks (the
rung it improves on, and the same training). Expected values are computed here by hand from
the model's shape; the report's predictions (``dpcost.strategies.hsdp``) must equal
them. The bytes per rank are also read per peer: the shard partner carries the shard group's
all-gathers and reduce-scatters, the replicate partner the all-reduce of the shard.
"""

import pytest

from dpcost.measure import measure_traffic

TOLERANCE = 0.01  # |measured / predicted - 1|: gloo's framing is the only difference
N = 4


@pytest.fixture(scope="module")
def run():
    return measure_traffic(world_size=N, model_bytes=1e6, steps=2, warmup=2,
                           scenarios=("fsdp", "hsdp"))


def shape(report):
    w, depth = report["model"]["width"], report["model"]["layers"]
    assert report["param_bytes"] == 4 * depth * (w * w + w)
    assert w % 2 == 0  # the shard group of 2 splits every parameter evenly: no padding
    return w, depth


def expected(report):
    """Bytes per rank per step, each way, by hand: shard group s = 2, replicate group m = 2.
    All-gather (s-1)/s P = P/2, twice (forward, backward); gloo's reduce-scatter is an
    all-reduce, 2 (s-1)/s P = P; the all-reduce of the P/s shard across the replicate group,
    2 (m-1)/m P/2 = P/2."""
    p = report["param_bytes"]
    return {"shard": p / 2 + p / 2 + p, "replicate": p / 2, "other": 0.0}


def test_the_mesh_pairs_each_rank_with_a_shard_and_a_replicate_partner(run):
    assert not run["skipped"]
    for row in run["scenarios"]["hsdp"]:
        r = row["rank"]
        assert row["mesh_shape"] == [2, 2]
        assert row["mesh_dim_names"] == ["replicate", "shard"]
        # mesh [[0, 1], [2, 3]]: shard groups are rows, replicate groups columns
        assert row["peer_ranks"] == {"shard": [r ^ 1], "replicate": [r ^ 2], "other": [r ^ 3]}


def test_the_prediction_is_the_derivation(run):
    want = expected(run)
    for row in run["scenarios"]["hsdp"]:
        assert row["predicted_sent_bytes"] == row["predicted_received_bytes"] \
            == pytest.approx(sum(want.values())) == pytest.approx(2.5 * run["param_bytes"])
        for role in ("shard", "replicate", "other"):
            assert row[f"predicted_{role}_peer_bytes"] == pytest.approx(want[role])


def test_measured_bytes_per_rank_match_the_prediction(run):
    for row in run["scenarios"]["hsdp"]:
        assert row["counter"] == "tcp_info"
        for direction in ("sent", "received"):
            measured, predicted = row[f"{direction}_bytes"], row[f"predicted_{direction}_bytes"]
            assert measured >= predicted  # framing adds, never removes
            assert abs(measured / predicted - 1) < TOLERANCE, (row["rank"], direction)


def test_measured_bytes_per_group_match_the_prediction(run):
    from dpcost.step_time import (
        GLOO_PREAMBLE_BYTES,
        gloo_framing_bytes,
        gloo_ring_allreduce_messages,
    )

    w, depth = shape(run)
    want = expected(run)
    for row in run["scenarios"]["hsdp"]:
        for direction in ("sent", "received"):
            for role in ("shard", "replicate"):
                measured = row[f"{role}_peer_{direction}_bytes"]
                assert measured >= want[role]
                assert abs(measured / want[role] - 1) < TOLERANCE, (row["rank"], role)
            # the diagonal peer shares only the world group: at most a late barrier preamble
            assert row[f"other_peer_{direction}_bytes"] <= GLOO_PREAMBLE_BYTES
            # the peers' bytes are the total less the closing barrier (world group)
            beside = row[f"{direction}_bytes"] - sum(
                row[f"{role}_peer_{direction}_bytes"] for role in ("shard", "replicate", "other"))
            assert 0 <= beside < 1000
        # the replicate group's framing: one ring all-reduce of each unit's shard per unit
        messages = gloo_ring_allreduce_messages(4 * (w * w + w) / 2, 2, rank=row["rank"] // 2)
        framing = depth * gloo_framing_bytes(messages, messages)[0]
        extra = row["replicate_peer_sent_bytes"] - want["replicate"]
        assert abs(extra - framing) <= GLOO_PREAMBLE_BYTES, (extra, framing)


def test_collective_calls_and_their_tensors(run):
    p = run["param_bytes"]
    w, depth = shape(run)
    for row in run["scenarios"]["hsdp"]:
        # per unit: 2 all-gathers, 1 reduce-scatter (shard group), 1 all-reduce (replicate)
        assert row["collective_calls"] == {"all_gather_single": 2 * depth,
                                           "reduce_scatter_single": depth, "all_reduce": depth}
        assert row["messages"] == row["predicted_messages"] == 4 * depth
        assert row["collective_tensor_bytes"] == {"all_gather_single": 2 * p,
                                                  "reduce_scatter_single": p,
                                                  "all_reduce": p / 2}


def test_model_state_is_sharded_over_the_shard_group(run):
    w, depth = shape(run)
    psi = depth * (w * w + w)
    for row in run["scenarios"]["hsdp"]:  # fp32 Adam, 16 bytes per parameter, over s = 2
        assert row["state_census_bytes"] == row["predicted_state_census_bytes"] == 16 * psi / 2
        assert row["unsharded_after_forward_bytes"] == 0  # resharded after each unit's forward
        assert row["peak_state_bytes"] == row["predicted_peak_state_bytes"]


def test_hsdp_trains_what_flat_fsdp_trains_and_moves_less(run):
    hsdp, fsdp = run["scenarios"]["hsdp"], run["scenarios"]["fsdp"]
    for mine, ref in zip(hsdp, fsdp, strict=True):
        assert mine["losses"] == pytest.approx(ref["losses"], rel=1e-5)
        assert mine["param_sum"] == pytest.approx(ref["param_sum"], rel=1e-6)
        # 2.5 P against FSDP's 4 (n-1)/n P' on gloo (P' padded to 4 shards)
        assert mine["sent_bytes"] < ref["sent_bytes"]
        assert ref["sent_bytes"] / mine["sent_bytes"] == pytest.approx(
            ref["predicted_sent_bytes"] / mine["predicted_sent_bytes"], rel=TOLERANCE)


def test_the_ladder_table_has_an_hsdp_row(run):
    from dpcost import strategies as st
    from dpcost.measure.strategy_scenarios import bytes_excess, format_ladder_table, ladder_rows

    for rank in range(N):
        rows = ladder_rows(run, rank)
        hsdp = next(row for row in rows if row["rung"] == "HSDP")
        assert hsdp["scenario"] == "hsdp"
        assert hsdp["modelled_sent_bytes"] == pytest.approx(2.5 * run["param_bytes"])
        assert abs(hsdp["measured_sent_bytes"] / hsdp["modelled_sent_bytes"] - 1) < TOLERANCE
        assert hsdp["measured_messages"] == hsdp["modelled_messages"]
        assert hsdp["measured_state_after_step_bytes"] == hsdp["modelled_state_after_step_bytes"]
        assert len(format_ladder_table(rows).splitlines()) == 2 + len(rows)
    assert st.LADDER[-1] == "HSDP"  # the last rung of the lesson's ladder
    excess = bytes_excess(run)
    assert 0 < excess["HSDP"] < TOLERANCE
    assert 0 < excess["FSDP full sharding"] < TOLERANCE


# --- without ranks ------------------------------------------------------------------------------

def test_an_odd_world_size_is_refused_in_one_line():
    from dpcost.measure.strategy_scenarios import build, hsdp_mesh_shape, predictions, unavailable
    from dpcost.measure.worker import RunConfig

    assert hsdp_mesh_shape(4) == (2, 2) and hsdp_mesh_shape(2) == (1, 2)
    for bad in (3, 1, 5):
        with pytest.raises(ValueError, match=f"even world_size.*got world_size {bad}"):
            hsdp_mesh_shape(bad)
    assert "world_size 3" in unavailable("hsdp", "gloo", 3)
    assert unavailable("hsdp", "gloo", 4) is None and unavailable("hsdp", "gloo") is None
    with pytest.raises(ValueError, match="world_size 3"):  # before torch builds anything
        build("hsdp", RunConfig(world_size=3, width=250, depth=4), 0)
    with pytest.raises(ValueError, match="world_size 3"):
        predictions("hsdp", 0, 4 * 4 * (250 * 250 + 250), 3, 4)
    from dpcost.measure import measure_traffic

    with pytest.raises(ValueError, match="world_size 3"):  # skipped before any rank starts
        measure_traffic(world_size=3, model_bytes=1e6, steps=1, scenarios=["hsdp"])


def test_the_cli_skips_hsdp_on_an_odd_world_size_without_starting_ranks(capsys):
    from dpcost.measure.__main__ import main

    assert main(["--scenario", "hsdp", "--world-size", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("hsdp skipped: scenario hsdp needs an even world_size")


def test_hsdp_prediction_against_its_limits():
    from dpcost import strategies as st
    from dpcost.measure.strategy_scenarios import predictions
    from dpcost.strategies import hsdp as hsdp_prediction

    p = 4 * 4 * (250 * 250 + 250)
    gloo = hsdp_prediction(p, 4, 2, "gloo", 4)
    assert gloo.sent_bytes == gloo.received_bytes == 2.5 * p and gloo.messages == 16
    assert gloo.extra["shard_group_bytes"] == 2 * p and gloo.extra["replicate_group_bytes"] == p / 2
    assert hsdp_prediction(p, 4, 2, "nccl", 4).sent_bytes == 2 * p  # a true reduce-scatter
    assert hsdp_prediction(p, 4, 2, "gloo", 4, reshard_after_forward=False).sent_bytes == 2 * p
    # 8 GPUs in 2 nodes of 4: 2 x 3/4 P + 2 x 3/4 P + 2 x 1/2 x P/4 on gloo
    assert hsdp_prediction(p, 8, 4, "gloo").sent_bytes == pytest.approx(3.25 * p)
    # one replicate group of n ranks is flat FSDP; replicate groups of 1 shard nothing
    for backend in ("gloo", "nccl"):
        assert hsdp_prediction(p, 4, 4, backend).sent_bytes == st.fsdp(p, 4, True,
                                                                       backend).sent_bytes
        assert hsdp_prediction(p, 4, 1, backend).sent_bytes == st.ddp(p, 4).sent_bytes
    assert hsdp_prediction(p, 4, 2, num_params=p // 4).state_after_step_bytes == 16 * p / 4 / 2
    with pytest.raises(ValueError, match="shard_size must divide num_gpus"):
        hsdp_prediction(p, 6, 4)
    # at 2 ranks the mesh is (1, 2): FSDP's bytes, plus one empty all-reduce call per unit
    two, flat = predictions("hsdp", 1, p, 2, 4), predictions("fsdp", 1, p, 2, 4)
    assert two["predicted_sent_bytes"] == flat["predicted_sent_bytes"] == 2 * p
    assert two["predicted_messages"] == flat["predicted_messages"] + 4
