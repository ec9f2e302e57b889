"""DDP's gradient buckets: which tensors share one all-reduce, in pure Python (no torch).

``reducer.cpp: compute_bucket_assignment_by_size`` fills a bucket with tensors in the order
given until its size reaches the cap (>=), never splitting a tensor, one group per dtype.
DDP's constructor calls it with ``[sys.maxsize]`` (one bucket in the first iteration, unless
``find_unused_parameters``); ``Reducer::rebuild_buckets`` calls it again at the second forward
with ``[1 MiB, 25 MiB]`` over the order the gradients became ready in the first backward.
Each bucket is one all-reduce: its latency is paid per bucket (``dpcost.step_time``).

``compute_bucket_assignment_by_size`` is the one algorithm (checked against
``torch.distributed._compute_bucket_assignment_by_size`` in tests/test_buckets.py); the other
functions are ways of calling it: bucket sizes from a gradient stream (``ddp_bucket_sizes``,
``ddp_buckets_from_sizes``) or bucket indices from DDP's caps (``bucket_assignment``,
``ddp_bucket_caps``, ``ddp_rebuilt_buckets``).
"""

from __future__ import annotations

from collections.abc import Sequence

from dpcost.core import check_real
from dpcost.units import MIB

__all__ = [
    "DEFAULT_BUCKET_CAP_BYTES",
    "DEFAULT_FIRST_BUCKET_BYTES",
    "compute_bucket_assignment_by_size",
    "ddp_bucket_sizes",
    "ddp_buckets_from_sizes",
    "bucket_assignment",
    "ddp_bucket_caps",
    "ddp_rebuilt_buckets",
]

# torch/nn/parallel/distributed.py: _DEFAULT_BUCKET_CAP_MB = 25 (MiB), and
# torch.distributed._DEFAULT_FIRST_BUCKET_BYTES = 1 MiB (both checked in tests against torch).
DEFAULT_BUCKET_CAP_BYTES = 25 * MIB
DEFAULT_FIRST_BUCKET_BYTES = MIB


def compute_bucket_assignment_by_size(tensor_bytes, bucket_size_limits, dtypes=None,
                                      tensor_indices=None):
    """Pure-Python ``torch.distributed._compute_bucket_assignment_by_size`` (reducer.cpp).

    ``tensor_bytes[i]``: bytes of tensor i (numel * element size), in the order given (DDP's
    constructor passes registration order; the rebuild passes gradient-ready order with
    ``tensor_indices``). Tensors are grouped per ``dtypes[i]`` (one group if None); a group's
    bucket closes as soon as its size reaches the current limit (>=), then the group moves to
    the next limit, staying on the last one; tensors are never split. The open buckets are
    appended at the end. Without ``tensor_indices`` the buckets are sorted by their smallest
    tensor index, as torch does; with them, bucket entries are ``tensor_indices[i]``.
    Returns (bucket_indices, per_bucket_size_limits), like torch.

    DDP (torch 2.13, ``distributed.py: BucketCapacityConfig.compute_bucket_size_limits``)
    calls it with ``[sys.maxsize]`` at construction unless ``find_unused_parameters``: one
    bucket in the first iteration. The rebuild after it (``Reducer::rebuild_buckets``) uses
    ``[1 MiB, 25 MiB]`` over the gradient-ready order.
    """
    if isinstance(tensor_bytes, str) or not isinstance(tensor_bytes, Sequence):
        raise TypeError(f"tensor_bytes must be a sequence of sizes, got "
                        f"{type(tensor_bytes).__name__}")
    sizes = [check_real(s, f"tensor_bytes[{i}]", 0.0) for i, s in enumerate(tensor_bytes)]
    if isinstance(bucket_size_limits, str) or not isinstance(bucket_size_limits, Sequence) \
            or not bucket_size_limits:
        raise ValueError(f"bucket_size_limits must be a non-empty sequence, got "
                         f"{bucket_size_limits!r}")
    limits = [check_real(x, f"bucket_size_limits[{i}]", 0.0)
              for i, x in enumerate(bucket_size_limits)]
    if dtypes is not None and len(dtypes) != len(sizes):
        raise ValueError(f"dtypes must have one entry per tensor ({len(sizes)}), got "
                         f"{len(dtypes)}")
    if tensor_indices is not None and len(tensor_indices) != len(sizes):
        raise ValueError(f"tensor_indices must have one entry per tensor ({len(sizes)}), got "
                         f"{len(tensor_indices)}")
    open_buckets: dict = {}  # key -> [indices, size, limit position]
    result = []
    for i, size in enumerate(sizes):
        index = tensor_indices[i] if tensor_indices is not None else i
        key = dtypes[i] if dtypes is not None else None
        bucket = open_buckets.setdefault(key, [[], 0.0, 0])
        bucket[0].append(index)
        bucket[1] += size
        limit = limits[bucket[2]]
        if bucket[1] >= limit:
            result.append((bucket[0], limit))
            open_buckets[key] = [[], 0.0, min(bucket[2] + 1, len(limits) - 1)]
    for indices, _, position in open_buckets.values():
        if indices:
            result.append((indices, limits[position]))
    if tensor_indices is None:
        result.sort(key=lambda item: min(item[0]))
    return [list(ix) for ix, _ in result], [lim for _, lim in result]


