"""ResNet-50 and GPT-2 built from ``torch.nn`` alone, at the presets' exact parameter counts.

Neither torchvision nor transformers is needed: ``benchmarks/gpu_memory_check.py`` runs these on
a GPU machine and on this CPU, and ``tests/test_torch_models.py`` checks that each full-size
model has exactly the parameter count of its preset in ``dpcost.presets.MODELS`` (counted on the
meta device, so nothing is allocated).

- ``resnet50``: torchvision's ResNet-50 v1.5 layout (the stride on the 3x3 conv of each stage's
  first block), He et al. 2016 with torchvision's ``torchvision/models/resnet.py: Bottleneck``;
  25,557,032 parameters.
- ``GPT2``: the GPT-2 decoder as Hugging Face's ``GPT2LMHeadModel`` lays it out (pre-LN blocks,
  fused QKV projection ``c_attn``, tanh-approximated GeLU ``gelu_new``, dropout 0.1 on the
  embeddings, attention probabilities and both residual branches, LM head tied to the token
  embedding). ``GPT2_CONFIGS`` holds the published configs 'gpt2' and 'gpt2-xl'.
  ``attention="eager"`` materialises the s x s scores and probabilities as HF's eager path does;
  ``attention="sdpa"`` calls ``F.scaled_dot_product_attention(..., is_causal=True)``, which on
  CUDA picks the flash or memory-efficient kernel and stores no s x s tensor.
- ``Llama``: Hugging Face's ``LlamaForCausalLM`` layout (RMSNorm pre-norm, rotary positions,
  grouped-query attention with the key/value heads repeated as ``repeat_kv`` does, SwiGLU MLP
  ``down(silu(gate x) * up x)``, untied LM head), at the configs of ``LLAMA_CONFIGS``.
- ``Bert``: Hugging Face's ``BertModel`` (post-LN encoder, exact GeLU, dropout 0.1, pooler),
  at 'bert-base-uncased'.
- ``PRESET_BUILDERS``: a builder and an example input for every preset of
  ``dpcost.presets.MODELS`` (what ``python -m dpcost.plan --model NAME`` builds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dpcost.presets import RESNET50_STAGES, TRANSFORMER_SHAPES

__all__ = ["Bottleneck", "resnet50", "RESNET50_STAGES", "GPT2Config", "GPT2_CONFIGS",
           "GPT2Block", "GPT2", "ATTENTIONS", "count_parameters", "LlamaConfig", "LLAMA_CONFIGS",
           "Llama", "Bert", "BERT_CONFIG", "PresetBuilder", "PRESET_BUILDERS", "small_cnn",
           "transformer_encoder", "frozen_mlp", "TiedLM", "tied_lm"]

ATTENTIONS = ("eager", "sdpa")



class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided in v1.5), 1x1 expand to 4 x width, each with batch norm."""

    def __init__(self, inplanes: int, width: int, stride: int, downsample: bool):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, 4 * width, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(4 * width)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = nn.Sequential(
            nn.Conv2d(inplanes, 4 * width, 1, stride, bias=False), nn.BatchNorm2d(4 * width)
        ) if downsample else None

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = self.downsample(x) if self.downsample is not None else x
        out += identity
        return self.relu(out)


