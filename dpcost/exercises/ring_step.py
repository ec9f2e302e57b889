"""Exercise 2: the student writes one step of the ring's schedule; the simulator runs it.

The student writes ``reduce_scatter_sends(num_ranks, step)`` and/or
``all_gather_sends(num_ranks, step)``: the list of ``(src_rank, dst_rank, chunk)`` sends of one
step. ``check(fn)`` compares a few steps with the ring schedule of the course (a table);
``submit(...)`` passes the student's functions to :func:`dpcost.ring.simulate_ring_allreduce`,
which moves real numpy data and counts the bytes, for n = 2..8 ranks, and verifies

- the result: every rank ends with the elementwise sum of all inputs (computed here), and
- the bytes: every rank sends and receives 2 (n - 1) / n * S bytes (S = one array's bytes),
  one chunk per step - the ring's point.

Any schedule that does both passes ``submit``, not only the course's. When only one phase is
given, the other phase uses the package's reference schedule (said in the report). Every run
happens in a forked child with a time limit (:mod:`dpcost.exercises.sandbox`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from dpcost import ring  # here, not in the child: the grader's children cannot import dpcost
from dpcost.exercises.report import Report, TestResult
from dpcost.exercises.sandbox import (
    DEFAULT_TIMEOUT,
    NO_RESULT,
    Outcome,
    is_package_function,
    protections,
    run_many,
    student_function_name,
    withhold,
)

PHASE_NAMES = ("reduce_scatter_sends", "all_gather_sends")
EVEN_LENGTH = 840  # divisible by 1..8, so every chunk has 840 / n elements
UNEVEN_CASES = [(3, 10), (5, 7), (8, 5)]  # (ranks, length): chunks differ by one element


def course_schedule(phase: str, num_ranks: int, step: int) -> list[tuple[int, int, int]]:
    """The course's ring schedule, written out here for ``check`` (sorted by sender).

    reduce-scatter, step s: rank r sends chunk (r - s) mod n to rank (r + 1) mod n (added);
    all-gather, step s: rank r sends chunk (r + 1 - s) mod n to rank (r + 1) mod n (copied).
    """
    n, s = num_ranks, step
    if phase == "reduce_scatter_sends":
        return [(r, (r + 1) % n, (r - s) % n) for r in range(n)]
    if phase == "all_gather_sends":
        return [(r, (r + 1) % n, (r + 1 - s) % n) for r in range(n)]
    raise ValueError(f"phase must be one of {', '.join(PHASE_NAMES)}; got {phase!r}")


CHECK_STEPS = [(2, 0), (3, 0), (3, 1), (4, 0), (4, 2)]  # (num_ranks, step) shown by check


def _phase_name(fn) -> str:
    return student_function_name(fn, PHASE_NAMES, "check(reduce_scatter_sends)", "schedule")


def _as_sends(value):
    """The sends sorted, or None when ``value`` is not a list of 3-tuples of ints."""
    if not isinstance(value, list):
        return None
    for send in value:
        if not (isinstance(send, tuple) and len(send) == 3 and all(
                isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
                for v in send)):
            return None
    return sorted(tuple(int(v) for v in send) for send in value)


def _judge_sends(expected, outcome: Outcome) -> str:
    if outcome.status in NO_RESULT:
        return outcome.detail
    if outcome.status == "raised":
        if outcome.error_type == "NotImplementedError":
            return "not written yet (it still raises NotImplementedError)"
        return f"raised {outcome.describe()}"
    sends = _as_sends(outcome.value)
    if sends is None:
        return "must return a list of (src, dst, chunk) tuples of ints"
    if sends != expected:
        missing = sorted(set(expected) - set(sends))
        extra = sorted(set(sends) - set(expected))
        return f"missing sends {missing}, unexpected sends {extra}"
    return ""


def check(fn, *, timeout: float = DEFAULT_TIMEOUT) -> Report:
    """Compare a few steps of your schedule ``fn`` with the course's ring; return a table."""
    name = _phase_name(fn)
    outcomes = run_many([(fn, (n, s), {}) for n, s in CHECK_STEPS], timeout)
    report = Report(f"check({name}): sends of a few steps, as (src, dst, chunk)", "check")
    for (n, s), outcome in zip(CHECK_STEPS, outcomes, strict=True):
        expected = course_schedule(name, n, s)
        reason = _judge_sends(expected, outcome)
        report.results.append(TestResult(name, "worked example", f"{name}({n}, {s})",
                                         str(expected), outcome.describe(), not reason, reason,
                                         outcome.stdout))
    report.protections = protections()  # what confined the child (not shown in the table)
    withhold(report, *report.results)  # later children do not see its expected values
    return report


