"""check/submit for the five functions: right code passes, each kind of wrong code fails."""

import inspect
import math
import numbers
import os
import time
import types

import pytest

import dpcost
from dpcost.exercises.five_functions import (
    FUNCTION_NAMES,
    battery,
    check,
    expected_value,
    submit,
)


# A reference solution written here, independently of dpcost.core.
def _n(num_gpus):
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, numbers.Integral):
        raise TypeError(f"num_gpus: bad {num_gpus!r}")
    return int(num_gpus)


def _p(size):
    if isinstance(size, bool) or not isinstance(size, numbers.Real) or type(
            size).__name__ == "bool_":
        raise TypeError(f"model_size_bytes: bad {size!r}")
    if not math.isfinite(size) or size < 0:
        raise ValueError(f"model_size_bytes: bad {size!r}")
    return int(size) if isinstance(size, numbers.Integral) else float(size)


def dp_communication_volume(model_size_bytes, num_gpus):
    size, n = _p(model_size_bytes), _n(num_gpus)
    return 0.0 if n <= 1 else float(2 * (n - 1) * size)


def ddp_communication_volume(model_size_bytes, num_gpus):
    size, n = _p(model_size_bytes), _n(num_gpus)
    return 0.0 if n <= 1 else float(2 * (n - 1) / n * size)  # / n first: no overflow


def dp_gpu0_memory_multiplier(num_gpus):
    return float(_n(num_gpus))


def ddp_gpu0_memory_multiplier(num_gpus):
    _n(num_gpus)
    return 1.0


def communication_reduction_factor(model_size_bytes, num_gpus):
    _p(model_size_bytes)
    n = _n(num_gpus)
    return 1.0 if n <= 1 else float(n)


REFERENCE = [dp_communication_volume, ddp_communication_volume, dp_gpu0_memory_multiplier,
             ddp_gpu0_memory_multiplier, communication_reduction_factor]


def test_expected_values_by_hand():
    assert expected_value("dp_communication_volume", (1.5e9, 8)) == 21e9  # 2 * 7 * 1.5e9
    assert expected_value("ddp_communication_volume", (1.5e9, 8)) == 2.625e9  # 2 * 7/8 * 1.5e9
    assert expected_value("communication_reduction_factor", (0, 8)) == 8.0
    assert expected_value("dp_communication_volume", (1.5e9, -3)) == 0.0
    assert expected_value("dp_gpu0_memory_multiplier", (-3,)) == -3.0
    assert expected_value("dp_communication_volume", (1e300, 10**20)) == math.inf


def test_reference_solution_passes_everything():
    for fn in REFERENCE:
        assert check(fn).all_passed
    report = submit(*REFERENCE)
    assert report.all_passed, report
    assert report.total == sum(len(battery(name)) for name in FUNCTION_NAMES) == 115


def test_submit_without_arguments_uses_callers_functions():
    report = submit()  # picks up the five defined in this module
    assert report.all_passed and report.total == 115


def test_battery_covers_the_issue_list():
    categories = {test.category for test in battery("communication_reduction_factor")}
    for needed in ("worked example", "num_gpus <= 1", "model size 0", "returns a Python float",
                   "the ratio is n for many sizes, 0 included", "large values",
                   "invalid num_gpus", "invalid model_size_bytes"):
        assert needed in categories


def failing(report):
    """{category: all failure reasons of that category, joined}."""
    reasons = {}
    for r in report.failures:
        reasons[r.category] = reasons.get(r.category, "") + r.reason + " | "
    return reasons


def test_int_result_fails_return_type():
    def dp_communication_volume(model_size_bytes, num_gpus):
        return 0 if num_gpus <= 1 else 2 * (num_gpus - 1) * model_size_bytes

    report = submit(dp_communication_volume)
    assert "Python float" in failing(report)["returns a Python float"]
    assert not check(dp_communication_volume).all_passed  # 4000000 * 6 is an int


def test_missing_one_gpu_case_fails():
    def ddp_communication_volume(model_size_bytes, num_gpus):
        return float(2 * (num_gpus - 1) / num_gpus * _p(model_size_bytes))

    reasons = failing(submit(ddp_communication_volume))
    assert "wrong value" in reasons["num_gpus <= 1"] or "ZeroDivision" in reasons["num_gpus <= 1"]


