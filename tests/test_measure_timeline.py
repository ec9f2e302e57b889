"""dpcost.measure.timeline: exposed communication, the overlap model, the Chrome trace.

Hand-made timelines first (exact values), then a real measured one over gloo at n = 2.
"""

import json
import random

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


def test_the_share_is_the_ratio_of_the_medians():
    """Three iterations, exposed of comm: 9 of 17 ms (ddp_iteration), 2 of 2 ms, 3 of 9 ms.
    The medians are 3 and 9 ms, so the share printed beside them is 1/3; the median of the
    per-iteration ratios (9/17, 1, 1/3) would be 9/17."""
    events = ddp_iteration(0) + [
        [1, "comm", "parameters out", 100 * MS, 102 * MS],
        [1, "compute", "forward", 102 * MS, 103 * MS],
        [2, "comm", "bucket 0 (1 B)", 200 * MS, 209 * MS],
        [2, "compute", "forward", 200 * MS, 206 * MS],
    ]
    ratios = [tl.iteration_summary(evs)["exposed_fraction"]
              for evs in tl.by_iteration(events).values()]
    assert ratios == pytest.approx([9 / 17, 1.0, 1 / 3])
    summary = tl.summary(events)
    assert summary["exposed_comm_s"] == pytest.approx(0.003)
    assert summary["comm_s"] == pytest.approx(0.009)
    assert summary["exposed_fraction"] == pytest.approx(1 / 3)


def test_overlapping_allreduces_counts_iterations_with_two_in_flight():
    assert tl.overlapping_allreduces(ddp_iteration(0)) == 0  # 21-29 then 35-44 ms
    both = [[1, "comm", "bucket 0 (1 B)", 0, 10 * MS], [1, "comm", "bucket 1 (1 B)", 5 * MS,
                                                         12 * MS]]
    assert tl.overlapping_allreduces(ddp_iteration(0) + both) == 1


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


def ols_slope(sizes, seconds):
    """Ordinary least squares' b of t = a + b·S: what fit_alpha_beta did before."""
    mean_s, mean_t = sum(sizes) / len(sizes), sum(seconds) / len(seconds)
    return sum((s - mean_s) * (t - mean_t) for s, t in zip(sizes, seconds, strict=True)) / sum(
        (s - mean_s) ** 2 for s in sizes)


A, B = 3e-4, 1e-9  # 0.3 ms and 1 GB/s: about gloo on loopback here


def loaded_timings(sizes, repeats, seed, late=()):
    """(sizes, seconds) with one entry per repeat: t = A + B·S, up to 0.5 ms of jitter, and
    30-50 ms more on the (size index, repeat) pairs in ``late``: a rank descheduled."""
    rng = random.Random(seed)
    flat_sizes, seconds = [], []
    for repeat in range(repeats):
        for index, size in enumerate(sizes):
            late_s = rng.uniform(30e-3, 50e-3) if (index, repeat) in late else 0.0
            flat_sizes.append(size)
            seconds.append(A + B * size + rng.uniform(0, 0.5e-3) + late_s)
    return flat_sizes, seconds


def test_late_small_all_reduces_turn_least_squares_negative_but_not_the_fit():
    # The design (4 KiB, P / 4, P at P = 4 MB, 5 repeats), with two of the five 4 KiB
    # repeats late: least squares tilts the line below zero, as it did on the loaded machine.
    sizes, seconds = loaded_timings([4096, 1e6, 4e6], 5, seed=7, late={(0, 1), (0, 3)})
    assert ols_slope(sizes, seconds) < 0
    a, b = tl.fit_alpha_beta(sizes, seconds)
    assert b == pytest.approx(B, rel=0.15) and 0 <= a < 1e-3


def test_timings_that_do_not_grow_with_size_raise_naming_them():
    with pytest.raises(tl.AlphaBetaFitError) as raised:
        tl.fit_alpha_beta([4096, 1e6, 4e6, 4e6], [3e-3, 2e-3, 1e-3, 1.5e-3])
    message = str(raised.value)
    assert isinstance(raised.value, ValueError)
    assert "b > 0" in message
    # the sizes and the median per size (4 MB: median of 1 ms and 1.5 ms)
    for shown in ("4096 B: 3.000e-03 s", "1e+06 B: 2.000e-03 s", "4e+06 B: 1.250e-03 s"):
        assert shown in message
    assert raised.value.sizes_bytes == [4096, 1e6, 4e6]
    assert raised.value.seconds == [3e-3, 2e-3, 1.25e-3] and raised.value.slope < 0
    with pytest.raises(tl.AlphaBetaFitError, match="median pairwise slope is 0.000e"):
        tl.fit_alpha_beta([4096, 1e6, 4e6], [1e-3, 1e-3, 1e-3])  # flat: b = 0 is no model


@pytest.mark.parametrize("index", [0, 2, 4])  # the smallest, a middle, the largest size
def test_one_huge_timing_barely_moves_the_slope(index):
    sizes = [4096, 2e6, 4e6, 8e6, 16e6]
    _, clean = tl.fit_alpha_beta(*loaded_timings(sizes, 1, seed=3))
    one_each, seconds = loaded_timings(sizes, 1, seed=3, late={(index, 0)})
    seconds[index] += 1.0  # one all-reduce a second late, and no repeat to outvote it
    assert abs(ols_slope(one_each, seconds) - B) > B  # least squares is thrown off
    _, b = tl.fit_alpha_beta(one_each, seconds)
    assert b == pytest.approx(clean, rel=0.1) and b == pytest.approx(B, rel=0.15)
    repeated, seconds = loaded_timings(sizes, 7, seed=3, late={(index, 2)})
    seconds[2 * len(sizes) + index] += 1.0  # one of seven repeats: its size's median ignores it
    assert tl.fit_alpha_beta(repeated, seconds)[1] == pytest.approx(B, rel=0.15)


