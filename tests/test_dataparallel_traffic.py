"""DP's and DDP's per-iteration transfers, recomputed by hand and checked against torch."""

import math
import random
from fractions import Fraction

import pytest
from torch_resnet50 import resnet50

from dpcost.buckets import (
    DEFAULT_BUCKET_CAP_BYTES,
    DEFAULT_FIRST_BUCKET_BYTES,
    ddp_buckets_from_sizes,
)
from dpcost.core import ddp_communication_volume, dp_communication_volume
from dpcost.dataparallel_traffic import (
    DP_CHUNK_BYTES,
    StepTransfer,
    busy_time_ratio,
    chain_broadcast_bytes,
    chain_messages,
    chain_reduce_bytes,
    coalesced_chunk_sizes,
    ddp_step_transfers,
    dp_full_volume,
    dp_messages,
    dp_path_traffic,
    dp_step_transfers,
    gpu_busy_bytes,
    gpu_bytes,
    resnet50_counts,
    resnet50_parameter_bytes,
    resnet50_ready_order_bytes,
)

MiB = 2**20


def gpu0_bytes(rows):
    """Bytes through GPU0's link, sent + received, over the rows."""
    return sum(r.gpu0_sent_bytes + r.gpu0_received_bytes for r in rows)


def all_links_bytes(rows):
    return sum(r.total_bytes for r in rows)


def test_full_volume_by_hand():
    # P=100, B=10, G=100, I=40, O=20, n=4: 3*210 + 3/4*(40+40) = 630 + 60 = 690
    assert dp_full_volume(100, 10, 100, 40, 20, 4) == 690.0
    # n=2: 1*(1+2+3) + 1/2*(4+2*5) = 6 + 7 = 13
    assert dp_full_volume(1, 2, 3, 4, 5, 2) == 13.0


def test_seed_formula_is_the_full_one_without_extras():
    for P in (0, 1, 1.5e9, 102_228_128):
        for n in (2, 3, 8, 64):
            assert dp_full_volume(P, 0, P, 0, 0, n) == pytest.approx(
                dp_communication_volume(P, n), rel=1e-15)


@pytest.mark.parametrize("n", [2, 3, 4, 7, 8])
def test_rows_add_up_to_the_full_volume(n):
    P, B, G, I, O = 1000, 30, 1000, 512, 96  # noqa: E741
    rows = dp_step_transfers(P, B, G, I, O, n)
    assert all(isinstance(r, StepTransfer) for r in rows)
    expected = float((n - 1) * (P + B + G) + Fraction(n - 1, n) * (I + 2 * O))
    assert gpu0_bytes(rows) == pytest.approx(expected, rel=1e-12)
    assert all_links_bytes(rows) == pytest.approx(expected, rel=1e-12)  # a star: all via GPU0
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
    assert dp_path_traffic(10, 10, 10, 10, 10, n) == []


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
    assert all_links_bytes(buckets) == pytest.approx(2 * (n - 1) * G)  # = DP's total for P = G
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


# --- DataParallel's two paths ----------------------------------------------------------------


def test_chunk_size_is_torch_default():
    import inspect

    from torch.nn.parallel import comm

    for f in (comm.broadcast_coalesced, comm.reduce_add_coalesced):
        assert inspect.signature(f).parameters["buffer_size"].default == DP_CHUNK_BYTES
    assert DP_CHUNK_BYTES == 10 * MiB


def test_chain_bytes_by_hand():
    assert chain_broadcast_bytes(5, 4) == [(5, 0), (5, 5), (5, 5), (0, 5)]
    assert chain_reduce_bytes(5, 4) == [(0, 5), (5, 0), (5, 5), (5, 5)]
    assert chain_broadcast_bytes(7, 2) == [(7, 0), (0, 7)]
    assert chain_reduce_bytes(7, 2) == [(0, 7), (7, 0)]
    assert chain_broadcast_bytes(7, 1) == [(0, 0)]


