"""dpcost.pitfalls: each DDP behaviour run for real on 2 gloo ranks, checked against numbers
recomputed here by hand (exact inputs), and the runner leaves no rank behind."""

import psutil
import pytest

from dpcost import pitfalls as p


@pytest.fixture(scope="module")
def runs():
    return {name: p.run_on_ranks(name) for name in p.DEMOS}


def test_no_sync_the_forward_decides(runs):
    # rank r's gradient per weight is batch * (r + 1) = 2, 4; their mean is 3
    local = [2.0, 4.0]
    for rank, result in enumerate(runs["no_sync_placement"]):
        grad = result["grad"]
        assert result["local_grad"] == local[rank]
        assert grad["forward and backward inside"] == local[rank]
        assert grad["forward inside, backward outside"] == local[rank]  # no all-reduce
        assert grad["forward outside, backward inside"] == 3.0  # all-reduced all the same
        assert grad["forward and backward outside"] == 3.0


def ema(means, momentum=0.1, start=0.0):
    """BatchNorm's running mean after each batch mean in turn (torch's update rule)."""
    out, value = [], start
    for mean in means:
        value = (1 - momentum) * value + momentum * mean
        out.append(value)
    return out


def test_batchnorm_running_stats_are_rank0s_at_every_forward_start(runs):
    batch_mean = {r: [8.0 * (r + 1) + step for step in range(3)] for r in (0, 1)}
    rank0, rank1 = (r["on"] for r in runs["batchnorm_buffers"])
    assert rank0["start"] == rank1["start"]  # broadcast from rank 0 before each forward
    assert rank0["end"] == pytest.approx(ema(batch_mean[0]), rel=1e-6)  # rank 0's chain alone
    assert rank0["start"][1:] == rank0["end"][:-1]
    # rank 1 updates rank 0's value with its own batch, then loses it at the next forward
    for step in range(3):
        expected = 0.9 * rank0["start"][step] + 0.1 * batch_mean[1][step]
        assert rank1["end"][step] == pytest.approx(expected, rel=1e-6)
    assert rank1["final"] != rank0["final"]
    # without the broadcast each rank keeps its own chain
    for rank, result in enumerate(runs["batchnorm_buffers"]):
        assert result["off"]["end"] == pytest.approx(ema(batch_mean[rank]), rel=1e-6)


def test_eval_through_ddp_on_rank0_alone_times_out_and_module_returns(runs):
    rank0, rank1 = runs["eval_on_rank0"]
    assert rank0["ddp_on_every_rank"] == rank1["ddp_on_every_rank"] == "returned"
    assert rank0["module_on_rank0_s"] < 1.0
    assert rank0["ddp_on_rank0_only"] == "RuntimeError, timed out", rank0["gloo_message"]
    assert p.SHORT_TIMEOUT_S <= rank0["ddp_on_rank0_only_s"] < p.SHORT_TIMEOUT_S + 20


def test_distributed_validation_double_counts_the_padding(runs):
    results = runs["distributed_validation"]
    labels = [int(i % 3 != 0) for i in range(11)]  # the rule predicts 1 for every sample
    assert [r["padded_ids"] for r in results] == [[0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9, 0]]
    for r in results:
        assert r["padded"] == [sum(labels) + labels[0], 12.0]  # sample 0 counted twice
        assert r["exact"] == [sum(labels), 11.0] == r["reference"]
    assert results[0]["own"] == [sum(labels[0::2]), 6.0]


def test_module_forward_in_training_lets_the_ranks_drift(runs):
    # zero start, lr 1/8, 3 steps, 3 weights; local gradient 2 (rank 0) or 4 (rank 1) per weight
    rank0, rank1 = runs["module_forward_in_training"]
    assert rank0["ddp(x)"] == rank1["ddp(x)"] == -3 * 3 * 0.125 * 3.0
    assert rank0["ddp.module(x)"] == -3 * 3 * 0.125 * 2.0
    assert rank1["ddp.module(x)"] == -3 * 3 * 0.125 * 4.0


def test_mean_of_per_rank_means_is_not_the_global_mean(runs):
    # rank 0: 2 elements of 1, rank 1: 6 elements of 3 (per weight)
    rank0, rank1 = runs["unequal_loss_elements"]
    assert rank0["per_rank_mean"] == rank1["per_rank_mean"] == (1.0 + 3.0) / 2
    assert rank0["global_mean"] == rank1["global_mean"] == (2 * 1.0 + 6 * 3.0) / 8
    assert rank0["total"] == rank1["total"] == 8.0


def test_dataparallel_checkpoint_loads_after_the_prefix_is_stripped():
    result = p.dp_checkpoint_into_plain_model()
    assert all(key.startswith("module.") for key in result["saved_keys"])
    assert result["as_is"].startswith("Error(s) in loading state_dict")
    assert result["stripped_keys"] == [k.removeprefix("module.") for k in result["saved_keys"]]
    assert result["after_strip"] == "loaded"


@pytest.mark.parametrize("kwargs, word", [
    ({"name": "nope"}, "name"),
    ({"name": "no_sync_placement", "world_size": 1}, "world_size"),
    ({"name": "no_sync_placement", "world_size": True}, "world_size"),
    ({"name": "no_sync_placement", "timeout_s": 0}, "timeout_s"),
    ({"name": "no_sync_placement", "group_timeout_s": "3"}, "group_timeout_s"),
])
def test_bad_arguments_name_the_parameter(kwargs, word):
    with pytest.raises(ValueError, match=word):
        p.run_on_ranks(**kwargs)


def test_a_run_past_its_time_is_killed_and_leaves_no_rank():
    from dpcost.measure.launch import warm_context

    warm_context()  # started before: it stays for the session
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    with pytest.raises(p.PitfallRunError, match="did not finish within 0.5 s"):
        p.run_on_ranks("eval_on_rank0", timeout_s=0.5)
    after = {c.pid for c in psutil.Process().children(recursive=True) if c.is_running()
             and c.status() != psutil.STATUS_ZOMBIE}
    assert after <= before
