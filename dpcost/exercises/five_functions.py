"""Exercise 1: the student writes the five core functions; ``check`` and ``submit`` test them.

``check(fn)`` runs the worked examples of one function and shows a table (call, expected,
got, pass/fail). ``submit(*fns)`` (or ``submit()`` to pick the five up from the notebook)
runs the full battery: worked examples, ``num_gpus`` <= 1 (1, 0, negative), model size 0,
the return type, the ratio n for many sizes (0 included), independence from the model size,
large values and invalid inputs; it reports a score and every failure with its reason.

Each call of the student's function runs in a forked child with a time limit
(:mod:`dpcost.grading.sandbox`). Expected values are computed here, exactly, with
``fractions.Fraction`` from the formulas of the contract, never by calling ``dpcost.core``:

    dp_communication_volume(P, n)        = 2 (n - 1) P        bytes   (0.0 for n <= 1)
    ddp_communication_volume(P, n)       = 2 (n - 1) / n * P  bytes   (0.0 for n <= 1)
    dp_gpu0_memory_multiplier(n)         = n                  (float(n), every integer n)
    ddp_gpu0_memory_multiplier(n)        = 1                  (1.0, every integer n)
    communication_reduction_factor(P, n) = n                  (1.0 for n <= 1; P = 0 too)
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

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

FUNCTION_NAMES = (
    "dp_communication_volume",
    "ddp_communication_volume",
    "dp_gpu0_memory_multiplier",
    "ddp_gpu0_memory_multiplier",
    "communication_reduction_factor",
)
_TAKES_SIZE = {"dp_communication_volume", "ddp_communication_volume",
               "communication_reduction_factor"}


def _exact_float(value: Fraction) -> float:
    try:
        return float(value)
    except OverflowError:  # beyond float range: the contract saturates to inf, keeping the sign
        return math.inf if value > 0 else -math.inf


def expected_value(name: str, args: tuple) -> float:
    """The contract's answer for ``name(*args)``, computed exactly with Fraction, as a float."""
    if name in _TAKES_SIZE:
        size = args[0]
        size, n = Fraction(int(size) if float(size).is_integer() else float(size)), int(args[1])
    else:
        n = int(args[0])
    if name == "dp_communication_volume":
        return 0.0 if n <= 1 else _exact_float(2 * (n - 1) * size)
    if name == "ddp_communication_volume":
        return 0.0 if n <= 1 else _exact_float(Fraction(2 * (n - 1), n) * size)
    if name == "dp_gpu0_memory_multiplier":
        return _exact_float(Fraction(n))
    if name == "ddp_gpu0_memory_multiplier":
        return 1.0
    if name == "communication_reduction_factor":
        return 1.0 if n <= 1 else _exact_float(Fraction(n))
    raise ValueError(f"name must be one of {', '.join(FUNCTION_NAMES)}; got {name!r}")


@dataclass
class Returns:
    """Expect a Python float equal to ``value`` (volumes: within 1e-12 relative; else exact)."""

    value: float
    rel_tol: float = 0.0


@dataclass
class Raises:
    """Expect ``error`` (an exception class name) with ``mention`` in its message."""

    error: str
    mention: str


@dataclass
class Case:
    args: tuple
    expect: Returns | Raises


@dataclass
class Test:
    category: str
    cases: list[Case]


def _fmt(value) -> str:
    if isinstance(value, float) and math.isfinite(value) and value == int(value) and abs(
            value) >= 1e5:
        return f"{value:g}"
    if type(value).__module__ == "numpy":
        return f"np.{type(value).__name__}({value})"
    return repr(value)


def _call_text(name: str, args: tuple) -> str:
    return f"{name}({', '.join(_fmt(a) for a in args)})"


def _returns(name: str, args: tuple) -> Case:
    volume = name in ("dp_communication_volume", "ddp_communication_volume")
    return Case(args, Returns(expected_value(name, args), 1e-12 if volume else 0.0))


