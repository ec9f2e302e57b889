"""DP's and DDP's per-iteration transfers, recomputed by hand and checked against torch."""

import math
import random
from fractions import Fraction

import pytest
from torch_resnet50 import resnet50

from dpcost.core import ddp_communication_volume, dp_communication_volume
from dpcost.dataparallel_traffic import (
    DEFAULT_BUCKET_CAP_BYTES,
    DEFAULT_FIRST_BUCKET_BYTES,
    StepTransfer,
    ddp_bucket_sizes,
    ddp_step_transfers,
    dp_full_volume,
    dp_step_transfers,
    gpu0_bytes,
    resnet50_counts,
    total_bytes,
)

MiB = 2**20


def test_full_volume_by_hand():
    # P=100, B=10, G=100, I=40, O=20, n=4: 3*210 + 3/4*(40+40) = 630 + 60 = 690
    assert dp_full_volume(100, 10, 100, 40, 20, 4) == 690.0
    # n=2: 1*(1+2+3) + 1/2*(4+2*5) = 6 + 7 = 13
    assert dp_full_volume(1, 2, 3, 4, 5, 2) == 13.0


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 16, 64])
@pytest.mark.parametrize("P", [0, 1, 1000, 4_000_000, 1.5e9, 102_228_128])
def test_seed_formula_is_the_full_one_without_extras(P, n):
    assert dp_full_volume(P, 0, P, 0, 0, n) == pytest.approx(dp_communication_volume(P, n),
                                                             rel=1e-15)


@pytest.mark.parametrize("n", [2, 3, 4, 7, 8])
def test_rows_add_up_to_the_full_volume(n):
    P, B, G, I, O = 1000, 30, 1000, 512, 96  # noqa: E741
    rows = dp_step_transfers(P, B, G, I, O, n)
    assert all(isinstance(r, StepTransfer) for r in rows)
    expected = float((n - 1) * (P + B + G) + Fraction(n - 1, n) * (I + 2 * O))
    assert gpu0_bytes(rows) == pytest.approx(expected, rel=1e-12)
    assert total_bytes(rows) == pytest.approx(expected, rel=1e-12)  # a star: all via GPU0
    assert dp_full_volume(P, B, G, I, O, n) == pytest.approx(expected, rel=1e-12)
    out = sum(r.gpu0_sent_bytes for r in rows)
    into = sum(r.gpu0_received_bytes for r in rows)
    assert out == pytest.approx((n - 1) * (P + B) + (n - 1) / n * (I + O))
    assert into == pytest.approx((n - 1) * G + (n - 1) / n * O)


def test_dp_rows_name_pytorch_functions():
    rows = dp_step_transfers(1, 1, 1, 1, 1, 4)
    text = " ".join(r.pytorch_function for r in rows)
    for name in ["scatter_kwargs", "replicate", "broadcast_coalesced", "parallel_apply",
                 "Gather.forward", "Gather.backward", "ReduceAddCoalesced",
                 "reduce_add_coalesced"]:
        assert name in text
    assert [r.phase for r in rows].index("backward") > [r.phase for r in rows].index("forward")
    # the parameters go out in forward, the gradients come back in backward
    params_row = next(r for r in rows if "parameters from GPU0" in r.action)
    grads_row = next(r for r in rows if "gradients onto GPU0" in r.action)
    assert params_row.phase == "forward" and params_row.gpu0_sent_bytes == 3
    assert grads_row.phase == "backward" and grads_row.gpu0_received_bytes == 3


