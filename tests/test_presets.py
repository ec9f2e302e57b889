"""Presets: parameter counts recomputed from each model's config, activation estimates checked
against the tensors torch really saves for backward, link speeds from their units."""

import dataclasses
import math

import pytest
import torch
from torch import nn
from torch_resnet50 import resnet50

from dpcost.presets import (
    DTYPE_BYTES,
    INTERCONNECTS,
    MODELS,
    InterconnectPreset,
    ModelPreset,
    custom_model,
    resnet50_activation_bytes_per_sample,
    transformer_activation_bytes_per_sample,
)

# --- parameter counts from the published configs ---------------------------------------------


def gpt2_parameters(vocab, positions, d, layers):
    """GPT-2: token + position embeddings, per layer LN, qkv, proj, LN, fc, proj (with biases),
    final LN; the LM head is tied to the token embedding."""
    per_layer = (2 * d) + (d * 3 * d + 3 * d) + (d * d + d) + (2 * d) + (d * 4 * d + 4 * d) + (
        4 * d * d + d)
    return vocab * d + positions * d + layers * per_layer + 2 * d


def bert_parameters(vocab, positions, types, d, layers, ffn):
    embeddings = vocab * d + positions * d + types * d + 2 * d
    per_layer = 3 * (d * d + d) + (d * d + d) + 2 * d + (d * ffn + ffn) + (ffn * d + d) + 2 * d
    pooler = d * d + d
    return embeddings + layers * per_layer + pooler


def llama_parameters(vocab, d, layers, heads, kv_heads, ffn):
    head_dim = d // heads
    attention = d * d + 2 * d * kv_heads * head_dim + d * d  # q, k, v, o (no biases)
    mlp = 3 * d * ffn  # gate, up, down
    per_layer = attention + mlp + 2 * d  # two RMSNorm weights
    return 2 * vocab * d + layers * per_layer + d  # embedding + untied head + final norm


@pytest.mark.parametrize("name, expected", [
    ("GPT-2 small", gpt2_parameters(50257, 1024, 768, 12)),
    ("GPT-2 XL", gpt2_parameters(50257, 1024, 1600, 48)),
    ("BERT-base", bert_parameters(30522, 512, 2, 768, 12, 3072)),
    ("Llama-2 7B", llama_parameters(32000, 4096, 32, 32, 32, 11008)),
    ("Llama-2 13B", llama_parameters(32000, 5120, 40, 40, 40, 13824)),
    ("Llama-2 70B", llama_parameters(32000, 8192, 80, 64, 8, 28672)),
])
def test_parameter_count_matches_config(name, expected):
    assert MODELS[name].parameters == expected


def test_gpt2_small_count_is_the_model_card_figure():
    # Independent of the formula above: the model card's number, and a torch module's count.
    assert gpt2_parameters(50257, 1024, 768, 12) == 124_439_808
    layer = nn.TransformerEncoderLayer(768, 12, 3072)  # same weights per layer as GPT-2's block
    per_layer = sum(p.numel() for p in layer.parameters())
    assert 50257 * 768 + 1024 * 768 + 12 * per_layer + 2 * 768 == MODELS["GPT-2 small"].parameters


def saved_bytes(module, inputs):
    """Bytes of the distinct non-parameter tensors autograd saves in one forward."""
    params = {p.data_ptr() for p in module.parameters()}
    seen = {}

    def pack(t):
        if t.data_ptr() not in params:
            seen[t.data_ptr()] = max(seen.get(t.data_ptr(), 0), t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(inputs)
    return sum(seen.values())


@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)
    return resnet50().train()


def test_resnet50_parameters_match_torchvision_docs(resnet):
    assert sum(p.numel() for p in resnet.parameters()) == MODELS["ResNet-50"].parameters


def test_resnet50_activation_estimate_matches_what_torch_saves(resnet):
    model = resnet
    size = 40  # small images keep the test fast (odd sides on the way: 5, 3, 2)
    one = saved_bytes(model, torch.randn(1, 3, size, size))
    two = saved_bytes(model, torch.randn(2, 3, size, size))
    per_sample = two - one  # BatchNorm's per-channel statistics cancel
    assert per_sample == pytest.approx(resnet50_activation_bytes_per_sample(size), rel=0.01)
    assert MODELS["ResNet-50"].activation_bytes_per_sample == resnet50_activation_bytes_per_sample(
        224)


def fused_dropout(x, p, train):
    # What F.dropout runs on CUDA (aten/src/ATen/native/Dropout.cpp: dropout takes the fused
    # kernel for CUDA tensors): native_dropout, whose mask is bool, 1 byte per element.
    return torch.native_dropout(x, p, train)[0]


