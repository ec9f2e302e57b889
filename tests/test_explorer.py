"""The explorer without a browser: set each control's .value, check readout and plotted data.

Expected numbers are recomputed here with the model's own functions (dp_path_traffic,
ddp_step_time, dp_step_time, memory_per_gpu, rank_memory, fits) and the presets' raw data,
never copied from the explorer's output.
"""

from __future__ import annotations

import io
import math
import re

import pytest
from PIL import Image, ImageChops

from dpcost import explorer_model as X
from dpcost.buckets import ddp_buckets_from_sizes
from dpcost.dataparallel_traffic import (
    dp_path_traffic,
    gpu_busy_bytes,
    resnet50_ready_order_bytes,
)
from dpcost.evaluate import dp_batch_split
from dpcost.explorer import Explorer, parse_parameter_count
from dpcost.memory import fits, memory_per_gpu, rank_memory, total_bytes
from dpcost.presets import GPUS, INTERCONNECTS, MODELS, custom_model
from dpcost.setting import facts_from_preset
from dpcost.step_time import (
    communication_hidden,
    ddp_step_time,
    dp_step_time,
    flat_ring_multinode_time,
    hierarchical_allreduce_time,
)
from dpcost.units import format_bytes, format_seconds


def close(a, b, rel=1e-12):
    return math.isclose(a, b, rel_tol=rel, abs_tol=0.0)


@pytest.fixture
def explorer():
    return Explorer()


def test_custom_model_and_bad_text_shows_an_error_not_a_traceback(explorer):
    explorer.controls["model"].value = "custom"
    assert not explorer.controls["custom"].disabled
    explorer.controls["custom"].value = "2e9"
    assert explorer.error is None
    assert "P = 4 GB" in explorer.readout_text()  # mixed: 2 bytes per parameter
    before = explorer.data()
    for bad in ("abc", "1GB", "", "-5", "0.2"):
        explorer.controls["custom"].value = bad
        assert explorer.error is not None
        assert explorer.readout_text().startswith("Cannot update: custom parameters")
        assert explorer.data() == before  # the figures stay as they were
    explorer.controls["custom"].value = "3e9"
    assert explorer.error is None and "P = 6 GB" in explorer.readout_text()


def test_parse_parameter_count():
    assert parse_parameter_count("1.5e9") == 1_500_000_000
    assert parse_parameter_count("1e12") == 10**12
    with pytest.raises(ValueError, match="at most 1e12"):
        parse_parameter_count("1.1e12")
    assert parse_parameter_count(" 350000000 ") == 350_000_000
    for bad in ("7B", "1GB", "x", ""):
        with pytest.raises(ValueError, match="custom parameters"):
            parse_parameter_count(bad)


def test_layered_render_matches_a_full_redraw(explorer):
    """The blitted PNG (cached axes + moved artists) looks like a figure drawn from scratch."""
    for name, value in (("gpus", 4), ("model", "Llama-2 13B"), ("optimizer", "sgd")):
        explorer.controls[name].value = value
    for name, view in explorer.views.items():
        fast = Image.open(io.BytesIO(explorer.images[name].value)).convert("RGB")
        full = Image.open(io.BytesIO(view.render_full())).convert("RGB")
        assert fast.size == full.size
        diff = ImageChops.difference(fast, full).convert("L")
        changed = sum(1 for v in diff.tobytes() if v > 64) / (diff.width * diff.height)
        assert changed < 0.005, (name, changed)  # antialiasing at edges only


def test_each_change_redraws_once_and_hold_batches(explorer, monkeypatch):
    renders = []
    original = Explorer.update
    monkeypatch.setattr(Explorer, "update", lambda self: (renders.append(1), original(self)))
    explorer.controls["gpus"].value = 16
    explorer.controls["model"].value = "BERT-base"  # also resets batch and outputs
    assert len(renders) == 2
    with explorer.hold():
        explorer.controls["gpus"].value = 32
        explorer.controls["precision"].value = "bf16"
    assert len(renders) == 3