def resnet50(num_classes: int = 1000) -> nn.Sequential:
    """ResNet-50 v1.5 for 3-channel images: 25,557,032 parameters with 1000 classes."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be an integer >= 1, got {num_classes!r}")
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
              nn.MaxPool2d(3, 2, 1)]
    inplanes = 64
    for width, blocks, stride in RESNET50_STAGES:
        for i in range(blocks):
            layers.append(Bottleneck(inplanes, width, stride if i == 0 else 1, i == 0))
            inplanes = 4 * width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, num_classes)]
    return nn.Sequential(*layers)


@dataclass(frozen=True)
class GPT2Config:
    """The fields of a Hugging Face GPT-2 config that set the shapes (and the dropout)."""

    vocab: int = 50257  # vocab_size
    positions: int = 1024  # n_positions
    hidden: int = 768  # n_embd
    layers: int = 12  # n_layer
    heads: int = 12  # n_head
    dropout: float = 0.1  # resid_pdrop = embd_pdrop = attn_pdrop
    layer_norm_eps: float = 1e-5  # layer_norm_epsilon

    def __post_init__(self):
        for name in ("vocab", "positions", "hidden", "layers", "heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")


# The published configs 'gpt2' and 'gpt2-xl' (presets.TRANSFORMER_SHAPES); both have dropouts
# 0.1 and layer_norm_epsilon 1e-5, GPT2Config's defaults.
GPT2_CONFIGS = {name: GPT2Config(vocab=s.vocab, positions=s.seq_len, hidden=s.hidden,
                                 layers=s.layers, heads=s.heads)
                for name, s in TRANSFORMER_SHAPES.items() if s.family == "gpt2"}


class GPT2Block(nn.Module):
    """One pre-LN block: x + drop(proj(attn(ln_1 x))), then x + drop(mlp(ln_2 x))."""

    def __init__(self, config: GPT2Config, attention: str = "sdpa"):
        super().__init__()
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {list(ATTENTIONS)}, got {attention!r}")
        h, self.heads, self.attention, self.p = (config.hidden, config.heads, attention,
                                                 config.dropout)
        self.ln_1 = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.c_attn = nn.Linear(h, 3 * h)
        self.c_proj = nn.Linear(h, h)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.ln_2 = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.c_fc = nn.Linear(h, 4 * h)
        self.act = nn.GELU(approximate="tanh")  # HF's "gelu_new"
        self.mlp_proj = nn.Linear(4 * h, h)
        self.mlp_dropout = nn.Dropout(config.dropout)

    def _attend(self, x, future):
        b, s, h = x.shape
        a = self.heads
        q, k, v = self.c_attn(self.ln_1(x)).view(b, s, 3, a, h // a).permute(2, 0, 3, 1, 4)
        if self.attention == "eager":
            # As HF's eager_attention_forward: the s x s scores, masked, softmax, dropout.
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(h // a))
            scores = scores.masked_fill(future, float("-inf"))
            out = self.attn_dropout(torch.softmax(scores, dim=-1)) @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                 dropout_p=self.p if self.training else 0.0)
        return self.resid_dropout(self.c_proj(out.transpose(1, 2).reshape(b, s, h)))

    def forward(self, x, future=None):
        """``future``: the (s, s) bool mask of the positions each query must not see (eager)."""
        x = x + self._attend(x, future)
        return x + self.mlp_dropout(self.mlp_proj(self.act(self.c_fc(self.ln_2(x)))))


class GPT2(nn.Module):
    """GPT-2 language model: token ids (b, s) -> logits (b, s, vocab), LM head tied to ``wte``."""

    def __init__(self, config: GPT2Config, attention: str = "sdpa"):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab, config.hidden)
        self.wpe = nn.Embedding(config.positions, config.hidden)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList(GPT2Block(config, attention) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.hidden, eps=config.layer_norm_eps)
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self):
        # As HF's GPT2PreTrainedModel._init_weights (initializer_range 0.02): N(0, 0.02) weights,
        # zero biases, the residual projections N(0, 0.02 / sqrt(2 L)) (GPT-2 paper, Sec. 2.3).
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, 0.02)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)
        for block in self.h:
            for proj in (block.c_proj, block.mlp_proj):
                nn.init.normal_(proj.weight, 0.0, 0.02 / math.sqrt(2 * self.config.layers))

    def forward(self, idx):
        b, s = idx.shape
        if s > self.config.positions:
            raise ValueError(f"sequence length {s} exceeds positions {self.config.positions}")
        pos = torch.arange(s, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        future = None
        if any(block.attention == "eager" for block in self.h):
            # One (s, s) bool mask shared by every layer (masked_fill saves it for backward).
            future = torch.ones(s, s, dtype=torch.bool, device=idx.device).triu(1)
        for block in self.h:
            x = block(x, future)
        return F.linear(self.ln_f(x), self.wte.weight)  # the tied LM head: no extra parameter


def count_parameters(module: nn.Module) -> int:
    """Number of parameter elements, each shared parameter once (``Module.parameters`` dedups)."""
    return sum(p.numel() for p in module.parameters())


@dataclass(frozen=True)
class LlamaConfig:
    """The fields of a Hugging Face Llama config that set the shapes."""

    vocab: int = 32_000  # vocab_size
    hidden: int = 4096  # hidden_size
    layers: int = 32  # num_hidden_layers
    heads: int = 32  # num_attention_heads
    kv_heads: int = 32  # num_key_value_heads
    mlp: int = 11_008  # intermediate_size
    positions: int = 4096  # max_position_embeddings
    rms_eps: float = 1e-5  # rms_norm_eps
    rope_theta: float = 10_000.0


# meta-llama/Llama-2-{7b,13b,70b}-hf (presets.TRANSFORMER_SHAPES).
LLAMA_CONFIGS = {name: LlamaConfig(vocab=s.vocab, hidden=s.hidden, layers=s.layers,
                                   heads=s.heads, kv_heads=s.kv_dim // (s.hidden // s.heads),
                                   mlp=s.mlp, positions=s.seq_len)
                 for name, s in TRANSFORMER_SHAPES.items() if s.family == "llama"}


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaBlock(nn.Module):
    """x + o(attn(rms x)), then x + down(silu(gate(rms x)) * up(rms x)); registration order as
    HF's ``LlamaDecoderLayer``: q, k, v, o, gate, up, down, the two norms."""

    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.heads, c.kv_heads, c.hidden // c.heads
        kv = c.kv_heads * self.head_dim
        self.q_proj = nn.Linear(c.hidden, c.hidden, bias=False)
        self.k_proj = nn.Linear(c.hidden, kv, bias=False)
        self.v_proj = nn.Linear(c.hidden, kv, bias=False)
        self.o_proj = nn.Linear(c.hidden, c.hidden, bias=False)
        self.gate_proj = nn.Linear(c.hidden, c.mlp, bias=False)
        self.up_proj = nn.Linear(c.hidden, c.mlp, bias=False)
        self.down_proj = nn.Linear(c.mlp, c.hidden, bias=False)
        self.input_layernorm = nn.RMSNorm(c.hidden, eps=c.rms_eps)
        self.post_attention_layernorm = nn.RMSNorm(c.hidden, eps=c.rms_eps)

    def forward(self, x, cos, sin):
        b, s, h = x.shape
        y = self.input_layernorm(x)
        q = self.q_proj(y).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(y).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(y).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        groups = self.heads // self.kv_heads  # HF's repeat_kv
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(out.transpose(1, 2).reshape(b, s, h))
        y = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


