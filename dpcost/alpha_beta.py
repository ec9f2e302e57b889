"""Bytes into seconds with the alpha-beta model: time = messages * alpha + bytes / beta.

alpha (``latency_s``) is the fixed cost of one message in seconds; beta
(``bandwidth_bytes_per_s``) is the bandwidth of one link per direction in bytes/s. We charge
the busiest link, the one that decides when the step is done:

- DDP, ring all-reduce: each rank's link carries 2 (n - 1) messages of S / n bytes, and sends
  and receives at the same time (full duplex): 2 (n - 1) alpha + 2 (n - 1) / n * S / beta.
- DP, star through GPU0: the broadcast in forward and the reduce in backward each put n - 1
  messages of S through GPU0's link, one after the other: 2 (n - 1) alpha + 2 (n - 1) S / beta.

The bandwidth terms differ by exactly n; the latency terms are equal and grow with n.
``ddp_communication_time_terms`` and ``dp_communication_time_terms`` treat the whole model as
ONE message stream (one all-reduce, one broadcast and one reduce) and the star is the copy
path. The real message counts are per bucket and per chunk: ``ddp_bucketed_time_terms`` (one
ring per DDP bucket) and ``dp_chunked_time_terms`` (one broadcast and one reduce per 10 MiB
chunk, on the copy or the NCCL path).

This module is the lessons' face of the time model: DDP's ring terms are
``dpcost.step_time.ring_allreduce_terms`` and ``bucketed_allreduce_terms``, DataParallel's
chunked ones ``step_time.dp_transfer_terms`` over ``dp_path_traffic`` (their owner, which also
adds compute and overlap), taking the five functions' ``model_size_bytes``. A size whose
time is past a float's range (an int such as 10**400) is refused with a ValueError, as in
``step_time``. Pure Python (no numpy), so the explorer can call it cheaply.
"""

from __future__ import annotations

import math

from dpcost.core import check_choice, check_model_size_bytes, check_num_gpus, check_real
from dpcost.dataparallel_traffic import DP_CHUNK_BYTES, DP_PATHS, dp_path_traffic
from dpcost.step_time import bucketed_allreduce_terms, dp_transfer_terms, ring_allreduce_terms

__all__ = [
    "ddp_communication_time_terms",
    "dp_communication_time_terms",
    "ddp_bucketed_time_terms",
    "dp_chunked_time_terms",
]


def _check_inputs(model_size_bytes, num_gpus, bandwidth_bytes_per_s, latency_s):
    """The five functions' checks on S and n, then a link: beta > 0 and alpha >= 0, finite.
    ValueError naming model_size_bytes when S is past a float's range (10**400)."""
    size = check_model_size_bytes(model_size_bytes)
    n = check_num_gpus(num_gpus)
    beta = check_real(bandwidth_bytes_per_s, "bandwidth_bytes_per_s", 0.0, strict=True)
    alpha = check_real(latency_s, "latency_s", 0.0)
    size = check_real(size, "model_size_bytes", 0.0)
    return size, n, beta, alpha


def ddp_communication_time_terms(
    model_size_bytes, num_gpus, bandwidth_bytes_per_s, latency_s
) -> tuple[float, float]:
    """(latency term, bandwidth term) in seconds of a ring all-reduce of S bytes on n ranks.

    ``(2 (n - 1) * alpha, 2 (n - 1) / n * S / beta)``: 2 (n - 1) steps, each one message of
    S / n bytes per rank (``step_time.ring_allreduce_terms``). Returns (0.0, 0.0) for n <= 1.
    """
    size, n, beta, alpha = _check_inputs(
        model_size_bytes, num_gpus, bandwidth_bytes_per_s, latency_s)
    return ring_allreduce_terms(size, n, beta, alpha)


def dp_communication_time_terms(
    model_size_bytes, num_gpus, bandwidth_bytes_per_s, latency_s
) -> tuple[float, float]:
    """(latency term, bandwidth term) in seconds of DP's star through GPU0's link.

    ``(2 (n - 1) * alpha, 2 (n - 1) * S / beta)``: the forward broadcast and the backward reduce
    each send n - 1 messages of S bytes through GPU0's link, serially. Returns (0.0, 0.0) for
    n <= 1.
    """
    size, n, beta, alpha = _check_inputs(
        model_size_bytes, num_gpus, bandwidth_bytes_per_s, latency_s)
    if n <= 1:
        return 0.0, 0.0
    return _finite(2 * (n - 1) * alpha, 2 * (n - 1) * size / beta)


def _finite(latency: float, bandwidth: float) -> tuple[float, float]:
    if not math.isfinite(latency + bandwidth):
        raise ValueError("model_size_bytes over bandwidth_bytes_per_s takes longer than a float "
                         f"can hold: {latency!r} + {bandwidth!r} s")
    return latency, bandwidth


def ddp_bucketed_time_terms(bucket_bytes, num_gpus, bandwidth_bytes_per_s,
                            latency_s) -> tuple[float, float]:
    """(latency, bandwidth) seconds of DDP's all-reduces, one ring per bucket:
    ``step_time.bucketed_allreduce_terms``,
    ``(2 (n-1) alpha x len(buckets), 2 (n-1)/n x sum(buckets) / beta)``. Buckets from
    ``dpcost.buckets.ddp_buckets_from_sizes`` (or ``ddp_bucket_sizes``).
    """
    return bucketed_allreduce_terms(bucket_bytes, num_gpus, bandwidth_bytes_per_s, latency_s)


def dp_chunked_time_terms(model_size_bytes, num_gpus, bandwidth_bytes_per_s, latency_s,
                          path="copy", chunk_bytes=DP_CHUNK_BYTES) -> tuple[float, float]:
    """(latency, bandwidth) seconds of DataParallel's broadcast of P and reduce of G = P.

    Each is cut into ``c = ceil(P / chunk_bytes)`` chunks (``comm.py``'s 10 MiB
    ``buffer_size``), each paying (n-1) alpha (serial copies on the copy path, the chain's
    hops on the NCCL path): latency ``2 c (n-1) alpha``. Bandwidth on GPU0's link: copy path
    ``2 (n-1) P / beta`` (the star), NCCL path ``2 P / beta`` (a pipelined chain). Computed
    from ``dataparallel_traffic.dp_path_traffic``'s two phases by
    ``step_time.dp_transfer_terms``, which ``step_time.dp_step_time`` charges too.
    """
    size, n, beta, alpha = _check_inputs(
        model_size_bytes, num_gpus, bandwidth_bytes_per_s, latency_s)
    check_choice(path, "path", DP_PATHS)
    limit = check_real(chunk_bytes, "chunk_bytes", 0.0, strict=True)
    if n <= 1:
        return 0.0, 0.0
    # the broadcast of P and the reduce of G = P, as dp_step_time charges them
    rows = dp_path_traffic(size, 0, size, 0, 0, n, path=path, chunk_bytes=limit)
    return _finite(*dp_transfer_terms(rows, beta, alpha))
