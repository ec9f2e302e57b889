"""The alpha-beta time model, recomputed by hand."""

import numpy as np
import pytest

from dpcost import step_time
from dpcost.alpha_beta import (
    ddp_bucketed_time_terms,
    ddp_communication_time_terms,
    dp_chunked_time_terms,
    dp_communication_time_terms,
)


def ddp_communication_time(*args):
    return sum(ddp_communication_time_terms(*args))


def dp_communication_time(*args):
    return sum(dp_communication_time_terms(*args))


FUNCTIONS = [
    ddp_communication_time_terms,
    dp_communication_time_terms,
]


def test_worked_example_100MB_25GBps_5us():
    # 100 MB over 25 GB/s with 5 us per message, n = 4.
    # ring: 6 messages -> 30 us; 2*3/4*1e8 = 1.5e8 bytes / 2.5e10 = 6 ms
    lat, bw = ddp_communication_time_terms(100e6, 4, 25e9, 5e-6)
    assert lat == pytest.approx(30e-6, rel=1e-12)
    assert bw == pytest.approx(6e-3, rel=1e-12)
    # star: 6 messages -> 30 us; 2*3*1e8 = 6e8 bytes / 2.5e10 = 24 ms
    lat, bw = dp_communication_time_terms(100e6, 4, 25e9, 5e-6)
    assert lat == pytest.approx(30e-6, rel=1e-12)
    assert bw == pytest.approx(24e-3, rel=1e-12)
    assert ddp_communication_time(100e6, 4, 25e9, 5e-6) == pytest.approx(6.03e-3, rel=1e-12)
    assert dp_communication_time(100e6, 4, 25e9, 5e-6) == pytest.approx(24.03e-3, rel=1e-12)


def test_more_hand_cases():
    # 1 GB on 8 GPUs over 100 GB/s, 2 us: ring 14 * 2 us = 28 us, 1.75e9 / 1e11 = 17.5 ms
    assert ddp_communication_time_terms(1e9, 8, 100e9, 2e-6) == pytest.approx((28e-6, 17.5e-3))
    # star: 28 us and 14e9 / 1e11 = 140 ms
    assert dp_communication_time_terms(1e9, 8, 100e9, 2e-6) == pytest.approx((28e-6, 0.14))
    # 2 GPUs, zero latency: ring 1 * S / beta, star 2 * S / beta
    assert ddp_communication_time(4000, 2, 1000, 0) == pytest.approx(4.0)
    assert dp_communication_time(4000, 2, 1000, 0) == pytest.approx(8.0)


@pytest.mark.parametrize("n", [2, 3, 4, 7, 8, 16, 64, 1000])
@pytest.mark.parametrize("size", [1, 1e6, 1.5e9, 25 * 2**20])
def test_bandwidth_ratio_is_n_and_latency_terms_equal(n, size):
    ddp_lat, ddp_bw = ddp_communication_time_terms(size, n, 25e9, 5e-6)
    dp_lat, dp_bw = dp_communication_time_terms(size, n, 25e9, 5e-6)
    assert dp_bw / ddp_bw == pytest.approx(n, rel=1e-12)
    assert dp_lat == ddp_lat == pytest.approx(2 * (n - 1) * 5e-6, rel=1e-12)


def test_ring_bandwidth_term_is_bounded_latency_term_grows():
    size, beta, alpha = 100e6, 25e9, 5e-6
    terms = [ddp_communication_time_terms(size, n, beta, alpha) for n in range(2, 257)]
    bandwidths = [bw for _, bw in terms]
    latencies = [lat for lat, _ in terms]
    assert all(b < 2 * size / beta for b in bandwidths)  # approaches 2 S / beta from below
    assert bandwidths == sorted(bandwidths)
    steps = [b - a for a, b in zip(latencies[:-1], latencies[1:], strict=True)]
    assert steps == pytest.approx([2 * alpha] * len(steps))  # +2 alpha per extra rank


@pytest.mark.parametrize("n", [1, 0, -3])
def test_one_gpu_costs_nothing(n):
    for f in (ddp_communication_time_terms, dp_communication_time_terms):
        assert f(1e9, n, 25e9, 5e-6) == (0.0, 0.0)
    assert ddp_communication_time(1e9, n, 25e9, 5e-6) == 0.0
    assert dp_communication_time(1e9, n, 25e9, 5e-6) == 0.0