def test_chunks_by_hand():
    # broadcast (C++ take_tensors): close once >= limit; reduce (_take_tensors): before exceeding
    assert coalesced_chunk_sizes([4, 4, 4, 20, 1], 10, "broadcast") == [12, 20, 1]
    assert coalesced_chunk_sizes([4, 4, 4, 20, 1], 10, "reduce") == [8, 4, 20, 1]
    assert coalesced_chunk_sizes(25, 10) == [10, 10, 5]
    assert coalesced_chunk_sizes(20, 10) == [10, 10]
    assert coalesced_chunk_sizes(0, 10) == []
    assert coalesced_chunk_sizes([], 10) == []


@pytest.mark.parametrize("seed", range(4))
def test_reduce_chunks_match_torch_take_tensors(seed):
    import torch
    from torch._utils import _take_tensors

    rng = random.Random(seed)
    numels = [rng.choice([1, 100, 300_000, 1_000_000, 3_000_000]) for _ in range(30)]
    tensors = [torch.empty(k) for k in numels]
    torch_chunks = [sum(t.numel() * 4 for t in chunk)
                    for chunk in _take_tensors(tensors, DP_CHUNK_BYTES)]
    assert coalesced_chunk_sizes([4 * k for k in numels], rule="reduce") == torch_chunks


def test_two_paths_by_hand():
    # P=100, B=0, G=100, I=O=0, n=4; the copy path is the star, the NCCL path a chain
    copy = dp_path_traffic(100, 0, 100, 0, 0, 4, path="copy")
    assert [(r.sent, r.received) for r in copy] == [
        ((300, 0, 0, 0), (0, 100, 100, 100)), ((0, 100, 100, 100), (300, 0, 0, 0))]
    nccl = dp_path_traffic(100, 0, 100, 0, 0, 4, path="nccl")
    assert [(r.sent, r.received) for r in nccl] == [
        ((100, 100, 100, 0), (0, 100, 100, 100)), ((0, 100, 100, 100), (100, 0, 100, 100))]
    assert gpu_busy_bytes(copy, 0) == 600 and gpu_busy_bytes(nccl, 0) == 200
    assert [gpu_busy_bytes(nccl, g) for g in range(4)] == [200, 200, 200, 200]
    # one chunk each way: 3 copies per chunk on the copy path, 1 NCCL call on the NCCL path;
    # both pay n - 1 = 3 alphas per chunk
    assert dp_messages(copy) == {"calls": 6, "latency_steps": 6}
    assert dp_messages(nccl) == {"calls": 2, "latency_steps": 6}


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_copy_path_is_the_five_functions_star(n):
    P, B, G, I, O = 1000, 30, 1000, 512, 96  # noqa: E741
    rows = dp_path_traffic(P, B, G, I, O, n, path="copy")
    sent, received = gpu_bytes(rows, 0)
    assert sent + received == pytest.approx(dp_full_volume(P, B, G, I, O, n))
    assert gpu_bytes(dp_path_traffic(P, 0, P, 0, 0, n, path="copy"), 0) == (
        (n - 1) * P, (n - 1) * P)
    assert sum(gpu_bytes(dp_path_traffic(P, 0, P, 0, 0, n, "copy"), 0)) == \
        dp_communication_volume(P, n)


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_nccl_path_per_gpu(n):
    P, B, G, I, O = 1000, 30, 1000, 512, 96  # noqa: E741
    rows = dp_path_traffic(P, B, G, I, O, n, path="nccl")
    # GPU0: P + B out in the broadcast, G in from the reduce, and the copies of I and O
    assert gpu_bytes(rows, 0) == pytest.approx(
        (P + B + (n - 1) / n * (I + O), G + (n - 1) / n * O))
    last = n - 1
    if n > 2:  # an intermediate GPU forwards the broadcast and the partial sums
        assert gpu_bytes(rows, 2 if n > 3 else 1)[0] >= P + B
    assert gpu_bytes(rows, last)[1] == pytest.approx(P + B + I / n + O / n + (G if n > 2 else 0))
    total_sent = sum(sum(r.sent) for r in rows)
    total_received = sum(sum(r.received) for r in rows)
    assert total_sent == pytest.approx(total_received)  # every byte sent is received
    # chain broadcast and reduce move (n - 1) S over all links, like the star
    assert total_sent == pytest.approx((n - 1) * (P + B + G) + (n - 1) / n * (I + 2 * O))


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16])
def test_busy_time_ratio(n):
    P = 4_000_000
    ddp_busy = ddp_communication_volume(P, n)  # a ring rank: max(sent, received)
    for path in ("copy", "nccl"):
        gpu0 = gpu_busy_bytes(dp_path_traffic(P, 0, P, 0, 0, n, path=path), 0)
        assert gpu0 / ddp_busy == pytest.approx(busy_time_ratio(n, path))
    assert busy_time_ratio(n, "copy") == n
    assert busy_time_ratio(n, "nccl") == pytest.approx(n / (n - 1))
    assert busy_time_ratio(8, "nccl") == pytest.approx(8 / 7)