def test_format_seconds():
    assert format_seconds(0) == "0 s"
    assert format_seconds(0.0123) == "12.3 ms"
    assert format_seconds(2.5e-6) == "2.5 µs"
    assert format_seconds(42) == "42 s"
    assert format_seconds(90) == "1.5 min"
    assert format_seconds(5400) == "1.5 h"


def test_unknown_setting_is_refused():
    with pytest.raises(TypeError, match="unknown explorer setting"):
        Explorer(num_gpu=8)


def test_a_huge_custom_count_is_refused_at_once_with_a_short_message():
    import time

    from dpcost.explorer import parse_parameter_count

    start = time.perf_counter()
    with pytest.raises(ValueError) as info:
        parse_parameter_count("9" * 100_000 + "!")
    assert time.perf_counter() - start < 0.5
    assert len(str(info.value)) < 120 and "..." in str(info.value)


H100, A100 = GPUS["H100 SXM 80GB"], GPUS["A100 SXM 80GB"]
NVLINK4, NDR = INTERCONNECTS["NVLink 4 (H100)"], INTERCONNECTS["InfiniBand NDR"]


def test_defaults_are_a_real_case_gpt2_xl_on_8_h100_in_one_node(explorer):
    c = explorer.controls
    assert (c["model"].value, c["gpus"].value, c["gpus_per_node"].value, c["gpu"].value,
            c["intra_link"].value, c["precision"].value) == (
        "GPT-2 XL", 8, 8, "H100 SXM 80GB", "NVLink 4 (H100)", "mixed")
    text = explorer.readout_text()
    assert text.startswith("n = 8 GPUs (one node of 8; H100 SXM 80GB, NVLink 4 (H100) in a "
                           f"node), P = {format_bytes(1_557_611_200 * 2, digits=3)} (mixed)")


@pytest.mark.parametrize("name", [m for m in MODELS])
def test_parameter_tensors_add_up_to_each_presets_exact_count(name):
    counts = facts_from_preset(MODELS[name]).tensor_elements
    assert sum(counts) == MODELS[name].parameters
    assert facts_from_preset(custom_model(123)).tensor_elements is None


@pytest.mark.parametrize("b,n,split", [
    (8, 8, [1] * 8), (16, 8, [2] * 8), (10, 8, [2] * 5), (9, 8, [2, 2, 2, 2, 1]),
    (17, 8, [3, 3, 3, 3, 3, 2]), (3, 8, [1, 1, 1]), (1, 4, [1]), (7, 1, [7])])
def test_dp_batch_split_is_torch_chunk(b, n, split):
    torch = pytest.importorskip("torch")
    assert dp_batch_split(b, n) == split
    # comm.cpp: scatter cuts the batch with tensor.chunk(n): the same sizes.
    assert [len(c) for c in torch.arange(b).chunk(n)] == split


def test_dp_is_refused_beyond_one_node(explorer):
    explorer.controls["gpus"].value = 64
    s, text, data = explorer.last, explorer.readout_text(), explorer.data()
    assert not s["dp_available"] and s["dp_bytes"] is None
    assert text.count("DataParallel cannot span machines") >= 3  # both paths and the verdict
    assert "GPU0 " not in text.split("Memory per GPU")[0]  # no DP numbers in the table
    assert data["volume"]["marker_dp_copy"] is None and data["volume"]["marker_dp_nccl"] is None
    assert "cannot span machines" in data["volume"]["note"]
    # the DP curves stop at the node's 8 GPUs
    for n, copy, nccl in zip(data["volume"]["gpus"], data["volume"]["dp_copy"],
                             data["volume"]["dp_nccl"], strict=True):
        assert math.isnan(copy) == math.isnan(nccl) == (n > 8)
    assert data["time"]["DP, copy path"]["total"] == 0
    assert "cannot span machines" in data["time"]["DP, copy path"]["label"]
    assert data["memory"]["dp_gpu0"]["parameters"] == 0
    assert data["memory"]["labels"][0] == "one node"
    assert data["memory"]["labels"][1].endswith("✓")  # GPT-2 XL's DDP rank fits on 80 GB
    # GPUs per node 64: the same 64 GPUs are one machine, and DataParallel runs again.
    explorer.controls["gpus_per_node"].value = 16
    assert not explorer.last["dp_available"]
    with explorer.hold():
        explorer.controls["gpus"].value = 16
    assert explorer.last["dp_available"] and "cannot span" not in explorer.readout_text()