def test_ratio_by_division_fails_at_size_zero():
    def communication_reduction_factor(model_size_bytes, num_gpus):
        n = _n(num_gpus)
        if n <= 1:
            return 1.0
        return dp_communication_volume(model_size_bytes, n) / ddp_communication_volume(
            model_size_bytes, n)

    reasons = failing(submit(communication_reduction_factor))
    assert "ZeroDivisionError" in reasons["model size 0"]
    assert check(communication_reduction_factor).failures[0].call == (
        "communication_reduction_factor(0, 8)")


def test_no_input_checks_fail_invalid_inputs():
    def dp_gpu0_memory_multiplier(num_gpus):
        return float(num_gpus)

    reasons = failing(submit(dp_gpu0_memory_multiplier))
    assert "no check of num_gpus: bad input must raise an error naming it" in reasons[
        "invalid num_gpus"]


def test_multiplying_before_dividing_overflows_to_inf():
    def ddp_communication_volume(model_size_bytes, num_gpus):
        size, n = _p(model_size_bytes), _n(num_gpus)
        return 0.0 if n <= 1 else float(2 * (n - 1) * size / n)  # 2e320 -> inf, then / n

    reasons = failing(submit(ddp_communication_volume))
    assert list(reasons) == ["huge values: near the float limit, or inf"]
    assert "overflow to inf" in reasons["huge values: near the float limit, or inf"]
    assert report_got(submit(ddp_communication_volume)) == ["inf (float)"]


def report_got(report):
    return [r.got for r in report.failures]


def test_error_must_name_the_parameter():
    def ddp_gpu0_memory_multiplier(num_gpus):
        if not isinstance(num_gpus, int) or isinstance(num_gpus, bool):
            raise TypeError("bad input")
        return 1.0

    reasons = failing(submit(ddp_gpu0_memory_multiplier))
    assert "must name the parameter 'num_gpus'" in reasons["invalid num_gpus"]


def test_infinite_loop_is_reported_fast():
    def dp_gpu0_memory_multiplier(num_gpus):
        while True:
            pass

    start = time.perf_counter()
    report = submit(dp_gpu0_memory_multiplier, timeout=0.2)
    assert time.perf_counter() - start < 10
    assert report.passed == 0
    reasons = [r.reason for r in report.results]
    assert sum("no result within 0.2 s" in r for r in reasons) == 2
    assert "timed out" in reasons[-1]


def test_print_noise_does_not_fail_and_is_noted(capfd):
    def ddp_gpu0_memory_multiplier(num_gpus):
        print("debugging!")
        _n(num_gpus)
        return 1.0

    report = submit(ddp_gpu0_memory_multiplier)
    assert report.all_passed and "debugging!" in report.results[0].printed
    assert "your code printed" in str(report)
    assert "debugging!" not in capfd.readouterr().out


def test_stub_reports_not_written_yet():
    def dp_communication_volume(model_size_bytes, num_gpus):
        raise NotImplementedError("write me")

    report = submit(dp_communication_volume)
    assert report.passed == 0
    assert all("not written yet" in r.reason for r in report.results)
    # one line per share of the credit, with a count: 13 formula tests, 14 input checks
    assert "(and 12 more tests" in str(report) and "(and 13 more tests" in str(report)
    assert str(report).count("why: not written yet") == 2


def test_missing_function_in_submit_without_arguments():
    namespace = {"submit": submit, "dp_gpu0_memory_multiplier": dp_gpu0_memory_multiplier}
    exec("report = submit()", namespace)
    report = namespace["report"]
    assert report.by_function()["dp_gpu0_memory_multiplier"] == (16, 16)
    assert "not defined" in report.failures[0].reason


def test_refuses_the_package_own_functions():
    with pytest.raises(ValueError, match="package's own"):
        check(dpcost.dp_communication_volume)
    with pytest.raises(ValueError, match="package's own"):
        submit(dpcost.core.communication_reduction_factor)


def test_refuses_unknown_names_and_non_functions():
    def dp_volume(p, n):
        return 0.0

    with pytest.raises(ValueError, match=r"named one of .*\(or pass name=\.\.\.\)"):
        check(dp_volume)
    assert check(dp_volume, name="dp_communication_volume").total == 3  # as the message offers
    with pytest.raises(ValueError, match="named one of") as refused:
        submit(dp_volume)  # submit takes no name=, so its message does not offer it
    assert "name=" not in str(refused.value)
    with pytest.raises(TypeError, match="your function itself"):
        check("dp_communication_volume")