def test_chunks_of_resnet50():
    sizes = [b for _, b in resnet50_parameter_bytes()]
    rows = dp_path_traffic(sum(sizes), 0, sum(sizes), 0, 0, 8, path="nccl", param_sizes=sizes)
    (bcast,) = [r for r in rows if "replicate" in r.action]
    (reduce,) = [r for r in rows if "sum the gradients" in r.action]
    assert sum(bcast.chunk_bytes) == sum(reduce.chunk_bytes) == 4 * 25_557_032
    # 97.5 MiB: 9 broadcast chunks (each closes at >= 10 MiB), 13 reduce chunks (each <= 10 MiB)
    assert (len(bcast.chunk_bytes), len(reduce.chunk_bytes)) == (9, 13)
    assert all(c >= DP_CHUNK_BYTES for c in bcast.chunk_bytes[:-1])
    assert all(c <= DP_CHUNK_BYTES or c in sizes for c in reduce.chunk_bytes)
    assert bcast.calls == len(bcast.chunk_bytes) and bcast.latency_steps == 7 * bcast.calls
    assert len(coalesced_chunk_sizes(4 * 25_557_032)) == 10  # cut exactly: 9 full + rest


def _ready_order(model, x):
    """Gradient-ready order of model's parameters, recorded with post-accumulate hooks."""
    params = list(model.parameters())
    order = []
    handles = [p.register_post_accumulate_grad_hook(lambda _p, i=i: order.append(i))
               for i, p in enumerate(params)]
    model(x).sum().backward()
    for h in handles:
        h.remove()
    return [params[i].numel() * params[i].element_size() for i in order]


def test_resnet50_parameter_list_matches_torch():
    model = resnet50()
    assert resnet50_parameter_bytes() == [
        (name, p.numel() * 4) for name, p in model.named_parameters()]