def test_returns_floats_for_numpy_and_int_inputs():
    lat, bw = ddp_communication_time_terms(np.int64(1000), np.int32(4), np.float64(1e3), 0)
    assert isinstance(lat, float) and isinstance(bw, float)
    assert bw == pytest.approx(1.5)


def test_the_ring_terms_are_step_times():
    """alpha_beta is the lessons' face of step_time's terms: the same floats, bit for bit."""
    for args in [(100e6, 4, 25e9, 5e-6), (1e9, 8, 100e9, 2e-6), (4000, 2, 1000, 0)]:
        assert ddp_communication_time_terms(*args) == step_time.ring_allreduce_terms(*args)
        assert ddp_communication_time(*args) == step_time.ring_allreduce_time(*args)


def test_bucketed_and_chunked_terms_by_hand():
    # 5 buckets of 100 B at n=4, beta=10, alpha=1: 5 x 6 alphas; 2*3/4*500/10
    assert ddp_bucketed_time_terms([100] * 5, 4, 10, 1) == (30.0, 75.0)
    assert ddp_bucketed_time_terms([100], 1, 10, 1) == (0.0, 0.0)
    # 25 MiB in 10 MiB chunks = 3 chunks each way: 2 x 3 x 3 alphas on both paths
    P = 25 * 2**20
    lat, bw = dp_chunked_time_terms(P, 4, 1e9, 1e-6, path="copy")
    assert (lat, bw) == (pytest.approx(18e-6), pytest.approx(2 * 3 * P / 1e9))
    lat, bw = dp_chunked_time_terms(P, 4, 1e9, 1e-6, path="nccl")
    assert (lat, bw) == (pytest.approx(18e-6), pytest.approx(2 * P / 1e9))
    # the one-stream functions charge the latency of one message each way
    assert dp_communication_time_terms(P, 4, 1e9, 1e-6)[0] == pytest.approx(6e-6)


@pytest.mark.parametrize("f", FUNCTIONS)
@pytest.mark.parametrize("kwargs, error, parameter", [
    ({"model_size_bytes": "1GB"}, TypeError, "model_size_bytes"),
    ({"model_size_bytes": -1}, ValueError, "model_size_bytes"),
    ({"model_size_bytes": 10**400}, ValueError, "model_size_bytes"),  # past a float's range
    ({"model_size_bytes": 1e308, "bandwidth_bytes_per_s": 1e-3}, ValueError,
     "size_bytes"),  # finite bytes, but their time overflows
    ({"num_gpus": 2.0}, TypeError, "num_gpus"),
    ({"bandwidth_bytes_per_s": 0}, ValueError, "bandwidth_bytes_per_s"),
    ({"bandwidth_bytes_per_s": 0, "num_gpus": 1}, ValueError, "bandwidth_bytes_per_s"),
    ({"latency_s": None}, TypeError, "latency_s"),
])
def test_bad_input_names_the_parameter(f, kwargs, error, parameter):
    args = {"model_size_bytes": 1e9, "num_gpus": 4, "bandwidth_bytes_per_s": 25e9,
            "latency_s": 5e-6, **kwargs}
    with pytest.raises(error) as info:
        f(**args)
    assert parameter in str(info.value)


@pytest.mark.parametrize("call, error, parameter", [
    (lambda: dp_chunked_time_terms(1e9, 4, 1e9, 1e-6, path="tree"), ValueError, "path"),
    (lambda: dp_chunked_time_terms(1e9, 4, 1e9, 1e-6, chunk_bytes=0), ValueError,
     "chunk_bytes"),
    (lambda: dp_chunked_time_terms(-1, 4, 1e9, 1e-6), ValueError, "model_size_bytes"),
    (lambda: ddp_bucketed_time_terms(100, 4, 1e9, 1e-6), TypeError, "bucket_bytes"),
    (lambda: ddp_bucketed_time_terms([1], 4, 0, 1e-6), ValueError, "bandwidth_bytes_per_s"),
])
def test_bad_bucket_and_chunk_input_names_the_parameter(call, error, parameter):
    with pytest.raises(error) as info:
        call()
    assert parameter in str(info.value)
