"""Real models and interconnects, each number with its source.

Every figure here is nominal: parameter counts are exact, counted from each model's published
config (``tests/test_presets.py`` recounts them; each ``source`` also gives the rounded figure
the paper prints, e.g. 117M for GPT-2 small, whose exact count is 124,439,808), but activation
sizes are estimates from a formula, and bandwidths, latencies and FLOP/s are the vendors'
nominal or typical published figures, not measurements.
Pure Python on purpose, so the explorer and the notebooks can import it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpcost.core import check_int, check_real

__all__ = [
    "DTYPE_BYTES",
    "ModelPreset",
    "MODELS",
    "custom_model",
    "MAX_COUNT",
    "check_parameter_count",
    "InterconnectPreset",
    "INTERCONNECTS",
    "transformer_activation_bytes_per_sample",
    "resnet50_activation_bytes_per_sample",
    "GPUPreset",
    "GPUS",
    "resnet50_forward_macs_per_image",
    "RESNET50_STAGES",
    "Layer",
    "resnet50_layers",
    "resnet50_maxpool_index_bytes",
    "TransformerShape",
    "TRANSFORMER_SHAPES",
    "transformer_parameter_counts",
    "TRAINING_FLOPS_PER_PARAMETER_TOKEN",
]

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class ModelPreset:
    """A model as the memory model sees it: parameters, outputs and activations per sample."""

    name: str
    parameters: int  # parameter count
    source: str  # where the count comes from (paper, model card, torchvision docs)
    kind: str  # "vision" | "language"
    output_elements_per_sample: int  # ResNet-50: 1000 logits; GPT-2 small: seq_len * 50257
    activation_bytes_per_sample: float  # fp32 activations kept for backward, per sample (estimate)
    default_batch_size: int
    # A module traced by dpcost.plan knows its tensors and its FLOPs; a preset or a custom count
    # leaves them None (the explorer then uses the preset's tables or a custom model's rules).
    parameter_elements: tuple[int, ...] | None = None  # each trainable tensor, registration order
    ready_order: tuple[int, ...] | None = None  # their indices as autograd makes gradients ready
    training_flops_per_sample: float | None = None  # forward + backward, counted on one sample


@dataclass(frozen=True)
class InterconnectPreset:
    """A link between GPUs or nodes: nominal bandwidth per direction and per-message latency."""

    name: str
    bandwidth_bytes_per_s: float  # per direction
    latency_s: float  # per message
    source: str


# --- activation estimates -------------------------------------------------------------------


def transformer_activation_bytes_per_sample(seq_len: int, hidden: int, heads: int,
                                            layers: int) -> float:
    """fp32 activations a transformer keeps for backward, per sample: ``L * s*h*(66 + 9*a*s/h)``.

    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
    (arXiv:2205.05198), Sec. 4.1, count ``s*b*h*(34 + 5*a*s/h)`` bytes per layer with 16-bit
    activations and 1-byte dropout masks: 11sbh + 5as^2b (attention), 19sbh (MLP), 4sbh (two
    layer norms). Of the 34, 2 are masks (after attention and after the MLP) and of the 5, 1 is
    the attention-dropout mask; the rest are 2-byte elements. In fp32 the elements double and
    the masks stay 1 byte (bool, as CUDA's fused dropout keeps them; CPU's ``F.dropout`` keeps
    a 4-byte float mask): (32*2 + 2) sbh + (4*2 + 1) as^2 b = 66 sbh + 9 as^2 b. It assumes
    eager attention (the s x s scores are stored; FlashAttention removes the 9*a*s/h term) and
    leaves out the embeddings, the final layer norm and the logits (the memory model counts
    those as outputs). An estimate, used for every transformer preset, Llama-2 included
    (its SwiGLU MLP, RMSNorm and absence of dropout make its true figure differ somewhat).
    """
    s, h, a = seq_len, hidden, heads
    return float(layers * s * h * (66 + 9 * a * s / h))


# --- architectures: one table per model family, one walk ------------------------------------

# ResNet-50 v1.5 (torchvision's: stride on the 3x3 conv): (width, blocks, first stride) per
# stage, He et al. 2016, Table 1, the 50-layer column; expansion 4.
RESNET50_STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))


@dataclass(frozen=True)
class Layer:
    """One ResNet-50 layer that holds parameters, in registration order."""

    name: str  # as named_parameters names it in tests/torch_resnet50.py's Sequential
    kind: str  # "conv" (no bias), "bn" (weight, bias, running statistics) or "fc"
    c_in: int
    c_out: int
    kernel: int  # 1 for "bn" and "fc"
    side: int  # side of its output feature map (1 for "fc")


def _halve(side: int) -> int:
    """Output side of ResNet's stride-2 layers: floor((side + 2*pad - kernel) / 2) + 1."""
    return (side - 1) // 2 + 1  # 7x7 pad 3, 3x3 pad 1 and 1x1 pad 0 all give this


