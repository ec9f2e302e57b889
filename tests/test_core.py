"""The five core functions against their contract (issue 2), and core's shared checkers."""

import math
from fractions import Fraction

import hypothesis_profile  # noqa: F401 - derandomized, before any @given
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dpcost
from dpcost import (
    communication_reduction_factor,
    ddp_communication_volume,
    ddp_gpu0_memory_multiplier,
    dp_communication_volume,
    dp_gpu0_memory_multiplier,
)
from dpcost.core import (
    check_choice,
    check_int,
    check_model_size_bytes,
    check_ranks,
    check_real,
)

GPUS = [2, 3, 4, 5, 7, 8, 16, 64, 1000, 1024]
VOLUME_FUNCTIONS = [dp_communication_volume, ddp_communication_volume]
SIZE_FUNCTIONS = VOLUME_FUNCTIONS + [communication_reduction_factor]
GPU_ONLY_FUNCTIONS = [dp_gpu0_memory_multiplier, ddp_gpu0_memory_multiplier]


def test_worked_example_matches_hand_arithmetic():
    # 1.5 GB on 8 GPUs: DP 2*7*1.5 = 21 GB through GPU0; DDP 2*7/8*1.5 = 2.625 GB per rank.
    assert dp_communication_volume(1.5e9, 8) == 21e9
    assert ddp_communication_volume(1.5e9, 8) == 2.625e9
    assert communication_reduction_factor(1.5e9, 8) == 8.0


@pytest.mark.parametrize("n", [1, 0, -1, -8, -(10**30)])
@pytest.mark.parametrize("size", [0, 1, 1.5e9])
def test_one_gpu_or_fewer(n, size):
    assert dp_communication_volume(size, n) == 0.0
    assert ddp_communication_volume(size, n) == 0.0
    assert communication_reduction_factor(size, n) == 1.0
    assert dp_gpu0_memory_multiplier(n) == float(n)
    assert ddp_gpu0_memory_multiplier(n) == 1.0


def test_results_are_python_floats():
    for size in [0, 5, 5.0, np.int64(5), np.float32(5.0)]:
        for n in [0, 1, 2, 8, np.int32(8)]:
            for fn in SIZE_FUNCTIONS:
                assert type(fn(size, n)) is float
        for fn in GPU_ONLY_FUNCTIONS:
            assert type(fn(np.int64(3))) is float


def test_ratio_is_n_even_for_zero_bytes():
    for n in GPUS:
        assert communication_reduction_factor(0, n) == float(n)
        assert communication_reduction_factor(0.0, n) == float(n)


@pytest.mark.parametrize("size_type", [np.int8, np.int32, np.int64, np.uint64, np.float16,
                                       np.float32, np.float64])
@pytest.mark.parametrize("gpu_type", [np.int8, np.int16, np.int32, np.int64, np.uint8])
def test_numpy_scalars(size_type, gpu_type):
    size, n = size_type(100), gpu_type(4)
    assert dp_communication_volume(size, n) == 600.0
    assert ddp_communication_volume(size, n) == 150.0
    assert communication_reduction_factor(size, n) == 4.0
    assert dp_gpu0_memory_multiplier(n) == 4.0


def test_numpy_integers_do_not_overflow():
    assert dp_communication_volume(np.int64(2**62), np.int64(2**40)) == float(
        2 * (2**40 - 1) * 2**62)


def test_docstrings_give_formula_and_units():
    for fn in SIZE_FUNCTIONS + GPU_ONLY_FUNCTIONS:
        doc = fn.__doc__
        assert doc and ("bytes" in doc or "dimensionless" in doc)
    assert "2 (n - 1) P" in dp_communication_volume.__doc__
    assert "2 (n - 1) / n * P" in ddp_communication_volume.__doc__


def test_package_exports_exactly_the_five():
    assert sorted(dpcost.__all__) == sorted(fn.__name__ for fn in SIZE_FUNCTIONS +
                                            GPU_ONLY_FUNCTIONS)


# Property-based checks (hypothesis).
sizes = st.one_of(st.integers(min_value=0, max_value=10**15),
                  st.floats(min_value=0, max_value=1e15, allow_nan=False, allow_infinity=False,
                            allow_subnormal=False))
gpu_counts = st.integers(min_value=2, max_value=100_000)


@given(sizes, gpu_counts)
def test_dp_is_n_times_ddp(size, n):
    # abs_tol: sizes below a byte may be subnormal floats, where relative rounding is coarse.
    assert math.isclose(dp_communication_volume(size, n), n * ddp_communication_volume(size, n),
                        rel_tol=1e-12, abs_tol=1e-9)


@given(sizes, sizes, st.integers(min_value=-10, max_value=10**6))
def test_ratio_independent_of_size(a, b, n):
    assert communication_reduction_factor(a, n) == communication_reduction_factor(b, n)


@given(sizes, gpu_counts)
def test_ddp_volume_below_twice_the_size(size, n):
    volume = ddp_communication_volume(size, n)
    assert volume < 2 * size or size == 0
    assert volume >= size  # n >= 2: at least one full copy's worth


@given(sizes, gpu_counts)
def test_dp_volume_linear_in_n(size, n):
    step = dp_communication_volume(size, n + 1) - dp_communication_volume(size, n)
    assert math.isclose(step, 2 * size, rel_tol=1e-9, abs_tol=1e-6)
    assert math.isclose(dp_communication_volume(size, n), (n - 1) * dp_communication_volume(
        size, 2), rel_tol=1e-12, abs_tol=1e-9)


def test_huge_values_saturate_to_inf_not_crash():
    assert dp_communication_volume(1e300, 10**20) == math.inf
    assert dp_communication_volume(10**400, 2) == math.inf
    assert communication_reduction_factor(1, 10**400) == math.inf
    assert dp_gpu0_memory_multiplier(10**400) == math.inf


