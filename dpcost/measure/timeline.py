"""Read a measured timeline: exposed communication, the overlap model, and a Chrome trace.

A timed scenario's result (``dpcost/measure/timed.py``) holds ``timeline``: events
``[iteration, lane, name, start_ns, end_ns]`` with lanes "compute" (forward, backward, optimizer
step), "comm" (each bucket all-reduce; DP's parameters out and gradients in) and "grad" (a
parameter's gradient ready: start = end). Torch-free.

Exposed communication of an iteration = the time during which communication runs and compute
does not: the length of (union of comm intervals) minus (union of compute intervals). Under DDP
the ``loss.backward()`` call lasts until DDP has waited for every bucket, so its compute part
is taken to end at the last gradient ready; what follows is the exposed tail.

The overlap model predicts that tail from when each bucket was handed to the all-reduce, r_k,
and an α-β cost per all-reduce of S_k bytes, t(S) = a + b·S (fitted on this machine from lone
all-reduces, ``fit_alpha_beta``). It assumes the all-reduces run one after another, each at its
lone speed: bucket k completes at c_k = max(r_k, c_{k-1}) + t(S_k), and the exposed tail is
c_K - (last gradient ready). DDP hands the buckets over in index order (``reducer.cpp:
mark_bucket_ready``: "Buckets are reduced in sequence"), and on NCCL a group's collectives
queue on its one stream per device (``ProcessGroupNCCL.cpp: collective``, ``ncclStreams_``),
so they run in series there. Gloo does not promise it: a process group has
``ProcessGroupGloo::Options`` ``threads`` workers, 2 by default (read by
``powersgd_gloo.default_gloo_threads``), so two buckets' all-reduces can be in flight at once,
sharing the link and the cores; ``overlapping_allreduces`` counts the iterations where a
measured timeline shows that. Serial
completion is then the model, not a fact of the backend.

Shares: ``summary`` and ``predicted_ddp`` give the median of each time over the iterations,
and ``exposed_fraction`` = median exposed ÷ median communication, the ratio of the two medians
they print (not the median of per-iteration ratios, which need not equal it).
"""

from __future__ import annotations

import itertools
import json
import math
import numbers
import statistics

from dpcost.step_time import serial_completion
from dpcost.timeline_events import LANES, by_iteration


def _union_length(intervals) -> int:
    total, current_start, current_end = 0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


def _subtract(intervals, holes):
    """Length of the union of ``intervals`` minus the part covered by ``holes``."""
    cut = []
    for start, end in intervals:
        pieces = [(start, end)]
        for hole_start, hole_end in holes:
            pieces = [piece for s, e in pieces for piece in
                      ((s, min(e, hole_start)), (max(s, hole_end), e)) if piece[1] > piece[0]]
        cut.extend(pieces)
    return _union_length(cut)


def compute_intervals(events) -> list:
    """Compute spans of one iteration; backward ends at the last gradient ready if any."""
    ready = [start for lane, _, start, _ in events if lane == "grad"]
    spans = []
    for lane, name, start, end in events:
        if lane != "compute":
            continue
        if name == "backward" and ready:
            end = min(end, max(ready))
        spans.append((start, end))
    return spans


def iteration_summary(events) -> dict:
    """Seconds of one iteration: step, compute, communication, exposed communication."""
    comm = [(start, end) for lane, _, start, end in events if lane == "comm"]
    compute = compute_intervals(events)
    first = min(start for _, _, start, _ in events)
    last = max(end for _, _, _, end in events)
    exposed = _subtract(comm, compute)
    comm_total = _union_length(comm)
    return {"step_s": (last - first) / 1e9, "compute_s": _union_length(compute) / 1e9,
            "comm_s": comm_total / 1e9, "exposed_comm_s": exposed / 1e9,
            "exposed_fraction": exposed / comm_total if comm_total else 0.0}


def summary(events) -> dict:
    """The median of each time in ``iteration_summary`` over the measured iterations;
    ``exposed_fraction`` = median exposed ÷ median communication (module docstring)."""
    rows = [iteration_summary(evs) for evs in by_iteration(events).values()]
    medians = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
    return _with_share(medians)


def _with_share(medians: dict) -> dict:
    comm = medians["comm_s"]
    return {**medians, "exposed_fraction": medians["exposed_comm_s"] / comm if comm else 0.0}


def overlapping_allreduces(events) -> int:
    """How many iterations have a bucket all-reduce that starts before the one before it ends:
    two all-reduces in flight at once, which the serial overlap model does not assume."""
    count = 0
    for evs in by_iteration(events).values():
        spans = bucket_events(evs)
        count += any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans))
    return count


def bucket_events(events) -> list:
    """(start_ns, end_ns, bytes) of each bucket all-reduce, in the order DDP launched them."""
    out = []
    for lane, name, start, end in events:
        if lane == "comm" and name.startswith("bucket "):
            out.append((start, end, int(name.split("(")[1].split(" ")[0])))
    return sorted(out)