def _pooled_side(image_size: int) -> int:
    return _halve(_halve(image_size))  # the 7x7 stride-2 stem, then the 3x3 stride-2 max-pool


def resnet50_layers(image_size: int = 224, num_classes: int = 1000) -> list[Layer]:
    """ResNet-50's conv, batch-norm and fc layers in registration order, with their shapes.

    The one walk of the architecture: parameters and buffers (``dataparallel_traffic``),
    multiply-accumulates and saved activations (here) are all counted from it.
    """
    side = _halve(image_size)
    layers = [Layer("0", "conv", 3, 64, 7, side), Layer("1", "bn", 64, 64, 1, side)]
    side, c_in, index = _pooled_side(image_size), 64, 4  # 2 is the ReLU, 3 the max-pool
    for width, blocks, stride in RESNET50_STAGES:
        for block in range(blocks):
            p, out = str(index), _halve(side) if block == 0 and stride == 2 else side
            layers += [Layer(p + ".conv1", "conv", c_in, width, 1, side),
                       Layer(p + ".bn1", "bn", width, width, 1, side),
                       Layer(p + ".conv2", "conv", width, width, 3, out),
                       Layer(p + ".bn2", "bn", width, width, 1, out),
                       Layer(p + ".conv3", "conv", width, 4 * width, 1, out),
                       Layer(p + ".bn3", "bn", 4 * width, 4 * width, 1, out)]
            if block == 0:  # the shortcut: a strided 1x1 conv and its batch norm
                layers += [Layer(p + ".downsample.0", "conv", c_in, 4 * width, 1, out),
                           Layer(p + ".downsample.1", "bn", 4 * width, 4 * width, 1, out)]
            side, c_in, index = out, 4 * width, index + 1
    # index + 0 is the average pool, + 1 the flatten
    return layers + [Layer(str(index + 2), "fc", c_in, num_classes, 1, 1)]


def resnet50_maxpool_index_bytes(image_size: int = 224) -> int:
    """Bytes of the max-pool's int64 argmax indices (64 channels at side/4), any precision."""
    return 8 * 64 * _pooled_side(image_size) ** 2


def resnet50_activation_bytes_per_sample(image_size: int = 224) -> float:
    """fp32 bytes ResNet-50 keeps for backward per image, counted from its feature-map sizes.

    Counts the distinct tensors autograd saves in torchvision's ``resnet50`` (ReLUs in place):
    the input image (saved by the first conv), every conv's output (saved by its BatchNorm),
    every ReLU's output (one after each conv but the shortcut's; the block's last one follows
    the addition; saved by the ReLU and the next conv or pool), the max-pool's output and its
    int64 indices, and the pooled 2048 features (saved by the fc layer).
    ``tests/test_presets.py`` checks this count against the tensors torch really saves. An
    estimate of live activations: cuDNN workspaces and temporaries are left out.
    """
    elements = 3 * image_size * image_size + 64 * _pooled_side(image_size) ** 2 + 2048
    for layer in resnet50_layers(image_size):
        if layer.kind == "conv":
            relu = 0 if layer.name.endswith("downsample.0") else 1
            elements += (1 + relu) * layer.c_out * layer.side ** 2
    return float(4 * elements + resnet50_maxpool_index_bytes(image_size))


@dataclass(frozen=True)
class TransformerShape:
    """A transformer preset's shape, from its published config: sequence length s (the
    context), hidden size h, heads a, layers L, vocabulary, MLP width and key/value width (h,
    or fewer with grouped-query attention)."""

    family: str  # "bert", "gpt2" or "llama": which tensors a layer holds
    seq_len: int
    hidden: int
    heads: int
    layers: int
    vocab: int
    mlp: int
    kv_dim: int


