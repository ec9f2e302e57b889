"""The pure models under any input: a finite, non-negative answer, or a ValueError or TypeError
that names the parameter; and the orderings the course relies on.

Hypothesis draws the extremes a person or a widget can reach: integers past a float's range
(10**400), subnormal and huge floats, zero GPUs, inf and nan. Derandomized with at most 200
examples per property (tests/hypothesis_profile.py), so every run tries the same cases.
"""

import math
import time

import hypothesis_profile  # noqa: F401 - derandomized, before any @given
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpcost import core, memory, presets, step_time
from dpcost.dataparallel_traffic import dp_path_traffic, gpu_busy_bytes

NAMES = ("model_size_bytes", "num_gpus", "size_bytes", "bandwidth_bytes_per_s", "latency_s",
         "flops", "peak_flops_per_s", "utilisation", "bucket_bytes", "forward_s", "backward_s",
         "element_bytes", "parameters", "batch_size", "param_bytes", "grad_bytes", "the step's",
         "num_buckets",
         "the all-reduce")

sizes = st.one_of(st.integers(0, 10**20), st.integers(10**300, 10**400),
                  st.floats(0, 1e30), st.floats(1e300, 1.7e308), st.floats(0, 1e-300),
                  st.just(math.inf), st.just(math.nan), st.integers(-10, -1))
gpus = st.one_of(st.integers(0, 1100), st.integers(10**18, 10**20), st.just(-1))
rates = st.one_of(st.floats(1e-300, 1e-250), st.floats(1e-3, 1e15), st.floats(1e300, 1e308),
                  st.just(0.0), st.just(math.inf))
seconds = st.one_of(st.floats(0, 10.0), st.floats(1e300, 1e308), st.just(0.0))


def answers_or_names_a_parameter(call):
    """The value of ``call()`` if it returns; None if it refused with a message naming a
    parameter. Anything else (OverflowError, ZeroDivisionError, a nameless error) fails."""
    try:
        return call()
    except (ValueError, TypeError) as error:
        assert any(name in str(error) for name in NAMES), str(error)
        return None


def finite_and_non_negative(*values):
    for value in values:
        assert isinstance(value, float | int) and math.isfinite(value) and value >= 0, value


@given(sizes, gpus)
def test_the_five_functions(size, n):
    for function in (core.dp_communication_volume, core.ddp_communication_volume):
        value = answers_or_names_a_parameter(lambda f=function: f(size, n))
        if value is not None:
            assert value >= 0 and not math.isnan(value)
    ratio = answers_or_names_a_parameter(lambda: core.communication_reduction_factor(size, n))
    if ratio is not None:
        assert ratio >= 1 or n <= 1


@given(sizes, gpus, rates, rates)
def test_ring_allreduce_time(size, n, beta, alpha):
    value = answers_or_names_a_parameter(
        lambda: step_time.ring_allreduce_time(size, n, beta, alpha / 1e12))
    if value is not None:
        finite_and_non_negative(value)


@given(sizes, rates, st.floats(1e-300, 1.0))
def test_compute_time(flops, peak, utilisation):
    value = answers_or_names_a_parameter(
        lambda: step_time.compute_time(flops, peak, utilisation))
    if value is not None:
        finite_and_non_negative(value)


@given(seconds, seconds, st.lists(sizes, max_size=6), st.integers(1, 64), rates, rates)
def test_ddp_step_time(forward, backward, buckets, n, beta, alpha):
    step = answers_or_names_a_parameter(
        lambda: step_time.ddp_step_time(forward, backward, buckets, n, beta, alpha / 1e12))
    if step is not None:
        finite_and_non_negative(step.total_s, step.communication_s, step.exposed_communication_s)
        assert 0 <= step.exposed_fraction <= 1
        assert step.total_s >= step.compute_s - 1e-12 * step.total_s