class AlphaBetaFitError(ValueError):
    """The timings give no positive seconds per byte, so there is no α-β model to fit.

    ``sizes_bytes`` and ``seconds``: the distinct sizes, ascending, and the median seconds at
    each, as the fit saw them; ``slope``: the median pairwise slope it found, in seconds per byte.
    """

    def __init__(self, sizes_bytes, seconds, slope):
        self.sizes_bytes, self.seconds, self.slope = list(sizes_bytes), list(seconds), slope
        points = ", ".join(f"{size:g} B: {t:.3e} s" for size, t in zip(sizes_bytes, seconds,
                                                                         strict=True))
        super().__init__(
            f"cannot fit t = a + b·S with b > 0: the median pairwise slope is {slope:.3e} s/B. "
            f"Median seconds per size: {points}. The timings do not grow with the size: the "
            "machine was too busy for them, or the sizes are too close together; time larger "
            "sizes or more repeats")


def _finite_non_negative(values, name: str) -> list[float]:
    out = []
    for index, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
                math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must hold finite, non-negative numbers, got {value!r} at "
                             f"index {index}")
        out.append(float(value))
    return out


def fit_alpha_beta(sizes_bytes, seconds) -> tuple[float, float]:
    """a (seconds) and b (seconds per byte) of t = a + b·S over measured (S, t) pairs.

    ``sizes_bytes[i]`` bytes took ``seconds[i]`` seconds; a size may repeat (one entry per timed
    repeat). Robust to a busy machine, where a few timings come out milliseconds late:

    1. t̃(S) = the median of the seconds timed at each distinct size S (late repeats drop out);
    2. b = the median, over all pairs S_i < S_j, of (t̃(S_j) - t̃(S_i)) / (S_j - S_i): the
       Theil–Sen slope, which ignores a minority of bad sizes that would tilt least squares,
       even into a negative slope;
    3. a = max(0, median over S of t̃(S) - b·S): a latency is not negative.

    Raises ``ValueError`` for lists of different lengths, values that are not finite and
    non-negative, or fewer than two different sizes; ``AlphaBetaFitError`` (a ``ValueError``)
    when b ≤ 0: a negative seconds per byte is no model, and none is returned.
    """
    sizes_bytes, seconds = list(sizes_bytes), list(seconds)
    if len(sizes_bytes) != len(seconds):
        raise ValueError(f"sizes_bytes and seconds must have the same length, got "
                         f"{len(sizes_bytes)} and {len(seconds)}")
    sizes = _finite_non_negative(sizes_bytes, "sizes_bytes")
    times = _finite_non_negative(seconds, "seconds")
    by_size = {}
    for size, t in zip(sizes, times, strict=True):
        by_size.setdefault(size, []).append(t)
    if len(by_size) < 2:
        raise ValueError(f"sizes_bytes needs at least two different sizes, got "
                         f"{sorted(by_size)}")
    distinct = sorted(by_size)
    medians = [statistics.median(by_size[size]) for size in distinct]
    points = list(zip(distinct, medians, strict=True))
    b = statistics.median((t_j - t_i) / (s_j - s_i)
                          for (s_i, t_i), (s_j, t_j) in itertools.combinations(points, 2))
    if not b > 0:
        raise AlphaBetaFitError(distinct, medians, b)
    return max(0.0, statistics.median(t - b * s for s, t in points)), b


def predicted_exposed_s(ready_ns, sizes_bytes, a: float, b: float, last_ready_ns: int) -> float:
    """The overlap model's exposed tail in seconds (module docstring): c_K - last ready."""
    if len(ready_ns) != len(sizes_bytes):
        raise ValueError("ready_ns and sizes_bytes must have one entry per bucket")
    spans = serial_completion(ready_ns, [(a + b * size) * 1e9 for size in sizes_bytes])
    return max(0.0, (spans[-1][1] - last_ready_ns) / 1e9) if spans else 0.0


def predicted_ddp(events, a: float, b: float) -> dict:
    """The overlap model for a DDP timeline, in seconds, median over iterations: the exposed
    tail, and the all-reduce time it assumes, sum of t(S_k); ``exposed_fraction`` is the ratio
    of those two medians."""
    rows = []
    for evs in by_iteration(events).values():
        buckets = bucket_events(evs)
        ready = [start for lane, _, start, _ in evs if lane == "grad"]
        sizes = [size for _, _, size in buckets]
        exposed = predicted_exposed_s([s for s, _, _ in buckets], sizes, a, b, max(ready))
        rows.append({"exposed_comm_s": exposed, "comm_s": sum(a + b * size for size in sizes)})
    return _with_share({key: statistics.median(row[key] for row in rows) for key in rows[0]})