def ddp_buckets_from_sizes(ready_order_bytes, first_iteration=False,
                           bucket_cap_bytes=DEFAULT_BUCKET_CAP_BYTES,
                           first_bucket_bytes=DEFAULT_FIRST_BUCKET_BYTES) -> list[float]:
    """Bytes of DDP's buckets from per-parameter gradient bytes in gradient-ready order.

    ``first_iteration``: one bucket of everything (torch 2.13's default). Otherwise the rebuilt
    buckets: caps ``first_bucket_bytes`` then ``bucket_cap_bytes`` (1 MiB, 25 MiB).
    """
    if first_iteration:
        sizes = [check_real(s, f"ready_order_bytes[{i}]", 0.0)
                 for i, s in enumerate(ready_order_bytes)]
        return [sum(sizes)] if sizes else []
    indices, _ = compute_bucket_assignment_by_size(
        ready_order_bytes, [first_bucket_bytes, bucket_cap_bytes])
    return [float(sum(ready_order_bytes[i] for i in bucket)) for bucket in indices]


def ddp_bucket_sizes(
    grad_bytes,
    bucket_cap_bytes=DEFAULT_BUCKET_CAP_BYTES,
    first_bucket_bytes=DEFAULT_FIRST_BUCKET_BYTES,
) -> list[float]:
    """Bytes in each of DDP's gradient buckets, in the order they are all-reduced.

    ``grad_bytes`` is either one number (a gradient stream cut exactly at the caps:
    ``[first, cap, cap, ..., rest]``) or a sequence of per-parameter gradient sizes in the order
    their gradients become ready. For a sequence, the reducer's rule applies
    (``reducer.cpp: compute_bucket_assignment_by_size``): parameters join the open bucket until
    its size reaches the cap (>=), so a bucket can overshoot by one parameter; the first bucket
    uses ``first_bucket_bytes``, the rest ``bucket_cap_bytes``. Defaults are DDP's: 1 MiB then
    25 MiB. DDP uses these caps from the second iteration on, once buckets are rebuilt in the
    real gradient order; the first iteration is bucketed by registration order (in torch 2.13
    as one bucket unless ``find_unused_parameters``). Passing ``bucket_cap_mb`` to DDP makes the
    first bucket as large as the others: call with ``first_bucket_bytes=bucket_cap_bytes``.
    """
    cap = check_real(bucket_cap_bytes, "bucket_cap_bytes", 0.0, strict=True)
    first = check_real(first_bucket_bytes, "first_bucket_bytes", 0.0, strict=True)
    if isinstance(grad_bytes, Sequence) and not isinstance(grad_bytes, str):
        sizes = [check_real(s, f"grad_bytes[{i}]", 0.0) for i, s in enumerate(grad_bytes)]
        indices, _ = compute_bucket_assignment_by_size(sizes, [first, cap],
                                                       tensor_indices=range(len(sizes)))
        return [sum(sizes[i] for i in bucket) for bucket in indices]
    total = check_real(grad_bytes, "grad_bytes", 0.0)
    if total <= first:
        return [total] if total > 0 else []
    buckets, rest = [first], total - first
    full = int(rest // cap)
    buckets += [cap] * full
    if rest - full * cap > 0:
        buckets.append(rest - full * cap)
    return buckets


def bucket_assignment(sizes_bytes, caps) -> list:
    """Indices of the tensors in each bucket, as ``dist._compute_bucket_assignment_by_size``.

    ``sizes_bytes``: each tensor's bytes, in the order they are bucketed (DDP's rebuilt buckets:
    the order the gradients became ready). ``caps``: bucket size limits in bytes; bucket i
    uses ``caps[min(i, len(caps) - 1)]``. A tensor joins the open bucket; the bucket closes
    as soon as its size reaches its limit (>=), so it may overshoot by one tensor, and tensors
    are never split (``reducer.cpp: compute_bucket_assignment_by_size``, one dtype and device).
    """
    sizes = [check_real(s, f"sizes_bytes[{i}]", 0.0) for i, s in enumerate(sizes_bytes)]
    caps = [check_real(c, f"caps[{i}]", 0.0, strict=True) for i, c in enumerate(caps)]
    if not caps:
        raise ValueError("caps must hold at least one bucket size limit, got []")
    return compute_bucket_assignment_by_size(sizes, caps, tensor_indices=range(len(sizes)))[0]


def ddp_bucket_caps(bucket_cap_mb=None) -> list:
    """The caps DDP's rebuilt buckets use, in bytes, in the order the buckets are filled
    (``distributed.py: _BucketCapacityConfig.create``; ``reducer.cpp: rebuild_buckets`` passes
    ``[first_bucket_bytes_cap_, bucket_bytes_cap_]``).

    Default (None): 1 MiB, then 25 MiB. The buckets are filled in the order the gradients
    became ready, so the 1 MiB cap goes to bucket 0, the *first* bucket all-reduced (the last
    layers'); the bucket all-reduced last, which no compute can hide, may hold up to 25 MiB
    (plus one tensor). ``DDP_SET_LAST_BUCKET_CAP=1`` moves the small cap to the last bucket:
    ``ddp_rebuilt_buckets(..., small_last_bucket=True)``. An explicit ``bucket_cap_mb`` (MiB,
    ``int(bucket_cap_mb * 2**20)`` bytes) applies to every bucket, the first included.
    The first iteration uses one bucket for all gradients (``compute_bucket_size_limits``
    returns ``[sys.maxsize]`` without ``find_unused_parameters``).
    """
    if bucket_cap_mb is None:
        return [DEFAULT_FIRST_BUCKET_BYTES, DEFAULT_BUCKET_CAP_BYTES]
    cap = int(check_real(bucket_cap_mb, "bucket_cap_mb", 0.0, strict=True) * MIB)
    if cap <= 0:
        raise ValueError(f"bucket_cap_mb must give a cap of at least 1 byte, got "
                         f"{bucket_cap_mb!r}")
    return [cap]


def ddp_rebuilt_buckets(ready_sizes_bytes, bucket_cap_mb=None,
                        small_last_bucket=False) -> list:
    """Indices into ``ready_sizes_bytes`` of each rebuilt bucket, in the order DDP all-reduces
    them (bucket 0 first), for gradients of one dtype listed in the order they became ready.

    Default: ``bucket_assignment(ready_sizes_bytes, ddp_bucket_caps(bucket_cap_mb))``.
    ``small_last_bucket=True`` is ``DDP_SET_LAST_BUCKET_CAP=1`` (``reducer.cpp:
    rebuild_buckets``): the same caps over the *reversed* ready order, and the buckets
    reversed again, so the first cap goes to the bucket all-reduced last.
    """
    if not isinstance(small_last_bucket, bool):
        raise ValueError(f"small_last_bucket must be True or False, got {small_last_bucket!r}")
    caps = ddp_bucket_caps(bucket_cap_mb)
    if not small_last_bucket:
        return bucket_assignment(ready_sizes_bytes, caps)
    sizes = list(ready_sizes_bytes)
    last = len(sizes) - 1
    reversed_buckets = bucket_assignment(sizes[::-1], caps)
    return [sorted(last - i for i in bucket) for bucket in reversed(reversed_buckets)]