def test_batch_smaller_than_n_uses_fewer_gpus_and_no_fractional_samples(explorer):
    with explorer.hold():
        explorer.controls["batch_size"].value = 10
        explorer.controls["gpus"].value = 8
    text = explorer.readout_text()
    assert "2 samples to each of 5 GPUs, so only 5 of the 8 GPUs are used" in text
    assert "device_ids[:len(inputs)]" in text
    assert "DDP: 2 samples per rank (ceil(10/8): DistributedSampler pads the data to 16)" in text
    assert not re.search(r"\d\.\d+ samples?", text)
    s = explorer.last
    assert s["dp_gpus_used"] == 5 and s["dp_split"] == [2] * 5
    explorer.controls["batch_size"].value = 3
    assert "1 sample to each of 3 GPUs, so only 3 of the 8 GPUs are used" in \
        explorer.readout_text()
    explorer.controls["batch_size"].value = 9
    assert "2 samples to each of 4 GPUs and 1 sample to 1, so only 5 of the 8" in \
        explorer.readout_text()
    # memory uses whole samples: GPU0 runs the first chunk, a DDP rank ceil(b/n)
    model = MODELS["GPT-2 XL"]
    gpu0 = memory_per_gpu(model, 5, 9, "adam", "mixed", attention="sdpa")["dp_gpu0"]
    gpu0["activations"] = memory_per_gpu(model, 1, 2, "adam", "mixed",
                                         attention="sdpa")["dp_gpu0"]["activations"]
    assert explorer.last["memory"]["dp_gpu0"] == gpu0
    assert explorer.last["memory"]["ddp"] == memory_per_gpu(
        model, 8, 16, "adam", "mixed", attention="sdpa")["ddp_rank"]


def _compute(name, samples, gpu, precision, whole=False, **kw):
    """One GPU's forward and backward from dpcost.gpu_time's parts: 6 N per token (1024 per
    GPT-2 sample), the preset's saved activations, ops estimated per layer (or counted); the
    whole ComputeTime when ``whole``."""
    from dpcost.gpu_time import CONV_FLOPS_SHARE, COUNTED_OPS, compute_time, estimated_ops
    from dpcost.presets import TRANSFORMER_SHAPES
    from dpcost.setting import preset_facts

    facts = preset_facts(name, precision)
    if name in COUNTED_OPS:
        ops, forward_ops, convolutions = COUNTED_OPS[name]["plain"]
    else:
        ops, forward_ops, convolutions = estimated_ops(
            TRANSFORMER_SHAPES[name].layers, precision), None, 0
    t = compute_time((facts.forward_flops + facts.backward_flops) * samples,
                     facts.activation_bytes * samples, ops, gpu, precision,
                     conv_share=CONV_FLOPS_SHARE.get(name, 0.0), convolutions=convolutions,
                     forward_ops=forward_ops, **kw)
    return t if whole else (t.forward_s, t.backward_s)


def test_paths_are_labelled_and_bytes_come_from_the_two_path_model(explorer):
    text = explorer.readout_text()
    model, n, b = MODELS["GPT-2 XL"], 8, 8
    P = G = model.parameters * 2
    I, O = 8 * 1024 * b, 1024 * 50_257 * 2 * b  # noqa: E741 token ids, bf16 logits
    copy = gpu_busy_bytes(dp_path_traffic(P, 0, G, I, O, n, path="copy"), 0)
    nccl = gpu_busy_bytes(dp_path_traffic(P, 0, G, I, O, n, path="nccl"), 0)
    ddp = 2 * (n - 1) / n * G
    assert f"DP, copy path GPU0 {format_bytes(copy, digits=3)} ({copy / ddp:.3g}x DDP's)" in text
    assert f"DP, NCCL path GPU0 {format_bytes(nccl, digits=3)} ({nccl / ddp:.3g}x DDP's)" in text
    assert f"DDP, ring per rank {format_bytes(ddp, digits=3)}" in text
    volume = explorer.data()["volume"]
    assert close(volume["marker_dp_copy"], copy) and close(volume["marker_dp_nccl"], nccl)
    assert close(volume["marker_ddp"], ddp)
    # the verdict never claims n-fold fewer bytes on the NCCL path
    assert "8x fewer bytes" not in text and "fewer bytes" not in text
    assert "NCCL path (every Linux CUDA build)" in text and "not by bytes" in text
    # without outputs the NCCL path's ratio is about n/(n-1)
    explorer.controls["outputs"].value = 1
    s = explorer.last
    assert 1.14 <= s["dp_bytes"]["nccl"] / s["ddp_bytes"] <= 1.15
    assert 7.99 <= s["dp_bytes"]["copy"] / s["ddp_bytes"] <= 8.01


