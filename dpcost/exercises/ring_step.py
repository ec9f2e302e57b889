"""Exercise 2: the student writes one step of the ring's schedule; the simulator runs it.

The student writes ``reduce_scatter_sends(num_ranks, step)`` and/or
``all_gather_sends(num_ranks, step)``: the ``(src_rank, dst_rank, chunk)`` sends of one step, as
a list of tuples (lists of 3 ints are accepted too). ``check(fn)`` compares a few steps with the
course's ring, in either direction (a table); ``submit(...)`` grades the schedule's *effect*:
the sandbox's child only calls the student's functions for every step and sends back the sends
(plain data); here, :func:`dpcost.ring.simulate_ring_allreduce` moves real numpy data along
them for n = 2..8 ranks, and the checker verifies

- the result: every rank ends with the elementwise sum of all inputs (computed here),
- the bytes: every rank sends and receives 2 (n - 1) / n * S bytes (S = one array's bytes), and
- the ring's point: in every step each rank sends one chunk and receives one.

The promise, precisely: any pair of schedules that does these three passes ``submit`` - the
ring in either direction, or with the chunks numbered otherwise. A phase given alone runs with a
ring for the other phase that fits it: after a reduce-scatter given alone, a ring all-gather that
starts from the chunk each rank holds summed; before an all-gather given alone, a ring
reduce-scatter that leaves summed on each rank the chunk that the all-gather sends from it first
(for the course's schedules, these are the course's). Every call of the student's code happens
in a forked child with a time limit (:mod:`dpcost.grading.sandbox`).
"""

from __future__ import annotations

import sys

import numpy as np

from dpcost import ring  # in the checker only: the student's code never needs it
from dpcost.exercises.report import Report, TestResult, solution_pointer
from dpcost.grading.sandbox import (
    DEFAULT_TIMEOUT,
    NO_RESULT,
    Outcome,
    is_package_function,
    protections,
    run_many,
    student_function_name,
    withhold,
)

Send = tuple[int, int, int]

PHASE_NAMES = ("reduce_scatter_sends", "all_gather_sends")
EVEN_LENGTH = 840  # divisible by 1..8, so every chunk has 840 / n elements
UNEVEN_CASES = [(3, 10), (5, 7), (8, 5)]  # (ranks, length): chunks differ by one element


def course_schedule(phase: str, num_ranks: int, step: int) -> list[Send]:
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


def mirrored_schedule(phase: str, num_ranks: int, step: int) -> list[Send]:
    """The same ring the other way round (rank r sends to rank (r - 1) mod n), sorted by sender.

    reduce-scatter, step s: rank r sends chunk (r + s) mod n (afterwards rank r holds chunk
    (r - 1) mod n summed); all-gather, step s: rank r sends chunk (r - 1 + s) mod n.
    """
    n, s = num_ranks, step
    if phase == "reduce_scatter_sends":
        return [(r, (r - 1) % n, (r + s) % n) for r in range(n)]
    if phase == "all_gather_sends":
        return [(r, (r - 1) % n, (r - 1 + s) % n) for r in range(n)]
    raise ValueError(f"phase must be one of {', '.join(PHASE_NAMES)}; got {phase!r}")


CHECK_STEPS = [(2, 0), (3, 0), (3, 1), (4, 0), (4, 2)]  # (num_ranks, step) shown by check


def _phase_name(fn) -> str:
    return student_function_name(fn, PHASE_NAMES, "check(reduce_scatter_sends)", "schedule")


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _as_sends(value):
    """The sends sorted, as tuples of ints, or None unless ``value`` is a list (or tuple) of
    sends, each a tuple (or list) of 3 ints."""
    if not isinstance(value, (list, tuple)):
        return None
    for send in value:
        if not (isinstance(send, (tuple, list)) and len(send) == 3 and all(
                _is_int(v) for v in send)):
            return None
    return sorted(tuple(int(v) for v in send) for send in value)


SENDS_SHAPE = "a list of (src, dst, chunk) sends, each a tuple (or list) of 3 ints"


def _judge_sends(name: str, num_ranks: int, step: int, outcome: Outcome) -> tuple[str, str]:
    """(reason, note) for one step against the course's ring: '' when it is the course's ring
    or its mirror image (the note then says which)."""
    if outcome.status in NO_RESULT:
        return outcome.detail, ""
    if outcome.status == "raised":
        if outcome.error_type == "NotImplementedError":
            return "not written yet (it still raises NotImplementedError)", ""
        return f"raised {outcome.describe()}", ""
    sends = _as_sends(outcome.value)
    if sends is None:
        return f"must return {SENDS_SHAPE}", ""
    expected = course_schedule(name, num_ranks, step)
    if sends == expected:
        return "", ""
    if sends == mirrored_schedule(name, num_ranks, step):
        return "", "the ring the other way round (to rank r - 1): also right"
    missing = sorted(set(expected) - set(sends))
    extra = sorted(set(sends) - set(expected))
    return f"missing sends {missing}, unexpected sends {extra}", ""


