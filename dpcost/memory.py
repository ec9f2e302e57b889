"""What each GPU holds during one training step under DataParallel (DP), DDP and ZeRO/FSDP.

Symbols: n GPUs, b the global batch, N parameters, O the bytes of the whole batch's outputs.
Every figure is in bytes. Each GPU's components count the tensors held at some point of the
step (``memory_per_gpu``, ``rank_memory``); their sum is a simple upper bound. ``step_peak``
follows the step instead: what is held at the end of forward, at the start of backward, while
backward frees each layer's activations as that layer's gradients appear, and at the
optimizer step; the largest of these is the step's peak (see "The step's peak" below).

Precision modes (``PRECISION_MODES``; bytes per parameter with Adam):

============  ======  =====  ===============================  =====  =========================
mode          params  grads  optimizer state                  total  source
============  ======  =====  ===============================  =====  =========================
``fp32``      4       4      8: two fp32 moments              16     torch/optim/adam.py
``mixed``     2       2      12: fp32 master + two moments    16     ZeRO paper (Rajbhandari et
                                                                     al. 2020) Sec. 3.1
``autocast``  4       4      8: two fp32 moments              16     torch/amp/autocast_mode.py
``bf16``      2       2      4: two bf16 moments              8      torch/optim/adam.py, measured
``fp16``      2       2      4: two fp16 moments              8      as bf16 (pure fp16)
============  ======  =====  ===============================  =====  =========================

The two mixed-precision layouts:

- ``mixed`` is the ZeRO/Megatron/DeepSpeed layout: 16-bit parameters and gradients (DDP's
  buckets and all-reduce in 16 bits), and an fp32 master copy that the optimizer updates.
  Realised by DeepSpeed's bf16/fp16 optimizers (``bf16: {enabled: true}``, ``fp16``) with or
  without ZeRO stages 1-3, and by Megatron-LM's distributed optimizer.
- ``autocast`` is PyTorch's own mixed precision, ``torch.autocast`` + DDP: the parameters,
  gradients (all-reduced in fp32, twice ``mixed``'s bytes) and Adam's moments stay fp32;
  matmul and convolution outputs are bf16, while autocast's fp32 ops (``layer_norm``,
  ``softmax``, ``log_softmax``: aten/src/ATen/autocast_mode.h, the fp32 list) give fp32, so the
  loss term's log-softmax and its gradient are fp32 (``PrecisionMode.loss_bytes``). With
  ``cache_enabled=True`` (the default, torch/amp/autocast_mode.py) autocast caches the bf16
  copy of every weight it casts until the autocast region exits, and the matmuls save those
  copies for backward: ``PrecisionMode.cast_copy_bytes`` (2 B per parameter) held from the
  forward into backward (``autocast_cast_cache_bytes``). ``torch.distributed.optim.
  ZeroRedundancyOptimizer`` keeps no master copy, so ZeRO-1 under autocast shards only the
  fp32 moments: 4 + 4 + 8/n B per parameter.

Pure bf16/fp16: ``torch.optim.Adam`` creates its moments with ``torch.zeros_like(param)``
(``torch/optim/adam.py: _init_group``), so they take the parameters' dtype;
``tests/test_memory_torch.py`` measures it on a real optimizer step. SGD keeps no state;
SGD with momentum one ``momentum_buffer`` per parameter (``torch/optim/sgd.py``: ``clone`` of
the gradient, so the parameters' dtype), plus the fp32 master copy in ``mixed``.

Where DP puts things (torch/nn/parallel/):
- ``data_parallel.py: DataParallel.forward`` calls ``replicate`` every forward, so GPUs 1..n-1
  hold a copy of the parameters during the step (``replicate.py: replicate`` ->
  ``_functions.py: Broadcast``). Their gradients are computed there and held until
  ``Broadcast.backward`` -> ``ReduceAddCoalesced`` sums them onto GPU0.
- ``_functions.py: ReduceAddCoalesced.forward`` returns ``comm.reduce_add_coalesced(...)``:
  new, gradient-sized tensors on GPU0 (``comm.py: reduce_add_coalesced`` unflattens each summed
  chunk into fresh outputs). While it runs, GPU0 holds both its own replica's gradients (an
  input of the sum) and the summed result, which autograd then accumulates into ``.grad``:
  the component "DP reduce buffer", N x gradient bytes, on GPU0 only.
- the optimizer is built on the original module's parameters, so its state lives on GPU0 only.
- ``scatter_gather.py: gather`` concatenates all n replicas' outputs on the output device
  (GPU0) and the loss is computed there; ``_functions.py: Gather.backward`` scatters the output
  gradient back, 1/n of it to each GPU.
Under DDP every rank holds the same: its parameters, gradients, its own optimizer state, and
activations, outputs and loss for its b/n samples; plus "DDP bucket copy": with the default
``gradient_as_bucket_view=False`` the reducer copies the gradients into flat all-reduce buckets,
a second gradient-sized buffer (``torch/nn/parallel/distributed.py``, docstring of
``gradient_as_bucket_view``: True makes gradients views into the buckets and saves "the total
gradients size"). So DP's GPU0 and a DDP rank each hold the gradients twice at the peak.

The loss term is 2 x the outputs: cross-entropy saves its log-softmax output for backward
(``log_softmax`` backward uses its result) and produces the outputs' gradient, each as big as
the outputs. Activations: ``activation_bytes_per_sample`` (Korthikanti et al. 2022 for the
transformer presets, with an attention switch; the feature maps for ResNet-50).

Left out: the CUDA context (a few hundred MB per GPU), the caching allocator's fragmentation,
cuDNN/cuBLAS workspaces, the 10 MiB flat chunks ``broadcast_coalesced``/``reduce_add_coalesced``
build on the way, the input batch, buffers (BatchNorm running stats), and autocast's fp32
log-softmax (the outputs and loss terms use the activations' width).

Sharded model states (``model_state_bytes_per_rank``): ZeRO paper Sec. 5, Table 1 (Psi
parameters, K optimizer bytes per parameter, Nd ranks): baseline (2 + 2 + K) Psi; ZeRO-1
(P_os) 2 Psi + 2 Psi + K Psi / Nd; ZeRO-2 (P_os+g) 2 Psi + (2 + K) Psi / Nd; ZeRO-3
(P_os+g+p, FSDP's FULL_SHARD) (2 + 2 + K) Psi / Nd.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpcost import defaults
from dpcost.core import check_choice, check_int, check_num_gpus, check_ranks, check_real
from dpcost.presets import (
    MODELS,
    TRANSFORMER_SHAPES,
    ModelPreset,
    check_parameter_count,
    resnet50_activation_bytes_per_sample,
    resnet50_maxpool_index_bytes,
    transformer_parameter_counts,
)
from dpcost.registry import BY_KEY, MODEL_STATES

__all__ = [
    "PrecisionMode",
    "PRECISION_MODES",
    "PRECISIONS",
    "TRAINING_PRECISIONS",
    "DEFAULT_PRECISION",
    "OPTIMIZERS",
    "ATTENTIONS",
    "STRATEGIES",
    "COMPONENTS",
    "MODEL_STATE_COMPONENTS",
    "model_state_bytes_per_parameter",
    "SHARDED_COMPONENTS",
    "shard_model_states",
    "transformer_layer_activation_parts",
    "transformer_layer_activation_bytes",
    "resnet50_activation_bytes",
    "activation_bytes_per_sample",
    "memory_per_gpu",
    "gpu0_memory_ratio",
    "total_bytes",
    "ddp_bucket_buffer_bytes",
    "dp_reduce_buffer_bytes",
    "model_state_bytes_per_rank",
    "rank_memory",
    "PHASES",
    "StepPeak",
    "step_peak",
    "rank_step_peak",
    "optimizer_temporary_bytes",
    "autocast_cast_cache_bytes",
    "even_layers",
    "transformer_backward_layers",
    "fits",
    "fit_verdicts",
    "format_precision_table",
    "format_memory_table",
]


@dataclass(frozen=True)
class PrecisionMode:
    """Bytes per element of each tensor kind under one precision mode, with the source."""

    name: str
    parameter_bytes: int  # the model's parameters (what forward reads)
    gradient_bytes: int  # their gradients (what DDP all-reduces)
    master_bytes: int  # an fp32 master copy the optimizer updates (mixed precision only)
    state_bytes: int  # each optimizer moment / momentum buffer
    activation_bytes: int  # each saved activation element; dropout masks are 1 byte in any mode
    description: str
    source: str
    # each element of the loss's log-softmax and the outputs' gradient it makes; None: the
    # activations' width (autocast runs log_softmax in fp32: 4)
    loss_bytes: int | None = None
    # bytes per parameter of the 16-bit weight copies held from forward into backward
    # (autocast's cast cache, 2); 0 where the parameters are already what the matmuls read
    cast_copy_bytes: int = 0

    @property
    def loss_element_bytes(self) -> int:
        """Bytes of each element of the loss term (log-softmax output and gradients)."""
        return self.activation_bytes if self.loss_bytes is None else self.loss_bytes


PRECISION_MODES: dict[str, PrecisionMode] = {
    "fp32": PrecisionMode(
        "fp32", 4, 4, 0, 4, 4, "fp32 parameters, gradients, optimizer state and activations",
        "torch/optim/adam.py: _init_group (exp_avg, exp_avg_sq = zeros_like(param))"),
    "mixed": PrecisionMode(
        "mixed", 2, 2, 4, 4, 2,
        "bf16/fp16 parameters, gradients (all-reduced in 16 bits) and activations; fp32 master "
        "weights and moments (DeepSpeed's bf16/fp16 optimizer, with or without ZeRO; "
        "Megatron-LM's distributed optimizer)",
        "ZeRO paper (Rajbhandari et al. 2020, arXiv:1910.02054) Sec. 3.1: 2 + 2 + K with "
        "K = 12 for Adam (fp32 parameters, momentum, variance)"),
    "autocast": PrecisionMode(
        "autocast", 4, 4, 0, 4, 2,
        "torch.autocast + DDP: fp32 parameters, gradients (all-reduced in fp32) and moments; "
        "bf16 matmul/conv outputs, fp32 log-softmax, a bf16 copy of each weight cached during "
        "forward (ZeroRedundancyOptimizer keeps no master copy: ZeRO-1 shards the fp32 "
        "moments only)",
        "torch/amp/autocast_mode.py: autocast (cache_enabled); aten/src/ATen/autocast_mode.h: "
        "AT_FORALL_LOWER_PRECISION_FP (linear, matmul, conv -> bf16), AT_FORALL_FP32 "
        "(layer_norm, softmax, log_softmax, nll_loss -> fp32); torch/optim/adam.py: "
        "_init_group (zeros_like(param): fp32 moments)",
        loss_bytes=4, cast_copy_bytes=2),
    "bf16": PrecisionMode(
        "bf16", 2, 2, 0, 2, 2, "pure bf16: parameters, gradients, optimizer state, activations",
        "torch/optim/adam.py: _init_group, zeros_like(param) keeps bf16; measured in "
        "tests/test_memory_torch.py"),
    "fp16": PrecisionMode(
        "fp16", 2, 2, 0, 2, 2, "pure fp16 (as bf16; rarely trained this way: no loss scaling)",
        "torch/optim/adam.py: _init_group, zeros_like(param) keeps fp16"),
}
PRECISIONS = tuple(PRECISION_MODES)
# What the course trains in and offers as a choice (the explorer's control, the planner's
# --precision): pure fp16 stays for dtype lookups only, since it trains without loss scaling;
# "autocast" joins once the explorer and the planner show its layout (issue 37 Sec. 4).
TRAINING_PRECISIONS = ("fp32", "mixed", "bf16")
# The course's default precision and attention (dpcost.defaults): mixed precision, the large
# models' layout (ZeRO paper Sec. 3.1), and SDPA. What the course measures on a CPU (gloo,
# fp32, eager or SDPA as the module runs) asks for its precision by name.
DEFAULT_PRECISION = defaults.PRECISION

# Moments per parameter: SGD none, momentum one buffer, Adam two (exp_avg, exp_avg_sq).
_MOMENTS = {"sgd": 0, "sgd_momentum": 1, "adam": 2}
OPTIMIZERS = tuple(_MOMENTS)
ATTENTIONS = ("eager", "sdpa")
STRATEGIES = ("ddp", "zero1", "zero2", "zero3")

COMPONENTS = ("parameters", "gradients", "optimizer state", "DDP bucket copy",
              "DP reduce buffer", "activations", "outputs", "loss and output grads")
MODEL_STATE_COMPONENTS = MODEL_STATES
# What each strategy divides among the n ranks (ZeRO paper Sec. 5: P_os, P_os+g, P_os+g+p):
# the strategy registry's entries.
SHARDED_COMPONENTS = {key: BY_KEY[key].sharded for key in STRATEGIES}


# --- input checks ---------------------------------------------------------------------------


def _check_model(model) -> ModelPreset:
    if not isinstance(model, ModelPreset):
        raise TypeError("model must be a dpcost.presets.ModelPreset (see MODELS or "
                        f"custom_model), got {type(model).__name__}")
    return model


def _precision(precision) -> str:
    return check_choice(precision, "precision", PRECISION_MODES)


# --- model states ---------------------------------------------------------------------------


def model_state_bytes_per_parameter(precision: str = DEFAULT_PRECISION,
                                    optimizer: str = "adam") -> dict[str, int]:
    """Bytes per parameter of the model states: {"parameters", "gradients", "optimizer state"}.

    optimizer state = master + moments x state bytes, moments 0 (SGD), 1 (momentum), 2 (Adam):
    fp32 4 + 4 + 8 = 16 B with Adam, 4 + 4 + 4 with momentum, 4 + 4 + 0 with SGD; mixed
    2 + 2 + 12 (Adam), 2 + 2 + 8 (momentum), 2 + 2 + 4 (SGD: the master copy); bf16/fp16
    2 + 2 + 4 (Adam), 2 + 2 + 2 (momentum), 2 + 2 + 0 (SGD).
    """
    mode = PRECISION_MODES[check_choice(precision, "precision", PRECISION_MODES)]
    moments = _MOMENTS[check_choice(optimizer, "optimizer", _MOMENTS)]
    return {"parameters": mode.parameter_bytes, "gradients": mode.gradient_bytes,
            "optimizer state": mode.master_bytes + moments * mode.state_bytes}


def shard_model_states(per_parameter: dict, parameters: float, num_ranks: int,
                       strategy: str) -> dict[str, float]:
    """Model-state bytes per rank by component: ``per_parameter[c] x parameters``, divided by
    n = ``num_ranks`` for the components ``strategy`` shards (``SHARDED_COMPONENTS``).

    The ZeRO rule alone, for callers that have checked their inputs (``strategies`` takes a
    real parameter count and its own p, g, K): ``model_state_bytes_per_rank`` checks them.
    """
    sharded = SHARDED_COMPONENTS[strategy]
    return {c: per_parameter[c] * parameters / (num_ranks if c in sharded else 1)
            for c in MODEL_STATE_COMPONENTS}


def model_state_bytes_per_rank(parameters: int, num_ranks: int, strategy: str = "ddp",
                               precision: str = DEFAULT_PRECISION,
                               optimizer: str = "adam") -> dict[str, float]:
    """Model-state bytes per rank under DDP or ZeRO stage 1/2/3, by component.

    ZeRO paper (Rajbhandari et al. 2020) Sec. 5 and Table 1, with p, g, k the bytes per
    parameter of ``model_state_bytes_per_parameter`` (2, 2, 12 in ``mixed`` with Adam) and
    N = ``parameters``, n = ``num_ranks``:

    - ``ddp``: p N + g N + k N (the baseline, every rank the same);
    - ``zero1`` (P_os; ``torch.distributed.optim.ZeroRedundancyOptimizer``): optimizer state /n;
    - ``zero2`` (P_os+g; FSDP's SHARD_GRAD_OP): gradients /n too;
    - ``zero3`` (P_os+g+p; FSDP's FULL_SHARD, ``fully_shard``): parameters /n too.

    Smooth in N/n, as the paper: real implementations pad each shard to a multiple of n
    elements (at most n-1 more). Left out: the all-gathered parameters of the unit being
    computed (ZeRO-3/FSDP, transient), communication buffers and DDP's bucket copy
    (``ddp_bucket_buffer_bytes``), which ZeRO-1 with DDP still holds.
    """
    n_params = check_parameter_count(parameters)
    n = check_int(num_ranks, "num_ranks", 1)
    check_choice(strategy, "strategy", STRATEGIES)
    per = model_state_bytes_per_parameter(precision, optimizer)
    return shard_model_states(per, n_params, n, strategy)


# --- activations ----------------------------------------------------------------------------


def transformer_layer_activation_parts(seq_len: int, hidden: int, heads: int, batch: int = 1,
                                       precision: str = DEFAULT_PRECISION,
                                       attention: str = defaults.ATTENTION) -> dict[str, float]:
    """Bytes one transformer layer keeps for backward, in three parts.

    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
    (arXiv:2205.05198) Sec. 4.1: s b h (34 + 5 a s / h) bytes per layer with 16-bit activations.
    Split by what each term is (s sequence, b batch, h hidden, a heads):

    - 2-byte elements, 16 s b h + 2 a s^2 b of them: layer-norm inputs (2 x sbh), the QKV
      input (sbh), Q and K (2 sbh), V (sbh), the output projection's input (sbh), the MLP's
      input (sbh), the GeLU input and output (2 x 4 sbh); softmax output and its dropout's
      output (2 a s^2 b);
    - 1-byte dropout masks, 2 s b h + a s^2 b: after the attention projection and after the
      MLP, and on the attention probabilities. 2 x 16 + 2 = 34, 2 x 2 + 1 = 5.

    So ``elements`` = (16 sbh + 2 a s^2 b) x w, with w the mode's activation bytes (4 in fp32:
    66 sbh + 9 a s^2 b in all), and ``dropout masks`` = 2 sbh + a s^2 b bytes in any mode (CUDA's
    fused dropout, ``native_dropout``, keeps bool masks). ``attention="sdpa"``
    (``F.scaled_dot_product_attention`` with the flash or memory-efficient kernel) stores no
    s x s tensor: the a s^2 b terms drop out, the attention mask is regenerated from the RNG
    state (FlashAttention, Dao et al. 2022, Sec. 3.1), and the kernel saves instead its output
    (the projection's input, already counted) and the softmax ``logsumexp``: a s b fp32 values,
    the part ``softmax stats`` (0 for eager). Left out: the layer norms' mean and rstd (4 s b
    values per layer), which tests/test_memory_torch.py measures on top.
    """
    s = check_int(seq_len, "seq_len", 1)
    h = check_int(hidden, "hidden", 1)
    a = check_int(heads, "heads", 1)
    b = check_int(batch, "batch", 1)
    w = PRECISION_MODES[check_choice(precision, "precision", PRECISION_MODES)].activation_bytes
    eager = check_choice(attention, "attention", ATTENTIONS) == "eager"
    sbh, as2b = s * b * h, a * s * s * b
    return {
        "elements": float((16 * sbh + (2 * as2b if eager else 0)) * w),
        "dropout masks": float(2 * sbh + (as2b if eager else 0)),
        "softmax stats": 0.0 if eager else float(4 * a * s * b),
    }


def transformer_layer_activation_bytes(seq_len: int, hidden: int, heads: int, batch: int = 1,
                                       precision: str = DEFAULT_PRECISION,
                                       attention: str = defaults.ATTENTION) -> float:
    """Sum of ``transformer_layer_activation_parts``: bytes per layer kept for backward.

    mixed/bf16 eager: s b h (34 + 5 a s / h); fp32 eager: s b h (66 + 9 a s / h); sdpa:
    34 s b h + 4 a s b (16-bit) or 66 s b h + 4 a s b (fp32).
    """
    return float(sum(transformer_layer_activation_parts(seq_len, hidden, heads, batch,
                                                        precision, attention).values()))


def resnet50_activation_bytes(image_size: int = 224,
                              precision: str = DEFAULT_PRECISION) -> float:
    """ResNet-50's bytes kept for backward per image: the feature maps at the mode's width.

    ``dpcost.presets.resnet50_activation_bytes_per_sample`` counts E fp32 elements and the
    max-pool's int64 indices I (8 bytes each at any precision): here E x w + I. (Under
    ``torch.autocast`` batch norm runs in fp32; this treats every map as w bytes: an estimate.)
    """
    size = check_int(image_size, "image_size", 1)
    w = PRECISION_MODES[check_choice(precision, "precision", PRECISION_MODES)].activation_bytes
    index = resnet50_maxpool_index_bytes(size)
    elements = (resnet50_activation_bytes_per_sample(size) - index) / 4
    return float(elements * w + index)


def _shape_of(model: ModelPreset):
    """The preset's transformer shape, if ``model`` is that preset (same fp32 estimate)."""
    preset = MODELS.get(model.name)
    if preset is None or model.activation_bytes_per_sample != preset.activation_bytes_per_sample:
        return None
    return TRANSFORMER_SHAPES.get(model.name)


