"""dpcost.measure.timeline: exposed communication, the overlap model, the Chrome trace.

Hand-made timelines first (exact values), then a real measured one over gloo at n = 2.
"""

import json

import pytest

from dpcost.measure import measure_traffic
from dpcost.measure import timeline as tl

MS = 1_000_000  # ns


def ddp_iteration(i=0):
    """forward 0-10 ms, backward 10-40 ms with gradients ready at 20, 30, 34 ms, two buckets
    all-reduced 21-29 ms and 35-44 ms: only 40..44 is not under compute... but backward's
    compute part ends at the last gradient ready, 34 ms, so 35-44 is exposed: 9 ms."""
    return [
        [i, "compute", "forward", 0, 10 * MS],
        [i, "compute", "backward", 10 * MS, 44 * MS],
        [i, "grad", "2.weight ready", 20 * MS, 20 * MS],
        [i, "grad", "1.weight ready", 30 * MS, 30 * MS],
        [i, "grad", "0.weight ready", 34 * MS, 34 * MS],
        [i, "comm", "bucket 0 (4000 B)", 21 * MS, 29 * MS],
        [i, "comm", "bucket 1 (2000 B)", 35 * MS, 44 * MS],
        [i, "compute", "optimizer step", 44 * MS, 46 * MS],
    ]


def test_exposed_communication_is_comm_outside_compute():
    summary = tl.iteration_summary([tuple(e[1:]) for e in ddp_iteration()])
    assert summary["step_s"] == pytest.approx(0.046)
    assert summary["comm_s"] == pytest.approx(0.017)  # 8 + 9 ms
    assert summary["exposed_comm_s"] == pytest.approx(0.009)  # 35..44 after the last ready
    assert summary["exposed_fraction"] == pytest.approx(9 / 17)
    assert summary["compute_s"] == pytest.approx(0.036)  # 0..34 and 44..46


def test_serial_phases_expose_all_communication():
    events = [("comm", "parameters out", 0, 5 * MS), ("compute", "forward", 5 * MS, 9 * MS),
              ("compute", "backward", 9 * MS, 20 * MS), ("comm", "gradients in", 20 * MS,
                                                          26 * MS)]
    summary = tl.iteration_summary(events)
    assert summary["exposed_comm_s"] == pytest.approx(0.011)
    assert summary["exposed_fraction"] == 1.0


def test_median_over_iterations():
    events = ddp_iteration(0) + [[1, *e[1:3], e[3] + 100 * MS, e[4] + 100 * MS]
                                 for e in ddp_iteration(1)]
    assert tl.summary(events)["exposed_comm_s"] == pytest.approx(0.009)
    assert list(tl.by_iteration(events)) == [0, 1]


def test_the_overlap_model_by_hand():
    # t(S) = 1 ms + S / (1 GB/s); buckets handed over at 21 and 35 ms; last gradient at 34 ms.
    a, b = 1e-3, 1e-9
    exposed = tl.predicted_exposed_s([21 * MS, 35 * MS], [4e6, 2e6], a, b, 34 * MS)
    # bucket 0: 21 + 1 + 4 = 26 ms; bucket 1: max(35, 26) + 1 + 2 = 38 ms -> 38 - 34 = 4 ms
    assert exposed == pytest.approx(0.004)
    # a backlog: bucket 0 takes 20 ms, so bucket 1 waits until 41 and ends at 44
    assert tl.predicted_exposed_s([21 * MS, 35 * MS], [19e6, 2e6], a, b, 34 * MS) == \
        pytest.approx(0.010)
    with pytest.raises(ValueError, match="one entry per bucket"):
        tl.predicted_exposed_s([1], [1, 2], a, b, 0)


def test_fit_alpha_beta_recovers_a_line():
    a, b = tl.fit_alpha_beta([1e3, 1e6, 4e6], [2e-4 + 1e3 * 5e-10, 2e-4 + 1e6 * 5e-10,
                                                2e-4 + 4e6 * 5e-10])
    assert a == pytest.approx(2e-4) and b == pytest.approx(5e-10)
    with pytest.raises(ValueError, match="two different sizes"):
        tl.fit_alpha_beta([1e3, 1e3], [1.0, 2.0])


def test_bucket_sizes_are_read_from_the_event_names():
    events = [tuple(e[1:]) for e in ddp_iteration()]
    assert [size for _, _, size in tl.bucket_events(events)] == [4000, 2000]


def test_chrome_trace_is_valid_trace_event_json(tmp_path):
    path = tmp_path / "trace.json"
    tl.write_chrome_trace(path, {"ddp": [ddp_iteration(), ddp_iteration()]})
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    instants = [e for e in events if e["ph"] == "i"]
    names = [e for e in events if e["ph"] == "M"]
    assert len(complete) == 2 * 5 and len(instants) == 2 * 3
    assert {e["args"]["name"] for e in names} >= {"ddp rank 0", "ddp rank 1", "compute", "comm"}
    for event in complete:
        assert {"name", "ph", "ts", "dur", "pid", "tid"} <= set(event)
        assert event["ts"] >= 0 and event["dur"] >= 0
    backward = next(e for e in complete if e["name"] == "backward")
    assert backward["ts"] == 10_000 and backward["dur"] == 34_000  # microseconds


@pytest.fixture(scope="module")
def measured():
    return measure_traffic(world_size=2, model_bytes=4e6, steps=3,
                           scenarios=("ddp-timeline", "dp-timeline", "dp-nccl-timeline"))


def test_a_measured_ddp_timeline_overlaps_buckets_with_backward(measured):
    for row in measured["scenarios"]["ddp-timeline"]:
        assert abs(row["sent_ratio"] - 1) < 0.005  # the timed hook moves what DDP moves
        for events in tl.by_iteration(row["timeline"]).values():
            backward = next(e for e in events if e[1] == "backward")
            buckets = tl.bucket_events(events)
            ready = [e[2] for e in events if e[0] == "grad"]
            assert len(ready) == 8  # 4 Linear layers: a weight and a bias each
            assert len(buckets) >= 2 and sum(size for *_, size in buckets) == \
                measured["param_bytes"]
            assert buckets[0][0] < backward[3]  # the first bucket starts before backward ends
            assert min(ready) < buckets[0][0] <= max(ready)
        calibration = row["allreduce_calibration"]
        a, b = tl.fit_alpha_beta(calibration["sizes_bytes"], calibration["seconds"])
        predicted = tl.predicted_ddp(row["timeline"], a, b)
        assert b > 0 and 0 <= predicted["exposed_fraction"] <= 1
        assert predicted["comm_s"] == pytest.approx(
            len(tl.bucket_events(events)) * a + measured["param_bytes"] * b)


@pytest.mark.parametrize("scenario", ["dp-timeline", "dp-nccl-timeline"])
def test_a_measured_dp_timeline_runs_its_phases_in_series(measured, scenario):
    for row in measured["scenarios"][scenario]:
        for events in tl.by_iteration(row["timeline"]).values():
            spans = {name: (start, end) for _, name, start, end in events}
            assert spans["parameters out"][1] <= spans["forward"][0]
            assert spans["backward"][1] <= spans["gradients in"][0]  # reduce after backward
            assert tl.iteration_summary(events)["exposed_fraction"] == 1.0
