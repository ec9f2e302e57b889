"""dpcost.measure.launch: a rank that raises or hangs ends the run, named, with nothing left."""

import os
from multiprocessing import resource_tracker

import psutil
import pytest

from dpcost.measure import MeasureError, measure_traffic
from dpcost.measure.launch import free_port


def our_descendants():
    # multiprocessing's resource tracker is the interpreter's helper (one per session, started
    # by the first spawn), not a rank: start it first so that it is in every "before".
    resource_tracker.ensure_running()
    return {p.pid for p in psutil.Process(os.getpid()).children(recursive=True)}


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
                        fault=(1, "hang"), timeout_s=10)  # generous: a loaded CI machine
    assert "rank 0 at ddp iteration" in str(info.value)  # the peer waits inside its step
    assert info.value.rank == 1
    assert our_descendants() - before == set()


def test_free_port_can_be_bound():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))
