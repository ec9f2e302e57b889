"""The ring figures draw what the simulator and the alpha-beta model computed."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from dpcost.plots.ring import bytes_per_rank, ring_frames, time_vs_gpus  # noqa: E402
from dpcost.ring import simulate_ring_allreduce, simulate_star_allreduce  # noqa: E402


def arrays(n, length=12):
    return [np.arange(length, dtype=np.int64) * (r + 1) for r in range(n)]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_frames(n):
    fig, data = ring_frames(simulate_ring_allreduce(arrays(n)))
    frames = data["frames"]
    assert len(frames) == 1 + 2 * (n - 1)
    assert frames[0][1] == [[1] * n] * n
    assert frames[-1][1] == [[n] * n] * n
    # after reduce-scatter each rank holds exactly one fully reduced chunk
    assert all(row.count(n) == 1 for row in frames[n - 1][1])
    assert fig.axes[0].get_title() == "start"
    plt.close(fig)


def test_ring_frames_needs_two_ranks():
    with pytest.raises(ValueError, match="at least 2"):
        ring_frames(simulate_ring_allreduce(arrays(1)))


def test_bytes_per_rank():
    ring, star = simulate_ring_allreduce(arrays(4)), simulate_star_allreduce(arrays(4))
    fig, data = bytes_per_rank(ring, star)
    assert data["ring_sent"] == [2 * 3 * 96 // 4] * 4  # S = 12 int64 = 96 bytes
    assert data["star_sent"] == [3 * 96, 96, 96, 96]
    assert len(fig.axes[0].patches) == 16
    plt.close(fig)
    with pytest.raises(ValueError, match="ranks"):
        bytes_per_rank(ring, simulate_star_allreduce(arrays(3)))


def test_time_vs_gpus():
    fig, data = time_vs_gpus(100e6, 25e9, 5e-6, gpu_counts=[2, 4, 8])
    # 100 MB = 1 MiB + 3 x 25 MiB + rest: 5 buckets; ceil(100e6 / 10 MiB) = 10 chunks each way
    assert len(data["buckets"]) == 5 and data["chunks"] == 10
    assert data["ring_latency_s"] == pytest.approx([5 * 2 * 5e-6, 5 * 6 * 5e-6, 5 * 14 * 5e-6])
    assert data["ring_bandwidth_s"] == pytest.approx([4e-3, 6e-3, 7e-3])
    # copy path: 2 x 10 chunks x (n-1) alphas + 2 (n-1) S / beta; NCCL path: ... + 2 S / beta
    assert data["star_total_s"] == pytest.approx(
        [20 * k * 5e-6 + 2 * k * 4e-3 for k in (1, 3, 7)])
    assert data["chain_total_s"] == pytest.approx([20 * k * 5e-6 + 8e-3 for k in (1, 3, 7)])
    ax = fig.axes[0]
    assert ax.get_title() and ax.get_xlabel() and "ms" in ax.get_ylabel()
    assert len(ax.get_legend().get_texts()) == 6
    plt.close(fig)