@pytest.mark.parametrize("n", [1, 0, -2])
def test_one_gpu_moves_nothing(n):
    assert dp_full_volume(10, 10, 10, 10, 10, n) == 0.0
    assert gpu0_bytes(dp_step_transfers(10, 10, 10, 10, 10, n)) == 0.0
    assert ddp_step_transfers(10, 10, 10, 10, 10, n) == []


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


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ddp_rows(n):
    P = G = 4 * 25_557_032
    B = 212_904
    rows = ddp_step_transfers(P, B, G, 10**6, 10**5, n)
    buckets = [r for r in rows if r.action.startswith("all-reduce")]
    assert len(buckets) == 5
    per_rank = sum(r.gpu0_sent_bytes for r in buckets)
    assert per_rank == pytest.approx(ddp_communication_volume(G, n), rel=1e-12)
    assert sum(r.gpu0_received_bytes for r in buckets) == pytest.approx(per_rank)
    assert total_bytes(buckets) == pytest.approx(2 * (n - 1) * G)  # = DP's total for P = G
    # buffer broadcast each forward: rank 0 sends B, all links (n-1) B
    (buf,) = [r for r in rows if "buffers" in r.action]
    assert (buf.phase, buf.gpu0_sent_bytes, buf.total_bytes) == ("forward", B, (n - 1) * B)
    # no inputs or outputs cross a link
    assert gpu0_bytes(rows) == pytest.approx(B + 2 * per_rank)
    assert "all_reduce_bucket" in buckets[0].pytorch_function
    assert "_sync_buffers" in buf.pytorch_function


def test_ddp_options():
    rows = ddp_step_transfers(100, 10, 100, 0, 0, 4, sync_buffers=False)
    assert not any("buffers" in r.action for r in rows)
    rows = ddp_step_transfers(100, 0, 100, 0, 0, 4)
    assert not any("buffers from rank 0" in r.action for r in rows)  # nothing to sync
    rows = ddp_step_transfers(100, 10, 100, 0, 0, 4, include_construction=True)
    assert rows[0].phase == "construction (once)"
    assert (rows[0].gpu0_sent_bytes, rows[0].total_bytes) == (110, 330)
    rows = ddp_step_transfers(100, 0, 100, 0, 0, 4, bucket_cap_bytes=30, first_bucket_bytes=30)
    assert [r.total_bytes for r in rows if "all-reduce" in r.action] == [180, 180, 180, 60]


@pytest.mark.parametrize(
    "args, error, name",
    [
        ((-1, 0, 0, 0, 0, 2), ValueError, "param_bytes"),
        ((0, "1MB", 0, 0, 0, 2), TypeError, "buffer_bytes"),
        ((0, 0, math.nan, 0, 0, 2), ValueError, "grad_bytes"),
        ((0, 0, 0, True, 0, 2), TypeError, "input_bytes"),
        ((0, 0, 0, 0, math.inf, 2), ValueError, "output_bytes"),
        ((0, 0, 0, 0, 0, 2.0), TypeError, "num_gpus"),
    ],
)
@pytest.mark.parametrize("f", [dp_step_transfers, dp_full_volume, ddp_step_transfers])
def test_bad_inputs(f, args, error, name):
    with pytest.raises(error, match=name):
        f(*args)


def test_bad_bucket_inputs():
    with pytest.raises(ValueError, match="bucket_cap_bytes"):
        ddp_bucket_sizes(100, bucket_cap_bytes=0)
    with pytest.raises(ValueError, match="grad_bytes"):
        ddp_bucket_sizes(-5)
    with pytest.raises(TypeError, match=r"grad_bytes\[1\]"):
        ddp_bucket_sizes([1, "2"])
    with pytest.raises(TypeError, match="grad_bytes"):
        ddp_bucket_sizes("100")


def test_resnet50_counts_match_a_real_module():
    counts = resnet50_counts()
    assert counts["parameters"] == 25_557_032  # torchvision docs, ResNet50_Weights.IMAGENET1K_V1
    model = resnet50()
    assert sum(p.numel() for p in model.parameters()) == counts["parameters"]
    buffers = list(model.buffers())
    assert sum(b.numel() for b in buffers) == counts["buffer_elements"]
    assert sum(b.numel() * b.element_size() for b in buffers) == counts["buffer_bytes"]
    assert counts["batchnorm_channels"] * 2 == 53_120
    assert counts["batchnorm_layers"] == 53
