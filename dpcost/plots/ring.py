"""Figures for the ring all-reduce: chunks moving, bytes per rank, and time against n."""

from __future__ import annotations

import matplotlib as mpl
import numpy as np
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter

from dpcost.plots import style
from dpcost.ring import AllReduceTrace


def _contributor_counts(holdings) -> np.ndarray:
    return np.array([[len(h) for h in row] for row in holdings])


def ring_frames(trace: AllReduceTrace):
    """Frame strip of a ring all-reduce: one rank x chunk grid per step, coloured by how many
    ranks' data each chunk sums. Top row: the start and the n - 1 reduce-scatter steps; bottom
    row: the n - 1 all-gather steps. Chunks received at that step are outlined.

    Returns (figure, data): data["frames"] is a list of (title, counts) with counts[rank][chunk].
    """
    style.apply()
    n = trace.num_ranks
    if n < 2:
        raise ValueError(f"ring_frames needs a trace of at least 2 ranks, got {n}")
    start = ("start", np.ones((n, n), dtype=int), set())
    frames = [start]
    for snap in trace.snapshots:
        received = {(t.dst, t.chunk) for t in trace.transfers
                    if t.phase == snap.phase and t.step == snap.step}
        frames.append((f"{snap.phase}, step {snap.step}",
                       _contributor_counts(snap.holdings), received))
    cmap = ListedColormap(mpl.colormaps["Blues"](np.linspace(0.15, 0.9, n)))
    norm = BoundaryNorm(np.arange(0.5, n + 1.5), n)
    # not pyplot-managed: shown once, where displayed
    fig = Figure(figsize=(2.6 * n + 1.0, 5.8), layout="constrained")  # near full size on a slide
    axes = fig.subplots(2, n, squeeze=False)
    panels = list(axes[0]) + [None] + list(axes[1][: n - 1])
    axes[1][n - 1].axis("off")
    image = None
    for (title, counts, received), ax in zip(frames, [p for p in panels if p is not None],
                                             strict=True):
        image = ax.imshow(counts, cmap=cmap, norm=norm)
        for r in range(n):
            for c in range(n):
                ax.text(c, r, str(counts[r, c]), ha="center", va="center", fontsize=13,
                        color="white" if counts[r, c] > n / 2 else "black")
        for r, c in received:
            ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, ec=style.DP_COLOR,
                                   lw=3))
        ax.set_title(title, fontsize=13)
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
        ax.set_xlabel("chunk")
        ax.set_ylabel("rank")
        ax.grid(False)
    bar = fig.colorbar(image, ax=axes, ticks=range(1, n + 1), shrink=0.8)
    bar.set_label("ranks whose data the chunk sums")
    axes[1][n - 1].plot([], [], "s", mfc="none", mec=style.DP_COLOR, mew=3, ms=14,
                        label="chunk received\nat this step")
    axes[1][n - 1].legend(loc="center", frameon=False, fontsize=13)
    fig.suptitle(f"Ring all-reduce on {n} ranks: reduce-scatter (top), all-gather (bottom)",
                 fontsize=15)
    return fig, {"frames": [(title, counts.tolist()) for title, counts, _ in frames]}


def bytes_per_rank(ring: AllReduceTrace, star: AllReduceTrace):
    """Grouped bars: bytes each rank sends and receives in a ring and in DP's star.

    Returns (figure, data) with the four per-rank lists in bytes.
    """
    style.apply()
    n = ring.num_ranks
    if star.num_ranks != n:
        raise ValueError(f"ring has {n} ranks but star has {star.num_ranks}")
    size = ring.expected.nbytes
    ranks = np.arange(n)
    width = 0.2
    fig = Figure()  # not pyplot-managed: shown once, where displayed
    ax = fig.subplots()
    bars = [
        (ring.sent_bytes, "ring: sent", style.DDP_COLOR, None),
        (ring.received_bytes, "ring: received", style.DDP_COLOR, "//"),
        (star.sent_bytes, "star (DataParallel): sent", style.DP_COLOR, None),
        (star.received_bytes, "star (DataParallel): received", style.DP_COLOR, "//"),
    ]
    for i, (values, label, color, hatch) in enumerate(bars):
        ax.bar(ranks + (i - 1.5) * width, [v / size for v in values], width, label=label,
               color=color if hatch is None else "white", ec=color, hatch=hatch, lw=1.5)
    ax.axhline(2 * (n - 1) / n, color=style.DDP_COLOR, ls=":", lw=1.5,
               label=f"2(n-1)/n = {2 * (n - 1) / n:g}")
    ax.set_xticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylabel("bytes moved / S (array size)")
    ax.set_xlabel("rank (rank 0 = GPU0)")
    ax.set_title(f"Bytes per rank in one all-reduce of S = {size:,} bytes on {n} ranks")
    ax.legend(loc="upper right")
    fig.tight_layout()
    return fig, {
        "ring_sent": list(ring.sent_bytes), "ring_received": list(ring.received_bytes),
        "star_sent": list(star.sent_bytes), "star_received": list(star.received_bytes),
    }