class Llama(nn.Module):
    """Llama 2 language model: token ids (b, s) -> logits (b, s, vocab), untied LM head."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab, config.hidden)
        self.layers = nn.ModuleList(LlamaBlock(config) for _ in range(config.layers))
        self.norm = nn.RMSNorm(config.hidden, eps=config.rms_eps)
        self.lm_head = nn.Linear(config.hidden, config.vocab, bias=False)

    def forward(self, idx):
        b, s = idx.shape
        if s > self.config.positions:
            raise ValueError(f"sequence length {s} exceeds positions {self.config.positions}")
        x = self.embed_tokens(idx)
        d = self.config.hidden // self.config.heads
        inv_freq = 1.0 / self.config.rope_theta ** (
            torch.arange(0, d, 2, device=idx.device, dtype=torch.float32) / d)
        angles = torch.outer(torch.arange(s, device=idx.device, dtype=torch.float32), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


# bert-base-uncased (presets.TRANSFORMER_SHAPES["BERT-base"]): vocab 30522, 512 positions.
BERT_CONFIG = TRANSFORMER_SHAPES["BERT-base"]


class BertLayer(nn.Module):
    """Post-LN encoder layer in HF ``BertLayer``'s registration order."""

    def __init__(self, h: int, heads: int, mlp: int, p: float = 0.1):
        super().__init__()
        self.heads, self.p = heads, p
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.attention_output = nn.Linear(h, h)
        self.attention_norm = nn.LayerNorm(h, eps=1e-12)
        self.intermediate = nn.Linear(h, mlp)
        self.output = nn.Linear(mlp, h)
        self.output_norm = nn.LayerNorm(h, eps=1e-12)
        self.dropout = nn.Dropout(p)

    def forward(self, x):
        b, s, h = x.shape

        def split(t):
            return t.view(b, s, self.heads, h // self.heads).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            split(self.query(x)), split(self.key(x)), split(self.value(x)),
            dropout_p=self.p if self.training else 0.0)
        x = self.attention_norm(x + self.dropout(self.attention_output(
            out.transpose(1, 2).reshape(b, s, h))))
        return self.output_norm(x + self.dropout(self.output(F.gelu(self.intermediate(x)))))