class GPT2Block(nn.Module):
    """One GPT-2 block with eager attention (as in Hugging Face's 'eager' path), dropout on."""

    def __init__(self, d, heads, dropout, p=0.1):
        super().__init__()
        self.heads, self.p, self.dropout = heads, p, dropout
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.gelu = nn.GELU(approximate="tanh")

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d // self.heads)
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        attn = self.dropout(scores.softmax(-1), self.p, True)
        y = (attn @ v).transpose(1, 2).reshape(b, s, d)
        x = x + self.dropout(self.proj(y), self.p, True)
        h = self.out(self.gelu(self.fc(self.ln2(x))))
        return x + self.dropout(h, self.p, True)


def block_bytes_per_sample(dropout, s=64, d=64, heads=4):
    torch.manual_seed(0)
    block = GPT2Block(d, heads, dropout)
    return saved_bytes(block, torch.randn(2, s, d)) - saved_bytes(block, torch.randn(1, s, d))


def test_transformer_formula_matches_what_torch_saves():
    s, d, heads = 64, 64, 4
    # 66 s h + 9 a s^2 bytes per sample per layer in fp32 with 1-byte dropout masks (layer
    # norm's per-token mean and rstd add 16 s bytes, inside the tolerance).
    assert block_bytes_per_sample(fused_dropout) == pytest.approx(
        s * d * 66 + 9 * heads * s * s, rel=0.01)
    assert transformer_activation_bytes_per_sample(s, d, heads, 3) == 3 * (
        s * d * 66 + 9 * heads * s * s)


def test_cpu_dropout_keeps_float_masks():
    # On CPU, F.dropout multiplies by a float noise tensor and keeps it: 3 more bytes for each
    # of the 2 s h + a s^2 mask elements than the formula's 1-byte masks.
    s, d, heads = 64, 64, 4
    formula = s * d * 66 + 9 * heads * s * s
    assert block_bytes_per_sample(nn.functional.dropout) == pytest.approx(
        formula + 3 * (2 * s * d + heads * s * s), rel=0.01)


def test_gpt2_small_preset_uses_context_and_vocabulary():
    gpt2 = MODELS["GPT-2 small"]
    assert gpt2.output_elements_per_sample == 1024 * 50257
    assert gpt2.activation_bytes_per_sample == 12 * (1024 * 768 * 66 + 9 * 12 * 1024 * 1024)
    assert gpt2.kind == "language" and MODELS["ResNet-50"].kind == "vision"


# --- the tables themselves -------------------------------------------------------------------


def test_model_keys_and_fields():
    assert list(MODELS) == ["ResNet-50", "BERT-base", "GPT-2 small", "GPT-2 XL", "Llama-2 7B",
                            "Llama-2 13B", "Llama-2 70B"]
    for key, model in MODELS.items():
        assert isinstance(model, ModelPreset) and model.name == key
        assert model.source and model.parameters > 0 and model.default_batch_size >= 1
        assert model.output_elements_per_sample > 0 and model.activation_bytes_per_sample > 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        MODELS["ResNet-50"].parameters = 1


def test_interconnect_bandwidths_from_their_units():
    gb = 1e9
    # PCIe: GT/s per lane x 16 lanes x 128b/130b encoding / 8 bits per byte.
    assert INTERCONNECTS["PCIe 4.0 x16"].bandwidth_bytes_per_s == pytest.approx(31.5077 * gb,
                                                                                rel=1e-5)
    assert INTERCONNECTS["PCIe 5.0 x16"].bandwidth_bytes_per_s == pytest.approx(63.0154 * gb,
                                                                                rel=1e-5)
    assert INTERCONNECTS["NVLink 3 (A100)"].bandwidth_bytes_per_s == 600 * gb / 2
    assert INTERCONNECTS["NVLink 4 (H100)"].bandwidth_bytes_per_s == 900 * gb / 2
    assert INTERCONNECTS["InfiniBand HDR"].bandwidth_bytes_per_s == 25 * gb  # 200 Gb/s
    assert INTERCONNECTS["InfiniBand NDR"].bandwidth_bytes_per_s == 50 * gb  # 400 Gb/s
    assert INTERCONNECTS["100 GbE"].bandwidth_bytes_per_s == 12.5 * gb  # 100 Gb/s
    assert list(INTERCONNECTS) == ["PCIe 4.0 x16", "PCIe 5.0 x16", "NVLink 3 (A100)",
                                   "NVLink 4 (H100)", "NVLink 2 (V100)", "NVLink 4 (H200)",
                                   "InfiniBand HDR", "InfiniBand NDR", "100 GbE"]
    for key, link in INTERCONNECTS.items():
        assert isinstance(link, InterconnectPreset) and link.name == key and link.source
        assert 1e-7 < link.latency_s < 1e-4  # microseconds, as published