def _judge(expect: Returns | Raises, outcome: Outcome, name: str = "", args: tuple = ()) -> str:
    """'' when the outcome meets the expectation, else the reason it does not (with the common
    mistake it shows, see :func:`diagnose`)."""
    if outcome.status in NO_RESULT:
        return outcome.detail
    if outcome.status == "raised" and outcome.error_type == "NotImplementedError":
        return "not written yet (it still raises NotImplementedError)"
    if isinstance(expect, Raises):
        if outcome.status == "returned":
            return (f"bad input must raise {expect.error} naming {expect.mention}, but the "
                    f"function returned {outcome.value_repr}")
        if expect.error not in outcome.error_bases:
            return f"expected {expect.error}, got {outcome.error_type}"
        if expect.mention not in outcome.error_message:
            return f"the {expect.error} message must name the parameter {expect.mention!r}"
        return ""
    if outcome.status == "raised":
        return f"raised {outcome.describe()} on valid input"
    # value_type names the returned type (a student's class called "float" reads
    # "__main__.float"); value is plain data converted in the child, so it is a float too.
    if outcome.value_type != "float" or type(outcome.value) is not float:
        return (f"must return a Python float, got {outcome.value_type} (wrap the result in "
                f"float(...))")
    got, want = outcome.value, expect.value
    if got == want or (expect.rel_tol and math.isclose(got, want, rel_tol=expect.rel_tol)):
        return ""
    diagnosis = diagnose(name, args, got, want)
    return f"wrong value: {got!r} != {want!r}" + (f" - {diagnosis}" if diagnosis else "")


def _near(a: float, b: float) -> bool:
    return math.isfinite(a) and math.isfinite(b) and math.isclose(a, b, rel_tol=1e-9)


def diagnose(name: str, args: tuple, got: float, want: float) -> str:
    """The common mistake that a wrong ``got`` (for ``name(*args)``, expected ``want``) shows, in
    words; '' when it matches none. Plain values only: it runs in the checker, never the child.

    Recognised: n <= 1 not special-cased, the DP and DDP formulas swapped (off by a factor n),
    one phase or one direction counted (exactly half), n in place of n - 1, the ratio inverted
    or computed as a quotient (0 / 0 at P = 0), and the two multipliers swapped.
    """
    n = int(args[-1])
    if name in ("dp_communication_volume", "ddp_communication_volume",
                "communication_reduction_factor") and n <= 1:
        return (f"n = {n} is at most 1, where nothing is communicated: the contract returns "
                f"{want!r} before any formula (check n <= 1 first)")
    if math.isnan(got):
        return ("NaN: a 0 / 0? At model size 0 both volumes are 0; P cancels in the ratio, so "
                "return n without dividing" if name == "communication_reduction_factor"
                else "NaN: an operation without a defined result (0 / 0, inf - inf)")
    if math.isinf(got) and math.isfinite(want):
        return ("overflow to inf: an intermediate product exceeded the float range (divide "
                "before you multiply)")
    if name == "dp_communication_volume":
        if _near(got, want / 2):
            return ("exactly half: you counted one direction only. GPU0 sends the parameters "
                    "to the n - 1 others in forward AND receives their gradients in backward")
        if _near(got * n, want):
            return ("n times too little: that is DDP's per-rank volume 2(n-1)/n P. Under "
                    "DataParallel GPU0 sends the whole P to each of the n - 1 other GPUs")
        if _near(got * (n - 1), want * n):
            return "you used n where the formula has n - 1: GPU0 does not send to itself"
    if name == "ddp_communication_volume":
        if _near(got, want / 2):
            return ("exactly half: you counted one phase only. The ring's reduce-scatter AND its "
                    "all-gather each send n - 1 chunks of P / n per rank")
        if _near(got, want * n):
            return ("n times too much: that is DataParallel's 2(n-1)P through GPU0. A DDP rank "
                    "sends one chunk of P / n per step, so divide by n")
        if _near(got * (n - 1), want * n):
            return "you used n where the formula has n - 1: a ring phase has n - 1 steps"
    if name == "communication_reduction_factor":
        if _near(got * want, 1.0):
            return "inverted: the factor is DP's volume over DDP's (n), not DDP's over DP's"
        if _near(got, want - 1):
            return "off by one: the factor is n, not n - 1 (P and the 2(n - 1) both cancel)"
        if _near(got, want):
            return ("a rounding away from n: dividing the two float volumes rounds; P cancels, "
                    "so return n itself")
    if name == "dp_gpu0_memory_multiplier" and got == 1.0 and n != 1:
        return "1 is DDP's multiplier; under DataParallel GPU0 holds all n replicas' outputs"
    if name == "ddp_gpu0_memory_multiplier" and got == float(n) and n != 1:
        return ("n is DataParallel's multiplier; under DDP every rank holds the same, so rank "
                "0's multiplier is 1")
    if want and _near(got, want * n):
        return "n times too large: a factor n too many"
    if want and _near(got * n, want):
        return "n times too small: a factor n missing"
    if want and _near(got, 2 * want):
        return "exactly twice the answer: something counted twice"
    return ""