# The edges (issue 9, section 4): each test below failed before its fix.
HUGE_GPUS = [10**20, 10**308, 10**400, 10**5000]


@pytest.mark.parametrize("n", [2, 8] + HUGE_GPUS,
                         ids=["2", "8", "1e20", "1e308", "1e400", "1e5000"])
def test_zero_bytes_move_nothing_for_every_n(n):
    # 2 (n - 1) * 0.0 once overflowed converting n to float and saturated to inf.
    for size in [0, 0.0, np.float64(0.0), np.int64(0)]:
        assert dp_communication_volume(size, n) == 0.0
        assert ddp_communication_volume(size, n) == 0.0


def test_tiny_size_times_huge_n_is_the_exact_product():
    # n does not fit a float, but 2 (n - 1) P does: the exact product decides, not inf.
    expected = float(2 * (10**400 - 1) * Fraction(1e-300))
    assert dp_communication_volume(1e-300, 10**400) == expected
    assert math.isclose(expected, 2e100, rel_tol=1e-12)
    assert ddp_communication_volume(10**400, 10**400) == math.inf  # beyond range: inf


@pytest.mark.parametrize("n", [-(10**400), -(10**5000)], ids=["-1e400", "-1e5000"])
def test_huge_negative_n(n):
    # n <= 1: volumes 0.0 and factor 1.0; the GPU0 multiplier is float(n), saturated: -inf.
    assert dp_gpu0_memory_multiplier(n) == -math.inf
    assert ddp_gpu0_memory_multiplier(n) == 1.0
    assert dp_communication_volume(1.5e9, n) == 0.0
    assert ddp_communication_volume(1.5e9, n) == 0.0
    assert communication_reduction_factor(1.5e9, n) == 1.0


@pytest.mark.parametrize("zero", [-0.0, np.float64(-0.0), np.float32(-0.0)])
@pytest.mark.parametrize("n", [1, 2, 8])
def test_negative_zero_size_gives_positive_zero(zero, n):
    for fn in VOLUME_FUNCTIONS:
        assert math.copysign(1.0, fn(zero, n)) == 1.0, fn.__name__
    assert math.copysign(1.0, check_model_size_bytes(zero)) == 1.0


class BadRepr:
    def __repr__(self):
        raise RuntimeError("no repr")


HAS_WIDE_LONGDOUBLE = np.finfo(np.longdouble).max > np.finfo(np.float64).max
# (bad value, the parameter it is given as, the error): the contract ex1 grades students on.
BAD_INPUTS = [
    *[(bad, "num_gpus", TypeError) for bad in [
        True, np.bool_(True), 8.0, "8", None, [8], 8j, Fraction(8), object(), BadRepr(),
        np.timedelta64(8), np.datetime64(8, "D")]],
    *[(bad, "model_size_bytes", TypeError) for bad in [
        False, np.bool_(False), "1GB", "9" * 100_000, None, [1], 1j, Fraction(1, 2), object(),
        np.timedelta64(8, "s")]],
    *[(bad, "model_size_bytes", ValueError) for bad in [
        -1, -0.5, np.int64(-3), float("nan"), float("inf"), float("-inf"), np.float32("inf"),
        -(10**5000)]],
    *([(np.longdouble("1e4000"), "model_size_bytes", ValueError),
       (-np.longdouble("1e4000"), "model_size_bytes", ValueError)] if HAS_WIDE_LONGDOUBLE else []),
]


@pytest.mark.parametrize("bad, parameter, error", BAD_INPUTS,
                         ids=[f"{p}-{i}" for i, (_, p, _) in enumerate(BAD_INPUTS)])
def test_bad_input_names_the_parameter(bad, parameter, error):
    """Each function refuses it, for any n (n = 1 too), in one short line naming the parameter."""
    if parameter == "num_gpus":
        calls = [(fn, (100, bad)) for fn in SIZE_FUNCTIONS] + [(fn, (bad,))
                                                                for fn in GPU_ONLY_FUNCTIONS]
    else:
        calls = [(fn, (bad, n)) for fn in SIZE_FUNCTIONS for n in (4, 1)]
    for fn, args in calls:
        with pytest.raises(error) as info:
            fn(*args)
        message = str(info.value)
        assert parameter in message and len(message) < 200 and "\n" not in message, fn.__name__


def test_checkers_return_plain_values():
    assert check_real(3, "x") == 3.0 and type(check_real(np.float32(3), "x")) is float
    assert check_int(np.int64(3), "k", 1) == 3 and type(check_int(np.int64(3), "k", 1)) is int
    assert check_choice("b", "mode", ("a", "b")) == "b"


@pytest.mark.parametrize("call, error, parameter", [
    (lambda: check_real(True, "latency_s"), TypeError, "latency_s"),
    (lambda: check_real(-1, "bytes", 0.0), ValueError, "bytes"),
    (lambda: check_real(0, "beta", 0.0, strict=True), ValueError, "beta"),
    (lambda: check_real(10**400, "size"), ValueError, "size"),
    (lambda: check_int(True, "k", 0), TypeError, "k"),
    (lambda: check_int(0, "k", 1), ValueError, "k"),
    (lambda: check_choice("c", "mode", ("a", "b")), ValueError, "mode"),
    (lambda: check_choice(["unhashable"], "mode", {"a": 1}), ValueError, "mode"),
    (lambda: check_ranks(0), ValueError, "num_gpus"),
])
def test_checkers_name_the_parameter(call, error, parameter):
    """core's checkers, the models' one set of validators, name the parameter."""
    with pytest.raises(error) as info:
        call()
    assert parameter in str(info.value)