# From the Hugging Face configs that MODELS' sources name (bert-base-uncased, gpt2, gpt2-xl,
# meta-llama/Llama-2-{7b,13b,70b}-hf); BERT's sequence is its 512 positions.
TRANSFORMER_SHAPES = {
    "BERT-base": TransformerShape("bert", 512, 768, 12, 12, 30_522, 3072, 768),
    "GPT-2 small": TransformerShape("gpt2", 1024, 768, 12, 12, 50_257, 3072, 768),
    "GPT-2 XL": TransformerShape("gpt2", 1024, 1600, 25, 48, 50_257, 6400, 1600),
    "Llama-2 7B": TransformerShape("llama", 4096, 4096, 32, 32, 32_000, 11_008, 4096),
    "Llama-2 13B": TransformerShape("llama", 4096, 5120, 40, 40, 32_000, 13_824, 5120),
    # 64 query heads, 8 key-value heads of 128: kv_dim 1024
    "Llama-2 70B": TransformerShape("llama", 4096, 8192, 64, 80, 32_000, 28_672, 1024),
}


def transformer_parameter_counts(name: str) -> list[int]:
    """Elements of each parameter tensor of a transformer preset, in registration order.

    - BERT (Hugging Face ``BertModel``): embeddings (word, position, token type, LayerNorm), per
      layer query, key, value, attention.output.dense, LayerNorm, intermediate.dense,
      output.dense, LayerNorm (each weight then bias), pooler.dense;
    - GPT-2 (``GPT2LMHeadModel``): wte, wpe, per block ln_1, attn.c_attn, attn.c_proj, ln_2,
      mlp.c_fc, mlp.c_proj (weights and biases), ln_f; lm_head is tied to wte;
    - Llama (``LlamaForCausalLM``): embed_tokens, per layer q, k, v, o projections (no bias),
      gate, up, down, input_layernorm, post_attention_layernorm; norm; untied lm_head.
    """
    s = TRANSFORMER_SHAPES[name]
    h, v, f = s.hidden, s.vocab, s.mlp
    if s.family == "bert":
        layer = [h * h, h] * 4 + [h, h, h * f, f, f * h, h, h, h]
        return [v * h, s.seq_len * h, 2 * h, h, h] + layer * s.layers + [h * h, h]
    if s.family == "gpt2":
        block = [h, h, h * 3 * h, 3 * h, h * h, h, h, h, h * f, f, f * h, h]
        return [v * h, s.seq_len * h] + block * s.layers + [h, h]
    layer = [h * h, h * s.kv_dim, h * s.kv_dim, h * h, h * f, h * f, f * h, h, h]
    return [v * h] + layer * s.layers + [h, v * h]


def _logits(name: str) -> int:
    """Logits per sample of a language-model head: sequence length x vocabulary."""
    s = TRANSFORMER_SHAPES[name]
    return s.seq_len * s.vocab


def _transformer_activations(name: str) -> float:
    s = TRANSFORMER_SHAPES[name]
    return transformer_activation_bytes_per_sample(s.seq_len, s.hidden, s.heads, s.layers)


# --- models ---------------------------------------------------------------------------------