def test_step_time_and_exposed_communication_equal_the_models_functions(explorer):
    from dpcost.gpu_time import ddp_host_seconds, replicate_seconds
    from dpcost.nccl_achieved import achieved_link

    with explorer.hold():
        explorer.controls["gpu"].value = "A100 SXM 80GB"
        explorer.controls["intra_link"].value = "NVLink 3 (A100)"
    model, n, b = MODELS["GPT-2 XL"], 8, 8
    link = achieved_link(INTERCONNECTS["NVLink 3 (A100)"])  # rings and all-reduce alike on A100
    counts = facts_from_preset(model).tensor_elements
    ready = [c * 2 for c in reversed(counts)]
    buckets = ddp_buckets_from_sizes(ready)
    fwd, bwd = _compute("GPT-2 XL", 1, A100, "mixed",
                        extra_backward_host_s=ddp_host_seconds(len(counts), 0, len(buckets)))
    ddp = ddp_step_time(fwd, bwd, buckets, n, link.bandwidth_bytes_per_s, link.latency_s)
    P = model.parameters * 2
    sizes = [c * 2 for c in counts]
    dp_fwd, dp_bwd = _compute("GPT-2 XL", 1, A100, "mixed", replicas=n)
    dp = {path: dp_step_time(dp_fwd, dp_bwd, P, P, n, link.bandwidth_bytes_per_s,
                             link.latency_s, path=path, input_bytes=8 * 1024 * b,
                             output_bytes=1024 * 50_257 * 2 * b, param_sizes=sizes,
                             replicate_s=replicate_seconds(len(counts), P, n))
          for path in ("copy", "nccl")}
    time = explorer.data()["time"]
    for row, st in (("DDP, ring", ddp), ("DP, copy path", dp["copy"]),
                    ("DP, NCCL path", dp["nccl"])):
        assert close(time[row]["total"], st.total_s, rel=1e-9)
        assert close(time[row]["exposed"], st.exposed_communication_s, rel=1e-9)
        assert close(time[row]["communication"], st.communication_s, rel=1e-9)
    assert dp["nccl"].exposed_communication_s == dp["nccl"].communication_s  # serial
    text = explorer.readout_text()
    hidden = communication_hidden(bwd, ddp.communication_s)
    assert (f"DDP, ring per rank {format_bytes(2 * 7 / 8 * P, digits=3)} "
            f"{format_seconds(ddp.total_s)} {format_seconds(ddp.exposed_communication_s)} "
            f"{'yes' if hidden else 'no'}: backward {format_seconds(bwd)}, "
            f"{len(buckets)} all-reduces {format_seconds(ddp.communication_s)}") in text


def _ddp_bucket_count(model, cap_mb, precision="mixed"):
    """DDP's rebuilt buckets for a preset at ``cap_mb`` (None: DDP's own caps), counted by
    dpcost.evaluate.ddp_buckets (torch's compute_bucket_assignment_by_size) on its own Setting."""
    from dpcost.evaluate import ddp_buckets
    from dpcost.setting import Setting

    setting = Setting(facts_from_preset(MODELS[model], precision, "sdpa"), gpus=8,
                      bucket_cap_mb=cap_mb)
    return len(ddp_buckets(setting)["rebuilt_bytes"])


