"""dpcost.measure.launch: a rank that raises or hangs ends the run, named, with nothing left."""

import pytest
from process_marks import our_descendants

from dpcost.measure import MeasureError, measure_traffic
from dpcost.measure.launch import warm_context
from dpcost.procs import free_port


def test_a_raising_rank_is_named_with_its_cause_and_nothing_is_left():
    before = our_descendants()
    with pytest.raises(MeasureError, match=r"rank 1 failed: RuntimeError: injected fault") as info:
        measure_traffic(world_size=2, model_bytes=5e5, steps=2, scenarios=("dp",),
                        fault=(1, "raise"))
    assert info.value.rank == 1
    assert "Traceback" in info.value.details
    assert our_descendants() - before == set()


def test_a_hanging_rank_is_named_within_the_timeout_and_nothing_is_left():
    before = our_descendants()
    with pytest.raises(MeasureError, match=r"rank 1 hung: no progress for \d+ s at ddp "
                                           r"iteration \d+ \(iteration start\)") as info:
        measure_traffic(world_size=2, model_bytes=5e5, steps=2, scenarios=("ddp",),
                        fault=(1, "hang"), timeout_s=4)  # serial: an idle machine
    assert "rank 0 at ddp iteration" in str(info.value)  # the peer waits inside its step
    assert info.value.rank == 1
    assert our_descendants() - before == set()


def test_free_port_can_be_bound():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))


def test_a_rank_killed_mid_run_is_named_and_not_the_peer_it_left_behind():
    # The peer fails with "Connection reset by peer": a consequence, not the cause. It usually
    # reports within the launcher's grace (the whole run takes about 0.4 s), and is then listed
    # as one; in 2 runs of about 80 on 2026-12-02 (one make test, one repeat under load) it had
    # not, even with 5 s of grace, and the cause stood alone. Not explained yet.
    before = our_descendants()
    with pytest.raises(MeasureError, match=r"^rank 1 died: killed by signal SIGKILL without "
                                           r"reporting( \(then rank\(s\) 0 failed as a "
                                           r"consequence\))?$") as info:
        measure_traffic(world_size=2, model_bytes=5e5, steps=3, scenarios=("ddp",),
                        fault=(1, "kill"))
    assert info.value.rank == 1
    assert our_descendants() - before == set()


@pytest.mark.parametrize("fault, cause", [
    ((1, "exit-after-result"), "rank 1 posted its result, then exited with status 3"),
    ((0, "abort-after-result"), "rank 0 posted its result, then died, killed by signal SIGABRT"),
])
def test_a_rank_that_ends_badly_after_posting_its_result_fails_the_run(fault, cause):
    before = our_descendants()
    with pytest.raises(MeasureError, match=cause) as info:
        measure_traffic(world_size=2, model_bytes=5e5, steps=2, scenarios=("dp",), fault=fault)
    assert info.value.rank == fault[0]
    assert our_descendants() - before == set()


def test_a_set_up_slower_than_the_timeout_is_not_called_a_hang():
    # Rank 1 takes 3 s more to build its model; the hang timeout (1 s) covers training only.
    report = measure_traffic(world_size=2, model_bytes=5e5, steps=2, scenarios=("ddp",),
                             fault=(1, "slow-setup"), timeout_s=1)
    assert [row["rank"] for row in report["scenarios"]["ddp"]] == [0, 1]


def test_set_up_phases_are_told_apart_from_training():
    from dpcost.measure.worker import PROGRESS_READY, PROGRESS_STARTING, encode_progress, in_setup

    assert in_setup(PROGRESS_STARTING) and in_setup(PROGRESS_READY)
    assert in_setup(encode_progress(0, -1, "model setup"))
    assert in_setup(encode_progress(1, 13, "model setup"))  # _count_buckets' second model
    assert not in_setup(encode_progress(0, 0, "iteration start"))
    assert not in_setup(encode_progress(1, 5, "snapshot barrier"))


@pytest.mark.parametrize("model_bytes", [float("inf"), float("nan"), 1e300])
def test_impossible_models_are_refused_before_any_rank_starts(model_bytes):
    before = our_descendants()
    with pytest.raises(ValueError, match="model_bytes|MemAvailable"):
        measure_traffic(world_size=2, model_bytes=model_bytes)
    assert our_descendants() - before == set()


def post_every_result_and_exit(messages, world_size):
    """A helper that did its job: every rank's result, then every rank's exit status 0."""
    for rank in range(world_size):
        messages.put(("result", rank, {"rank": rank}))
    for rank in range(world_size):
        messages.put(("exit", rank, 0))


def test_a_helper_gone_before_its_last_messages_are_read_is_not_a_failure():
    # The race that failed a CI run once: the helper flushes its queue and exits, and the
    # launcher sees it gone while the ranks' exits are still in the pipe. Joined before watching,
    # the helper is always gone first here, so the race is taken every time.
    from dpcost.measure import launch, worker

    context = warm_context()
    config = worker.RunConfig(world_size=3, width=8, depth=1)
    progress = context.Array("q", [worker.PROGRESS_READY] * 3, lock=False)
    messages = context.Queue()
    helper = context.Process(target=post_every_result_and_exit, args=(messages, 3))
    helper.start()
    helper.join()
    assert helper.exitcode == 0
    run = launch._watch_until_done(helper, progress, messages, config, timeout_s=5,
                                   startup_timeout_s=5, positions=list(progress))
    assert run["ranks"] == [{"rank": 0}, {"rank": 1}, {"rank": 2}]


def imported_and_frozen(answers):
    import gc
    import sys

    answers.put(("torch._dynamo" in sys.modules, "torch.distributed" in sys.modules,
                 gc.get_freeze_count()))


def test_what_the_warm_process_forks_has_torch_imported_and_frozen():
    """dpcost/measure/warm.py: torch is imported before the fork, and gc.freeze() keeps the
    collector off its objects (shared pages in the children, a quick exit for the server)."""
    context = warm_context()
    answers = context.Queue()
    child = context.Process(target=imported_and_frozen, args=(answers,))
    child.start()
    dynamo, distributed, frozen = answers.get(timeout=60)
    child.join()
    assert dynamo and distributed
    assert frozen > 100_000  # torch's objects: 283,996 with torch 2.13 here