MODELS: dict[str, ModelPreset] = {
    "ResNet-50": ModelPreset(
        name="ResNet-50",
        parameters=25_557_032,
        source="exact count 25,557,032 from torchvision's docs (ResNet50_Weights.IMAGENET1K_V1,"
        " num_params), recounted from the architecture (dataparallel_traffic.resnet50_counts)"
        " and from a torch module in the tests; He et al. 2016 print no parameter count (their "
        "Table 1 gives 3.8 x 10^9 FLOPs)",
        kind="vision",
        output_elements_per_sample=1000,  # ImageNet-1k logits
        activation_bytes_per_sample=resnet50_activation_bytes_per_sample(224),
        default_batch_size=256,  # Goyal et al. 2017: 32 images per GPU on 8 GPUs
    ),
    "BERT-base": ModelPreset(
        name="BERT-base",
        parameters=109_482_240,
        source="exact count (encoder + pooler) counted from the published Hugging Face config "
        "of bert-base-uncased: vocab 30522, 512 positions, d 768, 12 layers, FFN 3072 (the "
        "BERT paper, Devlin et al. 2019, prints 110M)",
        kind="language",
        # masked-LM logits at every position (BertForMaskedLM); its head adds ~0.6M parameters
        output_elements_per_sample=_logits("BERT-base"),
        activation_bytes_per_sample=_transformer_activations("BERT-base"),
        default_batch_size=32,
    ),
    "GPT-2 small": ModelPreset(
        name="GPT-2 small",
        parameters=124_439_808,
        source="exact count counted from the published Hugging Face config 'gpt2' (vocab "
        "50257, 1024 positions, d 768, 12 layers, LM head tied to the token embedding; the "
        "model card gives 124,439,808); the GPT-2 paper, Radford et al. 2019, prints 117M",
        kind="language",
        output_elements_per_sample=_logits("GPT-2 small"),
        activation_bytes_per_sample=_transformer_activations("GPT-2 small"),
        default_batch_size=8,
    ),
    "GPT-2 XL": ModelPreset(
        name="GPT-2 XL",
        parameters=1_557_611_200,
        source="exact count counted from the published Hugging Face config 'gpt2-xl' (vocab "
        "50257, 1024 positions, d 1600, 48 layers, 25 heads, tied LM head); the GPT-2 paper, "
        "Radford et al. 2019, prints 1542M",
        kind="language",
        output_elements_per_sample=_logits("GPT-2 XL"),
        activation_bytes_per_sample=_transformer_activations("GPT-2 XL"),
        default_batch_size=8,
    ),
    "Llama-2 7B": ModelPreset(
        name="Llama-2 7B",
        parameters=6_738_415_616,
        source="exact count counted from the published Hugging Face config "
        "meta-llama/Llama-2-7b-hf (vocab 32000, d 4096, 32 layers, 32 heads, MLP 11008, untied "
        "LM head); the Llama 2 paper, Touvron et al. 2023, prints 7B",
        kind="language",
        output_elements_per_sample=_logits("Llama-2 7B"),
        activation_bytes_per_sample=_transformer_activations("Llama-2 7B"),
        default_batch_size=8,
    ),
    "Llama-2 13B": ModelPreset(
        name="Llama-2 13B",
        parameters=13_015_864_320,
        source="exact count counted from the published Hugging Face config "
        "meta-llama/Llama-2-13b-hf (vocab 32000, d 5120, 40 layers, 40 heads, MLP 13824, "
        "untied LM head); the Llama 2 paper, Touvron et al. 2023, prints 13B",
        kind="language",
        output_elements_per_sample=_logits("Llama-2 13B"),
        activation_bytes_per_sample=_transformer_activations("Llama-2 13B"),
        default_batch_size=8,
    ),
    "Llama-2 70B": ModelPreset(
        name="Llama-2 70B",
        parameters=68_976_648_192,
        source="exact count counted from the published Hugging Face config "
        "meta-llama/Llama-2-70b-hf (vocab 32000, d 8192, 80 layers, 64 query / 8 key-value "
        "heads, MLP 28672, untied LM head); the Llama 2 paper, Touvron et al. 2023, prints 70B",
        kind="language",
        output_elements_per_sample=_logits("Llama-2 70B"),
        activation_bytes_per_sample=_transformer_activations("Llama-2 70B"),
        default_batch_size=8,
    ),
}


# The largest count a model here may have: 10^18 parameters, about 14,500 times Llama-2 70B.
# Far beyond any model, and its bytes (16 per parameter) stay exact in a float's range.
MAX_COUNT = 10**18


def check_parameter_count(value, name: str = "parameters") -> int:
    """``value`` as an int in [0, MAX_COUNT]; errors name ``name``."""
    count = check_int(value, name, 0)
    if count > MAX_COUNT:
        digits = len(str(count))
        raise ValueError(f"{name} must be at most 10**18, got "
                         + (f"{count:,}" if digits <= 30 else f"an integer of {digits:,} digits"))
    return count


def custom_model(parameters: int, output_elements_per_sample: int = 1000,
                 activation_bytes_per_sample: float = 0.0, name: str = "custom") -> ModelPreset:
    """A ModelPreset for any model: its parameter count, outputs and fp32 activations per sample."""
    parameters = check_parameter_count(parameters)
    outputs = check_parameter_count(output_elements_per_sample, "output_elements_per_sample")
    act = check_real(activation_bytes_per_sample, "activation_bytes_per_sample", 0.0)
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    return ModelPreset(name=name, parameters=parameters, source="user-defined", kind="custom",
                       output_elements_per_sample=outputs,
                       activation_bytes_per_sample=act, default_batch_size=1)


# --- interconnects --------------------------------------------------------------------------

_GB = 1e9  # decimal gigabyte: link speeds are quoted in powers of 10