def test_resnet50_real_buckets():
    import torch
    import torch.distributed as dist

    torch.manual_seed(0)
    model = resnet50()
    ready = _ready_order(model, torch.randn(2, 3, 64, 64))
    # the gradient order is the reverse of registration, each shortcut before its main branch
    assert ready == resnet50_ready_order_bytes(downsample_first=True)
    ours = ddp_buckets_from_sizes(ready)
    tensors = [torch.empty(b // 4) for b in ready]
    torch_ix, _ = dist._compute_bucket_assignment_by_size(
        tensors, [DEFAULT_FIRST_BUCKET_BYTES, DEFAULT_BUCKET_CAP_BYTES], [False] * len(ready),
        list(range(len(ready))))
    assert ours == [sum(ready[i] for i in b) for b in torch_ix]
    # measured on this machine: DDP's rebuilt_bucket_sizes for this module (2 ranks, gloo)
    assert ours == [8_196_000, 31_502_336, 26_255_360, 26_550_272, 9_724_160]
    # the figures: the same rule with each shortcut's gradients after its main branch
    assert ddp_buckets_from_sizes(resnet50_ready_order_bytes(downsample_first=False)) == [
        8_196_000, 31_502_336, 28_356_608, 26_288_128, 7_885_056]
    # first iteration: one bucket; no 1 MiB bucket, because fc.weight alone is 8.2 MB
    assert ddp_buckets_from_sizes(ready, first_iteration=True) == [102_228_128]
    assert ready[:2] == [4_000, 8_192_000]  # fc.bias, then fc.weight
    assert min(ours) > DEFAULT_FIRST_BUCKET_BYTES


def test_resnet50_shortcut_last_order_is_real():
    """A block that computes its shortcut first really delivers the shortcut's gradients last."""
    import torch
    from torch_resnet50 import Bottleneck

    class ShortcutFirst(Bottleneck):
        def forward(self, x):
            identity = self.downsample(x) if self.downsample is not None else x
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu(out + identity)

    torch.manual_seed(0)
    model = resnet50()
    for module in model:
        if isinstance(module, Bottleneck):
            module.__class__ = ShortcutFirst
    assert _ready_order(model, torch.randn(2, 3, 64, 64)) == resnet50_ready_order_bytes(
        downsample_first=False)


def test_ddp_rows_with_real_buckets():
    buckets = ddp_buckets_from_sizes(resnet50_ready_order_bytes())
    G = sum(buckets)
    rows = ddp_step_transfers(G, 0, G, 0, 0, 4, bucket_sizes=buckets)
    sizes = [r.total_bytes / (2 * 3) for r in rows if r.action.startswith("all-reduce")]
    assert sizes == pytest.approx(buckets)


@pytest.mark.parametrize("call, error, parameter", [
    (lambda: dp_step_transfers(-1, 0, 0, 0, 0, 2), ValueError, "param_bytes"),
    (lambda: dp_step_transfers(0, "1MB", 0, 0, 0, 2), TypeError, "buffer_bytes"),
    (lambda: dp_step_transfers(0, 0, math.nan, 0, 0, 2), ValueError, "grad_bytes"),
    (lambda: dp_step_transfers(0, 0, 0, True, 0, 2), TypeError, "input_bytes"),
    (lambda: dp_step_transfers(0, 0, 0, 0, math.inf, 2), ValueError, "output_bytes"),
    (lambda: dp_step_transfers(0, 0, 0, 0, 0, 2.0), TypeError, "num_gpus"),
    (lambda: dp_full_volume(0, 0, -1, 0, 0, 2), ValueError, "grad_bytes"),
    (lambda: ddp_step_transfers(0, 0, 0, -1, 0, 1), ValueError, "input_bytes"),
    (lambda: ddp_step_transfers(10, 0, 10, 0, 0, 4, bucket_sizes=[1, 2]), ValueError,
     "bucket_sizes"),
    (lambda: dp_path_traffic(1, 0, 1, 0, 0, "2"), TypeError, "num_gpus"),
    (lambda: dp_path_traffic(1, 0, 1, 0, 0, 2, path="ring"), ValueError, "path"),
    (lambda: dp_path_traffic(1, 0, 1, 0, 0, 2, chunk_bytes=0), ValueError, "chunk_bytes"),
    (lambda: dp_path_traffic(10, 0, 10, 0, 0, 2, param_sizes=[1, 2]), ValueError,
     "param_sizes"),
    (lambda: coalesced_chunk_sizes([1], 10, rule="other"), ValueError, "rule"),
    (lambda: coalesced_chunk_sizes([1], 0), ValueError, "buffer_size"),
    (lambda: coalesced_chunk_sizes(["1"], 10), TypeError, "tensor_bytes[0]"),
    (lambda: chain_broadcast_bytes(-1, 2), ValueError, "size_bytes"),
    (lambda: chain_reduce_bytes(1, 2.0), TypeError, "num_gpus"),
    (lambda: chain_messages(1, 0), ValueError, "slice_bytes"),
    (lambda: busy_time_ratio(4, "star"), ValueError, "path"),
])
def test_bad_input_names_the_parameter(call, error, parameter):
    with pytest.raises(error) as info:
        call()
    assert parameter in str(info.value)