def chrome_trace(timelines: dict, iterations=None) -> dict:
    """Chrome / Perfetto trace-event JSON for ``{label: [rank 0's events, rank 1's, ...]}``.

    One process per (label, rank), one thread per lane; complete events ("ph": "X") with
    microsecond times from the earliest event, instants ("ph": "i") for gradients ready.
    Open the file in https://ui.perfetto.dev or chrome://tracing.
    """
    origin = min(event[3] for ranks in timelines.values() for events in ranks for event in events)
    trace = []
    pid = 0
    for label, ranks in timelines.items():
        for rank, events in enumerate(ranks):
            trace.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                          "args": {"name": f"{label} rank {rank}"}})
            for tid, lane in enumerate(LANES):
                trace.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                              "args": {"name": lane}})
            for iteration, lane, name, start, end in events:
                if iterations is not None and iteration not in iterations:
                    continue
                common = {"name": name, "pid": pid, "tid": LANES.index(lane),
                          "ts": (start - origin) / 1e3, "args": {"iteration": iteration}}
                if lane == "grad":
                    trace.append({**common, "ph": "i", "s": "t"})
                else:
                    trace.append({**common, "ph": "X", "dur": (end - start) / 1e3})
            pid += 1
    return {"traceEvents": trace, "displayTimeUnit": "ms"}


def write_chrome_trace(path, timelines: dict, iterations=None) -> dict:
    """Write ``chrome_trace(...)`` to ``path`` as JSON; returns the trace."""
    trace = chrome_trace(timelines, iterations)
    with open(path, "w") as file:
        json.dump(trace, file)
    return trace


def timelines_of(report: dict, labels: dict) -> dict:
    """{label: [rank 0's events, rank 1's, ...]} for ``labels`` = {label: scenario name}."""
    return {label: [row["timeline"] for row in report["scenarios"][name]]
            for label, name in labels.items()}


def _model_columns(row: dict) -> dict:
    """overlap_table's model keys for one DDP rank, or {"model_fit_error": message}."""
    calibration = row["allreduce_calibration"]
    try:
        a, b = fit_alpha_beta(calibration["sizes_bytes"], calibration["seconds"])
    except AlphaBetaFitError as error:
        return {"model_fit_error": str(error)}
    model = predicted_ddp(row["timeline"], a, b)
    return {"model_exposed_comm_ms": model["exposed_comm_s"] * 1e3,
            "model_comm_ms": model["comm_s"] * 1e3,
            "model_exposed_fraction": model["exposed_fraction"],
            "link_alpha_ms": a * 1e3, "link_gb_per_s": 1 / b / 1e9}


def overlap_table(report: dict, labels: dict) -> list[dict]:
    """One row per (scenario, rank): measured medians in ms, and for DDP the overlap model's.

    Keys: step_ms, compute_ms, comm_ms, exposed_comm_ms, exposed_fraction (= the median
    exposed ÷ the median communication, so exposed_comm_ms / comm_ms); for DDP also
    model_exposed_comm_ms, model_comm_ms, model_exposed_fraction, link_alpha_ms (a in ms) and
    link_gb_per_s (1 / b in GB/s), from the lone all-reduces each DDP rank timed before training
    (``timed.calibrate_allreduce``), fitted as t = a + b·S (``fit_alpha_beta``). Where those
    timings give no positive b, the row has model_fit_error (the fit's message) instead of the
    model's keys: one noisy rank must not stop a lesson.
    """
    rows = []
    for label, name in labels.items():
        for row in report["scenarios"][name]:
            measured = summary(row["timeline"])
            entry = {"scenario": label, "rank": row["rank"],
                     "exposed_fraction": measured["exposed_fraction"]}
            for key in ("step", "compute", "comm", "exposed_comm"):
                entry[f"{key}_ms"] = measured[f"{key}_s"] * 1e3
            if "allreduce_calibration" in row:
                entry.update(_model_columns(row))
            rows.append(entry)
    return rows


def render_overlap_table(rows: list[dict]) -> str:
    """``overlap_table`` for people: ms per iteration, medians over the measured window. The
    share is exposed ÷ comm of the two medians printed beside it; the model's, its exposed ÷
    its communication (sum of t(S_k)).

    The model column shows "-" for rows without a model (DataParallel) and "fit failed" where
    the α-β fit failed; each failure's message follows the table.
    """
    lines = [f"{'scenario':<32} {'rank':>4} {'step':>7} {'compute':>8} {'comm':>7} "
             f"{'exposed':>8} {'exposed':>8}   {'model: exposed':<16}",
             f"{'':<32} {'':>4} {'ms':>7} {'ms':>8} {'ms':>7} {'ms':>8} {'share':>8}"]
    failures = []
    for row in rows:
        if "model_fit_error" in row:
            model = "fit failed"
            failures.append(f"{row['scenario']}, rank {row['rank']}: {row['model_fit_error']}")
        elif "model_exposed_comm_ms" in row:
            model = (f"{row['model_exposed_comm_ms']:.1f} ms, "
                     f"{100 * row['model_exposed_fraction']:.0f} %")
        else:
            model = "-"
        lines.append(f"{row['scenario']:<32} {row['rank']:>4} {row['step_ms']:>7.1f} "
                     f"{row['compute_ms']:>8.1f} {row['comm_ms']:>7.1f} "
                     f"{row['exposed_comm_ms']:>8.1f} {100 * row['exposed_fraction']:>7.0f}%   "
                     f"{model:<16}")
    lines.extend(f"model fit failed for {failure}" for failure in failures)
    return "\n".join(lines)