def activation_bytes_per_sample(model: ModelPreset, precision: str = DEFAULT_PRECISION,
                                attention: str = defaults.ATTENTION) -> float:
    """Bytes of activations one sample keeps for backward under ``precision`` and ``attention``.

    - the transformer presets (``TRANSFORMER_SHAPES``): L x ``transformer_layer_activation_bytes``
      at batch 1 (Korthikanti et al. 2022; ``attention`` eager or sdpa);
    - ResNet-50 at 224 x 224: ``resnet50_activation_bytes`` (``attention`` does not apply);
    - any other model (``custom_model``): its fp32 estimate x w / 4, as nothing says which of
      its bytes are masks or attention scores.
    """
    _check_model(model)
    check_choice(precision, "precision", PRECISION_MODES)
    check_choice(attention, "attention", ATTENTIONS)
    shape = _shape_of(model)
    if shape is not None:
        return shape.layers * transformer_layer_activation_bytes(
            shape.seq_len, shape.hidden, shape.heads, 1, precision, attention)
    resnet = MODELS["ResNet-50"]
    if model.name == resnet.name and (model.activation_bytes_per_sample
                                      == resnet.activation_bytes_per_sample):
        return resnet50_activation_bytes(224, precision)
    w = PRECISION_MODES[precision].activation_bytes
    return model.activation_bytes_per_sample * w / 4


