"""The sandbox: student code runs in a forked child; nothing it does reaches the caller."""

import os
import time

import pytest

from dpcost.exercises.sandbox import run_many, run_sandboxed


def multiply(a, b):
    return a * b


def noisy(x):
    print("python-level noise")
    os.write(1, b"fd-level noise\n")
    os.write(2, b"stderr noise\n")
    return x


def loop_forever():
    while True:
        pass


def test_returns_value_and_type():
    outcome = run_sandboxed(multiply, 6, 7)
    assert outcome.status == "returned" and outcome.value == 42
    assert outcome.value_type == "int" and outcome.value_repr == "42"


def test_exception_reported_with_type_message_and_bases():
    outcome = run_sandboxed(int, "not a number")
    assert outcome.status == "raised" and outcome.error_type == "ValueError"
    assert "not a number" in outcome.error_message
    assert "Exception" in outcome.error_bases


def test_system_exit_is_a_result_not_an_exit():
    outcome = run_sandboxed(exit, 3)
    assert outcome.status == "raised" and outcome.error_type == "SystemExit"


def test_print_noise_captured_not_shown(capfd):
    outcome = run_sandboxed(noisy, 5)
    assert outcome.value == 5
    for text in ("python-level noise", "fd-level noise", "stderr noise"):
        assert text in outcome.stdout
    out, err = capfd.readouterr()
    assert "noise" not in out + err


def test_infinite_loop_times_out_and_is_killed():
    start = time.perf_counter()
    outcome = run_sandboxed(loop_forever, timeout=0.3)
    assert outcome.status == "timeout" and "0.3 s" in outcome.detail
    assert time.perf_counter() - start < 5


def test_child_that_dies_is_reported():
    outcome = run_sandboxed(os._exit, 7)
    assert outcome.status == "crashed" and "code 7" in outcome.detail


def test_unpicklable_value_keeps_its_repr():
    outcome = run_sandboxed(lambda: (lambda: 1))
    assert outcome.status == "returned" and outcome.value is None
    assert outcome.value_type == "function"


def test_run_many_carries_on_after_a_timeout():
    calls = [(multiply, (2, 3), {}), (loop_forever, (), {}), (multiply, (4, 5), {})]
    outcomes = run_many(calls, timeout=0.3)
    assert [o.status for o in outcomes] == ["returned", "timeout", "returned"]
    assert outcomes[2].value == 20


def test_run_many_skips_after_max_timeouts():
    start = time.perf_counter()
    outcomes = run_many([(loop_forever, (), {})] * 6, timeout=0.2, max_timeouts=2)
    assert [o.status for o in outcomes] == ["timeout"] * 2 + ["skipped"] * 4
    assert time.perf_counter() - start < 5


def test_child_state_never_leaks_into_parent():
    state = []
    run_sandboxed(state.append, 1)
    assert state == []


@pytest.mark.parametrize("bad", [0, -1, "1", True])
def test_bad_timeout(bad):
    with pytest.raises(ValueError, match="timeout"):
        run_sandboxed(multiply, 1, 2, timeout=bad)


def test_not_callable():
    with pytest.raises(TypeError, match="func"):
        run_sandboxed(42)
