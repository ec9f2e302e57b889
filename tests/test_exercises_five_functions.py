"""check/submit for the five functions: right code passes, each kind of wrong code fails."""

import inspect
import math
import numbers
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
    assert "must raise TypeError naming num_gpus" in reasons["invalid num_gpus"]


def test_multiplying_before_dividing_overflows_to_inf():
    def ddp_communication_volume(model_size_bytes, num_gpus):
        size, n = _p(model_size_bytes), _n(num_gpus)
        return 0.0 if n <= 1 else float(2 * (n - 1) * size / n)  # 2e320 -> inf, then / n

    reasons = failing(submit(ddp_communication_volume))
    assert list(reasons) == ["huge values: near the float limit, or inf"]
    assert "inf != 2e+300" in reasons["huge values: near the float limit, or inf"]


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
    assert "(and 26 more tests" in str(report)


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
    assert "n = 0 is at most 1, where nothing is communicated" in report.failures[0].reason


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
    assert "n - 1" in diagnose("ddp_communication_volume", (1.5e9, 8), 3e9, 2.625e9)
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