# --- memory per GPU -------------------------------------------------------------------------


def memory_per_gpu(model: ModelPreset, num_gpus: int, batch_size: int, optimizer: str = "adam",
                   precision: str = DEFAULT_PRECISION, *, attention: str = defaults.ATTENTION,
                   gradient_as_bucket_view: bool = False) -> dict[str, dict[str, float]]:
    """Bytes held during one training step, per GPU and per component.

    Returns {"dp_gpu0": {...}, "dp_other": {...}, "ddp_rank": {...}}, each a dict component ->
    bytes with exactly the keys of ``COMPONENTS`` in that order (0.0 where a GPU holds none).
    ``precision`` is one of ``PRECISION_MODES`` (default: the course's, mixed);
    ``batch_size`` is the global batch b: DP scatters b/n samples to each GPU, each DDP rank
    holds b/n (a fraction when n does not divide b: a smooth model). With p, g, k bytes per
    parameter (``model_state_bytes_per_parameter``), A = ``activation_bytes_per_sample`` and O
    the whole batch's outputs at the activations' width w:

    ==========  ====  ====  ====  ===========  ===========  =======  =====  ==========
    GPU         par.  grad  opt.  DDP buckets  DP reduce    activ.   outp.  loss+grads
    ==========  ====  ====  ====  ===========  ===========  =======  =====  ==========
    DP GPU0     N p   N g   N k   0            N g          A b/n    O      2 O
    DP other    N p   N g   0     0            0            A b/n    O/n    O/n
    DDP rank    N p   N g   N k   N g (or 0)   0            A b/n    O/n    2 O/n
    ==========  ====  ====  ====  ===========  ===========  =======  =====  ==========

    The loss term's 2 O is at the activations' width, except under ``autocast``, whose
    log-softmax is fp32 (``PrecisionMode.loss_bytes``). These components are what the step holds
    at some point; ``step_peak`` turns them into the step's peak. DDP's bucket copy is 0 with
    ``gradient_as_bucket_view=True``. DP's other GPUs hold their
    replica's output until ``gather`` and the output gradient ``Gather.backward`` sends back;
    with n = 1 there is no other GPU and "dp_other" is all 0.0.
    """
    _check_model(model)
    n = check_ranks(num_gpus)
    b = check_int(batch_size, "batch_size", 1)
    check_choice(optimizer, "optimizer", _MOMENTS)
    mode = _precision(precision)
    check_choice(attention, "attention", ATTENTIONS)
    if not isinstance(gradient_as_bucket_view, bool):
        raise TypeError("gradient_as_bucket_view must be True or False, got "
                        f"{gradient_as_bucket_view!r}")
    per = model_state_bytes_per_parameter(mode, optimizer)
    N = model.parameters
    params, grads, optim = (float(N * per[c]) for c in MODEL_STATE_COMPONENTS)
    buckets = 0.0 if gradient_as_bucket_view else grads
    activations = activation_bytes_per_sample(model, mode, attention) * b / n
    w = PRECISION_MODES[mode].activation_bytes
    outputs = float(model.output_elements_per_sample * b * w)  # the whole batch's, O
    # 2 O: log-softmax's output and the outputs' gradient (fp32 under autocast)
    loss = 2.0 * model.output_elements_per_sample * b * PRECISION_MODES[mode].loss_element_bytes

    def gpu(p, g, s, bucket, reduce, a, o, loss):
        return dict(zip(COMPONENTS, (p, g, s, bucket, reduce, a, o, loss), strict=True))

    dp_gpu0 = gpu(params, grads, optim, 0.0, grads, activations, outputs, loss)
    if n == 1:
        dp_other = gpu(*[0.0] * len(COMPONENTS))
    else:
        dp_other = gpu(params, grads, 0.0, 0.0, 0.0, activations, outputs / n, outputs / n)
    ddp_rank = gpu(params, grads, optim, buckets, 0.0, activations, outputs / n, loss / n)
    return {"dp_gpu0": dp_gpu0, "dp_other": dp_other, "ddp_rank": ddp_rank}