def test_the_bucket_cap_moves_ddps_step_as_the_host_cost_per_bucket_says(explorer):
    """Issue 37: each bucket costs DDP about 0.19 ms of host work (measured on an H200), so a
    1 MiB cap makes GPT-2 XL's step on 8 H100 slower than DDP's default 25 MiB (the old model,
    2(n-1) alpha per bucket, said faster). GPT-2 XL at 1 sample per GPU is launch-bound, so each
    extra bucket's host cost lands on backward and on the step; the buckets shown are DDP's."""
    from dpcost.gpu_time import DDP_BUCKET_S

    assert explorer.controls["bucket_cap_mb"].value == 25  # torch's _DEFAULT_BUCKET_CAP_MB
    default = explorer.last
    assert default["bucket_cap_mb"] is None  # 25: DDP left to its own caps, 1 MiB first
    assert default["ddp_buckets"] == _ddp_bucket_count("GPT-2 XL", None)
    assert f"bucket cap 25 MiB (DDP's default; its first bucket 1 MiB): " \
           f"{default['ddp_buckets']} buckets" in explorer.readout_text()
    assert "bound by the host (launch-bound)" in explorer.readout_text()
    explorer.controls["bucket_cap_mb"].value = 1
    small = explorer.last
    buckets = _ddp_bucket_count("GPT-2 XL", 1)
    assert small["ddp_buckets"] == buckets > default["ddp_buckets"]
    assert f"bucket cap 1 MiB (bucket_cap_mb=1: every bucket): {buckets} buckets" in \
        explorer.readout_text()
    assert f"{buckets} all-reduces" in explorer.readout_text()
    slower = small["steps"]["DDP, ring"].total_s - default["steps"]["DDP, ring"].total_s
    extra = (buckets - default["ddp_buckets"]) * DDP_BUCKET_S
    assert 0.9 * extra < slower < 1.1 * extra  # the extra buckets' host work, all of it
    # The bucket cap is DDP's: DataParallel's steps do not move.
    for name in ("DP, copy path", "DP, NCCL path"):
        assert small["steps"][name].total_s == default["steps"][name].total_s


def test_a_large_bucket_cap_exposes_the_last_buckets_all_reduce(explorer):
    """The other end of the trade-off (lesson 05's question 3): with one bucket (GPT-2 small's
    249 MB of 16-bit gradients under a 250 MiB cap) nothing is ready before backward ends, so
    all of the all-reduce is exposed, and over PCIe the step is slower than at DDP's default;
    so is it at 1 MiB, whose 50 buckets each cost their host work."""
    with explorer.hold():
        explorer.controls["model"].value = "GPT-2 small"
        explorer.controls["intra_link"].value = "PCIe 4.0 x16"
    default = explorer.last["steps"]["DDP, ring"]
    assert explorer.last["ddp_buckets"] == _ddp_bucket_count("GPT-2 small", None) == 7
    explorer.controls["bucket_cap_mb"].value = 250
    assert explorer.last["ddp_buckets"] == _ddp_bucket_count("GPT-2 small", 250) == 1
    one = explorer.last["steps"]["DDP, ring"]
    assert close(one.exposed_communication_s, one.communication_s, rel=1e-12)
    assert one.communication_s > 0
    assert default.exposed_communication_s < one.exposed_communication_s
    assert one.total_s > default.total_s
    explorer.controls["bucket_cap_mb"].value = 1
    assert explorer.last["ddp_buckets"] == _ddp_bucket_count("GPT-2 small", 1) == 50
    assert explorer.last["steps"]["DDP, ring"].total_s > default.total_s


def test_communication_hidden_flips_with_the_link(explorer):
    # NVLink's all-reduces fit under GPT-2 XL's backward; PCIe's do not.
    assert explorer.last["hidden"]["DDP, ring"]
    explorer.controls["intra_link"].value = "PCIe 4.0 x16"
    s = explorer.last
    assert not s["hidden"]["DDP, ring"]
    assert s["steps"]["DDP, ring"].communication_s > s["ddp_backward_s"]
    assert "no: backward" in explorer.readout_text()