def _pcie_x16_bytes_per_s(gigatransfers_per_s: float) -> float:
    """x16 lanes at ``gigatransfers_per_s`` GT/s, 128b/130b encoding, bytes/s per direction."""
    return gigatransfers_per_s * 1e9 * 16 * (128 / 130) / 8


INTERCONNECTS: dict[str, InterconnectPreset] = {
    "PCIe 4.0 x16": InterconnectPreset(
        name="PCIe 4.0 x16",
        bandwidth_bytes_per_s=_pcie_x16_bytes_per_s(16),  # 31.5 GB/s
        latency_s=5e-6,
        source="PCI-SIG PCIe 4.0 spec: 16 GT/s x 16 lanes = 32 GB/s raw per direction, 31.5 "
        "GB/s after 128b/130b encoding (used here); packet overhead leaves ~25-27 GB/s usable "
        "in practice. Latency: typical few-us GPU peer copy",
    ),
    "PCIe 5.0 x16": InterconnectPreset(
        name="PCIe 5.0 x16",
        bandwidth_bytes_per_s=_pcie_x16_bytes_per_s(32),  # 63.0 GB/s
        latency_s=5e-6,
        source="PCI-SIG PCIe 5.0 spec: 32 GT/s x 16 lanes = 64 GB/s raw per direction, 63.0 "
        "GB/s after 128b/130b encoding (used here); ~50-55 GB/s usable in practice. Latency: "
        "typical few-us GPU peer copy",
    ),
    "NVLink 3 (A100)": InterconnectPreset(
        name="NVLink 3 (A100)",
        bandwidth_bytes_per_s=300 * _GB,
        latency_s=3e-6,
        source="NVIDIA A100 datasheet: NVLink 600 GB/s total (both directions) = 300 GB/s per "
        "direction per GPU, nominal. Latency: typical few-us NCCL small-message figure",
    ),
    "NVLink 4 (H100)": InterconnectPreset(
        name="NVLink 4 (H100)",
        bandwidth_bytes_per_s=450 * _GB,
        latency_s=3e-6,
        source="NVIDIA H100 SXM datasheet: NVLink 900 GB/s total (both directions) = 450 GB/s "
        "per direction per GPU, nominal. Latency: typical few-us NCCL small-message figure",
    ),
    "NVLink 2 (V100)": InterconnectPreset(
        name="NVLink 2 (V100)",
        bandwidth_bytes_per_s=150 * _GB,
        latency_s=3e-6,
        source="NVIDIA Tesla V100 datasheet (SXM2): NVLink 300 GB/s total (both directions) = "
        "150 GB/s per direction per GPU, nominal. Latency: typical few-us NCCL small-message "
        "figure",
    ),
    "NVLink 4 (H200)": InterconnectPreset(
        name="NVLink 4 (H200)",
        bandwidth_bytes_per_s=450 * _GB,
        latency_s=3e-6,
        source="NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): NVLink 900 GB/s total (both "
        "directions) = 450 GB/s per direction per GPU, nominal, as H100's. Latency: typical "
        "few-us NCCL small-message figure",
    ),
    "InfiniBand HDR": InterconnectPreset(
        name="InfiniBand HDR",
        bandwidth_bytes_per_s=200e9 / 8,  # 25 GB/s
        latency_s=1.5e-6,
        source="InfiniBand Trade Association / NVIDIA ConnectX-6: HDR 200 Gb/s per port per "
        "direction = 25 GB/s, nominal. Latency: typical published ~1-2 us end to end",
    ),
    "InfiniBand NDR": InterconnectPreset(
        name="InfiniBand NDR",
        bandwidth_bytes_per_s=400e9 / 8,  # 50 GB/s
        latency_s=1.5e-6,
        source="InfiniBand Trade Association / NVIDIA ConnectX-7: NDR 400 Gb/s per port per "
        "direction = 50 GB/s, nominal. Latency: typical published ~1-2 us end to end",
    ),
    "100 GbE": InterconnectPreset(
        name="100 GbE",
        bandwidth_bytes_per_s=100e9 / 8,  # 12.5 GB/s
        latency_s=10e-6,
        source="IEEE 802.3 100 Gb Ethernet: 100 Gb/s per direction = 12.5 GB/s, nominal "
        "(TCP/IP framing takes a few % more). Latency: typical ~10 us or more over TCP",
    ),
}