def total_bytes(components: dict[str, float]) -> float:
    """Sum of one GPU's components, in bytes."""
    return float(sum(components.values()))


def gpu0_memory_ratio(model: ModelPreset, num_gpus: int, batch_size: int,
                      optimizer: str = "adam", precision: str = DEFAULT_PRECISION, *,
                      attention: str = defaults.ATTENTION,
                      gradient_as_bucket_view: bool = False) -> float:
    """total(DP GPU0) / total(DDP rank), dimensionless.

    With the default bucket copy, DP's reduce buffer and DDP's buckets are both N g, so only the
    outputs and loss terms differ (3 O on DP's GPU0 against 3 O/n on a DDP rank): with X = the
    rest, the ratio is (X + 3 O) / (X + 3 O/n), between 1 and n, near n only when the outputs
    dominate. With ``gradient_as_bucket_view=True`` the DDP rank sheds N g.
    """
    memory = memory_per_gpu(model, num_gpus, batch_size, optimizer, precision,
                            attention=attention, gradient_as_bucket_view=gradient_as_bucket_view)
    return total_bytes(memory["dp_gpu0"]) / total_bytes(memory["ddp_rank"])


def ddp_bucket_buffer_bytes(model: ModelPreset, precision: str = DEFAULT_PRECISION, *,
                            gradient_as_bucket_view: bool = False) -> float:
    """Bytes of DDP's gradient buckets per rank: N g, 0 with ``gradient_as_bucket_view=True``.

    ``torch/nn/parallel/distributed.py: DistributedDataParallel``, argument
    ``gradient_as_bucket_view`` (default False): gradients are copied into flat all-reduce
    buckets; True makes the gradients views into the buckets and saves "the total gradients
    size". The "DDP bucket copy" component of ``memory_per_gpu``.
    """
    _check_model(model)
    mode = PRECISION_MODES[_precision(precision)]
    return 0.0 if gradient_as_bucket_view else float(model.parameters * mode.gradient_bytes)