def test_the_readout_says_which_clock_bounds_compute_and_what_dps_host_work_is(explorer):
    """The readout's time line: one GPU's compute from dpcost.gpu_time (host: kernels launched;
    device: FLOPs and bytes), and DataParallel's host work, replicate and its 8 replicas'
    forwards launched through one interpreter, recomputed from dpcost.gpu_time's parts."""
    from dpcost.gpu_time import replicate_seconds

    model, n = MODELS["GPT-2 XL"], 8
    r = X.readout(explorer.last, "mixed", NVLINK4, NDR, H100)
    time = r["time"]
    plain = _compute("GPT-2 XL", 1, H100, "mixed", whole=True)
    assert (time["bound"], time["host_s"], time["device_s"]) == (
        "host", plain.host_s, plain.device_s)
    assert plain.host_s > plain.device_s  # launch-bound: the host's clock sets the step
    counts = facts_from_preset(model).tensor_elements
    assert close(time["dp_replicate_s"], replicate_seconds(len(counts), model.parameters * 2, n))
    interpreter = _compute("GPT-2 XL", 1, H100, "mixed", replicas=n)[0] - plain.forward_s
    assert interpreter > 0 and close(time["dp_interpreter_s"], interpreter, rel=1e-9)
    text = explorer.readout_text()
    assert f"replicate {format_seconds(time['dp_replicate_s'])} each step and " \
           f"{format_seconds(interpreter)} more forward: its 8 replicas' kernels launched " \
           "through one interpreter" in text
    # A large batch of ResNet-50 keeps the GPU busier than the host: the device's clock.
    with explorer.hold():
        explorer.controls["model"].value = "ResNet-50"
        explorer.controls["batch_size"].value = 4096
    assert explorer.last["result"].compute.bound == "device"
    assert "bound by the device" in explorer.readout_text()


def test_multinode_ddp_two_level_beside_the_flat_ring(explorer):
    with explorer.hold():
        explorer.controls["gpus"].value = 64
        explorer.controls["model"].value = "ResNet-50"
    from dpcost.gpu_time import ddp_host_seconds
    from dpcost.nccl_achieved import achieved_link

    n, g = 64, 8
    buckets = ddp_buckets_from_sizes(resnet50_ready_order_bytes(dtype_bytes=2))
    per_rank = math.ceil(256 / 64)
    fwd, bwd = _compute("ResNet-50", per_rank, H100, "mixed",
                        extra_backward_host_s=ddp_host_seconds(161, 159, len(buckets)))
    nv, ib = achieved_link(NVLINK4), achieved_link(NDR)
    links = (nv.bandwidth_bytes_per_s, nv.latency_s, ib.bandwidth_bytes_per_s, ib.latency_s)
    # the BatchNorm buffers' broadcast before forward, a pipelined ring across the nodes
    buffers = 4 * 2 * 26_560 / 2 + 8 * 53  # running stats at 16 bits, counters int64
    sync = buffers / ib.bandwidth_bytes_per_s + (n - 1) * ib.latency_s
    two = ddp_step_time(fwd, bwd, buckets, n, *links[:2], allreduce_time=lambda x:
                        hierarchical_allreduce_time(x, g, 8, *links)["total"],
                        buffer_broadcast_s=sync)
    flat = ddp_step_time(fwd, bwd, buckets, n, *links[:2], allreduce_time=lambda x:
                         flat_ring_multinode_time(x, g, 8, *links), buffer_broadcast_s=sync)
    time = explorer.data()["time"]
    assert close(time["DDP, two-level"]["total"], two.total_s, rel=1e-6)
    assert close(time["DDP, flat ring"]["total"], flat.total_s, rel=1e-6)
    assert close(time["DDP, two-level"]["exposed"], two.exposed_communication_s, rel=1e-6)
    text = explorer.readout_text()
    assert "8 nodes of 8, InfiniBand NDR between nodes" in text
    assert "DDP, two-level" in text and "DDP, flat ring" in text