def check(fn, *, timeout: float = DEFAULT_TIMEOUT) -> Report:
    """Compare a few steps of your schedule ``fn`` with the course's ring; return a table.

    The ring in the other direction (rank r sends to rank r - 1) passes too; ``submit`` grades
    any schedule by what it does.
    """
    name = _phase_name(fn)
    outcomes = run_many([(fn, (n, s), {}) for n, s in CHECK_STEPS], timeout)
    report = Report(f"check({name}): sends of a few steps, as (src, dst, chunk)", "check")
    for (n, s), outcome in zip(CHECK_STEPS, outcomes, strict=True):
        reason, note = _judge_sends(name, n, s, outcome)
        got = outcome.describe() + (f" - {note}" if note else "")
        report.results.append(TestResult(name, "worked example", f"{name}({n}, {s})",
                                         str(course_schedule(name, n, s)), got, not reason,
                                         reason, outcome.stdout))
    if report.failures:
        report.footer.append(solution_pointer(name))
    report.protections = protections()  # what confined the child (not shown in the table)
    withhold(report, *report.results)  # later children do not see its expected values
    return report



def _collect_sends(schedules, num_ranks: int) -> tuple:
    """Runs in the sandbox's child: what each schedule returns for every step, as it is.

    Only these values come back (plain data, or the test fails); the checker validates them and
    runs the simulator itself.
    """
    return tuple(tuple(schedule(num_ranks, step) for step in range(num_ranks - 1))
                 for schedule in schedules)


def _validated(name: str, num_ranks: int, step: int, value) -> list[Send]:
    """The sends of one step, checked; ValueError saying what is wrong otherwise."""
    call = f"{name}({num_ranks}, {step})"
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{call} must return {SENDS_SHAPE}; got {type(value).__name__}")
    sends = []
    for send in value:
        if not (isinstance(send, (list, tuple)) and len(send) == 3
                and all(_is_int(v) for v in send)):
            raise ValueError(f"{call} returned {send!r}: must return {SENDS_SHAPE}")
        src, dst, chunk = (int(v) for v in send)
        if not (0 <= src < num_ranks and 0 <= dst < num_ranks and 0 <= chunk < num_ranks):
            raise ValueError(f"{call} returned {send!r}: ranks and chunks are 0..{num_ranks - 1}")
        if src == dst:
            raise ValueError(f"{call} returned {send!r}: a rank cannot send to itself")
        sends.append((src, dst, chunk))
    return sends


def _summed_chunks(reduce_scatter: list[list[Send]], num_ranks: int) -> list[int] | None:
    """After running ``reduce_scatter``, the chunk that each rank holds fully summed, as
    [chunk of rank 0, ...] when every rank holds exactly one, each a different chunk; else None."""
    placeholder = [np.zeros(num_ranks, dtype=np.int64) for _ in range(num_ranks)]
    trace = ring.simulate_ring_allreduce(placeholder, lambda n, s: reduce_scatter[s],
                                         lambda n, s: [])
    everyone = frozenset(range(num_ranks))
    holdings = trace.snapshots[num_ranks - 2].holdings  # after the last reduce-scatter step
    owned = [[c for c in range(num_ranks) if holdings[r][c] == everyone]
             for r in range(num_ranks)]
    if all(len(chunks) == 1 for chunks in owned) and len({c[0] for c in owned}) == num_ranks:
        return [chunks[0] for chunks in owned]
    return None


def _first_sends(all_gather: list[list[Send]], num_ranks: int) -> list[int] | None:
    """The chunk each rank sends at the all-gather's step 0 (the one it must hold summed), as
    [chunk of rank 0, ...] when every rank sends exactly one, each a different chunk; else None."""
    first = all_gather[0] if all_gather else []
    by_rank = {src: chunk for src, _, chunk in first}
    if (len(first) == num_ranks and sorted(by_rank) == list(range(num_ranks))
            and len(set(by_rank.values())) == num_ranks):
        return [by_rank[r] for r in range(num_ranks)]
    return None


def fitting_all_gather(summed: list[int], num_ranks: int) -> list[list[Send]]:
    """A ring all-gather (to rank r + 1) after a reduce-scatter that left chunk ``summed[r]``
    on rank r: at step s, rank r sends chunk summed[(r - s) mod n], the one it received last."""
    n = num_ranks
    return [[(r, (r + 1) % n, summed[(r - s) % n]) for r in range(n)] for s in range(n - 1)]