def _simulate_plain(inputs, reduce_scatter_sends, all_gather_sends) -> tuple:
    """Run the simulator on the student's schedules and return its trace as plain data.

    Runs in the sandbox's child (the kernel receives only these tuples of ints and strings):
    (outputs per rank, bytes sent per rank, bytes received per rank, (phase, step, src, dst)
    per transfer).
    """
    trace = ring.simulate_ring_allreduce(inputs, reduce_scatter_sends, all_gather_sends)
    return (tuple(tuple(out.tolist()) for out in trace.outputs), tuple(trace.sent_bytes),
            tuple(trace.received_bytes),
            tuple((t.phase, t.step, t.src, t.dst) for t in trace.transfers))


@dataclass
class _Trace:
    """What the kernel keeps of one simulated all-reduce (plain data, checked)."""

    outputs: list[np.ndarray]
    sent_bytes: tuple
    received_bytes: tuple
    transfers: tuple  # (phase, step, src, dst)


def _ints(values, count=None) -> bool:
    return isinstance(values, tuple) and (count is None or len(values) == count) and all(
        type(v) is int for v in values)


def _trace(outcome: Outcome, num_ranks: int, length: int) -> _Trace | None:
    """The trace of ``_simulate_plain``, or None when the value is not of that shape."""
    value = outcome.value
    if not (isinstance(value, tuple) and len(value) == 4):
        return None
    outputs, sent, received, transfers = value
    if not (isinstance(outputs, tuple) and len(outputs) == num_ranks
            and all(_ints(out, length) for out in outputs)
            and _ints(sent, num_ranks) and _ints(received, num_ranks)
            and isinstance(transfers, tuple) and all(
                isinstance(t, tuple) and len(t) == 4 and type(t[0]) is str and _ints(t[1:])
                for t in transfers)):
        return None
    return _Trace([np.array(out, dtype=np.int64) for out in outputs], sent, received, transfers)


def _inputs(num_ranks: int, length: int) -> list[np.ndarray]:
    # Integers, so "every rank holds the sum" means exactly; seeded per setting.
    rng = np.random.default_rng(1000 * num_ranks + length)
    return [rng.integers(-1000, 1000, size=length, dtype=np.int64) for _ in range(num_ranks)]


def _judge_result(inputs, outcome: Outcome, trace: _Trace | None) -> tuple[str, str]:
    """(got, reason) for "every rank ends with the sum of all inputs"."""
    if trace is None:
        return outcome.describe(), _run_failure(outcome)
    total = np.sum(np.stack(inputs), axis=0)  # the sum, computed here, not by the simulator
    for rank, out in enumerate(trace.outputs):
        if not np.array_equal(out, total):
            wrong = int(np.count_nonzero(out != total))
            return (f"rank {rank} wrong at {wrong} of {total.size} elements",
                    f"rank {rank} does not hold the sum: a chunk was never added, added twice, "
                    "or not copied to every rank")
    return "every rank holds the sum", ""


def _run_failure(outcome: Outcome) -> str:
    if outcome.status == "raised" and outcome.error_type == "NotImplementedError":
        return "not written yet (it still raises NotImplementedError)"
    if outcome.status == "raised":
        return f"the simulator stopped: {outcome.describe()}"
    if outcome.status == "returned":
        return ("the simulator's trace did not come back as expected"
                + (f": {outcome.value_note}" if outcome.value_note else ""))
    return outcome.detail


def _judge_bytes(num_ranks: int, nbytes: int, outcome: Outcome, trace: _Trace | None
                 ) -> tuple[str, str]:
    """(got, reason) for "each rank sends and receives 2 (n - 1) / n * S bytes"."""
    if trace is None:
        return outcome.describe(), _run_failure(outcome)
    want = 2 * (num_ranks - 1) * nbytes // num_ranks  # exact: S divides by n here
    for rank in range(num_ranks):
        sent, received = trace.sent_bytes[rank], trace.received_bytes[rank]
        if (sent, received) != (want, want):
            return (f"rank {rank} sent {sent} B, received {received} B",
                    f"each rank must send and receive 2(n-1)/n*S = {want} bytes; rank {rank} "
                    f"sent {sent} and received {received}")
    return f"every rank sent and received {want} B", ""


def _judge_balance(num_ranks: int, outcome: Outcome, trace: _Trace | None) -> tuple[str, str]:
    """(got, reason) for "in every step each rank sends one chunk and receives one"."""
    if trace is None:
        return outcome.describe(), _run_failure(outcome)
    steps: dict[tuple[str, int], list] = {}
    for phase, step, src, dst in trace.transfers:
        steps.setdefault((phase, step), []).append((src, dst))
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(num_ranks - 1):
            records = steps.get((phase, step), [])
            senders = sorted(src for src, _ in records)
            receivers = sorted(dst for _, dst in records)
            if senders != list(range(num_ranks)) or receivers != list(range(num_ranks)):
                return (f"{phase} step {step}: senders {senders}, receivers {receivers}",
                        "in a ring step every rank sends exactly one chunk and receives "
                        "exactly one")
    return "one chunk per rank per step", ""