def test_precision_attention_and_fit_verdicts_follow_memory_py(explorer):
    with explorer.hold():
        explorer.controls["model"].value = "Llama-2 7B"
        explorer.controls["precision"].value = "mixed"
        explorer.controls["attention"].value = "eager"
    model, n, b = MODELS["Llama-2 7B"], 8, 8
    expected = {"ddp": memory_per_gpu(model, n, b, "adam", "mixed",
                                      attention="eager")["ddp_rank"]}
    for strategy in ("zero1", "zero2", "zero3"):
        expected[strategy] = rank_memory(model, n, b, strategy, "adam", "mixed",
                                         attention="eager")
    s = explorer.last
    for k, parts in expected.items():
        assert s["memory"][k] == parts
        assert s["fits"][k] == fits(total_bytes(parts), 80e9)
    # 16 B x 6.7e9 > 80 GB; eager attention's s x s scores at s = 4096 fill even ZeRO-3's GPU
    assert s["fits"]["ddp"] is False and s["fits"]["zero3"] is False
    text = explorer.readout_text()
    assert "Memory per GPU on H100 SXM 80GB (80 GB)" in text
    assert f"DDP {format_bytes(total_bytes(expected['ddp']), digits=3)} does not fit" in text
    assert f"ZeRO-3 {format_bytes(total_bytes(expected['zero3']), digits=3)} does not fit" in text
    memory = explorer.data()["memory"]
    assert memory["capacity"] == 80e9 == H100.memory_bytes
    assert memory["ddp"] == {k: float(v) for k, v in expected["ddp"].items()}
    eager = total_bytes(s["memory"]["ddp"])
    explorer.controls["attention"].value = "sdpa"
    assert total_bytes(explorer.last["memory"]["ddp"]) < eager  # no s x s scores kept
    zero3 = rank_memory(model, n, b, "zero3", "adam", "mixed", attention="sdpa")
    assert explorer.last["fits"]["zero3"] is True
    assert f"ZeRO-3 {format_bytes(total_bytes(zero3), digits=3)} fits" in explorer.readout_text()
    explorer.controls["precision"].value = "bf16"
    assert explorer.last["memory"]["ddp"]["optimizer state"] == model.parameters * 4


def test_bad_input_names_the_parameter():
    model = MODELS["GPT-2 XL"]
    good = dict(model=model, precision="mixed", num_gpus=8, gpus_per_node=8,
                intra_link=NVLINK4, inter_link=NDR, gpu=H100, bucket_cap_mb=None,
                optimizer="adam", batch_size=8)
    for key, bad, match in (("precision", "fp8", "precision"), ("num_gpus", 0, "num_gpus"),
                            ("gpus_per_node", 0, "gpus_per_node"),
                            ("num_gpus", 12, "multiple of gpus_per_node"),
                            ("bucket_cap_mb", 0.0, "bucket_cap_mb"),
                            ("bucket_cap_mb", -1, "bucket_cap_mb"),
                            ("bucket_cap_mb", math.nan, "bucket_cap_mb"),
                            ("bucket_cap_mb", 2.0**20, "bucket_cap_mb"),
                            ("batch_size", 0, "batch_size"), ("optimizer", "lamb", "optimizer")):
        with pytest.raises((TypeError, ValueError), match=match):
            X.scenario(**{**good, key: bad})
    with pytest.raises(ValueError, match="attention"):
        X.scenario(**good, attention="flash")


def test_one_gpu_has_nothing_to_communicate(explorer):
    explorer.controls["gpus"].value = 1
    text = explorer.readout_text()
    assert "One GPU: nothing to communicate" in text
    assert "DP and DDP: all 8 samples on the one GPU" in text
    time = explorer.data()["time"]
    assert time["DP, NCCL path"]["exposed"] == time["DDP, ring"]["exposed"] == 0


def test_readout_lines_keep_every_number_of_the_readout_one_table_row_per_line(explorer):
    lines = explorer.readout_lines()
    header = "per step | busiest link | step time | exposed comm. | comm. hidden?"
    assert lines[1] == header
    rows = [line for line in lines if line.startswith(("DP, ", "DDP, "))]
    assert [row.split(" | ")[0] for row in rows] == [X.DP_COPY, X.DP_NCCL, X.DDP_RING]
    assert all(len(row.split(" | ")) == 5 for row in rows)
    # Nothing is lost against the one-line text form the notebook's checks read.
    assert " ".join(" ".join(lines).replace(" | ", " ").split()) == \
        " ".join(explorer.readout_text().split())
    explorer.controls["gpus"].value = 64
    assert any(X.CANNOT_SPAN in line for line in explorer.readout_lines())


