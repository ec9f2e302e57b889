"""The five core functions against their contract (issue 2), recomputed independently."""

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

SIZES = [0, 1, 7, 1000, 4_000_000, 1.5e9, 25 * 2**20, 0.5, 3.14159, 7e12]
GPUS = [2, 3, 4, 5, 7, 8, 16, 64, 1000, 1024]
VOLUME_FUNCTIONS = [dp_communication_volume, ddp_communication_volume]
SIZE_FUNCTIONS = VOLUME_FUNCTIONS + [communication_reduction_factor]
GPU_ONLY_FUNCTIONS = [dp_gpu0_memory_multiplier, ddp_gpu0_memory_multiplier]


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", GPUS)
def test_formulas(size, n):
    exact = Fraction(size)
    assert close(dp_communication_volume(size, n), float(2 * (n - 1) * exact))
    assert close(ddp_communication_volume(size, n), float(Fraction(2 * (n - 1), n) * exact))
    assert dp_gpu0_memory_multiplier(n) == float(n)
    assert ddp_gpu0_memory_multiplier(n) == 1.0
    assert communication_reduction_factor(size, n) == float(n)


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


@pytest.mark.parametrize("bad", [True, False, np.bool_(True), 8.0, 2.5, "8", None, [8], 8j,
                                 Fraction(8), object()])
def test_num_gpus_type_errors(bad):
    for fn in SIZE_FUNCTIONS:
        with pytest.raises(TypeError, match="num_gpus"):
            fn(100, bad)
    for fn in GPU_ONLY_FUNCTIONS:
        with pytest.raises(TypeError, match="num_gpus"):
            fn(bad)


@pytest.mark.parametrize("bad", [True, False, np.bool_(False), "1GB", "100", None, [1], 1j,
                                 Fraction(1, 2), object()])
def test_model_size_type_errors(bad):
    for fn in SIZE_FUNCTIONS:
        with pytest.raises(TypeError, match="model_size_bytes"):
            fn(bad, 4)


@pytest.mark.parametrize("bad", [-1, -0.5, -1e9, np.int64(-3), float("nan"), float("inf"),
                                 float("-inf"), np.float64("nan"), np.float32("inf")])
def test_model_size_value_errors(bad):
    for fn in SIZE_FUNCTIONS:
        with pytest.raises(ValueError, match="model_size_bytes"):
            fn(bad, 4)


def test_model_size_checked_even_when_one_gpu():
    with pytest.raises(ValueError, match="model_size_bytes"):
        dp_communication_volume(-1, 1)
    with pytest.raises(TypeError, match="model_size_bytes"):
        communication_reduction_factor("1GB", 0)


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


@given(st.integers(min_value=-(10**600), max_value=10**600))
def test_gpu0_multiplier_keeps_the_sign_of_n(n):
    # The contract: float(n) for every integer n, saturated to inf with n's sign.
    value = dp_gpu0_memory_multiplier(n)
    try:
        expected = float(n)
    except OverflowError:
        expected = math.inf if n > 0 else -math.inf
    assert value == expected
    assert math.copysign(1.0, value) == (1.0 if n >= 0 else -1.0)


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
    assert math.copysign(1.0, dpcost.core.check_model_size_bytes(zero)) == 1.0


@pytest.mark.parametrize("bad", [np.timedelta64(8), np.timedelta64(8, "s"),
                                 np.datetime64(8, "D")])
def test_numpy_times_are_not_numbers(bad):
    # numpy registers timedelta64 as an integer type (numbers.Integral); a duration is refused.
    for fn in SIZE_FUNCTIONS:
        with pytest.raises(TypeError, match="num_gpus"):
            fn(100, bad)
        with pytest.raises(TypeError, match="model_size_bytes"):
            fn(bad, 4)
    for fn in GPU_ONLY_FUNCTIONS:
        with pytest.raises(TypeError, match="num_gpus"):
            fn(bad)


def test_error_for_a_5000_digit_negative_size_names_the_parameter():
    # Python refuses int -> str beyond 4300 digits; the message gives the digit count instead.
    for fn in SIZE_FUNCTIONS:
        with pytest.raises(ValueError, match=r"model_size_bytes must be >= 0, got -\(an "
                                             r"integer of 5001 digits\)"):
            fn(-(10**5000), 4)
    with pytest.raises(ValueError, match=r"got -\(an integer of 5000 digits\)"):
        dpcost.core.check_model_size_bytes(-(10**4999 + 1))


def test_errors_show_bad_values_briefly_and_safely():
    class BadRepr:
        def __repr__(self):
            raise RuntimeError("no repr")

    with pytest.raises(TypeError, match="num_gpus .* BadRepr"):
        dp_gpu0_memory_multiplier(BadRepr())
    with pytest.raises(TypeError, match="model_size_bytes") as info:
        dp_communication_volume("9" * 100_000, 4)
    assert len(str(info.value)) < 200


@pytest.mark.skipif(np.finfo(np.longdouble).max <= np.finfo(np.float64).max,
                    reason="numpy.longdouble is a float64 on this platform")
def test_finite_longdouble_beyond_float_range_says_so():
    big = np.longdouble("1e4000")
    assert np.isfinite(big)
    for fn in SIZE_FUNCTIONS:
        with pytest.raises(ValueError, match="model_size_bytes .* too large for a float") as info:
            fn(big, 4)
        assert "finite" not in str(info.value)
        with pytest.raises(ValueError, match="model_size_bytes must be >= 0"):
            fn(-big, 4)
    assert dp_communication_volume(np.longdouble(2.5), 3) == 10.0  # in range: accepted


def test_check_real_names_the_parameter_and_its_bounds():
    from dpcost.core import check_real

    assert check_real(3, "x") == 3.0
    with pytest.raises(TypeError, match="latency_s must be a number, got bool"):
        check_real(True, "latency_s")
    with pytest.raises(ValueError, match="bytes must be >= 0"):
        check_real(-1, "bytes", 0.0)
    with pytest.raises(ValueError, match="beta must be > 0"):
        check_real(0, "beta", 0.0, strict=True)
    with pytest.raises(ValueError, match="must be finite"):
        check_real(10**400, "size")


def test_the_shared_validators_name_the_parameter_and_agree_everywhere():
    """core's check_int, check_choice and check_ranks are the models' one set of validators."""
    import numpy as np

    from dpcost import explorer_model, memory, presets, strategies
    from dpcost.core import check_choice, check_int, check_ranks

    assert check_int(np.int64(3), "k", 1) == 3 and type(check_int(np.int64(3), "k", 1)) is int
    with pytest.raises(TypeError, match="k must be an integer"):
        check_int(True, "k", 0)
    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        check_int(0, "k", 1)
    assert check_choice("b", "mode", ("a", "b")) == "b"
    with pytest.raises(ValueError, match=r"mode must be one of \('a', 'b'\), got 'c'"):
        check_choice("c", "mode", ("a", "b"))
    with pytest.raises(ValueError, match="mode must be one of"):
        check_choice(["unhashable"], "mode", {"a": 1})
    with pytest.raises(ValueError, match="num_gpus must be >= 1"):
        check_ranks(0)
    # the cases the copies used to disagree on: a numpy int in the explorer, 10**400 bytes
    assert explorer_model._check_int("global_batch", np.int64(8), 1) == 8
    with pytest.raises(ValueError, match="size_bytes must be finite"):
        strategies.ring_allreduce_bytes(10**400, 4)
    with pytest.raises(ValueError, match="x must be finite"):
        memory._check_bytes("x", 10**400)
    with pytest.raises(TypeError, match="parameters must be an integer"):
        presets.custom_model(1.5)