def _expected_text(expect: Returns | Raises) -> str:
    if isinstance(expect, Raises):
        return f"{expect.error} naming {expect.mention}"
    return repr(expect.value)


def worked_examples(name: str) -> list[Case]:
    """The worked examples ``check`` shows for ``name`` (also the first tests of ``submit``)."""
    if name in _TAKES_SIZE:
        # n = 0, not 1: at n = 1 the formulas already give the contract's answer (2(n - 1)P = 0,
        # n = 1.0), so only n = 0 shows a function that forgets the n <= 1 rule.
        args = [(1.5e9, 8), (4_000_000, 4), (1.5e9, 0)]
        if name == "communication_reduction_factor":
            args.append((0, 8))
    else:
        args = [(8,), (4,), (1,)]
    return [_returns(name, a) for a in args]


def battery(name: str) -> list[Test]:
    """Every test ``submit`` runs for ``name``, in order (each test stops at its first failure)."""
    if name not in FUNCTION_NAMES:
        raise ValueError(f"name must be one of {', '.join(FUNCTION_NAMES)}; got {name!r}")
    tests = [Test("worked example", [case]) for case in worked_examples(name)]
    sized = name in _TAKES_SIZE

    def call(*size_and_n):  # argument tuple for this function: (P, n) or (n,)
        return size_and_n if sized else size_and_n[-1:]

    few = [1, -1, -8, -64] if sized else [1, 0, -1, -8]  # n = 0 is a worked example if sized
    tests += [Test("num_gpus <= 1", [_returns(name, call(1.5e9, n))]) for n in few]
    if sized:
        tests += [Test("model size 0", [_returns(name, (0, 8)), _returns(name, (0.0, 3))]),
                  Test("model size 0 and one GPU", [_returns(name, (0, 1))])]
    tests.append(Test("returns a Python float", [
        _returns(name, call(size, n)) for size in (5, 5.0, np.int64(5), np.float32(5.0))
        for n in (2, 8, np.int32(8), np.int64(3))]))
    gpus = [2, 3, 8, 64, 1024]
    sizes = [0, 0.0, 1, 7, 0.5, 4_000_000, 1.5e9, 25 * 2**20]
    if name == "communication_reduction_factor":
        tests.append(Test("the ratio is n for many sizes, 0 included", [
            _returns(name, (size, n)) for n in gpus for size in sizes]))
        tests.append(Test("independent of the model size, n <= 1 too", [
            _returns(name, (size, n)) for n in (1, 0, -3) for size in sizes]))
    elif sized:
        tests.append(Test("formula for many sizes and GPU counts", [
            _returns(name, (size, n)) for n in gpus for size in sizes]))
    else:
        tests.append(Test("many GPU counts", [_returns(name, (n,)) for n in gpus + [-5]]))
        tests.append(Test("numpy integer GPU counts", [
            _returns(name, (t(4),)) for t in (np.int8, np.int16, np.int64, np.uint8)]))
    if sized:
        tests += [
            Test("large values", [_returns(name, (7e12, 1024)), _returns(name, (10**15, 10**6))]),
            Test("large numpy integers do not overflow",
                 [_returns(name, (np.int64(2**62), np.int64(2**40)))]),
            Test("huge values: near the float limit, or inf",
                 [_returns(name, (1e300, 10**20))]),
        ]
    else:
        tests.append(Test("large values", [_returns(name, (10**12,)),
                                           _returns(name, (np.int64(2**40),))]))
    for bad in (True, 8.0, 2.5, "8", None):
        tests.append(Test("invalid num_gpus", [Case(call(100, bad),
                                                    Raises("TypeError", "num_gpus"))]))
    if sized:
        for bad in (True, "1GB", None):
            tests.append(Test("invalid model_size_bytes", [
                Case((bad, 4), Raises("TypeError", "model_size_bytes"))]))
        for bad in (-1, -0.5, float("nan"), float("inf")):
            tests.append(Test("invalid model_size_bytes", [
                Case((bad, 4), Raises("ValueError", "model_size_bytes"))]))
        tests.append(Test("model size checked even for one GPU", [
            Case((-1, 1), Raises("ValueError", "model_size_bytes"))]))
    return tests


