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