class Bert(nn.Module):
    """BERT encoder with pooler: token ids (b, s) -> (b, s, h) states and the (b, h) pooled
    output, returned concatenated as (b, s + 1, h) so that one tensor leaves the module."""

    def __init__(self, shape=BERT_CONFIG):
        super().__init__()
        h = shape.hidden
        self.word_embeddings = nn.Embedding(shape.vocab, h)
        self.position_embeddings = nn.Embedding(shape.seq_len, h)
        self.token_type_embeddings = nn.Embedding(2, h)
        self.embeddings_norm = nn.LayerNorm(h, eps=1e-12)
        self.drop = nn.Dropout(0.1)
        self.layer = nn.ModuleList(BertLayer(h, shape.heads, shape.mlp)
                                   for _ in range(shape.layers))
        self.pooler = nn.Linear(h, h)

    def forward(self, idx):
        s = idx.shape[1]
        pos = torch.arange(s, device=idx.device)
        x = self.word_embeddings(idx) + self.position_embeddings(pos) \
            + self.token_type_embeddings(torch.zeros_like(idx))
        x = self.drop(self.embeddings_norm(x))
        for layer in self.layer:
            x = layer(x)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return torch.cat((x, pooled[:, None]), dim=1)


@dataclass(frozen=True)
class PresetBuilder:
    """How to build a preset's module and its input: ``build()`` -> nn.Module; the input is
    ``(batch, *sample_shape)`` float (``tokens`` False) or integer tokens below ``vocab``."""

    build: object
    sample_shape: tuple
    tokens: bool
    vocab: int = 0


PRESET_BUILDERS = {
    "ResNet-50": PresetBuilder(resnet50, (3, 224, 224), tokens=False),
    "BERT-base": PresetBuilder(Bert, (BERT_CONFIG.seq_len,), tokens=True,
                               vocab=BERT_CONFIG.vocab),
    **{name: PresetBuilder(lambda c=c: GPT2(c), (c.positions,), tokens=True, vocab=c.vocab)
       for name, c in GPT2_CONFIGS.items()},
    **{name: PresetBuilder(lambda c=c: Llama(c), (c.positions,), tokens=True, vocab=c.vocab)
       for name, c in LLAMA_CONFIGS.items()},
}


# --- small modules a reader might bring (lesson 10, and the bucket checks on real DDP) --------


def small_cnn(num_classes: int = 10) -> nn.Sequential:
    """A CIFAR-sized CNN: three conv + batch-norm stages and a linear head (input 3 x 32 x 32)."""
    def stage(c_in, c_out):
        return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
                nn.ReLU(), nn.MaxPool2d(2)]
    return nn.Sequential(*stage(3, 32), *stage(32, 64), *stage(64, 128), nn.Flatten(),
                         nn.Linear(128 * 4 * 4, 256), nn.ReLU(), nn.Linear(256, num_classes))


def transformer_encoder(d_model: int = 256, layers: int = 4) -> nn.TransformerEncoder:
    """``torch.nn.TransformerEncoder`` of ``layers`` layers (8 heads, MLP 4 d, batch first):
    input (batch, sequence, d_model)."""
    layer = nn.TransformerEncoderLayer(d_model, 8, 4 * d_model, batch_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


def frozen_mlp(width: int = 512) -> nn.Sequential:
    """Three Linear layers with the first one frozen (``requires_grad=False``): DDP leaves its
    parameters out of every bucket. Input (batch, width)."""
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                          nn.Linear(width, 10))
    model[0].requires_grad_(False)
    return model


class TiedLM(nn.Module):
    """A tiny language model whose output layer reuses the embedding (tied weights): the
    embedding's gradient is complete, and ready, only when backward reaches the input."""

    def __init__(self, vocab: int = 1000, hidden: int = 128):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(),
                                 nn.Linear(4 * hidden, hidden))
        self.norm = nn.LayerNorm(hidden)

    def forward(self, idx):
        x = self.embed(idx)
        return F.linear(self.norm(x + self.mlp(x)), self.embed.weight)


def tied_lm() -> TiedLM:
    """``TiedLM()``: input token ids (batch, sequence) below 1000."""
    return TiedLM()
