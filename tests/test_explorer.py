"""The explorer without a browser: set each control's .value, check readout and plotted data.

Expected numbers are recomputed here from the formulas (2(n-1)P, 2(n-1)/n P, the alpha-beta
times, the memory table) and the presets' raw data, never copied from the explorer's output.
"""

from __future__ import annotations

import io
import math

import pytest
from PIL import Image, ImageChops

from dpcost.explorer import CURVE_GPUS, GPU_CHOICES, Explorer, parse_parameter_count
from dpcost.explorer_views import TimeView, VolumeView, format_seconds
from dpcost.presets import INTERCONNECTS, MODELS
from dpcost.units import format_bytes


def close(a, b, rel=1e-12):
    return math.isclose(a, b, rel_tol=rel, abs_tol=0.0)


@pytest.fixture
def explorer():
    return Explorer()


def test_defaults_readout_and_volume_curve():
    e = Explorer()  # GPT-2 XL, fp32, 8 GPUs, PCIe 4.0 x16, Adam
    P = 1_557_611_200 * 4
    text = e.readout_text()
    assert text.startswith(f"n = 8, P = {format_bytes(P, digits=3)}: reduction factor 8x.")
    assert f"DP {format_bytes(14 * P, digits=3)}" in text
    assert f"DDP {format_bytes(14 / 8 * P, digits=3)}" in text
    assert "DDP wins" in text and "8x fewer bytes" in text
    volume = e.data()["volume"]
    assert volume["gpus"] == [float(n) for n in CURVE_GPUS]
    for n, dp, ddp in zip(volume["gpus"], volume["dp"], volume["ddp"], strict=True):
        assert close(dp, 2 * (n - 1) * P) and close(ddp, 2 * (n - 1) / n * P)
    assert volume["marker_gpus"] == 8 and volume["n_line"] == 8
    assert close(volume["marker_dp"], 14 * P) and close(volume["marker_ddp"], 1.75 * P)


def test_curve_gpus_are_log_spaced_and_hold_every_slider_value():
    assert GPU_CHOICES == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert CURVE_GPUS[0] == 2 and CURVE_GPUS[-1] == 1024 and CURVE_GPUS == sorted(set(CURVE_GPUS))
    assert set(GPU_CHOICES[1:]) <= set(CURVE_GPUS)
    ratios = [b / a for a, b in zip(CURVE_GPUS, CURVE_GPUS[1:], strict=False)]
    assert max(ratios) <= 1.5  # dense enough on a log axis


@pytest.mark.parametrize("n", [1, 2, 64, 1024])
def test_gpu_slider_moves_markers_times_and_readout(explorer, n):
    explorer.controls["gpus"].value = n
    P = MODELS["GPT-2 XL"].parameters * 4
    link = INTERCONNECTS["PCIe 4.0 x16"]
    data, text = explorer.data(), explorer.readout_text()
    assert data["volume"]["n_line"] == n and data["time"]["n_line"] == n
    if n == 1:
        assert data["volume"]["marker_gpus"] is None and data["time"]["marker_gpus"] is None
        assert "One GPU: nothing to communicate" in text
        assert "DP 0 B in 0 s, DDP 0 B in 0 s" in text
        return
    dp_time = 2 * (n - 1) * link.latency_s + 2 * (n - 1) * P / link.bandwidth_bytes_per_s
    ddp_time = 2 * (n - 1) * link.latency_s + 2 * (n - 1) / n * P / link.bandwidth_bytes_per_s
    assert data["volume"]["marker_gpus"] == n
    assert close(data["time"]["marker_dp"], dp_time)
    assert close(data["time"]["marker_ddp"], ddp_time)
    assert f"reduction factor {n}x" in text
    assert f"in {format_seconds(dp_time)}, DDP" in text
    assert f"in {format_seconds(ddp_time)}." in text
    assert f"n = {n}: DP / DDP = {n}x" in data["volume"]["note"]


