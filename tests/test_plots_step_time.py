"""The modelled timeline draws the intervals the time model computed."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from dpcost.plots.step_time import modelled_timeline  # noqa: E402
from dpcost.step_time import ddp_step_time, dp_step_time  # noqa: E402


def test_modelled_timeline():
    ddp = ddp_step_time(1e-3, 4e-3, [1, 1, 2], 2, 1e3, 0, optimizer_s=1e-3)
    dp = dp_step_time(1e-3, 2e-3, 10, 10, 2, 1e4, 0, path="nccl")
    fig, data = modelled_timeline({"DDP": ddp, "DP, NCCL path": dp}, "a title")
    assert data["DDP"]["total_ms"] == 8.0 and data["DDP"]["exposed_ms"] == 2.0
    assert data["DP, NCCL path"]["total_ms"] == dp.total_s * 1e3
    comm = [b for b in data["DDP"]["bars"] if b[1] == "communication"]
    assert [(b[2], b[3]) for b in comm] == [(2.0, 3.0), (3.0, 4.0), (5.0, 7.0)]
    ax = fig.axes[0]
    assert ax.get_title() == "a title" and "ms" in ax.get_xlabel()
    assert len(ax.get_yticklabels()) == 4 and len(fig.legends[0].get_texts()) == 3
    plt.close(fig)
