"""dpcost.measure.rank_answers.gather: ranks forked from the warm forkserver, one answer each,
and no rank left behind; on real processes (UNTIMED lane: it starts ranks)."""

import multiprocessing.process

import pytest

from dpcost.measure.rank_answers import RankError, gather


def test_answers_come_back_in_rank_order():
    # min(rank, port) is the rank: a builtin, so the forkserver's child can unpickle it
    assert gather(min, (), world_size=3, timeout_s=120) == [0, 1, 2]


def test_a_rank_reaped_by_the_forkserver_after_it_looked_alive_is_left_alone(monkeypatch):
    """The race behind a red `make test` (`python -m dpcost.measure --model`: "could not write
    to stdout: No such process"): a rank answers, the clean-up sees it alive, it exits, the
    forkserver (its parent, not us) reaps it, and os.kill on its pid raised ProcessLookupError.
    Here every rank has exited and been reaped when it is asked whether it is alive."""
    def alive_a_moment_ago(process):
        process.join()  # it exits now and the forkserver reaps it
        return True

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "is_alive", alive_a_moment_ago)
    assert gather(min, (), world_size=2, timeout_s=120) == [0, 1]


def test_a_rank_that_raises_is_named():
    with pytest.raises(RankError, match=r"rank 0 failed: .*TypeError"):
        gather(len, (), world_size=1, timeout_s=120)  # len(rank, port): a TypeError