def test_model_preset_brings_its_size_batch_and_outputs(explorer):
    explorer.controls["model"].value = "ResNet-50"
    assert explorer.controls["batch_size"].value == MODELS["ResNet-50"].default_batch_size
    assert explorer.controls["outputs"].value == 1000
    P = 25_557_032 * 4
    assert f"P = {format_bytes(P, digits=3)}" in explorer.readout_text()
    volume = explorer.data()["volume"]
    assert close(volume["marker_dp"], 2 * 7 * P)
    assert volume["note"] == "n = 8: DP / DDP = 8x"
    # DP GPU0 holds the whole batch's 256 x 1000 fp32 logits, a DDP rank 1/8 of them.
    memory = explorer.data()["memory"]
    assert close(memory["dp_gpu0"]["outputs"], 256 * 1000 * 4)
    assert close(memory["ddp_rank"]["outputs"], 256 * 1000 * 4 / 8)


def test_dtype_halves_every_byte_and_time_curve(explorer):
    fp32 = explorer.data()
    explorer.controls["dtype"].value = "bf16"
    bf16 = explorer.data()
    for a, b in zip(fp32["volume"]["dp"], bf16["volume"]["dp"], strict=True):
        assert close(b, a / 2)
    # Time = latency + bytes / bandwidth: only the bandwidth term halves.
    link, n = INTERCONNECTS["PCIe 4.0 x16"], 8
    latency = 2 * (n - 1) * link.latency_s
    assert close(bf16["time"]["marker_dp"] - latency, (fp32["time"]["marker_dp"] - latency) / 2,
                 rel=1e-9)
    assert close(bf16["memory"]["dp_gpu0"]["parameters"], MODELS["GPT-2 XL"].parameters * 2)


def test_interconnect_changes_only_the_time_view(explorer):
    images = {k: w.value for k, w in explorer.images.items()}
    volume = explorer.data()["volume"]
    explorer.controls["interconnect"].value = "NVLink 4 (H100)"
    link, P, n = INTERCONNECTS["NVLink 4 (H100)"], MODELS["GPT-2 XL"].parameters * 4, 8
    assert close(explorer.data()["time"]["marker_ddp"],
                 2 * (n - 1) * link.latency_s + 2 * (n - 1) / n * P / link.bandwidth_bytes_per_s)
    assert explorer.data()["volume"] == volume
    assert explorer.images["time"].value != images["time"]
    assert explorer.images["volume"].value == images["volume"]
    assert explorer.images["memory"].value == images["memory"]
    assert "over NVLink 4 (H100)" in explorer.readout_text()


@pytest.mark.parametrize("optimizer,state", [("sgd", 0), ("sgd_momentum", 4), ("adam", 8)])
def test_optimizer_sets_the_state_bars(explorer, optimizer, state):
    explorer.controls["optimizer"].value = optimizer
    N = MODELS["GPT-2 XL"].parameters
    memory = explorer.data()["memory"]
    assert memory["dp_gpu0"]["optimizer state"] == N * state
    assert memory["ddp_rank"]["optimizer state"] == N * state
    assert memory["dp_gpu0"]["parameters"] == memory["ddp_rank"]["parameters"] == N * 4


def test_batch_and_outputs_drive_the_memory_view_and_its_totals(explorer):
    explorer.controls["model"].value = "GPT-2 small"
    with explorer.hold():
        explorer.controls["batch_size"].value = 32
        explorer.controls["outputs"].value = 1024 * 50_257
        explorer.controls["gpus"].value = 4
    out = 32 * 1024 * 50_257 * 4  # O, the whole batch's fp32 logits
    memory = explorer.data()["memory"]
    assert close(memory["dp_gpu0"]["outputs"], out)
    assert close(memory["dp_gpu0"]["loss and output grads"], 2 * out)
    assert close(memory["ddp_rank"]["outputs"], out / 4)
    assert close(memory["ddp_rank"]["loss and output grads"], 2 * out / 4)
    dp_total, ddp_total = (sum(memory[g].values()) for g in ("dp_gpu0", "ddp_rank"))
    assert close(dp_total - ddp_total, 3 * out * (1 - 1 / 4), rel=1e-9)
    text = explorer.readout_text()
    assert f"DP's GPU0 {format_bytes(dp_total, digits=3)}" in text
    assert f"a DDP rank {format_bytes(ddp_total, digits=3)}" in text
    assert memory["ylim"][1] >= 1.12 * dp_total  # the bars and their totals fit