@given(seconds, sizes, st.integers(1, 1024), rates, st.sampled_from(["copy", "nccl"]))
def test_dp_step_time(compute, size, n, beta, path):
    step = answers_or_names_a_parameter(
        lambda: step_time.dp_step_time(compute, 2 * compute, size, size, n, beta, 1e-6,
                                       path=path))
    if step is not None:
        finite_and_non_negative(step.total_s, step.communication_s)
        assert step.exposed_fraction <= 1


@given(st.one_of(st.integers(0, 10**15), st.floats(0, 1e15)), st.integers(1, 64),
       st.integers(1, 8), st.integers(0, 63))
def test_gloo_messages_are_whole_and_bounded(size, n, element, rank):
    count = answers_or_names_a_parameter(
        lambda: step_time.gloo_ring_allreduce_messages(size, n, element, rank=rank % n))
    if count is not None:
        assert isinstance(count, int) and 0 <= count <= 2 * (n - 1) * max(
            1, math.ceil(size / (1024 * 1024)) + 2 * n)


@given(st.one_of(st.integers(0, 10**19), st.integers(10**300, 10**400)), st.integers(1, 2048),
       st.integers(1, 4096), st.sampled_from(["fp32", "mixed", "bf16"]))
def test_memory_per_gpu(parameters, n, batch, precision):
    model = answers_or_names_a_parameter(lambda: presets.custom_model(parameters))
    if model is None:
        return
    mem = answers_or_names_a_parameter(
        lambda: memory.memory_per_gpu(model, n, batch, precision=precision))
    if mem is not None:
        for side in mem.values():
            finite_and_non_negative(*side.values())
        ratio = memory.gpu0_memory_ratio(model, n, batch, precision=precision)
        assert math.isfinite(ratio) and ratio >= 1 - 1e-12


@given(st.one_of(st.integers(0, 10**19), st.integers(10**300, 10**400)), st.integers(1, 4096),
       st.sampled_from(memory.STRATEGIES))
def test_model_state_shrinks_with_each_stage(parameters, n, strategy):
    states = answers_or_names_a_parameter(
        lambda: memory.model_state_bytes_per_rank(parameters, n, strategy))
    if states is not None:
        finite_and_non_negative(*states.values())
        baseline = memory.model_state_bytes_per_rank(parameters, n, "ddp")
        assert sum(states.values()) <= sum(baseline.values())


@given(st.integers(0, 10**13), st.integers(2, 1024), st.sampled_from(["copy", "nccl"]))
def test_gpu0_is_the_busiest_link_of_dataparallel(size, n, path):
    rows = dp_path_traffic(size, 0, size, 0, 0, n, path=path)
    busy = [gpu_busy_bytes(rows, gpu) for gpu in range(n)]
    assert busy[0] == max(busy)
    assert busy[0] >= core.ddp_communication_volume(size, n) - 1e-6 * size


@pytest.mark.parametrize("call", [
    lambda: step_time.gloo_ring_allreduce_messages(1e14, 8),
    lambda: step_time.dp_step_time(1e-3, 2e-3, 1e12, 1e12, 1024, 1e9, 1e-6),
], ids=["gloo messages of 100 TB", "DataParallel's step at 1 TB on 1024 GPUs"])
def test_large_inputs_are_closed_form(call):
    """Counted in closed form, not by a loop over segments or chunks and GPUs (they took 11 s
    and 15 s): well under a second even on a loaded machine."""
    started = time.process_time()
    call()
    assert time.process_time() - started < 1.0


@given(st.one_of(st.integers(0, 10**6), st.integers(10**300, 10**400)), st.integers(1, 4096),
       st.floats(0, 1e-3))
def test_allreduce_latency(num_buckets, n, alpha):
    from dpcost import strategies

    value = answers_or_names_a_parameter(
        lambda: strategies.allreduce_latency_s(num_buckets, n, alpha))
    if value is not None:
        finite_and_non_negative(value)