def dp_reduce_buffer_bytes(model: ModelPreset, precision: str = DEFAULT_PRECISION) -> float:
    """Bytes of DP's second gradient-sized buffer on GPU0 during ``reduce_add``: N g.

    ``_functions.py: ReduceAddCoalesced.forward`` -> ``comm.py: reduce_add_coalesced`` returns
    new summed tensors on GPU0 while GPU0's own replica gradients (one of the summands) are
    still alive. The "DP reduce buffer" component of ``memory_per_gpu``.
    """
    _check_model(model)
    return float(model.parameters * PRECISION_MODES[_precision(precision)].gradient_bytes)


def rank_memory(model: ModelPreset, num_gpus: int, batch_size: int, strategy: str = "ddp",
                optimizer: str = "adam", precision: str = DEFAULT_PRECISION, *,
                attention: str = defaults.ATTENTION,
                gradient_as_bucket_view: bool = False) -> dict[str, float]:
    """Bytes one data-parallel rank holds under ``strategy``, with ``COMPONENTS``' keys.

    Model states from ``model_state_bytes_per_rank``; activations, outputs and loss for b/n
    samples as a DDP rank's. "DDP bucket copy": N g for ``ddp`` and ``zero1``
    (``ZeroRedundancyOptimizer`` runs under DDP, whose reducer still copies the gradients, 0 with
    ``gradient_as_bucket_view=True``); 0 for ``zero2``/``zero3`` (FSDP reduce-scatters its own
    flat gradients instead). "DP reduce buffer" is 0. With ``strategy="ddp"`` this is
    ``memory_per_gpu(...)["ddp_rank"]``. Left out for FSDP: the all-gathered parameters and the
    unsharded gradients of the unit being computed (transient, one unit's worth).
    """
    _check_model(model)
    n = check_num_gpus(num_gpus)
    ddp = memory_per_gpu(model, n, batch_size, optimizer, precision, attention=attention,
                         gradient_as_bucket_view=gradient_as_bucket_view)["ddp_rank"]
    states = model_state_bytes_per_rank(model.parameters, n, strategy, precision, optimizer)
    out = {**ddp, **states}
    if strategy in ("zero2", "zero3"):
        out["DDP bucket copy"] = 0.0
    return {c: out[c] for c in COMPONENTS}


