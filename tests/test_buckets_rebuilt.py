"""dpcost.buckets.ddp_rebuilt_buckets and ddp_bucket_caps: which bucket gets the 1 MiB cap.

The lesson's model (4 x Linear(1000, 1000), fp32) in its ready order: last layer first, each
bias before its weight. The measured buckets are lesson 07's (2 gloo ranks, checked there).
"""

import pytest

from dpcost import buckets as bk

MIB = 2**20
# ready order of 4 x Linear(1000, 1000): 6.bias, 6.weight, 4.bias, ..., 0.bias, 0.weight
LESSON_READY = [4_000, 4_000_000] * 4


def sizes(buckets, ready=LESSON_READY):
    return [sum(ready[i] for i in bucket) for bucket in buckets]


def test_default_puts_the_small_cap_on_the_first_bucket_reduced():
    buckets = bk.ddp_rebuilt_buckets(LESSON_READY)
    assert buckets == [[0, 1], [2, 3, 4, 5, 6, 7]]
    assert sizes(buckets) == [4_004_000, 12_012_000]  # the tail bucket is the large one
    assert buckets == bk.bucket_assignment(LESSON_READY, bk.ddp_bucket_caps())


def test_set_last_bucket_cap_puts_it_on_the_last():
    buckets = bk.ddp_rebuilt_buckets(LESSON_READY, small_last_bucket=True)
    assert buckets == [[0, 1, 2, 3, 4, 5, 6], [7]]  # 0.weight alone, reduced last
    assert sizes(buckets) == [12_016_000, 4_000_000]


def test_small_tensors_fill_a_small_last_bucket_up_to_the_cap():
    ready = [MIB // 4] * 12  # 3 MiB in twelve 256 KiB tensors
    assert sizes(bk.ddp_rebuilt_buckets(ready), ready) == [MIB, 2 * MIB]
    assert sizes(bk.ddp_rebuilt_buckets(ready, small_last_bucket=True), ready) == [2 * MIB, MIB]
    # past 26 MiB: a 1 MiB bucket, one of 25 MiB, the rest; reversed with the option
    ready = [MIB] * 30
    assert sizes(bk.ddp_rebuilt_buckets(ready), ready) == [MIB, 25 * MIB, 4 * MIB]
    assert sizes(bk.ddp_rebuilt_buckets(ready, small_last_bucket=True), ready) == \
        [4 * MIB, 25 * MIB, MIB]


def test_an_explicit_cap_is_the_same_in_both_orders_but_for_the_remainder():
    ready = [MIB] * 5
    assert sizes(bk.ddp_rebuilt_buckets(ready, 2), ready) == [2 * MIB, 2 * MIB, MIB]
    assert sizes(bk.ddp_rebuilt_buckets(ready, 2, small_last_bucket=True), ready) == \
        [MIB, 2 * MIB, 2 * MIB]


def test_every_index_once_in_ready_order_within_a_bucket():
    ready = [3, 700_000, 5, 900_000, 2_000_000, 7, 30 * MIB, 11]
    for small_last in (False, True):
        buckets = bk.ddp_rebuilt_buckets(ready, small_last_bucket=small_last)
        assert sorted(i for bucket in buckets for i in bucket) == list(range(len(ready)))
        assert all(bucket == sorted(bucket) for bucket in buckets)


def test_matches_torch_reversed_assignment():
    """reducer.cpp: rebuild_buckets reverses the tensors, assigns, reverses the buckets."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    numels = [1000, 10, 300_000, 10, 70_000, 5, 2_000_000]
    tensors = [torch.empty(k) for k in numels]
    order = list(range(len(numels)))[::-1]
    theirs, _ = dist._compute_bucket_assignment_by_size(
        [tensors[i] for i in order], bk.ddp_bucket_caps(), [False] * len(numels), order)
    expected = [sorted(bucket) for bucket in reversed(theirs)]
    assert bk.ddp_rebuilt_buckets([4 * k for k in numels], small_last_bucket=True) == expected
