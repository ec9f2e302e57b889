"""The DataParallel traffic breakdown figure draws what dp_step_transfers computed."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from dpcost.plots.traffic import dp_volume_breakdown  # noqa: E402


def test_dp_volume_breakdown():
    case = dict(param_bytes=100, buffer_bytes=10, grad_bytes=100, input_bytes=40, output_bytes=20)
    fig, data = dp_volume_breakdown({"toy": case}, 4)
    # 3/4*40, 3*100, 3*10, 3/4*20, 3/4*20, 3*100
    assert data["toy"]["dp_terms"] == [30, 300, 30, 15, 15, 300]
    assert data["toy"]["dp_total"] == 690
    # DDP rank 0 sends 2*3/4*100 = 150 in the all-reduce and the buffers once: 10
    assert data["toy"]["ddp_total"] == 160
    assert len(fig.axes[0].patches) == 7
    plt.close(fig)


def test_two_paths_per_gpu():
    from dpcost.plots.traffic import two_paths_per_gpu

    fig, data = two_paths_per_gpu(100, 4)
    # copy path: GPU0 300 out then 300 in; NCCL chain: 100 out then 100 in on every GPU
    assert data["copy"]["busy"] == [600, 200, 200, 200]
    assert data["nccl"]["busy"] == [200, 200, 200, 200]
    assert data["nccl"]["sent"] == [100, 200, 200, 100]
    assert data["ddp"]["busy"] == [150] * 4  # 2 * 3/4 * 100
    ax = fig.axes[0]
    assert ax.get_title() and ax.get_xlabel() and "GB" in ax.get_ylabel()
    assert len(ax.get_legend().get_texts()) == 3
    plt.close(fig)