def _function_name(fn, name: str | None, accepts_name: bool = False) -> str:
    return student_function_name(fn, FUNCTION_NAMES, "check(dp_communication_volume)",
                                 "function", name, accepts_name)


def _run_tests(fn, name: str, tests: list[Test], timeout: float, max_timeouts=None
               ) -> list[TestResult]:
    """Run every case of ``tests`` in the sandbox; one result per test (its first failure)."""
    calls = [(fn, case.args, {}) for test in tests for case in test.cases]
    withhold(*tests, *(case for test in tests for case in test.cases))  # emptied in the child
    outcomes = iter(run_many(calls, timeout, max_timeouts))
    results = []
    for test in tests:
        judged = [(case, next(outcomes)) for case in test.cases]
        case, outcome, reason = judged[0][0], judged[0][1], ""
        for case, outcome in judged:
            reason = _judge(case.expect, outcome, name, case.args)
            if reason:
                break
        if reason:
            reason += _size_dependence(name, judged)
        results.append(TestResult(name, test.category, _call_text(name, case.args),
                                  _expected_text(case.expect), outcome.describe(), not reason,
                                  reason, outcome.stdout))
    withhold(*results)  # the next function's child does not see these expected values
    return results


def _size_dependence(name: str, judged: list[tuple[Case, Outcome]]) -> str:
    """A note when the ratio returned different values for one n at different model sizes."""
    if name != "communication_reduction_factor":
        return ""
    by_n: dict[int, set] = {}
    for case, outcome in judged:
        if outcome.status == "returned" and type(outcome.value) is float:
            by_n.setdefault(int(case.args[1]), set()).add(
                "nan" if math.isnan(outcome.value) else outcome.value)
    varying = sorted(n for n, values in by_n.items() if len(values) > 1)
    if not varying:
        return ""
    return (f" (and your factor changes with the model size at n = {varying[0]}: P cancels in "
            "DP / DDP, so the factor must be the same for every size)")



def check(fn, *, name: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> Report:
    """Run the worked examples of your function ``fn``; return a :class:`Report` (a table)."""
    name = _function_name(fn, name, accepts_name=True)
    tests = [Test("worked example", [case]) for case in worked_examples(name)]
    report = Report(f"check({name}): worked examples", "check")
    report.results = _run_tests(fn, name, tests, timeout)
    if report.failures:
        report.footer.append(solution_pointer(name))
    report.protections = protections()  # what confined the child (not shown in the table)
    withhold(report, *report.results)  # later children do not see its expected values
    return report


def submit(*fns, timeout: float = DEFAULT_TIMEOUT, max_timeouts: int = 2) -> Report:
    """Run the full battery on your functions; return a :class:`Report` with score and failures.

    ``submit()`` with no arguments tests the five functions defined where it is called (the
    notebook); a missing one fails all its tests. After ``max_timeouts`` time-outs in one
    function, its remaining calls are skipped (they fail), so an infinite loop costs seconds.
    """
    if fns:
        named = [(_function_name(fn, None), fn) for fn in fns]
    else:
        caller = sys._getframe(1).f_globals
        named = [(name, caller.get(name)) for name in FUNCTION_NAMES]
        for name, fn in named:
            if fn is not None and is_package_function(fn):
                raise ValueError(f"{name} here is the dpcost package's own function (imported "
                                 "from dpcost?); define your own in the notebook instead")
    report = battery_report(named, timeout, max_timeouts)
    failing = list(dict.fromkeys(r.function for r in report.failures))
    if failing:
        report.footer.append(solution_pointer(failing[0]))
    return report


def battery_report(named: list[tuple[str, object]], timeout: float = DEFAULT_TIMEOUT,
                   max_timeouts: int = 2) -> Report:
    """The full battery for each ``(name, function)`` (None: not defined); a :class:`Report`.

    ``submit`` calls this for the notebook's functions, ``dpcost.grading.grade`` for the
    functions that the notebook's file defines.
    """
    report = Report("submit: the full battery", "submit")
    for name, fn in named:
        tests = battery(name)
        if fn is None or not callable(fn):
            report.results += [
                TestResult(name, test.category, _call_text(name, test.cases[0].args),
                           _expected_text(test.cases[0].expect), "-", False,
                           f"{name} is not defined: run its cell first") for test in tests]
        else:
            report.results += _run_tests(fn, name, tests, timeout, max_timeouts)
    report.protections = protections()  # what confined the children (not shown in the table)
    withhold(report, *report.results)  # later children do not see its expected values
    return report