def test_custom_model_and_bad_text_shows_an_error_not_a_traceback(explorer):
    explorer.controls["model"].value = "custom"
    assert not explorer.controls["custom"].disabled
    explorer.controls["custom"].value = "2e9"
    assert explorer.error is None
    assert close(explorer.data()["volume"]["marker_dp"], 2 * 7 * 2e9 * 4)
    assert "P = 8 GB" in explorer.readout_text()
    before = explorer.data()
    for bad in ("abc", "1GB", "", "-5", "0.2"):
        explorer.controls["custom"].value = bad
        assert explorer.error is not None
        assert explorer.readout_text().startswith("Cannot update: custom parameters")
        assert explorer.data() == before  # the figures stay as they were
    explorer.controls["custom"].value = "3e9"
    assert explorer.error is None and "P = 12 GB" in explorer.readout_text()


def test_parse_parameter_count():
    assert parse_parameter_count("1.5e9") == 1_500_000_000
    assert parse_parameter_count(" 350000000 ") == 350_000_000
    for bad in ("7B", "1GB", "x", ""):
        with pytest.raises(ValueError, match="custom parameters"):
            parse_parameter_count(bad)


def test_verdict_names_latency_when_it_dominates(explorer):
    # ResNet-50 in bf16 on 1024 GPUs over 100 GbE: 2046 x 10 us of latency against
    # 2 x 1023/1024 x 51 MB / 12.5 GB/s of bandwidth.
    with explorer.hold():
        explorer.controls["model"].value = "ResNet-50"
        explorer.controls["dtype"].value = "bf16"
        explorer.controls["interconnect"].value = "100 GbE"
        explorer.controls["gpus"].value = 1024
    link, P = INTERCONNECTS["100 GbE"], 25_557_032 * 2
    assert 2046 * link.latency_s > 2 * 1023 / 1024 * P / link.bandwidth_bytes_per_s
    assert "mostly latency" in explorer.readout_text()
    assert explorer.controls["batch_size"].value == 256  # the preset's, even inside hold()
    explorer.controls["model"].value = "GPT-2 XL"  # 3.1 GB: bandwidth wins again
    assert "mostly latency" not in explorer.readout_text()


def test_every_preset_fits_the_fixed_axes():
    """The fixed y ranges hold every preset, so switching presets never redraws the axes."""
    n_max = max(CURVE_GPUS)
    for model in MODELS.values():
        for w in (2, 4):
            P = model.parameters * w
            assert VolumeView.Y_RANGE[0] <= P <= 2 * (n_max - 1) * P <= VolumeView.Y_RANGE[1]
            for link in INTERCONNECTS.values():
                beta, alpha = link.bandwidth_bytes_per_s, link.latency_s
                fastest = 2 * alpha + P / beta  # DDP on 2 GPUs
                slowest = 2 * (n_max - 1) * (alpha + P / beta)  # DP on 1024
                assert TimeView.Y_RANGE[0] <= fastest and slowest <= TimeView.Y_RANGE[1]


def test_layered_render_matches_a_full_redraw(explorer):
    """The blitted PNG (cached axes + moved artists) looks like a figure drawn from scratch."""
    for name, value in (("gpus", 256), ("model", "Llama-2 13B"), ("optimizer", "sgd")):
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
        explorer.controls["dtype"].value = "fp16"
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
        Explorer(gpu=8)


def test_a_huge_custom_count_is_refused_at_once_with_a_short_message():
    import time

    from dpcost.explorer import parse_parameter_count

    start = time.perf_counter()
    with pytest.raises(ValueError) as info:
        parse_parameter_count("9" * 100_000 + "!")
    assert time.perf_counter() - start < 0.5
    assert len(str(info.value)) < 120 and "..." in str(info.value)