def time_vs_gpus(size_bytes: float, bandwidth_bytes_per_s: float, latency_s: float,
                 gpu_counts=range(2, 65)):
    """alpha-beta time on the busiest link against n, messages counted as PyTorch sends them:
    the ring's latency and bandwidth terms over DDP's buckets (``ddp_bucket_sizes``, 1 MiB then
    25 MiB) and their sum, and DataParallel's broadcast + reduce in 10 MiB chunks on the copy
    path (star) and the NCCL path (chain). Log-log axes, times in milliseconds.

    Returns (figure, data): "gpus", "buckets", "chunks", "ring_latency_s", "ring_bandwidth_s",
    "ring_total_s", "star_total_s" (copy path), "chain_total_s" (NCCL path), in seconds.
    """
    from dpcost.alpha_beta import ddp_bucketed_time_terms, dp_chunked_time_terms
    from dpcost.dataparallel_traffic import DP_CHUNK_BYTES, ddp_bucket_sizes

    style.apply()
    gpus = list(gpu_counts)
    buckets = ddp_bucket_sizes(size_bytes)
    ring = [ddp_bucketed_time_terms(buckets, n, bandwidth_bytes_per_s, latency_s) for n in gpus]
    star = [sum(dp_chunked_time_terms(size_bytes, n, bandwidth_bytes_per_s, latency_s, "copy"))
            for n in gpus]
    chain = [sum(dp_chunked_time_terms(size_bytes, n, bandwidth_bytes_per_s, latency_s, "nccl"))
             for n in gpus]
    chunks = -(-int(size_bytes) // DP_CHUNK_BYTES)
    lat = [a for a, _ in ring]
    bw = [b for _, b in ring]
    total = [a + b for a, b in ring]
    fig = Figure()  # not pyplot-managed: shown once, where displayed
    ax = fig.subplots()
    ms = 1e3
    ax.plot(gpus, [t * ms for t in star], "-", color=style.DP_COLOR, lw=2.5,
            label=f"DP copy path (star), {chunks} chunks each way")
    ax.plot(gpus, [t * ms for t in chain], "-", color=style.DP_NCCL_COLOR, lw=2.5,
            label=f"DP NCCL path (chain), {chunks} chunks each way")
    ax.plot(gpus, [t * ms for t in total], "-", color=style.DDP_COLOR, lw=2.5,
            label=f"DDP ring total, {len(buckets)} buckets")
    ax.plot(gpus, [t * ms for t in bw], "--", color=style.DDP_COLOR, lw=1.8,
            label="ring bandwidth term: 2(n-1)/n S/beta")
    ax.plot(gpus, [t * ms for t in lat], ":", color=style.DDP_COLOR, lw=2.2,
            label=f"ring latency term: 2(n-1) alpha x {len(buckets)} buckets")
    ax.axhline(2 * size_bytes / bandwidth_bytes_per_s * ms, color="gray", lw=1, ls="-.",
               label="2 S/beta (the ring's bandwidth limit)")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_yscale("log")
    ax.set_xlabel("number of GPUs, n (log scale)")
    ax.set_ylabel("time on the busiest link (ms, log scale)")
    ax.set_title(f"alpha-beta model, illustrative: S = {size_bytes / 1e6:g} MB, "
                 f"beta = {bandwidth_bytes_per_s / 1e9:g} GB/s, "
                 f"alpha = {latency_s * 1e6:g} us")
    ax.legend(loc="upper left", fontsize=13)
    fig.tight_layout()
    return fig, {"gpus": gpus, "buckets": buckets, "chunks": chunks, "ring_latency_s": lat,
                 "ring_bandwidth_s": bw, "ring_total_s": total, "star_total_s": star,
                 "chain_total_s": chain}
