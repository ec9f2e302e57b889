"""Exercise 1: the student writes the five core functions; ``check`` and ``submit`` test them.

``check(fn)`` runs the worked examples of one function and shows a table (call, expected,
got, pass/fail). ``submit(*fns)`` (or ``submit()`` to pick the five up from the notebook)
runs the full battery: worked examples, ``num_gpus`` <= 1 (1, 0, negative), model size 0,
the return type, the ratio n for many sizes (0 included), independence from the model size,
large values and invalid inputs; it reports a score and every failure with its reason.

Each reason names the mistake a wrong value shows (:data:`MISTAKES`), the same on every line:
the mistake that explains all the values a function returned is found first
(:func:`function_mistake`), so one value that two mistakes give is never misnamed. A function's
credit is 80 % for its formula and the edge n <= 1 and 20 % for the input checks
(:data:`WEIGHTS`). :func:`preview_credit` is what the grade cells run in the student's kernel:
the grader's credit for the notebook being run, as saved.

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

import json
import math
import numbers
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

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


# Each function's credit: most for the idea (its formula, with the edge n <= 1), a small share
# for the contract's input checks (errors for bad input; numpy inputs converted, so they cannot
# overflow). Report.credit weighs the two; the report names both.
FORMULA, CHECKS = "formula and n <= 1", "input checks"
WEIGHTS = {FORMULA: 0.8, CHECKS: 0.2}


@dataclass
class Test:
    category: str
    cases: list[Case]
    part: str = FORMULA


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


# Common mistakes: the value each gives, as a function of (P, n) computed exactly (Fractions), and
# what it means. One entry per mistake: two that give the same value everywhere are one mistake
# (2 n / n P and 2 P both leave out the ring's (n - 1)/n), so no entry shadows another.
MISTAKES = {
    "dp_communication_volume": [
        (lambda p, n: (n - 1) * p,
         "exactly half: you counted one direction only. GPU0 sends the parameters to the n - 1 "
         "others in forward AND receives their gradients in backward"),
        (lambda p, n: Fraction(2 * (n - 1), n) * p,
         "n times too little: that is DDP's per-rank volume 2(n-1)/n P. Under DataParallel "
         "GPU0 sends the whole P to each of the n - 1 other GPUs"),
        (lambda p, n: 2 * n * p,
         "you used n where the formula has n - 1: GPU0 does not send to itself"),
        (lambda p, n: 2 * p,
         "the n - 1 is missing: GPU0 sends P to EACH of the n - 1 other GPUs and gets n - 1 "
         "gradient copies back, so the volume grows with n"),
    ],
    "ddp_communication_volume": [
        (lambda p, n: Fraction(n - 1, n) * p,
         "exactly half: you counted one phase only. The ring's reduce-scatter AND its "
         "all-gather each send n - 1 chunks of P / n per rank"),
        (lambda p, n: 2 * (n - 1) * p,
         "n times too much: that is DataParallel's 2(n-1)P through GPU0. A DDP rank sends one "
         "chunk of P / n per step, so divide by n"),
        (lambda p, n: 2 * p,
         "the ring's (n - 1)/n factor is missing: in each phase a rank sends n - 1 chunks of "
         "P / n, (n - 1)/n P and not a whole P, so 2(n-1)/n P in all"),
        (lambda p, n: Fraction(2, n) * p,
         "one step per phase: each phase has n - 1 steps, and each step sends a chunk of P / n"),
    ],
    "dp_gpu0_memory_multiplier": [
        (lambda n: 1,
         "1 is DDP's multiplier; under DataParallel GPU0 holds all n replicas' outputs"),
        (lambda n: n - 1, "off by one: GPU0 holds its own output too, n in all"),
    ],
    "ddp_gpu0_memory_multiplier": [
        (lambda n: n,
         "n is DataParallel's multiplier; under DDP every rank holds the same, so rank 0's "
         "multiplier is 1"),
    ],
    "communication_reduction_factor": [
        (lambda p, n: Fraction(1, n),
         "inverted: the factor is DP's volume over DDP's (n), not DDP's over DP's"),
        (lambda p, n: n - 1,
         "off by one: the factor is n, not n - 1 (P and the 2(n - 1) both cancel)"),
    ],
}


def _exact_args(name: str, args: tuple) -> tuple:
    """(P, n) as (Fraction, int), or (n,), for plain Python or numpy numbers."""
    if name in _TAKES_SIZE:
        size = args[0]
        return Fraction(int(size) if float(size).is_integer() else float(size)), int(args[1])
    return (int(args[0]),)


def _mistakes_matching(name: str, args: tuple, got: float) -> list[str]:
    """The reasons of every mistake in :data:`MISTAKES` that gives ``got`` for these args."""
    found = []
    for value, why in MISTAKES.get(name, []):
        try:
            gives = _exact_float(Fraction(value(*_exact_args(name, args))))
        except (ZeroDivisionError, OverflowError, ValueError):
            continue
        if _near(got, gives):
            found.append(why)
    return found


def _plain(value) -> bool:
    return type(value) in (int, float)


def function_mistake(name: str, observed: list[tuple[tuple, float]]) -> str:
    """The one mistake that explains every value a function returned, in words ('' if none).

    ``observed``: (args, returned float) of the calls with valid plain inputs (numpy and
    overflow apart) and, for the volumes and the ratio, n >= 2, where the formula applies. One
    value can fit two mistakes (at n = 2, 2P is both DataParallel's 2(n-1)P and the ring
    without its (n-1)/n); several values of n leave one. So the worked examples (n = 8 and 4)
    and the whole battery name the same mistake, on every line.
    """
    wrong = [(args, got) for args, got in observed if got != expected_value(name, args)]
    if not wrong:
        return ""
    fits = None
    for args, got in observed:
        matching = set(_mistakes_matching(name, args, got))
        fits = matching if fits is None else fits & matching
    return next((why for _, why in MISTAKES.get(name, []) if why in fits), "")


def _observed(name: str, judged) -> list[tuple[tuple, float]]:
    """The (args, value) pairs :func:`function_mistake` fits, from (case, outcome) pairs."""
    observed = []
    for case, outcome in judged:
        if not (isinstance(case.expect, Returns) and outcome.status == "returned"
                and type(outcome.value) is float and math.isfinite(outcome.value)
                and math.isfinite(case.expect.value) and all(_plain(a) for a in case.args)):
            continue
        if name in _TAKES_SIZE and int(case.args[-1]) <= 1:
            continue
        observed.append((case.args, outcome.value))
    return observed


def _judge(expect: Returns | Raises, outcome: Outcome, name: str = "", args: tuple = (),
           mistake: str = "", checked: frozenset = frozenset(("num_gpus", "model_size_bytes"))
           ) -> str:
    """'' when the outcome meets the expectation, else the reason it does not: the same words
    for every test that fails the same way (the table shows the values), so the report can group
    them. ``mistake``: the function's mistake, :func:`function_mistake`; ``checked``: the
    parameters it checks at all (see :func:`_run_tests`)."""
    if outcome.status in NO_RESULT:
        return outcome.detail
    if outcome.status == "raised" and outcome.error_type == "NotImplementedError":
        return "not written yet (it still raises NotImplementedError)"
    if isinstance(expect, Raises):
        named = expect.mention in outcome.error_message
        if outcome.status == "raised" and expect.error in outcome.error_bases and named:
            return ""
        if expect.mention not in checked:
            return (f"no check of {expect.mention}: bad input must raise an error naming it (the "
                    f"expected column says which); call {_checker(expect.mention)} first")
        if outcome.status == "returned":
            return (f"bad input must raise {expect.error} naming {expect.mention}, but the "
                    f"function returned a value")
        if expect.error not in outcome.error_bases:
            return f"bad input must raise {expect.error}, got {outcome.error_type}"
        return f"the {expect.error} message must name the parameter {expect.mention!r}"
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
    diagnosis = diagnose(name, args, got, want, mistake)
    return "wrong value: " + (diagnosis or "no common mistake recognised; compare your code "
                              "with the formula in the task")


def _checker(parameter: str) -> str:
    return "check_num_gpus" if parameter == "num_gpus" else "check_model_size_bytes"


def _near(a: float, b: float) -> bool:
    return math.isfinite(a) and math.isfinite(b) and math.isclose(a, b, rel_tol=1e-9)


def diagnose(name: str, args: tuple, got: float, want: float, mistake: str = "") -> str:
    """The common mistake that a wrong ``got`` (for ``name(*args)``, expected ``want``) shows, in
    words; '' when it matches none, or several equally. Plain values only: it runs in the
    checker, never the child. ``mistake``: what :func:`function_mistake` found for the whole
    function; it wins wherever it explains ``got``, so one mistake gets one diagnosis.

    Recognised: n <= 1 not special-cased, a NaN (0 / 0) or an overflow, numpy integers that
    wrap around, the mistakes of :data:`MISTAKES` (one direction or one phase, DP and DDP
    swapped, n for n - 1, the ring's (n - 1)/n left out, the ratio inverted or off by one, the
    multipliers swapped), the ratio rounded by a division, and a factor n or 2 off.
    """
    n = int(args[-1])
    if name in _TAKES_SIZE and n <= 1:
        return (f"n <= 1 is not special-cased: with at most one GPU nothing is communicated, "
                f"so the contract returns {want!r} before any formula (check n <= 1 first)")
    if math.isnan(got):
        return ("NaN: a 0 / 0? At model size 0 both volumes are 0; P cancels in the ratio, so "
                "return n without dividing" if name == "communication_reduction_factor"
                else "NaN: an operation without a defined result (0 / 0, inf - inf)")
    if math.isinf(got) and math.isfinite(want):
        return ("overflow to inf: an intermediate product exceeded the float range (divide "
                "before you multiply)")
    if mistake and mistake in _mistakes_matching(name, args, got):
        return mistake
    if any(type(a).__module__ == "numpy" and isinstance(a, numbers.Integral) for a in args):
        return ("numpy integers wrap around when they overflow: the input checks return "
                "Python ints, which do not (call them first)")
    matching = _mistakes_matching(name, args, got)
    if len(matching) == 1:
        return matching[0]
    if matching:  # one value, two mistakes (at n = 2 say): naming one could be wrong
        return ""
    if name == "communication_reduction_factor" and _near(got, want):
        return ("a rounding away from n: dividing the two float volumes rounds; P cancels, "
                "so return n itself")
    factors = [why for factor, why in (
        (n, "n times too large: a factor n too many"),
        (Fraction(1, n) if n else None, "n times too small: a factor n missing"),
        (2, "exactly twice the answer: something counted twice"))
        if factor is not None and want and math.isfinite(want)
        and _near(got, float(factor * Fraction(want)))]
    return factors[0] if len(factors) == 1 else ""


def _expected_text(expect: Returns | Raises) -> str:
    if isinstance(expect, Raises):
        return f"{expect.error} naming {expect.mention}"
    value = expect.value
    if isinstance(value, float) and math.isfinite(value) and abs(value) >= 1e15:
        return f"{value:.10g}"  # huge sizes: 10 digits say enough (the test allows 1e-12)
    return repr(value)


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
            Test("huge values: near the float limit, or inf",
                 [_returns(name, (1e300, 10**20))]),
            Test("large numpy integers do not overflow",
                 [_returns(name, (np.int64(2**62), np.int64(2**40)))], CHECKS),
        ]
    else:
        tests.append(Test("large values", [_returns(name, (10**12,)),
                                           _returns(name, (np.int64(2**40),))]))
    for bad in (True, 8.0, 2.5, "8", None):
        tests.append(Test("invalid num_gpus", [Case(call(100, bad),
                                                    Raises("TypeError", "num_gpus"))], CHECKS))
    if sized:
        for bad in (True, "1GB", None):
            tests.append(Test("invalid model_size_bytes", [
                Case((bad, 4), Raises("TypeError", "model_size_bytes"))], CHECKS))
        for bad in (-1, -0.5, float("nan"), float("inf")):
            tests.append(Test("invalid model_size_bytes", [
                Case((bad, 4), Raises("ValueError", "model_size_bytes"))], CHECKS))
        tests.append(Test("model size checked even for one GPU", [
            Case((-1, 1), Raises("ValueError", "model_size_bytes"))], CHECKS))
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
    judged = [[(case, next(outcomes)) for case in test.cases] for test in tests]
    every = [pair for pairs in judged for pair in pairs]
    mistake = function_mistake(name, _observed(name, every))
    # A parameter is unchecked when some bad value of it came back as a result and no error
    # named it: then every bad input of it fails for that one reason.
    bad = [(case.expect.mention, outcome) for case, outcome in every
           if isinstance(case.expect, Raises)]
    unchecked = {mention for mention, outcome in bad if outcome.status == "returned"} - {
        mention for mention, outcome in bad
        if outcome.status == "raised" and mention in outcome.error_message}
    checked = frozenset(mention for mention, _ in bad if mention not in unchecked)
    results = []
    for test, pairs in zip(tests, judged, strict=True):
        case, outcome, reason = pairs[0][0], pairs[0][1], ""
        for case, outcome in pairs:
            reason = _judge(case.expect, outcome, name, case.args, mistake, checked)
            if reason:
                break
        if reason:
            reason += _size_dependence(name, pairs)
        results.append(TestResult(name, test.category, _call_text(name, case.args),
                                  _expected_text(case.expect), outcome.describe(), not reason,
                                  reason, outcome.stdout, test.part))
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
    report = Report(f"check({name}): worked examples", "check", weights=dict(WEIGHTS))
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
    report = Report("submit: the full battery", "submit", weights=dict(WEIGHTS))
    for name, fn in named:
        tests = battery(name)
        if fn is None or not callable(fn):
            report.results += [
                TestResult(name, test.category, _call_text(name, test.cases[0].args),
                           _expected_text(test.cases[0].expect), "-", False,
                           f"{name} is not defined: run its cell first", part=test.part)
                for test in tests]
        else:
            report.results += _run_tests(fn, name, tests, timeout, max_timeouts)
    report.protections = protections()  # what confined the children (not shown in the table)
    withhold(report, *report.results)  # later children do not see its expected values
    return report


# ----------------------------------------------------------------------------------------------
# The grade cells' preview of the credit, in the student's kernel.

EXERCISE_FILE = "ex1_five_functions.ipynb"  # the name the grader knows the exercise by


def running_notebook() -> tuple[Path | None, str]:
    """The ex1 notebook file this kernel runs, and in words which one it is (or why none).

    Jupyter's server tells a kernel its notebook's path (``JPY_SESSION_NAME``, which ipykernel
    also puts in ``__session__``), so a copy (File > Duplicate, ``ex1_try.ipynb``) is found
    under its own name. A kernel started without it (nbclient, nbval, nbgrader's Validate): the
    exercise's file in the kernel's folder.
    """
    session = os.environ.get("JPY_SESSION_NAME", "")
    if session.endswith(".ipynb") and _is_ex1(Path(session)):
        return Path(session), f"{Path(session).name}, the notebook this kernel runs, as saved"
    here = Path.cwd() / EXERCISE_FILE
    if _is_ex1(here):
        return here, (f"{EXERCISE_FILE} in this kernel's folder, as saved (the kernel was not "
                      "told which notebook it runs)")
    return None, (f"this kernel was not told which notebook it runs, and its folder has no "
                  f"{EXERCISE_FILE}: save the notebook, or run the grader on it yourself "
                  f"(python -I -m dpcost.grading.grade NOTEBOOK FUNCTION)")


def _code_cells(path: Path) -> list[dict]:
    """The code cells of the notebook file ``path`` ([] when it is not a readable notebook)."""
    try:
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [c for c in cells if isinstance(c, dict) and c.get("cell_type") == "code"]


def _is_ex1(path: Path) -> bool:
    """Whether ``path`` is an ex1 notebook: it has ex1's grade cells (grade.GRADE_CELLS)."""
    return bool({cell.get("id") for cell in _code_cells(path)}
                & {f"grade-{i}" for i in range(1, len(FUNCTION_NAMES) + 1)})


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def unsaved_change(path: Path, name: str) -> str:
    """A warning when the saved file's definition of ``name`` is not the one this kernel ran
    last (edited and run without saving, or saved without running); '' when they agree."""
    try:
        from IPython import get_ipython
    except ImportError:
        return ""
    shell = get_ipython()
    if shell is None:
        return ""
    defines = re.compile(rf"^def {re.escape(name)}\(", re.M)
    ran = [source for source in shell.history_manager.input_hist_raw if defines.search(source)]
    saved = [_source(cell) for cell in _code_cells(path) if defines.search(_source(cell))]
    # No definition in the history: none ran here, or the cells ran without history (nbval's
    # store_history=False); either way nothing to compare.
    if not ran or [s.strip() for s in ran[-1:]] == [s.strip() for s in saved[-1:]]:
        return ""
    return (f"The saved file's {name} is not the one this kernel ran last: save the notebook "
            "(Ctrl+S) and run this cell again. The credit below is the saved file's.")


def preview_credit(name: str, points: float = 1) -> float:
    """What a grade cell shows in the student's kernel: the credit of ``name`` in the notebook
    this kernel runs (its saved file), computed by the grader in a new interpreter, as nbgrader's
    grading does outside the kernel; prints which file it graded and the report, returns the
    credit (``points`` x the share earned). Only a preview: the instructor's command recomputes
    it outside every kernel."""
    if name not in FUNCTION_NAMES:
        raise ValueError(f"name must be one of {', '.join(FUNCTION_NAMES)}; got {name!r}")
    path, which = running_notebook()
    if path is None:
        print(f"No credit preview: {which}.")
        return 0.0
    print(f"Graded: {which}.")
    warning = unsaved_change(path, name)
    if warning:
        print(warning)
    with tempfile.TemporaryDirectory(prefix="dpcost-credit-") as folder:
        # the grader knows the exercise by its file's name: a copy of the file, under that name
        shutil.copyfile(path, Path(folder) / EXERCISE_FILE)
        graded = subprocess.run([sys.executable, "-I", "-m", "dpcost.grading.grade", "--points",
                                 f"{points:g}", EXERCISE_FILE, name], cwd=folder,
                                capture_output=True, text=True, timeout=300,
                                stdin=subprocess.DEVNULL)
    report, _, score = graded.stdout.rpartition("\nscore: ")
    if graded.returncode != 0 or not report:
        raise RuntimeError(f"the grader failed: {graded.stderr[-2000:]}")
    print(report)
    return float(score)