def test_dtype_bytes_match_torch():
    for name, dtype in [("fp32", torch.float32), ("bf16", torch.bfloat16),
                        ("fp16", torch.float16)]:
        assert DTYPE_BYTES[name] == torch.tensor([], dtype=dtype).element_size()


def test_custom_model():
    m = custom_model(1000, output_elements_per_sample=10, activation_bytes_per_sample=64)
    assert (m.parameters, m.output_elements_per_sample, m.activation_bytes_per_sample) == (
        1000, 10, 64.0)
    assert type(m.activation_bytes_per_sample) is float
    assert m.name == "custom" and custom_model(5, name="tiny").name == "tiny"


@pytest.mark.parametrize("kwargs, error, parameter", [
    ({"parameters": 1.5}, TypeError, "parameters"),
    ({"parameters": -1}, ValueError, "parameters"),
    ({"parameters": 10**18 + 1}, ValueError, "parameters"),
    ({"output_elements_per_sample": -3}, ValueError, "output_elements_per_sample"),
    ({"activation_bytes_per_sample": float("nan")}, ValueError, "activation_bytes_per_sample"),
    ({"activation_bytes_per_sample": "1GB"}, TypeError, "activation_bytes_per_sample"),
    ({"name": 7}, TypeError, "name"),
])
def test_bad_input_names_the_parameter(kwargs, error, parameter):
    with pytest.raises(error) as info:
        custom_model(**{"parameters": 10, **kwargs})
    assert parameter in str(info.value)


# --- GPUs, FLOPs and where the exact counts come from ----------------------------------------


def test_gpu_presets_from_the_datasheets():
    from dpcost.presets import GPUS, INTERCONNECTS

    a100, h100 = GPUS["A100 SXM 80GB"], GPUS["H100 SXM 80GB"]
    v100, h200 = GPUS["V100 SXM2 32GB"], GPUS["H200 SXM 141GB"]
    assert a100.peak_flops == {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}
    # H100 and H200 datasheets print sparse figures (1,979 bf16, 989 tf32); dense is half
    for gpu in (h100, h200):
        assert gpu.peak_flops["bf16"] == 1979e12 / 2 and gpu.peak_flops["tf32"] == 989e12 / 2
        assert gpu.peak_flops["fp32"] == 67e12
    # Volta: 125 TFLOPS of fp16 tensor cores, 15.7 fp32, no bf16 or TF32 of its own
    assert v100.peak_flops["fp16"] == 125e12 and v100.peak_flops["fp32"] == 15.7e12
    assert "no bf16" in v100.source
    assert [g.memory_bytes for g in (a100, h100, v100, h200)] == [80e9, 80e9, 32e9, 141e9]
    # HBM bandwidths as the datasheets print them: 2,039 GB/s, 3.35 TB/s, 900 GB/s, 4.8 TB/s
    assert [g.memory_bandwidth_bytes_per_s for g in (a100, h100, v100, h200)] == \
        [2039e9, 3.35e12, 900e9, 4.8e12]
    for gpu in GPUS.values():
        assert "datasheet" in gpu.source and "sparsity" in gpu.source
        assert "bandwidth" in gpu.source
        assert set(gpu.peak_flops) >= {"bf16", "fp32", "tf32"}
    # the NVLink each board comes with: 300 GB/s (V100) and 900 GB/s (H200) both ways
    assert INTERCONNECTS["NVLink 2 (V100)"].bandwidth_bytes_per_s == 300e9 / 2
    assert INTERCONNECTS["NVLink 4 (H200)"].bandwidth_bytes_per_s == 900e9 / 2


def test_each_count_says_where_it_comes_from():
    for name, model in MODELS.items():
        assert "exact count" in model.source, name
        assert "print" in model.source, name  # the paper's rounded figure, beside it
    assert "117M" in MODELS["GPT-2 small"].source
    assert "1542M" in MODELS["GPT-2 XL"].source


def test_kaplan_constant():
    from dpcost.presets import TRAINING_FLOPS_PER_PARAMETER_TOKEN

    assert TRAINING_FLOPS_PER_PARAMETER_TOKEN == 6  # forward 2N + backward 4N per token
