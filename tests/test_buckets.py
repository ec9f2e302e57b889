"""DDP's buckets (dpcost.buckets), by hand and against torch's own
``dist._compute_bucket_assignment_by_size``."""

import random

import pytest

from dpcost.buckets import (
    DEFAULT_BUCKET_CAP_BYTES,
    DEFAULT_FIRST_BUCKET_BYTES,
    bucket_assignment,
    compute_bucket_assignment_by_size,
    ddp_bucket_caps,
    ddp_bucket_sizes,
    ddp_buckets_from_sizes,
    ddp_rebuilt_buckets,
)

MiB = 2**20


def test_default_bucket_caps_match_torch():
    import torch.distributed as dist
    from torch.nn.parallel import distributed

    assert DEFAULT_FIRST_BUCKET_BYTES == dist._DEFAULT_FIRST_BUCKET_BYTES
    assert DEFAULT_BUCKET_CAP_BYTES == distributed._DEFAULT_BUCKET_CAP_MB * 2**20


def test_bucket_sizes_of_a_flat_stream():
    assert ddp_bucket_sizes(0) == []
    assert ddp_bucket_sizes(1000) == [1000]
    assert ddp_bucket_sizes(MiB) == [MiB]
    assert ddp_bucket_sizes(MiB + 1) == [MiB, 1]
    assert ddp_bucket_sizes(MiB + 50 * MiB) == [MiB, 25 * MiB, 25 * MiB]
    assert ddp_bucket_sizes(100, bucket_cap_bytes=30, first_bucket_bytes=10) == [10, 30, 30, 30]
    # ResNet-50's gradients, fp32: 1 MiB + 3 full buckets + the rest
    G = 4 * 25_557_032
    sizes = ddp_bucket_sizes(G)
    assert sizes[:4] == [MiB, 25 * MiB, 25 * MiB, 25 * MiB]
    assert sum(sizes) == G and len(sizes) == 5


def test_bucket_sizes_per_parameter_by_hand():
    # close a bucket once it reaches its cap, overshooting by the parameter that crossed it
    assert ddp_bucket_sizes([4, 4, 4, 20, 1], bucket_cap_bytes=10, first_bucket_bytes=5) == [
        8, 24, 1]
    assert ddp_bucket_sizes([5, 10, 3], bucket_cap_bytes=10, first_bucket_bytes=5) == [5, 10, 3]
    assert ddp_bucket_sizes([], 10, 5) == []


@pytest.mark.parametrize("seed", range(5))
def test_bucket_sizes_per_parameter_match_torch_reducer(seed):
    import torch
    import torch.distributed as dist

    rng = random.Random(seed)
    numels = [rng.choice([10, 1000, 50_000, 300_000, 2_000_000, 7_000_000]) for _ in range(40)]
    tensors = [torch.empty(k) for k in numels]
    ready_order = list(range(len(tensors)))[::-1]  # gradients arrive in reverse order
    ordered = [tensors[i] for i in ready_order]
    limits = [DEFAULT_FIRST_BUCKET_BYTES, DEFAULT_BUCKET_CAP_BYTES]
    indices, _ = dist._compute_bucket_assignment_by_size(
        ordered, limits, [False] * len(tensors), ready_order)
    torch_sizes = [sum(4 * numels[i] for i in bucket) for bucket in indices]
    assert ddp_bucket_sizes([4 * numels[i] for i in ready_order]) == torch_sizes


@pytest.mark.parametrize("seed", range(6))
def test_bucket_assignment_matches_torch(seed):
    import torch
    import torch.distributed as dist

    rng = random.Random(seed)
    count = rng.randint(1, 40)
    numels = [rng.choice([1, 10, 1000, 50_000, 300_000, 2_000_000, 7_000_000])
              for _ in range(count)]
    dtypes = [rng.choice([torch.float32, torch.float16]) if seed % 2 else torch.float32
              for _ in range(count)]
    tensors = [torch.empty(k, dtype=d) for k, d in zip(numels, dtypes, strict=True)]
    sizes = [t.numel() * t.element_size() for t in tensors]
    limits = rng.choice([[MiB, 25 * MiB], [25 * MiB], [10_000, 100_000, 5 * MiB]])
    torch_ix, torch_lim = dist._compute_bucket_assignment_by_size(
        tensors, limits, [False] * count)
    ours_ix, ours_lim = compute_bucket_assignment_by_size(sizes, limits, dtypes=dtypes)
    assert (ours_ix, ours_lim) == (torch_ix, torch_lim)
    # with tensor_indices (the rebuild's ready order): same buckets; the open ones at the end
    # come from a hash map in torch, so compare them as a set when there are several dtypes
    order = list(range(count))[::-1]
    ordered = [tensors[i] for i in order]
    torch_ix, _ = dist._compute_bucket_assignment_by_size(
        ordered, limits, [False] * count, order)
    ours_ix, _ = compute_bucket_assignment_by_size(
        [sizes[i] for i in order], limits, dtypes=[dtypes[i] for i in order],
        tensor_indices=order)
    assert sorted(map(tuple, ours_ix)) == sorted(map(tuple, torch_ix))
    if not seed % 2:
        assert ours_ix == torch_ix


