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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dpcost.presets import RESNET50_STAGES, TRANSFORMER_SHAPES

__all__ = ["Bottleneck", "resnet50", "RESNET50_STAGES", "GPT2Config", "GPT2_CONFIGS",
           "GPT2Block", "GPT2", "ATTENTIONS", "count_parameters"]

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
