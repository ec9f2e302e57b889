"""The volume figure draws the copy path, the NCCL path and DDP as computed by hand."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from dpcost.plots.volume import volume_vs_gpus  # noqa: E402


def test_volume_vs_gpus():
    fig, data = volume_vs_gpus(100, gpu_counts=[1, 2, 4, 8], mark_gpus=4)
    assert data["dp_bytes"] == [0, 200, 600, 1400]  # 2(n-1)P
    assert data["dp_nccl_bytes"] == [0, 200, 200, 200]  # P out, then P in
    assert data["ddp_bytes"] == [0, 100, 150, 175]  # 2(n-1)/n P
    ax = fig.axes[0]
    assert ax.get_title() and ax.get_xlabel() and "GB" in ax.get_ylabel()
    assert len(ax.get_legend().get_texts()) == 4
    assert ax.get_yscale() == "log"  # the copy path would squeeze the other three lines flat
    assert [round(x) for x in ax.lines[0].get_xdata()] == [2, 4, 8]  # n = 1 moves 0 bytes
    plt.close(fig)
