"""The five core functions against their contract (issue 2), recomputed independently."""

import math
from fractions import Fraction

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