def test_report_renders_text_and_html():
    report = check(dp_communication_volume)
    text, html = str(report), report._repr_html_()
    assert "dp_communication_volume(1.5e+09, 8)" in text and "21000000000.0" in text
    assert "3/3 worked examples pass." in text
    assert "<table " in html and "pass" in html and "0x" not in text
    assert "Score: 115/115" in str(submit(*REFERENCE))


def test_a_students_module_named_dpcost_something_is_not_the_package():
    # Identity, not name: a student's own module may be called dpcost_mine.
    mine = types.ModuleType("dpcost_mine")
    mine.math, mine.numbers = math, numbers
    exec(inspect.getsource(_p) + inspect.getsource(_n)
         + inspect.getsource(dp_communication_volume), mine.__dict__)
    fn = mine.dp_communication_volume
    assert fn.__module__ == "dpcost_mine"
    assert check(fn).all_passed

    def ddp_gpu0_memory_multiplier(num_gpus):
        _n(num_gpus)
        return 1.0

    ddp_gpu0_memory_multiplier.__module__ = "dpcost.core"  # a name alone proves nothing
    assert submit(ddp_gpu0_memory_multiplier).all_passed


def test_submit_without_arguments_refuses_an_imported_package_function():
    namespace = {"submit": submit, "dp_gpu0_memory_multiplier": dpcost.dp_gpu0_memory_multiplier}
    with pytest.raises(ValueError, match="package's own function"):
        exec("submit()", namespace)


def test_expected_values_beyond_float_range_keep_their_sign():
    from dpcost import dp_gpu0_memory_multiplier
    from dpcost.exercises.five_functions import expected_value

    assert expected_value("dp_gpu0_memory_multiplier", (-10**400,)) == float("-inf")
    assert expected_value("dp_gpu0_memory_multiplier", (-10**400,)) == \
        dp_gpu0_memory_multiplier(-10**400)
    assert expected_value("dp_gpu0_memory_multiplier", (10**400,)) == float("inf")


def test_a_function_that_forgets_n_at_most_1_fails_check():
    """Issue 22: the n = 1 example already gave 0, so check passed it; n = 0 gives -P."""
    def dp_communication_volume(model_size_bytes, num_gpus):
        return float(2 * (_n(num_gpus) - 1) * _p(model_size_bytes))

    report = check(dp_communication_volume)
    assert [r.passed for r in report.results] == [True, True, False]
    assert report.failures[0].call == "dp_communication_volume(1.5e+09, 0)"
    assert "n <= 1 is not special-cased" in report.failures[0].reason


def _ddp_one_phase(model_size_bytes, num_gpus):
    n, size = _n(num_gpus), _p(model_size_bytes)
    return 0.0 if n <= 1 else float((n - 1) / n * size)


def _ddp_is_dp(model_size_bytes, num_gpus):
    return dp_communication_volume(model_size_bytes, num_gpus)


def _dp_is_ddp(model_size_bytes, num_gpus):
    return ddp_communication_volume(model_size_bytes, num_gpus)


def _ratio_by_division(model_size_bytes, num_gpus):
    n, size = _n(num_gpus), _p(model_size_bytes)
    if n <= 1 or size == 0:
        return 1.0 if n <= 1 else float(n)
    return dp_communication_volume(size, n) / ddp_communication_volume(size, n)


def _ratio_inverted(model_size_bytes, num_gpus):
    n = _n(num_gpus)
    _p(model_size_bytes)
    return 1.0 if n <= 1 else 1 / n


def _dp_multiplier_one(num_gpus):
    _n(num_gpus)
    return 1.0


@pytest.mark.parametrize("fn, name, says", [
    (_ddp_one_phase, "ddp_communication_volume", "exactly half: you counted one phase only"),
    (_ddp_is_dp, "ddp_communication_volume", "n times too much: that is DataParallel's"),
    (_dp_is_ddp, "dp_communication_volume", "n times too little: that is DDP's"),
    (_ratio_by_division, "communication_reduction_factor",
     "your factor changes with the model size at n = 3"),
    (_ratio_inverted, "communication_reduction_factor", "inverted: the factor is DP's volume"),
    (_dp_multiplier_one, "dp_gpu0_memory_multiplier", "1 is DDP's multiplier"),
], ids=lambda v: v.__name__ if callable(v) else None)
def test_common_mistakes_are_named(fn, name, says):
    fn.__name__ = name
    report = submit(fn)
    assert any(says in r.reason for r in report.failures), [r.reason for r in report.failures]