def test_the_committed_notebook_keeps_a_static_snapshot_of_the_opening_explorer():
    """Lesson 05's widget cell leaves text and PNGs equal to a fresh explorer's (no kernel)."""
    import base64
    import json
    from pathlib import Path

    notebook = json.loads((Path(__file__).resolve().parents[1] / "notebooks" /
                           "05_explorer.ipynb").read_text())
    cell = next(c for c in notebook["cells"] if "".join(c["source"]).endswith("explorer.show()"))
    outputs = cell["outputs"]
    assert "application/vnd.jupyter.widget-view+json" in outputs[0]["data"]
    text = "".join("".join(o["text"]) for o in outputs if o["output_type"] == "stream")
    fresh = Explorer()
    lines = text.replace("\n    ", " ").splitlines()  # undo the wrapping
    assert lines[2:] == fresh.readout_lines() and max(map(len, text.splitlines())) <= 96
    pngs = [base64.b64decode(o["data"]["image/png"]) for o in outputs if "image/png" in
            o.get("data", {})]
    for png, name in zip(pngs, fresh.views, strict=True):
        expected = Image.open(io.BytesIO(fresh.images[name].value)).convert("RGB")
        saved = Image.open(io.BytesIO(png)).convert("RGB")
        assert saved.size == expected.size and ImageChops.difference(saved, expected).getbbox() \
            is None, f"the {name} snapshot differs from a fresh explorer's figure"


def test_the_model_runs_without_ipywidgets_matplotlib_or_torch():
    """explorer_model computes what the widget shows with none of them importable (as on a page
    in the browser)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "for name in ('ipywidgets', 'matplotlib', 'torch', 'numpy'):\n"
            "    sys.modules[name] = None  # as if not installed\n"
            "from dpcost import explorer_model as m\n"
            "from dpcost.presets import GPUS, INTERCONNECTS as L, MODELS\n"
            "s = m.scenario(MODELS['GPT-2 XL'], 'mixed', 8, 8, L['NVLink 4 (H100)'],\n"
            "               L['InfiniBand NDR'], GPUS['H100 SXM 80GB'], None, 'adam', 64)\n"
            "print(bool(m.verdict(s)), sorted(n for n in sys.modules if n.startswith('dpcost')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=str(__import__("pathlib").Path(__file__).parents[1]))
    assert done.returncode == 0, done.stderr[-2000:]
    shown, modules = done.stdout.split(" ", 1)
    assert shown == "True"
    assert "'dpcost.explorer'" not in modules and "explorer_views" not in modules


def test_the_voila_page_has_its_own_face_and_opens_on_the_sites_case(monkeypatch, capsys):
    """Under Voila (SERVER_SOFTWARE=voila/...) show() gives the page a title, hides the lesson's
    other cells and shows one live explorer of its own, at the opening case of the site's page
    (explorer_model.explore's settings); no static snapshot, no notebook instructions."""
    import IPython.display

    from dpcost.explorer import PAGE_HEAD

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *objects: shown.extend(objects))
    lesson = Explorer()
    monkeypatch.setenv("SERVER_SOFTWARE", "voila/0.5.13")
    lesson.show()
    assert capsys.readouterr().out == ""  # no snapshot printed
    head, widget = shown
    assert isinstance(head, IPython.display.HTML) and head.data == PAGE_HEAD
    assert ":not(:has(.dpcost-page))" in PAGE_HEAD and "Run the cell" not in PAGE_HEAD
    assert widget is lesson.page.widget and lesson.page is not lesson
    site = X.explore(None)["settings"]
    assert {k: str(v) for k, v in lesson.page.settings().items() if k in site} == {
        k: str(v) for k, v in site.items()}
    # the lesson's checks move their explorer; the page's stays on the opening case
    before = lesson.page.readout_text()
    lesson.controls["model"].value = "Llama-2 7B"
    assert lesson.page.readout_text() == before != lesson.readout_text()

    shown.clear()
    monkeypatch.setenv("SERVER_SOFTWARE", "TornadoServer/6.5")  # a notebook server
    lesson.show()
    assert shown[0] is lesson.widget and "Snapshot at these settings" in capsys.readouterr().out