# --- the step's peak ------------------------------------------------------------------------

PHASES = ("forward end", "backward start", "backward", "backward end", "optimizer step")


@dataclass(frozen=True)
class StepPeak:
    """The most one GPU holds during a training step, and when.

    ``bytes`` = sum(``held``) + ``transient``; ``held`` has ``COMPONENTS``' keys, each the part
    of that component held at the peak; ``transient`` the temporaries then (the optimizer's
    foreach copies, a layer's backward intermediates, autocast's cast cache); ``phases`` the
    largest bytes of each of ``PHASES``.
    """

    bytes: float
    phase: str
    held: dict
    transient: float
    phases: dict


def optimizer_temporary_bytes(parameters: float, precision: str = DEFAULT_PRECISION,
                              optimizer: str = "adam", largest_tensor: float | None = None
                              ) -> float:
    """Bytes of the optimizer step's temporaries on one GPU, beyond its state and gradients.

    - Adam, foreach (the default on a GPU): ``torch/optim/adam.py: _multi_tensor_adam`` updates
      the moments in place (``_foreach_lerp_``, ``_foreach_mul_``, ``_foreach_addcmul_``) and
      makes one new state-sized list, ``exp_avg_sq_sqrt = torch._foreach_sqrt(
      device_exp_avg_sqs)``, for all the tensors of a device and dtype at once:
      ``parameters`` x the state's bytes.
    - Adam under ``mixed``: the master copy is stepped one tensor at a time (as
      ``benchmarks/gpu_memory_check.py`` does, and as an fp32 gradient must exist to step the
      fp32 master): that tensor's fp32 gradient and its ``exp_avg_sq_sqrt``, 4 + 4 B x
      ``largest_tensor`` elements (default ``parameters``: one flat buffer).
    - SGD, with or without momentum: ``torch/optim/sgd.py: _multi_tensor_sgd`` updates the
      buffers and parameters in place (``_foreach_mul_``, ``_foreach_add_``): 0 once the
      buffers exist (the first step clones the gradients into them: the state itself).

    ``parameters`` is the elements this GPU steps (its shard under ZeRO).
    """
    n = check_real(parameters, "parameters", 0.0)
    mode = PRECISION_MODES[_precision(precision)]
    check_choice(optimizer, "optimizer", _MOMENTS)
    if optimizer != "adam":
        return 0.0
    if mode.master_bytes:
        largest = n if largest_tensor is None else check_real(largest_tensor, "largest_tensor",
                                                              0.0)
        return float((mode.master_bytes + mode.state_bytes) * min(largest, n))
    return float(n * mode.state_bytes)


def autocast_cast_cache_bytes(parameters: float, precision: str = DEFAULT_PRECISION) -> float:
    """Bytes of the 16-bit weight copies held from forward into backward: parameters x
    ``PrecisionMode.cast_copy_bytes`` (2 under ``autocast``, else 0).

    ``torch/amp/autocast_mode.py``: with ``cache_enabled=True`` (the default) autocast keeps the
    bf16 cast of each leaf weight that requires grad until the autocast region exits (the end
    of forward); the linear and conv layers save the same copies for their backward, which
    frees each as that layer's backward ends. An upper bound: embeddings and norms run without
    a cast (aten/src/ATen/autocast_mode.h lists neither among the lower-precision ops).
    """
    n = check_real(parameters, "parameters", 0.0)
    return float(n * PRECISION_MODES[_precision(precision)].cast_copy_bytes)


def even_layers(activations: float, gradients: float, count: int) -> list[tuple]:
    """``count`` equal layers that split ``activations`` and ``gradients`` bytes between them:
    the ``layers`` of ``step_peak`` for a stack of identical blocks."""
    c = check_int(count, "count", 1)
    a = check_real(activations, "activations", 0.0)
    g = check_real(gradients, "gradients", 0.0)
    return [(a / c, g / c)] * c


_OUTSIDE_BLOCKS = {"gpt2": (2, 2), "llama": (1, 2), "bert": (5, 2)}


def transformer_backward_layers(model: ModelPreset, samples: float,
                                precision: str = DEFAULT_PRECISION,
                                attention: str = defaults.ATTENTION,
                                gradient_share: float = 1.0) -> tuple[list[tuple], float]:
    """``step_peak``'s layers and per-layer transient for a transformer preset.

    Returns (layers, transient): L equal layers, each with its activations
    (``transformer_layer_activation_bytes`` x ``samples``) and its parameters' gradients
    (``dpcost.presets.transformer_parameter_counts``: one block's tensors, x the mode's
    gradient bytes x ``gradient_share``, e.g. 1/n where gradients are sharded). The embeddings,
    final norm and LM head are left to ``step_peak``'s rest: their gradients counted from the
    start of backward (the LM head's comes first), the rest of the activations to its end.
    The transient: the largest pair of tensors a layer's backward holds at once beyond what it
    saved, the gradient flowing into an op and the one it makes: the MLP's two s b f tensors,
    or under eager attention the s x s probabilities' and scores' gradients (2 a s^2 b), at the
    activations' width. (None, 0.0) for a model without ``TRANSFORMER_SHAPES``.
    """
    _check_model(model)
    shape = _shape_of(model)
    if shape is None:
        return None, 0.0
    b = check_real(samples, "samples", 0.0)
    mode = PRECISION_MODES[_precision(precision)]
    eager = check_choice(attention, "attention", ATTENTIONS) == "eager"
    share = check_real(gradient_share, "gradient_share", 0.0)
    counts = transformer_parameter_counts(model.name)
    # tensors before the blocks (GPT-2: wte, wpe; Llama: embed_tokens; BERT: 5 embeddings')
    # and after them (GPT-2: ln_f's two; Llama: norm, lm_head; BERT: the pooler's two)
    first, last = _OUTSIDE_BLOCKS[shape.family]
    per_block = (len(counts) - first - last) // shape.layers
    block_elements = sum(counts[first:first + per_block])
    layer_activations = b * transformer_layer_activation_bytes(
        shape.seq_len, shape.hidden, shape.heads, 1, mode.name, attention)
    layers = even_layers(layer_activations * shape.layers,
                         block_elements * mode.gradient_bytes * share * shape.layers,
                         shape.layers)
    s, w = shape.seq_len, mode.activation_bytes
    transient = 2 * s * b * shape.mlp * w
    if eager:
        transient = max(transient, 2 * shape.heads * s * s * b * w)
    return layers, float(transient)