def test_diagnose_works_on_plain_values():
    """The diagnosis runs in the checker (the grader's side) on numbers, never on the child's
    objects: the same words from the values alone."""
    from dpcost.exercises.five_functions import diagnose

    assert diagnose("ddp_communication_volume", (1.5e9, 8), 1.3125e9, 2.625e9).startswith(
        "exactly half")
    assert diagnose("dp_communication_volume", (1.5e9, 8), 10.5e9, 21e9).startswith(
        "exactly half: you counted one direction only")
    assert "(n - 1)/n factor is missing" in diagnose("ddp_communication_volume", (1.5e9, 8),
                                                      3e9, 2.625e9)
    # one value, two mistakes: at n = 2, 2P is DP's 2(n - 1)P and the ring without (n - 1)/n
    assert diagnose("ddp_communication_volume", (1.5e9, 2), 3e9, 1.5e9) == ""
    assert diagnose("communication_reduction_factor", (0, 8), math.nan, 8.0).startswith("NaN")
    assert diagnose("dp_communication_volume", (1.5e9, 8), 1.0, 21e9) == ""  # no pattern


def test_a_failed_check_or_submit_points_to_the_hints_and_the_solution():
    def ddp_communication_volume(model_size_bytes, num_gpus):
        return _ddp_one_phase(model_size_bytes, num_gpus)

    pointer = ('Stuck after trying? The hint button under the task reveals its hints one at a '
               'time, then the worked solution; in code, `hint("ddp_communication_volume")` '
               'prints the next hint and `solution("ddp_communication_volume")` the worked '
               'solution.')
    for report in (check(ddp_communication_volume), submit(ddp_communication_volume)):
        assert report.footer == [pointer]
        assert str(report).endswith(pointer)
        assert report._repr_html_().endswith(
            "<code>solution(&quot;ddp_communication_volume&quot;)</code> the worked solution.</p>")
    assert check(REFERENCE[1]).footer == [] and submit(*REFERENCE).footer == []


# ---- issue 38: one diagnosis per mistake, the credit split, grouped reasons -------------------

def _with_checks(formula):
    """A student's function: the contract's checks and n <= 1, then ``formula(P, n)``."""
    def volume(model_size_bytes, num_gpus):
        size, n = _p(model_size_bytes), _n(num_gpus)
        return 0.0 if n <= 1 else float(formula(size, n))
    return volume


# Each mistake written out as a student would write it, and the words it must get on every line.
MISTAKEN = [
    ("ddp_communication_volume", lambda p, n: 2 * p, "the ring's (n - 1)/n factor is missing"),
    ("ddp_communication_volume", lambda p, n: 2 * n / n * p,
     "the ring's (n - 1)/n factor is missing"),
    ("ddp_communication_volume", lambda p, n: (n - 1) / n * p, "you counted one phase only"),
    ("ddp_communication_volume", lambda p, n: 2 * (n - 1) * p, "that is DataParallel's"),
    ("ddp_communication_volume", lambda p, n: 2 / n * p, "one step per phase"),
    ("dp_communication_volume", lambda p, n: 2 * n * p, "you used n where the formula has n - 1"),
    ("dp_communication_volume", lambda p, n: (n - 1) * p, "you counted one direction only"),
    ("dp_communication_volume", lambda p, n: 2 * (n - 1) / n * p, "that is DDP's"),
    ("dp_communication_volume", lambda p, n: 2 * p, "the n - 1 is missing"),
]


@pytest.mark.parametrize("name, formula, says", MISTAKEN)
def test_one_mistake_gets_one_diagnosis_in_the_examples_and_the_battery(name, formula, says):
    """The student's 2P for DDP was told "you used n where the formula has n - 1" by the worked
    examples and "n times too much: DataParallel's" by two battery rows (at n = 2, where 2P is
    also 2(n-1)P). Every wrong value of one mistake now gets the same, right, words."""
    fn = _with_checks(formula)
    fn.__name__ = name
    examples, battery_report = check(fn), submit(fn)
    wrong = [r for report in (examples, battery_report) for r in report.failures
             if r.reason.startswith("wrong value") and "overflow to inf" not in r.reason]
    assert examples.failures and len(wrong) > len(examples.failures)
    assert len({r.reason for r in wrong}) == 1 and says in wrong[0].reason, wrong