# --- GPUs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPUPreset:
    """A GPU's peak dense math rates (FLOP/s, no sparsity), its memory and that memory's
    bandwidth, with sources."""

    name: str
    peak_flops: dict  # {"bf16", "fp16", "tf32", "fp32"} -> dense FLOP/s
    memory_bytes: float  # HBM capacity, bytes
    memory_bandwidth_bytes_per_s: float  # HBM bandwidth, bytes/s (the datasheet's, nominal)
    source: str


GPUS: dict[str, GPUPreset] = {
    "A100 SXM 80GB": GPUPreset(
        name="A100 SXM 80GB",
        peak_flops={"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
        memory_bytes=80e9,
        memory_bandwidth_bytes_per_s=2039e9,
        source="NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column): FP32 19.5 "
        "TFLOPS; TF32 Tensor Core 156 TFLOPS, BF16/FP16 Tensor Core 312 TFLOPS (dense; the "
        "datasheet's 312*/624* are with sparsity); 80GB HBM2e (decimal here; the device "
        "reports 81,920 MiB), GPU memory bandwidth 2,039 GB/s",
    ),
    "H100 SXM 80GB": GPUPreset(
        name="H100 SXM 80GB",
        peak_flops={"bf16": 989.5e12, "fp16": 989.5e12, "tf32": 494.5e12, "fp32": 67e12},
        memory_bytes=80e9,
        memory_bandwidth_bytes_per_s=3.35e12,
        source="NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column): FP32 67 TFLOPS; "
        "TF32 Tensor Core 989 TFLOPS*, BF16/FP16 Tensor Core 1,979 TFLOPS*, where * is with "
        "sparsity and dense is half (494.5 and 989.5 here); 80GB HBM3 (decimal here), GPU "
        "memory bandwidth 3.35 TB/s",
    ),
    "V100 SXM2 32GB": GPUPreset(
        name="V100 SXM2 32GB",
        # Volta has no bf16 and no TF32: the course's 16-bit modes run there as fp16 (with loss
        # scaling) at the fp16 tensor-core rate, and "tf32" is plain fp32 math.
        peak_flops={"bf16": 125e12, "fp16": 125e12, "tf32": 15.7e12, "fp32": 15.7e12},
        memory_bytes=32e9,
        memory_bandwidth_bytes_per_s=900e9,
        source="NVIDIA Tesla V100 datasheet (V100 SXM2 column): single precision 15.7 TFLOPS, "
        "tensor performance 125 TFLOPS (fp16 tensor cores, dense: Volta has no sparsity, no "
        "bf16 and no TF32; the 16-bit rate here is fp16's), 32 GB HBM2 (decimal here), memory "
        "bandwidth 900 GB/s",
    ),
    "H200 SXM 141GB": GPUPreset(
        name="H200 SXM 141GB",
        peak_flops={"bf16": 989.5e12, "fp16": 989.5e12, "tf32": 494.5e12, "fp32": 67e12},
        memory_bytes=141e9,
        memory_bandwidth_bytes_per_s=4.8e12,
        source="NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column): FP32 67 TFLOPS; "
        "TF32 Tensor Core 989 TFLOPS*, BF16/FP16 Tensor Core 1,979 TFLOPS*, where * is with "
        "sparsity and dense is half (494.5 and 989.5 here, as H100's); 141GB HBM3e (decimal "
        "here), GPU memory bandwidth 4.8 TB/s",
    ),
}

# --- FLOPs per step ---------------------------------------------------------------------------

# Kaplan et al. 2020, "Scaling Laws for Neural Language Models" (arXiv:2001.08361), Sec. 2.1:
# training costs C ~ 6 N FLOPs per token (forward 2N, backward 4N), N = non-embedding parameters.
TRAINING_FLOPS_PER_PARAMETER_TOKEN = 6


def resnet50_forward_macs_per_image(image_size: int = 224) -> int:
    """Multiply-accumulates of one ResNet-50 forward (convolutions and fc), counted from its shape.

    About 4.09e9 at 224 x 224: the figure torchvision's docs list as "GFLOPS 4.09" for
    ResNet50_Weights.IMAGENET1K_V1 and He et al. 2016 (Table 1) as "3.8 x 10^9 FLOPs" (both count
    multiply-adds; He et al. count the v1 layout). One MAC is two FLOPs.
    ``tests/test_presets.py`` checks the count against ``torch.utils.flop_counter``.
    """
    return sum(layer.c_in * layer.c_out * layer.kernel ** 2 * layer.side ** 2
               for layer in resnet50_layers(image_size) if layer.kind in ("conv", "fc"))
