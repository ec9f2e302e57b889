"""What dpcost.plan's trace counts, against measurements and hand counts (issue 37 Sec. 4):
torch.nn's transformer on the fused attention CUDA runs, the activations' dtypes, the aten ops
of a step, the convolutions' share of the FLOPs, and the GPU given by its figures."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dpcost.plan import plan  # noqa: E402
from dpcost.plan.trace import trace_step  # noqa: E402
from dpcost.presets import GPUS, RESNET50_STAGES, resnet50_layers  # noqa: E402

ENCODER = "dpcost.torch_models:transformer_encoder"  # lesson 10's: d 256, 4 layers, 8 heads
B, S, D, HEADS, LAYERS = 8, 512, 256, 8, 4


def _meta_encoder(dtype):
    from dpcost.torch_models import transformer_encoder

    with torch.device("meta"):
        return (transformer_encoder(D, LAYERS).to(dtype),
                torch.zeros(B, S, D, dtype=dtype, device="meta"))


def test_torch_nn_transformer_activations_within_30_percent_of_the_h200():
    # Measured on one NVIDIA H200 (torch 2.11.0+cu130, bf16 autocast): lesson 10's encoder
    # (transformer_encoder(256, 4), 8 x 512 tokens) after a training forward,
    # torch.cuda.max_memory_allocated() = 163 MB (issue 37, from ../shared/gpu's runs).
    # Before nn.MultiheadAttention reached the flash routing, the plan said 1,015 MB.
    measured = 163e6
    r = plan(ENCODER, gpus=1, input_shape=f"{B},{S},{D}")
    assert r["notes"]["sdpa_calls"] == LAYERS  # MHA's inner SDPA call, once per layer
    assert 0.7 * measured <= r["activation_bytes"] <= 1.3 * measured, r["activation_bytes"]


def test_bf16_activations_are_bf16_but_masks_and_statistics():
    # CUDA's kernels under bf16: dropout keeps a bool mask (native_dropout), flash attention
    # an fp32 logsumexp per (sample, head, position), layer norm fp32 mean and rstd per token;
    # everything else autograd saves is bf16. Masks per layer: after attention (d), inside the
    # MLP (4d), after the MLP (d), one byte per element.
    module, x = _meta_encoder(torch.bfloat16)
    by_dtype = trace_step(module, x).saved_by_dtype
    tokens = B * S
    assert by_dtype["bool"] == LAYERS * 6 * tokens * D
    assert by_dtype["float32"] == LAYERS * 4 * (B * HEADS * S + 2 * 2 * tokens)
    assert set(by_dtype) <= {"bfloat16", "bool", "float32", "uint64"}  # uint64: flash's RNG
    fp32_module, fp32_x = _meta_encoder(torch.float32)
    fp32 = trace_step(fp32_module, fp32_x).saved_by_dtype
    assert fp32["float32"] == 2 * by_dtype["bfloat16"] + by_dtype["float32"]  # 4 B for 2 B


def test_ops_of_a_two_layer_mlp_counted_by_hand():
    # Linear -> ReLU -> Linear, loss output.sum(); the input needs no gradient. Not views:
    # forward addmm, relu, addmm; the loss's sum; backward the seed ones_like, the second
    # addmm's mm (input), mm (weight) and sum (bias), threshold_backward, the first addmm's
    # mm (weight) and sum (bias): 3 + 1 + 7 = 11, 3 of them in forward.
    with torch.device("meta"):
        mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        x = torch.zeros(3, 4)
    t = trace_step(mlp, x)
    assert (t.ops, t.forward_ops, t.convolutions) == (11, 3, 0)
    assert t.views > 0  # t(), expand, detach: dispatched too, counted apart


def test_resnet50_convolutions_and_their_share_of_the_flops():
    # ResNet-50's 53 convolutions (resnet50_layers' walk of He et al. Table 1), each once in
    # forward and once in backward; every multiply-add but the fc layer's is a convolution's.
    layers = resnet50_layers()
    convs = [layer for layer in layers if layer.kind == "conv"]
    fc = [layer for layer in layers if layer.kind == "fc"][0]
    assert len(convs) == 1 + sum(3 * blocks + 1 for _, blocks, _ in RESNET50_STAGES)
    from dpcost.plan import traced_facts

    facts, _, _ = traced_facts("ResNet-50", "fp32", None, 1, None)
    assert facts.convolutions == 2 * len(convs)
    assert facts.ops > facts.forward_ops > 0
    conv_macs = sum(c.c_in * c.c_out * c.kernel ** 2 * c.side ** 2 for c in convs)
    fc_macs = fc.c_in * fc.c_out
    # backward is 2x forward, less the first convolution's input gradient (the image needs none)
    first = convs[0].c_in * convs[0].c_out * convs[0].kernel ** 2 * convs[0].side ** 2
    expected = (3 * conv_macs - first) / (3 * conv_macs - first + 3 * fc_macs)
    assert facts.conv_flops_share == pytest.approx(expected, rel=1e-6)


def test_gpu_presets_and_figures():
    h200 = plan("ResNet-50", gpus=8, gpu="H200")
    assert h200["capacity_bytes"] == 141e9 and h200["links"]["intra"] == "NVLink 4 (H200)"
    v100 = plan("ResNet-50", gpus=8, gpu="V100")
    assert v100["capacity_bytes"] == 32e9 and v100["links"]["intra"] == "NVLink 2 (V100)"
    assert "fp16" in v100["gpu_note"]  # no bf16 on Volta: said, not hidden
    # a GPU by its figures: the capacity is the one given, and more FLOP/s never slow a step
    # (at 64 images a GPU, where the device's clock, not the host's launches, sets the step)
    slow = plan("ResNet-50", gpus=8, gpu="H100", gpu_tflops=50, gpu_memory_gb=40,
                gpu_bandwidth=1000, batch=64)
    fast = plan("ResNet-50", gpus=8, gpu="H100", gpu_tflops=5000, gpu_memory_gb=40,
                gpu_bandwidth=100_000, batch=64)
    assert slow["capacity_bytes"] == fast["capacity_bytes"] == 40e9
    assert "50 TFLOP/s" in slow["settings"]["gpu"]
    assert slow["steps"]["ddp"]["compute_s"] > fast["steps"]["ddp"]["compute_s"]
    assert GPUS["H100 SXM 80GB"].memory_bytes == 80e9  # the preset itself is left as it was


def test_a_measured_step_is_the_compute_and_the_report_says_so():
    from dpcost.plan.report import format_table

    r = plan("ResNet-50", gpus=8, step_ms=25.0)
    assert r["steps"]["ddp"]["compute_s"] == pytest.approx(0.025)
    assert r["compute"].startswith("measured by the user")
    assert "measured" in format_table(r)
    assert plan("ResNet-50", gpus=8)["compute"].startswith("modelled")


def test_autocast_keeps_fp32_states_and_zero1_for_llama_7b_does_not_fit():
    # torch.autocast: fp32 parameters, gradients (all-reduced in fp32) and Adam moments, and
    # ZeroRedundancyOptimizer keeps no master copy: ZeRO-1 holds 4 + 4 + 8/8 B per parameter
    # plus DDP's bucket copy (4 B): about 13 B, 87.6 GB for Llama-2 7B on 8 GPUs (issue 37).
    from dpcost.memory import PRECISION_MODES

    if "autocast" not in PRECISION_MODES:
        pytest.skip("dpcost.memory has no autocast precision yet")
    from dpcost.setting import preset_facts

    r = plan(preset_facts("Llama-2 7B", "autocast"), gpus=8, precision="autocast")
    assert not r["fits"]["zero1"]
    assert "ZeRO-1" not in r["recommendation"].split("Use ")[-1][:8]
    assert "torch.autocast" in r["settings"]["layout"]
    traced = plan("dpcost.torch_models:small_cnn", gpus=2, precision="autocast",
                  input_shape="4,3,32,32")
    assert set(traced["by_dtype"]) == {"float32"}  # fp32 parameters and gradients
