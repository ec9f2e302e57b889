"""PowerSGD's hook on gloo: the one-bucket case runs in order; a waiting callback holds a worker.

Real gloo ranks at world size 2. The expected all-reduce sizes are recomputed here by hand from
the model (4 x Linear(500)): per bucket PowerSGD at rank 1 all-reduces the biases (U), one
500-vector per weight for P and one for Q. Lesson 08 runs and asserts the multi-bucket cases
(DDP's default buckets with 2 and with 8 gloo workers).
"""

import sys
import time

import psutil
import pytest

from dpcost.measure import powersgd_gloo as pg
from dpcost.measure.launch import warm_context

LAYER_ELEMENTS = 500 * 500 + 500


def _descendants():
    # The launcher's warm process lives for the session and forks the ranks: start it first,
    # so that it is in every "before". The ranks, in sessions of their own, are still its
    # children, so a rank left behind is a new descendant.
    warm_context()
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.mark.parametrize("kwargs, name", [
    ({"bucket_cap_mb": 0}, "bucket_cap_mb"), ({"bucket_cap_mb": float("nan")}, "bucket_cap_mb"),
    ({"bucket_cap_mb": True}, "bucket_cap_mb"), ({"gloo_threads": 0}, "gloo_threads"),
    ({"gloo_threads": 2.0}, "gloo_threads"), ({"gloo_threads": 65}, "gloo_threads"),
    ({"straggler_s": -1}, "straggler_s"), ({"straggler_s": 6}, "straggler_s"),
])
def test_bad_cases_are_refused_before_any_rank_starts(kwargs, name):
    before = _descendants()
    with pytest.raises(ValueError, match=name):
        pg.probe(**kwargs)
    assert _descendants() == before


def test_the_probe_model_buckets_as_ddp_rebuilds_them():
    # 1 MiB first bucket: two 1,002,000 B layers reach it; the other two share the 25 MiB one
    assert pg.predicted_buckets(None) == 2
    assert pg.predicted_buckets(pg.ONE_BUCKET_MB) == 1


def test_one_bucket_keeps_the_calls_in_order_and_the_replicas_identical():
    before = _descendants()
    result = pg.probe(bucket_cap_mb=pg.ONE_BUCKET_MB, gloo_threads=2,
                      straggler_s=pg.STRAGGLER_S)
    assert _descendants() == before
    assert result["outcome"] == "ran" and result["steps"] == [4, 4]
    assert result["buckets"] == pg.predicted_buckets(pg.ONE_BUCKET_MB) == 1
    warmup = [["plain", 0, 4 * LAYER_ELEMENTS]] * pg.START_ITER  # the whole model, plainly
    compressed = [["U", 0, 4 * 500], ["P", 0, 4 * 500], ["Q", 0, 4 * 500]] * 2
    assert result["calls"] == [warmup + compressed] * 2
    assert result["out_of_order"] is None and result["mismatched"] == 0
    assert result["replica_max_diff"] == 0.0  # both ranks got the very same sums
    assert pg.describe(result)["outcome"] == "ran, replicas identical"


def test_with_one_gloo_worker_the_hook_waits_on_the_thread_that_would_run_p():
    before = _descendants()
    result = pg.probe(**pg.ONE_WORKER_CASE)
    assert _descendants() == before
    assert result["outcome"] == "hung"
    assert result["steps"] == [pg.START_ITER] * 2  # the warm-up ran; the first compressed not
    # each rank issued U, then P from U's callback, and waits for P
    assert [calls[pg.START_ITER:] for calls in result["calls"]] == [
        [["U", 0, 2000], ["P", 0, 2000]]] * 2
    # rank 0's callback holds its only worker; rank 1, the straggler, may have found its U
    # complete and waited on DDP's thread instead, which holds no worker
    p_wait = ["unpack_uncompressed_tensors_and_allreduce_ps"]
    assert result["waiting"][0] == p_wait and result["waiting"][1] in ([], p_wait)
    assert pg.describe(result)["outcome"] == "hung: all 1 of rank 0's workers wait in the hook"


def test_a_faulthandler_dump_is_read_for_the_hook_functions_waiting():
    hook = "/x/torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py"
    dump = f"""Thread 0x00007f01 (most recent call first):
  File "{hook}", line 611 in compute_qs

Thread 0x00007f02 (most recent call first):

Current thread 0x00007f03 (most recent call first):
  File "{hook}", line 589 in unpack_uncompressed_tensors_and_allreduce_ps
  File "{hook}", line 647 in powerSGD_hook
  File "/x/torch/autograd/graph.py", line 979 in _engine_run_backward
  File "/x/dpcost/measure/powersgd_gloo.py", line 180 in rank_main
"""
    # the worker's wait counts; DDP's thread (it runs rank_main) waits too, but holds no worker
    assert pg._waiting_in_hook(dump) == ["compute_qs"]
    worker_last = dump.replace("Current thread 0x00007f03", "Thread 0x00007f03").replace(
        "Thread 0x00007f01", "Current thread 0x00007f01")
    assert pg._waiting_in_hook(worker_last) == ["compute_qs"]
    assert pg._waiting_in_hook(dump.replace("rank_main", "run")) == [
        "compute_qs", "unpack_uncompressed_tensors_and_allreduce_ps"]
    assert pg._waiting_in_hook("") == []


def test_gloo_gives_a_process_group_two_workers_by_default():
    # in a fresh process: the test process must not hold a default process group
    before = _descendants()
    assert pg.default_gloo_threads() == (2, 2)  # the option, and the threads it started
    assert _descendants() == before


def test_a_failing_rank_is_reported_with_its_output_and_its_peer_is_killed(tmp_path):
    before = _descendants()
    commands = [[sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"],
                [sys.executable, "-c", "import time; time.sleep(60)"]]
    started = time.monotonic()
    with pytest.raises(pg.ProbeError, match=r"exit statuses \[3, -9\](.|\n)*boom"):
        pg.run_ranks(commands, tmp_path, timeout_s=30)
    assert time.monotonic() - started < 10
    assert _descendants() == before


def test_ranks_that_never_train_are_stopped_at_the_timeout(tmp_path):
    before = _descendants()
    commands = [[sys.executable, "-c", "import time; time.sleep(60)"]] * 2
    started = time.monotonic()
    with pytest.raises(pg.ProbeError, match="did not finish within 1 s"):
        pg.run_ranks(commands, tmp_path, timeout_s=1)
    assert time.monotonic() - started < 10
    assert _descendants() == before