def fitting_reduce_scatter(summed: list[int], num_ranks: int) -> list[list[Send]]:
    """A ring reduce-scatter (to rank r + 1) that leaves chunk ``summed[r]`` summed on rank r:
    that chunk starts at rank r + 1, so at step s rank r sends chunk summed[(r - 1 - s) mod n]."""
    n = num_ranks
    return [[(r, (r + 1) % n, summed[(r - 1 - s) % n]) for r in range(n)] for s in range(n - 1)]


def _inputs(num_ranks: int, length: int) -> list[np.ndarray]:
    # Integers, so "every rank holds the sum" means exactly; seeded per setting.
    rng = np.random.default_rng(1000 * num_ranks + length)
    return [rng.integers(-1000, 1000, size=length, dtype=np.int64) for _ in range(num_ranks)]


def _run_failure(outcome: Outcome) -> str:
    if outcome.status == "raised" and outcome.error_type == "NotImplementedError":
        return "not written yet (it still raises NotImplementedError)"
    if outcome.status == "raised":
        return f"your schedule raised {outcome.describe()}"
    if outcome.status == "returned":
        return ("your schedule's sends did not come back as expected"
                + (f": {outcome.value_note}" if outcome.value_note else ""))
    return outcome.detail


def _simulate(given: dict, steps: dict, num_ranks: int, length: int):
    """Run the simulator on the student's validated steps (a fitting ring for a phase not
    given); (trace, why the result may be wrong)."""
    n = num_ranks
    rs, ag = steps.get("reduce_scatter_sends"), steps.get("all_gather_sends")
    hint = ""
    if rs is None:
        summed = _first_sends(ag, n)
        rs = fitting_reduce_scatter(summed if summed else [(r + 1) % n for r in range(n)], n)
        if summed is None:
            hint = ("at your all-gather's step 0 each rank must send one chunk, a different one "
                    "per rank: the chunk it holds summed")
    if ag is None:
        summed = _summed_chunks(rs, n)
        ag = fitting_all_gather(summed if summed else [(r + 1) % n for r in range(n)], n)
        if summed is None:
            hint = ("after your reduce-scatter each rank must hold one chunk summed over all "
                    "ranks, a different one per rank")
    if len(given) == 2:
        summed, first = _summed_chunks(rs, n), _first_sends(ag, n)
        if summed is None:
            hint = ("after your reduce-scatter each rank must hold one chunk summed over all "
                    "ranks, a different one per rank")
        elif first is not None and first != summed:
            rank = next(r for r in range(n) if first[r] != summed[r])
            hint = (f"your all-gather starts where your reduce-scatter did not leave the sums: "
                    f"rank {rank} holds chunk {summed[rank]} summed, but sends chunk "
                    f"{first[rank]} at the all-gather's step 0")
    trace = ring.simulate_ring_allreduce(_inputs(n, length), lambda _n, s: rs[s],
                                         lambda _n, s: ag[s])
    return trace, hint


def _judge_result(inputs, trace, hint: str) -> tuple[str, str]:
    """(got, reason) for "every rank ends with the sum of all inputs"."""
    total = np.sum(np.stack(inputs), axis=0)  # the sum, computed here, not by the simulator
    for rank, out in enumerate(trace.outputs):
        if not np.array_equal(out, total):
            wrong = int(np.count_nonzero(out != total))
            return (f"rank {rank} wrong at {wrong} of {total.size} elements",
                    f"rank {rank} does not hold the sum: "
                    + (hint or "a chunk was never added, added twice, or not copied to every "
                       "rank"))
    return "every rank holds the sum", ""


def _judge_bytes(num_ranks: int, nbytes: int, trace) -> tuple[str, str]:
    """(got, reason) for "each rank sends and receives 2 (n - 1) / n * S bytes"."""
    want = 2 * (num_ranks - 1) * nbytes // num_ranks  # exact: S divides by n here
    for rank in range(num_ranks):
        sent, received = trace.sent_bytes[rank], trace.received_bytes[rank]
        if (sent, received) != (want, want):
            return (f"rank {rank} sent {sent} B, received {received} B",
                    f"each rank must send and receive 2(n-1)/n*S = {want} bytes; rank {rank} "
                    f"sent {sent} and received {received}")
    return f"every rank sent and received {want} B", ""


def _judge_balance(num_ranks: int, trace) -> tuple[str, str]:
    """(got, reason) for "in every step each rank sends one chunk and receives one"."""
    steps: dict[tuple[str, int], list] = {}
    for t in trace.transfers:
        steps.setdefault((t.phase, t.step), []).append((t.src, t.dst))
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