def test_the_2p_answer_is_not_called_n_for_n_minus_1_anywhere():
    def ddp_communication_volume(model_size_bytes, num_gpus):
        return 0.0 if _n(num_gpus) <= 1 else float(2 * _p(model_size_bytes))

    reasons = [r.reason for report in (check(ddp_communication_volume),
                                       submit(ddp_communication_volume))
               for r in report.failures if r.part == "formula and n <= 1"]
    assert reasons and all("(n - 1)/n factor is missing" in r for r in reasons), reasons
    assert not any("n times too much" in r or "where the formula has n - 1" in r
                   for r in reasons)
    # the n = 2 row that said "DataParallel's 2(n-1)P" before
    row = next(r for r in submit(ddp_communication_volume).failures
               if r.call == "ddp_communication_volume(5, 2)")
    assert "(n - 1)/n factor is missing" in row.reason


def test_a_right_formula_without_input_checks_earns_most_of_the_credit():
    """The review: right formulas without the contract's checks scored about half. The credit
    is now 80 % for the formula and n <= 1 and 20 % for the input checks, and the report says
    which tests count where. Counted here by hand from the battery's categories."""
    def dp_gpu0_memory_multiplier(num_gpus):
        return float(num_gpus)  # right for every integer, no check at all

    report = submit(dp_gpu0_memory_multiplier)
    checks = [r for r in report.results if r.category == "invalid num_gpus"]
    others = [r for r in report.results if r.category != "invalid num_gpus"]
    assert len(checks) == 5 and not any(r.passed for r in checks)
    assert all(r.passed for r in others)  # so the formula part is full, the checks part empty
    assert report.credit() == pytest.approx(0.8)
    text = str(report)
    assert "80 % of the credit" in text and "80 % for the formula and n <= 1" in text
    assert "20 % for the input checks" in text
    assert f"formula and n <= 1: {len(others)}/{len(others)}, input checks: 0/5" in text
    assert "80 % of the credit" in report._repr_html_()


def test_the_credit_weighs_each_part_by_its_tests_passed():
    """A function failing one formula test and every input check: 0.8 x (k - 1)/k."""
    def dp_communication_volume(model_size_bytes, num_gpus):
        n = num_gpus
        return 0.0 if n <= 1 else float(2 * (n - 1) * model_size_bytes)

    report = submit(dp_communication_volume)
    formula = [r for r in report.results if r.part == "formula and n <= 1"]
    checks = [r for r in report.results if r.part == "input checks"]
    assert len(formula) + len(checks) == report.total == 27
    # every invalid input fails (no checks), and numpy int64s overflow without the conversion
    assert not any(r.passed for r in checks) and all(r.passed for r in formula)
    assert report.credit() == pytest.approx(0.8)
    assert report.credit(exclude={"dp_communication_volume"}) == 0.0
    assert submit(*REFERENCE).credit() == 1.0


def test_repeated_reasons_are_grouped_with_a_count():
    def dp_communication_volume(model_size_bytes, num_gpus):
        n = num_gpus
        return 0.0 if n <= 1 else float(2 * (n - 1) * model_size_bytes)

    report = submit(dp_communication_volume)
    groups = report.grouped_failures()
    assert sum(1 + more for _, more in groups) == len(report.failures) == 14
    # no check at all: one line per parameter, and the numpy int64s that wrap around
    assert len(groups) == len({(r.part, r.reason) for r in report.failures}) == 3
    text = str(report)
    assert text.count("why: ") == len(groups)
    assert "why: no check of num_gpus" in text and "call check_num_gpus first" in text
    assert "(and 4 more tests of dp_communication_volume fail for the same reason)" in text
    assert "(and 7 more tests of dp_communication_volume fail for the same reason)" in text
    # the formula's failures first, then the input checks' (here only the checks fail)
    assert text.index("Failures, input checks (20 % of the credit)") > text.index("Score:")


