"""What NCCL achieves on a link, against the line rate a datasheet quotes.

The step model's collectives run at the bus bandwidth NCCL's own tests measure (nccl-tests'
``busbw``: for an all-reduce, ``2 (n-1)/n x size / time``, so the ring formula with this rate
gives the measured time), not at the line rate: about 77 % of NVLink 3 on 8 A100s, 82 % of
NVLink 4 for a ring on 8 H100s, and *more* than the line rate with NVLink SHARP (NVLS, H100's
and H200's default all-reduce on NVSwitch: the switch reduces, so each GPU sends its data once).
Without peer-to-peer (PCIe boards without it, ``NCCL_P2P_DISABLE=1``) NCCL stages every chunk
through host memory: 4 GB/s on PCIe 3.0 x16, a quarter of the line rate. The latency is the
per-step alpha of a ring that matches the smallest all-reduce's time.

Each figure names its published source; ``tests/test_published_gpu_runs.py`` checks the step
model against them and more.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["Achieved", "ACHIEVED", "HOST_STAGED_FRACTION", "achieved_link"]


@dataclass(frozen=True)
class Achieved:
    fraction: float  # achieved all-reduce bus bandwidth / line rate per direction, large messages
    latency_s: float | None  # alpha per ring step; None: the link preset's
    algorithm: str
    source: str
    ring_fraction: float | None = None  # broadcast, reduce, all-gather, reduce-scatter (rings);
    # None: as the all-reduce


ACHIEVED = {
    "NVLink 3 (A100)": Achieved(
        231.58e9 / 300e9, 44e-6 / 14, "ring",
        "Azure ND A100 v4 (8 x A100 80GB SXM4, NVSwitch, NCCL 2.18.5), nccl-tests "
        "all_reduce_perf: busbw 231.58 GB/s at 8 GB; 1 KB in about 44 us (busbw 0.04 GB/s), "
        "14 ring steps"),
    "NVLink 4 (H100)": Achieved(
        480e9 / 450e9, 45e-6 / 14, "NVLS",
        "S. Jeaugey (NVIDIA), github.com/NVIDIA/nccl-tests/issues/212: 8 x H100 SXM, NVLS peak "
        "all-reduce busBw ~480 GB/s; a ring (and every other collective) reaches ~370 GB/s of "
        "the 450 GB/s line rate", ring_fraction=370e9 / 450e9),
    "NVLink 4 (H200)": Achieved(
        479.98e9 / 450e9, 30e-6 / 14, "NVLS",
        "Azure ND H200 v5 (8 x H200, NVSwitch, NCCL 2.20.5), nccl-tests all_reduce_perf: "
        "busbw 479.98 GB/s at 8 GB; 1 KB in about 30 us (busbw 0.06 GB/s); rings as H100's "
        "(nccl-tests#212: ~370 of 450 GB/s)", ring_fraction=370e9 / 450e9),
    "InfiniBand HDR": Achieved(
        96e9 / 100e9, None, "ring/tree across nodes",
        "github.com/NVIDIA/nccl-tests/issues/119: 3 nodes x 8 A100, 4 x HDR per node, peak "
        "all-reduce busbw ~96 GB/s against 100 GB/s of NICs (no latency published there)"),
    "InfiniBand NDR": Achieved(
        0.96, None, "ring/tree across nodes",
        "as HDR (no published NDR figure read): 96 % of the NICs' rate, nccl-tests#119"),
}

# github.com (AutoDL, 2 x RTX 2080 Ti, PCIe 3.0 x16 switch, P2P not supported): all_reduce
# busbw 4.00 GB/s from 128 MB, 8 B in 12.25 us; PCIe 3.0 x16 carries 15.75 GB/s.
HOST_STAGED_FRACTION = 4.00e9 / 15.75e9
HOST_STAGED_LATENCY_S = 12.25e-6 / 2


def achieved_link(link, peer_to_peer: bool = True, collective: str = "all-reduce"):
    """``link`` (a ``presets.InterconnectPreset``) at the rate NCCL achieves on it for
    ``collective`` ("all-reduce", or "ring" for broadcast, reduce, all-gather and
    reduce-scatter, which NVLS does not speed up here): its bandwidth and latency replaced by the
    published figures, the source appended. PCIe without peer-to-peer is host-staged; a link
    with no published figure keeps its line rate."""
    if not peer_to_peer and link.name.startswith("PCIe"):
        return replace(link, bandwidth_bytes_per_s=link.bandwidth_bytes_per_s
                       * HOST_STAGED_FRACTION, latency_s=HOST_STAGED_LATENCY_S,
                       source=f"{link.source}; host-staged without peer-to-peer: 4.00 GB/s of "
                              "PCIe 3.0's 15.75 measured (nccl-tests, 2 x RTX 2080 Ti)")
    figure = ACHIEVED.get(link.name)
    if figure is None:
        return link
    fraction = figure.fraction if collective == "all-reduce" or figure.ring_fraction is None \
        else figure.ring_fraction
    return replace(link, bandwidth_bytes_per_s=link.bandwidth_bytes_per_s * fraction,
                   latency_s=link.latency_s if figure.latency_s is None else figure.latency_s,
                   source=f"{link.source}; achieved ({figure.algorithm}): {figure.source}")