def test_bucket_assignment_closes_a_bucket_once_it_reaches_its_cap():
    assert bucket_assignment([4, 4, 4, 4], [8]) == [[0, 1], [2, 3]]
    assert bucket_assignment([3, 3, 3], [4, 100]) == [[0, 1], [2]]  # overshoots, first cap
    assert bucket_assignment([10, 1, 1], [5]) == [[0], [1, 2]]  # never split
    assert bucket_assignment([], [5]) == []


def test_bucket_assignment_by_caps_matches_torch():
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    cases = [([1000, 10, 1000, 10, 70_000], [4096, 100_000]), ([5] * 9, [16]),
             ([2**18, 1, 2**18, 1], [2**20, 25 * 2**20])]
    for numels, caps in cases:
        tensors = [torch.empty(k) for k in numels]
        theirs, _ = dist._compute_bucket_assignment_by_size(
            tensors, caps, [False] * len(numels), list(range(len(numels))))
        assert bucket_assignment([4 * k for k in numels], caps) == theirs


def test_ddp_bucket_caps():
    assert ddp_bucket_caps() == [2**20, 25 * 2**20]
    assert ddp_bucket_caps(0.5) == [2**19]  # an explicit cap applies to the first too


@pytest.mark.parametrize("call, error, parameter", [
    (lambda: ddp_bucket_sizes(100, bucket_cap_bytes=0), ValueError, "bucket_cap_bytes"),
    (lambda: ddp_bucket_sizes(100, first_bucket_bytes=-1), ValueError, "first_bucket_bytes"),
    (lambda: ddp_bucket_sizes(-5), ValueError, "grad_bytes"),
    (lambda: ddp_bucket_sizes("100"), TypeError, "grad_bytes"),
    (lambda: ddp_bucket_sizes([1, "2"]), TypeError, "grad_bytes[1]"),
    (lambda: ddp_buckets_from_sizes([1, -2], first_iteration=True), ValueError,
     "ready_order_bytes[1]"),
    (lambda: compute_bucket_assignment_by_size(100, [10]), TypeError, "tensor_bytes"),
    (lambda: compute_bucket_assignment_by_size([1, -2], [10]), ValueError, "tensor_bytes[1]"),
    (lambda: compute_bucket_assignment_by_size([1], []), ValueError, "bucket_size_limits"),
    (lambda: compute_bucket_assignment_by_size([1], [-1]), ValueError, "bucket_size_limits[0]"),
    (lambda: compute_bucket_assignment_by_size([1, 2], [10], dtypes=["a"]), ValueError,
     "dtypes"),
    (lambda: compute_bucket_assignment_by_size([1, 2], [10], tensor_indices=[0]), ValueError,
     "tensor_indices"),
    (lambda: bucket_assignment([1, -2], [5]), ValueError, "sizes_bytes[1]"),
    (lambda: bucket_assignment([1], [0]), ValueError, "caps[0]"),
    (lambda: bucket_assignment([1], []), ValueError, "caps"),
    (lambda: ddp_bucket_caps(0), ValueError, "bucket_cap_mb"),
    (lambda: ddp_bucket_caps(1e-9), ValueError, "bucket_cap_mb"),
    (lambda: ddp_rebuilt_buckets([1], small_last_bucket=1), ValueError, "small_last_bucket"),
    (lambda: ddp_rebuilt_buckets([1, -2]), ValueError, "sizes_bytes[1]"),
])
def test_bad_input_names_the_parameter(call, error, parameter):
    with pytest.raises(error) as info:
        call()
    assert parameter in str(info.value)
