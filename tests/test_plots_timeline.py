"""Lesson 07's Gantt chart draws what was measured, landscape, one panel per scenario."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from dpcost.plots.timeline import COMPUTE_COLORS, gantt  # noqa: E402

MS = 1_000_000  # ns


def _rank(offset_ms: int, comm: list):
    """Two iterations of one rank: forward, backward, a gradient tick, comm, optimizer."""
    events = []
    for it in (0, 1):
        t = (100 * it + offset_ms) * MS
        events += [(it, "compute", "forward", t, t + 10 * MS),
                   (it, "compute", "backward", t + 10 * MS, t + 30 * MS),
                   (it, "grad", "w", t + 20 * MS, t + 20 * MS),
                   (it, "compute", "optimizer step", t + 40 * MS, t + 45 * MS)]
        events += [(it, "comm", name, t + start * MS, t + end * MS) for name, start, end in comm]
    return events


def test_gantt_is_landscape_and_draws_every_event():
    ddp = [_rank(0, [("bucket 0", 20, 28), ("bucket 1", 30, 38)]) for _ in range(2)]
    dp = [_rank(0, [("parameters out", 0, 5), ("gradients in", 30, 40)]) for _ in range(2)]
    fig, drawn = gantt({"DDP (buckets)": ddp, "DataParallel star (copy path)": dp})
    width, height = fig.get_size_inches()
    assert width > 1.5 * height  # fits a 16:9 screen without shrinking
    assert len(fig.axes) == 2 and fig.axes[0].get_position().y0 == fig.axes[1].get_position().y0
    assert drawn["DDP (buckets)"][0]["comm"] == [("bucket 0", 20.0, 28.0), ("bucket 1", 30.0, 38.0)]
    assert drawn["DataParallel star (copy path)"][1]["compute"][0] == ("forward", 0.0, 10.0)
    assert all(ax.get_xlabel().endswith("(ms)") for ax in fig.axes)
    # forward is dark enough to read on white: its luminance is well below a pale pastel's
    r, g, b = (int(COMPUTE_COLORS["forward"][i:i + 2], 16) / 255 for i in (1, 3, 5))
    assert 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.5
    plt.close(fig)