def test_two_functions_reports_keep_each_functions_failures_together():
    def ddp_gpu0_memory_multiplier(num_gpus):
        return float(num_gpus)

    def dp_gpu0_memory_multiplier(num_gpus):
        return 1.0

    report = submit(dp_gpu0_memory_multiplier, ddp_gpu0_memory_multiplier)
    order = [r.function for r, _ in report.grouped_failures()]
    assert order == sorted(order, key=["dp_gpu0_memory_multiplier",
                                       "ddp_gpu0_memory_multiplier"].index)
    assert any("1 is DDP's multiplier" in r.reason for r in report.failures)
    assert any("n is DataParallel's multiplier" in r.reason for r in report.failures)


# ---- the grade cells' credit preview grades the notebook being run (issue 38) ----------------

def _ex1_copy(folder, name, solution_3=None):
    """The committed student notebook (stubs) saved as ``name`` in ``folder``, with
    dp_gpu0_memory_multiplier's cell written as ``solution_3``."""
    import nbformat

    from dpcost.exercises import STUDENT_DIR

    notebook = nbformat.read(STUDENT_DIR / "ex1_five_functions.ipynb", as_version=4)
    if solution_3 is not None:
        next(c for c in notebook.cells if c.get("id") == "solution-3").source = solution_3
    nbformat.write(notebook, folder / name)
    return folder / name


RIGHT_3 = ("def dp_gpu0_memory_multiplier(num_gpus):\n"
           "    return float(check_num_gpus(num_gpus))\n")


def test_the_credit_cell_grades_a_renamed_copy(tmp_path, monkeypatch, capsys):
    """The review: an edited copy (ex1_try.ipynb, File > Duplicate) got 0 and "not written yet"
    because the cell graded the file named ex1_five_functions.ipynb beside it. Jupyter's server
    tells the kernel its notebook (JPY_SESSION_NAME): that file is graded, and named."""
    from dpcost.exercises.five_functions import preview_credit

    _ex1_copy(tmp_path, "ex1_five_functions.ipynb")  # the untouched stubs, beside it
    copy = _ex1_copy(tmp_path, "ex1_try.ipynb", RIGHT_3)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JPY_SESSION_NAME", str(copy))
    assert preview_credit("dp_gpu0_memory_multiplier") == 1.0
    said = capsys.readouterr().out
    assert said.startswith("Graded: ex1_try.ipynb, the notebook this kernel runs, as saved.")
    assert "dp_gpu0_memory_multiplier: 16/16 tests passed" in said
    # a kernel not told its notebook (nbclient, nbval): the exercise's file here, said so
    monkeypatch.delenv("JPY_SESSION_NAME")
    assert preview_credit("dp_gpu0_memory_multiplier", points=2) == 0.0
    said = capsys.readouterr().out
    assert "Graded: ex1_five_functions.ipynb in this kernel's folder" in said
    assert "was not told which notebook it runs" in said and "not written yet" in said
    # a session path that is not an ex1 notebook is not graded
    (tmp_path / "other.ipynb").write_text('{"cells": []}')
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "other.ipynb"))
    (tmp_path / "ex1_five_functions.ipynb").unlink()
    assert preview_credit("dp_gpu0_memory_multiplier") == 0.0
    assert capsys.readouterr().out.startswith("No credit preview: this kernel was not told")
    assert sorted(os.listdir(tmp_path)) == ["ex1_try.ipynb", "other.ipynb"]  # no copy left


def test_the_credit_cell_says_when_the_saved_file_differs_from_what_ran(tmp_path, monkeypatch,
                                                                        capsys):
    """Edited and run, not saved: the preview grades the saved file and says that it differs
    from the code this kernel ran (IPython's own history of the cells it ran)."""
    from IPython.core.interactiveshell import InteractiveShell

    from dpcost.exercises.five_functions import preview_credit

    copy = _ex1_copy(tmp_path, "ex1_try.ipynb", RIGHT_3)
    monkeypatch.setenv("JPY_SESSION_NAME", str(copy))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))  # its history database here
    shell = InteractiveShell.instance()
    try:
        shell.run_cell(RIGHT_3, store_history=True)  # what the file holds: no warning
        assert preview_credit("dp_gpu0_memory_multiplier") == 1.0
        assert "not the one this kernel ran last" not in capsys.readouterr().out
        shell.run_cell(RIGHT_3.replace("float(", "1.0 * float("), store_history=True)
        assert preview_credit("dp_gpu0_memory_multiplier") == 1.0  # the saved file's credit
        said = capsys.readouterr().out
        assert ("The saved file's dp_gpu0_memory_multiplier is not the one this kernel ran "
                "last") in said
    finally:
        InteractiveShell.clear_instance()