def step_peak(components: dict, *, layers=None, layer_transient: float = 0.0,
              optimizer_temporaries: float = 0.0, cast_cache: float = 0.0) -> StepPeak:
    """The peak of one training step from what a GPU holds (``memory_per_gpu``'s or
    ``rank_memory``'s components), following the step instead of summing it.

    With R = parameters + optimizer state + DDP bucket copy (held throughout: the bucket copy
    from DDP's construction, ``torch/nn/parallel/distributed.py``, ``gradient_as_bucket_view``),
    A activations, G gradients, O outputs, 2 O the loss term and D DP's reduce buffer:

    - forward end: R + A + O + O: the outputs (logits) and log-softmax's output, which
      ``cross_entropy`` saves (``log_softmax``'s backward reads its result). Gradients are
      absent: ``zero_grad(set_to_none=True)`` (the default) freed them after the last step.
    - backward start: R + A + O + 2 O: ``nll_loss``'s backward makes the log-probabilities'
      gradient (O) while log-softmax's saved output (O) is alive, and ``_log_softmax_backward
      _data`` makes the outputs' gradient (O), counted where the outputs were: the logits
      themselves are freed once the loss holds what backward needs (``loss = loss_fn(model(x),
      y)``, or ``del logits``). Then the three are freed.
    - backward: layer by layer from the last, layer k's backward holds the activations of
      layers 1..k, the gradients of layers k..L, those of the rest (from the start: an LM
      head's come first) and ``layer_transient`` (the gradients flowing through the layer);
      activations fall and gradients rise, so the largest is at one end for equal layers.
      ``layers``: (activation bytes, gradient bytes) per layer in forward order, e.g.
      ``even_layers`` or ``transformer_backward_layers``; what they leave of A is held to the
      end of backward (saved by the stem or the head) and what they leave of G is counted from
      its start. ``None``: one layer holding everything (A + G at once: the upper bound).
    - backward end: R + G + D (+ the rest of A): DataParallel's ``ReduceAddCoalesced`` makes
      GPU0's summed gradients (D) while its replica's (G) are alive.
    - optimizer step: R + G + ``optimizer_temporaries`` (``optimizer_temporary_bytes``).

    ``cast_cache`` (``autocast_cast_cache_bytes``) is held from the end of forward to the end
    of backward (an upper bound: each layer's copy goes with its backward). The peak is the
    largest phase; a tie goes to the earlier one.
    """
    if not isinstance(components, dict) or set(components) != set(COMPONENTS):
        raise ValueError(f"components must be a dict with the keys {list(COMPONENTS)}, got "
                         f"{components!r:.200}")
    c = {k: check_real(components[k], f"components[{k!r}]", 0.0) for k in COMPONENTS}
    layer_transient = check_real(layer_transient, "layer_transient", 0.0)
    optimizer_temporaries = check_real(optimizer_temporaries, "optimizer_temporaries", 0.0)
    cast_cache = check_real(cast_cache, "cast_cache", 0.0)
    A, G = c["activations"], c["gradients"]
    if layers is None:
        layers = [(A, G)]
    try:
        layers = [(float(a), float(g)) for a, g in layers]
    except (TypeError, ValueError):
        raise ValueError("layers must be (activation bytes, gradient bytes) pairs, got "
                         f"{layers!r:.200}") from None
    if not layers or any(not (math.isfinite(a) and math.isfinite(g)) or a < 0 or g < 0
                         for a, g in layers):
        raise ValueError(f"layers must be finite non-negative pairs, got {layers!r:.200}")
    slack = 1e-9 * max(A, G, 1.0)
    if sum(a for a, _ in layers) > A + slack or sum(g for _, g in layers) > G + slack:
        raise ValueError("layers hold more than components' activations or gradients")
    rest_a = max(A - sum(a for a, _ in layers), 0.0)
    rest_g = max(G - sum(g for _, g in layers), 0.0)

    resident = {k: c[k] for k in ("parameters", "optimizer state", "DDP bucket copy")}
    none = dict.fromkeys(COMPONENTS, 0.0)

    def point(transient, **held):
        held = {**none, **resident, **held}
        return held, transient

    points = {  # phase -> candidates (held components, transient bytes)
        "forward end": [point(cast_cache, activations=A, outputs=c["outputs"],
                              **{"loss and output grads": c["loss and output grads"] / 2})],
        "backward start": [point(cast_cache, activations=A, outputs=c["outputs"],
                                 **{"loss and output grads": c["loss and output grads"]})],
        "backward": [],
        "backward end": [point(0.0, gradients=G, activations=rest_a,
                               **{"DP reduce buffer": c["DP reduce buffer"]})],
        "optimizer step": [point(optimizer_temporaries, gradients=G)],
    }
    acts = [a for a, _ in layers]
    grads = [g for _, g in layers]
    for k in range(len(layers) - 1, -1, -1):
        points["backward"].append(point(cast_cache + layer_transient,
                                        activations=rest_a + sum(acts[:k + 1]),
                                        gradients=rest_g + sum(grads[k:])))

    def total(candidate):
        held, transient = candidate
        return sum(held.values()) + transient

    phases = {name: max(total(p) for p in points[name]) for name in PHASES}
    phase = max(PHASES, key=lambda name: phases[name])  # the first of equal maxima
    held, transient = max(points[phase], key=total)
    return StepPeak(float(phases[phase]), phase, {k: float(held[k]) for k in COMPONENTS},
                    float(transient), {k: float(v) for k, v in phases.items()})