def submit(*fns, timeout: float = DEFAULT_TIMEOUT) -> Report:
    """Run your schedule(s) through the simulator for n = 2..8; return score and failures.

    Pass ``reduce_scatter_sends``, ``all_gather_sends`` or both; ``submit()`` with no arguments
    takes whichever of the two is defined where it is called. A phase not given runs the
    package's reference schedule (``dpcost.ring``), so each phase can be practised alone.
    """
    if fns:
        given = {_phase_name(fn): fn for fn in fns}
    else:
        caller = sys._getframe(1).f_globals
        given = {name: caller[name] for name in PHASE_NAMES if callable(caller.get(name))}
        for name, fn in given.items():
            if is_package_function(fn):
                raise ValueError(f"{name} here is the dpcost package's own schedule (imported "
                                 "from dpcost?); define your own in the notebook instead")
    if not given:
        raise ValueError("define reduce_scatter_sends and/or all_gather_sends first, then "
                         "pass them: submit(reduce_scatter_sends, all_gather_sends)")
    return simulator_report(given, timeout)


def simulator_report(given: dict, timeout: float = DEFAULT_TIMEOUT) -> Report:
    """Run the schedules ``given`` ({phase name: function}; the reference runs a phase not
    given) through the simulator for n = 2..8; a :class:`Report`. ``submit`` calls this for
    the notebook's functions, ``dpcost.exercises.grade`` for those the notebook's file defines.
    """
    rs = given.get("reduce_scatter_sends", ring.ring_reduce_scatter_sends)
    ag = given.get("all_gather_sends", ring.ring_all_gather_sends)
    label = " + ".join(name for name in PHASE_NAMES if name in given)
    report = Report(f"submit: {label} in the ring simulator, n = 2..8", "submit")
    for name in PHASE_NAMES:
        if name not in given:
            report.notes.append(f"{name}: not given, so the package's reference schedule "
                                "runs that phase.")
    settings = [(n, EVEN_LENGTH) for n in range(2, 9)] + UNEVEN_CASES
    inputs = {setting: _inputs(*setting) for setting in settings}
    # In the child the simulator runs; the reference of a phase the student wrote does not.
    references = {"reduce_scatter_sends": ring.ring_reduce_scatter_sends,
                  "all_gather_sends": ring.ring_all_gather_sends}
    outcomes = run_many([(_simulate_plain, (inputs[setting], rs, ag), {})
                         for setting in settings], timeout, max_timeouts=2,
                        allowed=("dpcost.ring",),
                        refused=[references[name] for name in given])
    for (n, length), outcome in zip(settings, outcomes, strict=True):
        nbytes = length * 8  # int64
        call = f"{n} ranks, {length} int64 each (S = {nbytes} B)"
        trace = _trace(outcome, n, length) if outcome.returned else None
        judged = [("result", "every rank holds the sum", _judge_result(inputs[n, length],
                                                                        outcome, trace))]
        if length == EVEN_LENGTH:
            want = 2 * (n - 1) * nbytes // n
            judged.append(("bytes per rank", f"each rank sends and receives {want} B",
                           _judge_bytes(n, nbytes, outcome, trace)))
            if n in (2, 5, 8):
                judged.append(("one chunk per rank per step", "one chunk per rank per step",
                               _judge_balance(n, outcome, trace)))
        else:
            judged.append(("total bytes", f"2(n-1)*S = {2 * (n - 1) * nbytes} B in all",
                           _judge_total(n, nbytes, outcome, trace)))
        for category, expected, (got, reason) in judged:
            report.results.append(TestResult(label, f"n = {n}: {category}", call, expected, got,
                                             not reason, reason, outcome.stdout))
    report.protections = protections()  # what confined the child (not shown in the table)
    withhold(report, *report.results)  # later children do not see its expected values
    return report


def _judge_total(num_ranks: int, nbytes: int, outcome: Outcome, trace: _Trace | None
                 ) -> tuple[str, str]:
    """(got, reason) for "all ranks together send 2 (n - 1) S bytes" (uneven chunks)."""
    if trace is None:
        return outcome.describe(), _run_failure(outcome)
    total, want = sum(trace.sent_bytes), 2 * (num_ranks - 1) * nbytes
    if total != want:
        return (f"{total} B in all", f"the ranks together must send 2(n-1)*S = {want} bytes "
                                     f"(each chunk n-1 times per phase), not {total}")
    return f"{total} B in all", ""
