"""DP against DDP communication volume as the number of GPUs grows."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from dpcost.core import ddp_communication_volume, dp_communication_volume
from dpcost.plots import style


def volume_vs_gpus(model_size_bytes: float, gpu_counts=range(1, 33), mark_gpus: int | None = None):
    """Line figure against n, in GB: DP's 2(n-1)P through GPU0 on its copy path (the five
    functions), GPU0's 2P on its NCCL path (a pipelined chain: P out, then P in), and DDP's
    2(n-1)/n P per rank, on a log axis (n = 1 moves nothing and is left out of the drawing).

    Returns (figure, data) where data maps "gpus", "dp_bytes" (copy path), "dp_nccl_bytes" and
    "ddp_bytes" to lists, so that callers and tests can check exactly what was drawn.
    """
    from dpcost.dataparallel_traffic import dp_path_traffic, gpu_busy_bytes

    style.apply()
    gpus = list(gpu_counts)
    dp = [dp_communication_volume(model_size_bytes, n) for n in gpus]
    ddp = [ddp_communication_volume(model_size_bytes, n) for n in gpus]
    nccl = [gpu_busy_bytes(dp_path_traffic(model_size_bytes, 0, model_size_bytes, 0, 0, n,
                                           path="nccl"), 0) if n > 1 else 0.0 for n in gpus]
    fig = Figure()  # not pyplot-managed: shown once, where the caller displays it
    ax = fig.subplots()
    # A log axis: DP's copy path reaches tens of GB while the other three stay near 2P, which a
    # linear axis squeezes into its bottom few per cent. n = 1 moves 0 bytes: not drawable here.
    drawn = [i for i, n in enumerate(gpus) if n > 1]
    xs = [gpus[i] for i in drawn]
    ax.plot(xs, [dp[i] / 1e9 for i in drawn], "o-", color=style.DP_COLOR, ms=4,
            label="DataParallel, copy path: through GPU0's link, 2(n-1)P")
    # The NCCL path sits exactly on DDP's limit (both 2P): a wide pale band under a dotted line.
    ax.plot(xs, [nccl[i] / 1e9 for i in drawn], "-", color=style.DP_NCCL_COLOR, lw=7,
            alpha=0.8, solid_capstyle="butt",
            label="DataParallel, NCCL path: GPU0's link, P out + P in = 2P")
    ax.plot(xs, [ddp[i] / 1e9 for i in drawn], "s-", color=style.DDP_COLOR, ms=4,
            label="DDP: sent by each rank, 2(n-1)/n P")
    ax.axhline(2 * model_size_bytes / 1e9, color=style.DDP_COLOR, ls=":", lw=2,
               label="DDP's limit as n grows: 2P (the NCCL path's level)")
    if mark_gpus is not None and mark_gpus in xs:
        i = gpus.index(mark_gpus)
        ax.annotate(f"copy path, n = {mark_gpus}: {dp[i] / ddp[i]:g}x DDP",
                    (mark_gpus, dp[i] / 1e9), xytext=(-40, 30), textcoords="offset points",
                    arrowprops={"arrowstyle": "->"})
    ax.set_yscale("log")
    ax.set_ylim(0.4 * min(ddp[i] for i in drawn) / 1e9, 8 * max(dp) / 1e9)
    ax.set_title(f"Communication per training step, model of {model_size_bytes / 1e9:g} GB"
                 " (log scale)")
    ax.set_xlabel("number of GPUs, n")
    ax.set_ylabel("bytes per step (GB, decimal, log scale)")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.legend(loc="upper left")
    fig.tight_layout()
    return fig, {"gpus": gpus, "dp_bytes": dp, "dp_nccl_bytes": nccl, "ddp_bytes": ddp}