def rank_step_peak(model: ModelPreset, num_gpus: int, batch_size: int, strategy: str = "ddp",
                   optimizer: str = "adam", precision: str = DEFAULT_PRECISION, *,
                   attention: str = defaults.ATTENTION, gradient_as_bucket_view: bool = False,
                   largest_tensor: float | None = None) -> StepPeak:
    """``step_peak`` of one rank's ``rank_memory``, with the preset's layers where it has them
    (``transformer_backward_layers``), Adam's foreach temporaries on the rank's share of the
    state (``optimizer_temporary_bytes``) and autocast's cast cache.

    ``largest_tensor``: elements of the largest parameter (``mixed`` steps one at a time);
    default the largest of ``dpcost.presets.transformer_parameter_counts`` for a transformer
    preset, else the whole model.
    """
    parts = rank_memory(model, num_gpus, batch_size, strategy, optimizer, precision,
                        attention=attention, gradient_as_bucket_view=gradient_as_bucket_view)
    n = check_num_gpus(num_gpus)
    sharded = SHARDED_COMPONENTS[strategy]
    samples = batch_size / n
    layers, transient = transformer_backward_layers(
        model, samples, precision, attention,
        gradient_share=1 / n if "gradients" in sharded else 1.0)
    stepped = model.parameters / (n if "optimizer state" in sharded else 1)
    if largest_tensor is None and _shape_of(model) is not None:
        largest_tensor = max(transformer_parameter_counts(model.name))
    temporaries = optimizer_temporary_bytes(stepped, precision, optimizer, largest_tensor)
    cast = autocast_cast_cache_bytes(model.parameters, precision)
    return step_peak(parts, layers=layers, layer_transient=transient,
                     optimizer_temporaries=temporaries, cast_cache=cast)


# --- does it fit ----------------------------------------------------------------------------


def fits(bytes_needed: float, capacity_bytes: float) -> bool:
    """True when ``bytes_needed`` <= ``capacity_bytes`` (a GPU's memory, in bytes).

    The memory model is an upper bound on what the step holds but leaves out the CUDA context,
    workspaces and fragmentation: a "fits" within a few GB of the capacity is not a promise.
    """
    return (check_real(bytes_needed, "bytes_needed", 0.0)
            <= check_real(capacity_bytes, "capacity_bytes", 0.0))


def fit_verdicts(memory: dict[str, dict[str, float]], capacity_bytes: float) -> dict[str, bool]:
    """For each GPU of a ``memory_per_gpu`` result, whether its total fits ``capacity_bytes``.

    GPUs that hold nothing (DP's "dp_other" at n = 1) are left out.
    """
    capacity = check_real(capacity_bytes, "capacity_bytes", 0.0)
    return {gpu: fits(total_bytes(parts), capacity) for gpu, parts in memory.items()
            if total_bytes(parts) > 0}


# --- tables ---------------------------------------------------------------------------------


def format_precision_table(optimizers=OPTIMIZERS) -> str:
    """Bytes per parameter of each precision mode and optimizer, with each mode's source."""
    header = f"{'mode':<6} {'optimizer':<13}{'params':>7}{'grads':>7}{'optim':>7}{'total':>7}"
    lines = [header, "-" * len(header)]
    for mode in PRECISION_MODES.values():
        for optimizer in optimizers:
            per = model_state_bytes_per_parameter(mode.name, optimizer)
            lines.append(f"{mode.name:<6} {optimizer:<13}" + "".join(
                f"{per[c]:>7}" for c in MODEL_STATE_COMPONENTS) + f"{sum(per.values()):>7}")
    lines.append("")
    lines += [f"{mode.name}: {mode.description}. Source: {mode.source}"
              for mode in PRECISION_MODES.values()]
    return "\n".join(lines)


_SHORT_NAMES = {"parameters": "params", "gradients": "grads", "optimizer state": "optim",
                "DDP bucket copy": "buckets", "DP reduce buffer": "reduce",
                "activations": "activ.", "outputs": "outputs", "loss and output grads": "loss+og"}
_GPU_NAMES = {"dp_gpu0": "DP GPU0", "dp_other": "DP other", "ddp_rank": "DDP rank"}


def format_memory_table(model: ModelPreset, configs, optimizer: str = "adam",
                        precision: str = DEFAULT_PRECISION, unit: str = "GB", *,
                        attention: str = defaults.ATTENTION) -> str:
    """A text table of ``memory_per_gpu`` in ``unit`` ("GB" or "MB", decimal), one row per GPU
    per (n, batch) in ``configs``.

    Columns: n, global batch, GPU, the eight components, the total, and for DP's GPU0 its ratio
    to a DDP rank (``gpu0_memory_ratio``).
    """
    scales = {"GB": 1e9, "MB": 1e6}
    if unit not in scales:
        raise ValueError(f"unit must be one of {sorted(scales)}, got {unit!r}")
    mode = _precision(precision)
    scale = scales[unit]
    header = (f"{'n':>3} {'batch':>6}  {'GPU':<9}"
              + "".join(f"{_SHORT_NAMES[c]:>10}" for c in COMPONENTS) + f"{'total':>10}  ratio")
    named = f", {attention} attention" if model.kind == "language" else ""  # a CNN has none
    lines = [f"{model.name}, {mode}, {optimizer}{named}: {unit} (decimal) held "
             "per GPU during one step", header, "-" * len(header)]
    for n, batch in configs:
        memory = memory_per_gpu(model, n, batch, optimizer, mode, attention=attention)
        ratio = total_bytes(memory["dp_gpu0"]) / total_bytes(memory["ddp_rank"])
        for gpu, components in memory.items():
            cells = "".join(f"{components[c] / scale:10.3f}" for c in COMPONENTS)
            tail = f"  {ratio:.3f}x" if gpu == "dp_gpu0" else ""
            lines.append(f"{n:>3} {batch:>6}  {_GPU_NAMES[gpu]:<9}{cells}"
                         f"{total_bytes(components) / scale:10.3f}{tail}")
    return "\n".join(lines)