@pytest.mark.parametrize("sizes, seconds, match", [
    ([1e3, 1e6], [1e-3], "same length, got 2 and 1"),
    ([1e3, float("nan")], [1e-3, 2e-3], r"sizes_bytes must hold finite.*nan at index 1"),
    ([1e3, 1e6], [1e-3, float("inf")], r"seconds must hold finite.*inf at index 1"),
    ([-1, 1e6], [1e-3, 2e-3], r"sizes_bytes must hold finite, non-negative.*-1 at index 0"),
    ([1e3, 1e6], [-1e-3, 2e-3], r"seconds must hold finite, non-negative.*-0.001 at index 0"),
    ([1e3, "1e6"], [1e-3, 2e-3], r"sizes_bytes must hold.*'1e6' at index 1"),
    ([1e3, 1e6], [None, 2e-3], r"seconds must hold.*None at index 0"),
    ([1e3, 1e6], [True, 2e-3], r"seconds must hold.*True at index 0"),
    ([], [], "sizes_bytes needs at least two different sizes"),
    ([1e3, 1e3, 1e3], [1e-3, 2e-3, 3e-3], "sizes_bytes needs at least two different sizes"),
])
def test_fit_alpha_beta_checks_its_input(sizes, seconds, match):
    with pytest.raises(ValueError, match=match) as raised:
        tl.fit_alpha_beta(sizes, seconds)
    assert not isinstance(raised.value, tl.AlphaBetaFitError)


def test_calibration_sizes_span_four_times_the_model():
    from dpcost.measure.timed import calibration_sizes

    sizes = calibration_sizes(4_000_000)
    assert sizes[0] == 4096 and sizes[-1] >= 4 * 4_000_000 and len(sizes) == 5
    assert sizes == sorted(set(sizes)) and all(size % 4 == 0 for size in sizes)
    assert [sizes[-1] // size for size in sizes[1:]] == [8, 4, 2, 1]
    assert len(set(calibration_sizes(10))) == 5  # a tiny model: still five different sizes
    big = calibration_sizes(10**9)  # a large one: the buffer is never larger than the model
    assert big[-1] == 10**9 and big[1] > 100e6


def timed_report(calibrations):
    """A report with one hand-made DDP timeline per rank and a DP one, as overlap_table reads."""
    return {"scenarios": {
        "ddp-timeline": [{"rank": rank, "timeline": ddp_iteration(),
                          "allreduce_calibration": calibration}
                         for rank, calibration in enumerate(calibrations)],
        "dp-timeline": [{"rank": 0, "timeline": [[0, *event] for event in (
            ("comm", "parameters out", 0, 5 * MS), ("compute", "forward", 5 * MS, 9 * MS))]}]}}


def test_overlap_table_reports_a_failed_fit_instead_of_crashing():
    good = {"sizes_bytes": [4096, 2e6, 4e6], "seconds": [1e-3 + 4096e-9, 3e-3, 5e-3]}
    bad = {"sizes_bytes": [4096, 2e6, 4e6], "seconds": [5e-3, 3e-3, 1e-3]}
    rows = tl.overlap_table(timed_report([good, bad]),
                            {"DDP": "ddp-timeline", "DP": "dp-timeline"})
    assert rows[0]["link_gb_per_s"] == pytest.approx(1.0) and "model_fit_error" not in rows[0]
    assert rows[0]["link_alpha_ms"] == pytest.approx(1.0)
    assert "4096 B: 5.000e-03 s" in rows[1]["model_fit_error"]
    assert not {"model_exposed_comm_ms", "link_gb_per_s", "link_alpha_ms"} & set(rows[1])
    assert rows[1]["exposed_comm_ms"] == pytest.approx(9.0)  # the measurement still stands
    lines = tl.render_overlap_table(rows).splitlines()
    assert lines[2].rstrip().endswith("%") and lines[3].rstrip().endswith("fit failed")
    assert lines[4].rstrip().endswith("-")  # DataParallel: no model
    assert lines[5].startswith("model fit failed for DDP, rank 1: cannot fit t = a + b·S")


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
        sizes = calibration["sizes_bytes"]
        assert sizes[0] == 4096 and sizes[-1] >= 4 * measured["param_bytes"]
        assert [len(times) for times in calibration["repeat_seconds"]] == \
            [calibration["repeats"]] * len(sizes)
        a, b = tl.fit_alpha_beta(sizes, calibration["seconds"])  # medians per size
        # ... and the same fit from every repeat: the fit takes the medians itself
        assert (a, b) == tl.fit_alpha_beta(
            [size for size, times in zip(sizes, calibration["repeat_seconds"], strict=True)
             for _ in times], [t for times in calibration["repeat_seconds"] for t in times])
        predicted = tl.predicted_ddp(row["timeline"], a, b)
        assert b > 0 and a >= 0 and 0 <= predicted["exposed_fraction"] <= 1
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


def test_the_measured_table_share_is_exposed_over_comm(measured):
    labels = {"DDP": "ddp-timeline", "DP": "dp-timeline", "DP chain": "dp-nccl-timeline"}
    for row in tl.overlap_table(measured, labels):
        assert row["exposed_fraction"] == pytest.approx(row["exposed_comm_ms"] / row["comm_ms"])
        if "model_comm_ms" in row:
            assert row["model_exposed_fraction"] == pytest.approx(
                row["model_exposed_comm_ms"] / row["model_comm_ms"])
    for row in measured["scenarios"]["ddp-timeline"]:
        iterations = len(tl.by_iteration(row["timeline"]))
        assert 0 <= tl.overlapping_allreduces(row["timeline"]) <= iterations