def _judge_total(num_ranks: int, nbytes: int, trace) -> tuple[str, str]:
    """(got, reason) for "all ranks together send 2 (n - 1) S bytes" (uneven chunks)."""
    total, want = sum(trace.sent_bytes), 2 * (num_ranks - 1) * nbytes
    if total != want:
        return (f"{total} B in all", f"the ranks together must send 2(n-1)*S = {want} bytes "
                                     f"(each chunk n-1 times per phase), not {total}")
    return f"{total} B in all", ""


def submit(*fns, timeout: float = DEFAULT_TIMEOUT) -> Report:
    """Run your schedule(s) through the simulator for n = 2..8; return score and failures.

    Pass ``reduce_scatter_sends``, ``all_gather_sends`` or both; ``submit()`` with no arguments
    takes whichever of the two is defined where it is called. A phase not given runs a ring
    that fits the one given (see the module's docstring), so each phase can be practised alone.
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
    report = simulator_report(given, timeout)
    failing = [name for name in PHASE_NAMES if name in given]
    if report.failures:
        report.footer.append(solution_pointer(failing[0]))
    return report


NOT_GIVEN = {
    "reduce_scatter_sends": "reduce_scatter_sends: not given, so a ring reduce-scatter that "
                            "leaves summed on each rank the chunk your all-gather sends from it "
                            "first runs that phase.",
    "all_gather_sends": "all_gather_sends: not given, so a ring all-gather that starts from the "
                        "chunk your reduce-scatter leaves summed on each rank runs that phase.",
}


def simulator_report(given: dict, timeout: float = DEFAULT_TIMEOUT) -> Report:
    """Run the schedules ``given`` ({phase name: function}; a fitting ring runs a phase not
    given) through the simulator for n = 2..8; a :class:`Report`. ``submit`` calls this for
    the notebook's functions, ``dpcost.grading.grade`` for those the notebook's file defines.
    """
    names = [name for name in PHASE_NAMES if name in given]
    label = " + ".join(names)
    report = Report(f"submit: {label} in the ring simulator, n = 2..8", "submit")
    report.notes += [NOT_GIVEN[name] for name in PHASE_NAMES if name not in given]
    settings = [(n, EVEN_LENGTH) for n in range(2, 9)] + UNEVEN_CASES
    schedules = tuple(given[name] for name in names)
    # the child only calls the student's schedules (_collect_sends); the simulator and the
    # reference schedules run here, in the checker
    outcomes = run_many([(_collect_sends, (schedules, n), {}) for n, _ in settings], timeout,
                        max_timeouts=2)
    for (n, length), outcome in zip(settings, outcomes, strict=True):
        nbytes = length * 8  # int64
        call = f"{n} ranks, {length} int64 each (S = {nbytes} B)"
        rows = [("result", "every rank holds the sum")]
        if length == EVEN_LENGTH:
            rows.append(("bytes per rank",
                         f"each rank sends and receives {2 * (n - 1) * nbytes // n} B"))
            if n in (2, 5, 8):
                rows.append(("one chunk per rank per step", "one chunk per rank per step"))
        else:
            rows.append(("total bytes", f"2(n-1)*S = {2 * (n - 1) * nbytes} B in all"))
        judged = _judge_setting(names, outcome, n, length, nbytes, [r[0] for r in rows])
        for (category, expected), (got, reason) in zip(rows, judged, strict=True):
            report.results.append(TestResult(label, f"n = {n}: {category}", call, expected, got,
                                             not reason, reason, outcome.stdout))
    report.protections = protections()  # what confined the child (not shown in the table)
    withhold(report, *report.results)  # later children do not see its expected values
    return report


def _judge_setting(names, outcome, n, length, nbytes, categories) -> list[tuple[str, str]]:
    """(got, reason) for each of ``categories`` in one setting."""
    failure = ""
    if not outcome.returned:
        failure = _run_failure(outcome)
    else:
        value = outcome.value
        if not (isinstance(value, tuple) and len(value) == len(names) and all(
                isinstance(phase, tuple) and len(phase) == n - 1 for phase in value)):
            failure = _run_failure(outcome)
        else:
            try:
                steps = {name: [_validated(name, n, s, sends) for s, sends in enumerate(phase)]
                         for name, phase in zip(names, value, strict=True)}
            except ValueError as exc:
                failure = str(exc)
    if failure:
        return [(outcome.describe() if not outcome.returned else "-", failure)] * len(categories)
    trace, hint = _simulate(dict.fromkeys(names), steps, n, length)
    judges = {"result": lambda: _judge_result(_inputs(n, length), trace, hint),
              "bytes per rank": lambda: _judge_bytes(n, nbytes, trace),
              "one chunk per rank per step": lambda: _judge_balance(n, trace),
              "total bytes": lambda: _judge_total(n, nbytes, trace)}
    return [judges[category]() for category in categories]
