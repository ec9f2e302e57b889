"""A training setting, the one input of ``dpcost.evaluate``: a model's facts, hardware, knobs.

``ModelFacts`` is what the course knows of a model at one precision: its trainable tensors
(bytes, elements, dtypes, the order autograd readies their gradients), frozen parameters,
buffers, FLOPs, activations, inputs and outputs. ``dpcost.plan`` traces a real module into
one; ``preset_facts`` builds one from a preset of ``dpcost.presets`` (ResNet-50 from its layer
walk, the transformers from their configs, a bare count as many small tensors). ``Setting``
adds the GPUs, links and training knobs. Pure Python, so that the site's explorer runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from dpcost import defaults
from dpcost.core import _show, check_choice, check_int, check_real
from dpcost.dataparallel_traffic import (
    resnet50_counts,
    resnet50_parameter_bytes,
    resnet50_ready_order_bytes,
)
from dpcost.gpu_time import CONV_FLOPS_SHARE
from dpcost.memory import ATTENTIONS, OPTIMIZERS, PRECISION_MODES, activation_bytes_per_sample
from dpcost.presets import (
    GPUS,
    INTERCONNECTS,
    MODELS,
    TRANSFORMER_SHAPES,
    GPUPreset,
    InterconnectPreset,
    ModelPreset,
    transformer_parameter_counts,
)
from dpcost.step_time import resnet50_training_flops, transformer_training_flops

__all__ = ["ModelFacts", "Setting", "preset_facts", "facts_from_preset", "MAX_GPUS",
           "MAX_BATCH", "MAX_BUCKETS", "MAX_COMPUTE_S", "MAX_OUTPUTS", "MAX_ELEMENTS"]

# The bounds a Setting checks at construction, so that every figure of ``evaluate`` is a finite
# float reached in well under a second. GPUs: 4 x the 16,384 H100s of the largest published
# training run (Llama 3, Dubey et al. 2024, Sec. 3.3.1), as ``dpcost.plan`` bounds them.
MAX_GPUS = 65_536
MAX_BATCH = 2**53  # global samples: every count below it is exact in a float
# DDP buckets of a model known only by its parameter count (the explorer's custom model):
# the time model walks every bucket, so 1e12 fp32 parameters at the default 25 MiB cap
# (152,588 buckets) fit, and a cap of a few bytes (billions of buckets) is refused.
MAX_BUCKETS = 2**18
MAX_COMPUTE_S = 3600.0  # a measured forward + backward: an hour (plan's --step-ms bound)
MAX_OUTPUTS = 10**10  # output elements per sample (the explorer's bound)
MAX_ELEMENTS = 2**63 - 1  # a model's counts (parameters, outputs, ops): torch's int64 sizes
_MIB = 2**20


def _check_count(value, name: str, minimum: int, maximum: int) -> int:
    """``value`` as an int in [minimum, maximum], or an error naming ``name``."""
    number = check_int(value, name, minimum)
    if number > maximum:
        raise ValueError(f"{name} must be <= {maximum:,}, got {_show(number)}")
    return number


def _check_flag(value, name: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} "
                        f"{_show(value)}")


def _check_type(value, name: str, kind: type) -> None:
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be a {kind.__name__}, got {type(value).__name__} "
                        f"{_show(value)}")


@dataclass(frozen=True)
class ModelFacts:
    """One model at one precision, as DDP, DataParallel and the memory model see it.

    Per-tensor lists follow DDP's parameter order (trainable, shared ones once); ``None`` when
    the tensors are unknown (a bare parameter count: taken as many tensors small against the
    bucket caps). FLOPs, activations, inputs and outputs are for ``batch`` samples and scale
    with the samples a GPU runs.
    """

    name: str
    precision: str
    attention: str
    parameters: int  # trainable elements, N
    tensor_bytes: tuple | None  # gradient bytes of each trainable tensor (= its parameter bytes)
    tensor_elements: tuple | None
    tensor_dtypes: tuple | None  # "float32", "bfloat16", ...: DDP buckets each dtype apart
    ready_order: tuple | None  # indices, in the order backward readies the gradients
    frozen_elements: int
    frozen_bytes: float
    buffer_bytes: tuple  # each buffer DataParallel broadcasts and DDP syncs
    batch: int  # the samples the figures below are for
    forward_flops: float
    backward_flops: float
    activation_bytes: float  # kept for backward
    input_bytes: float
    output_elements: int
    output_bytes: float
    tokens_per_sample: int = 0  # 0 for a non-token input
    tensor_names: tuple | None = None  # DDP's parameter names, when traced
    # aten ops one forward + backward dispatches (each a kernel launch on a GPU, or a view the
    # host still pays for); about independent of the batch. 0: unknown (dpcost.gpu_time
    # estimates it from the tensors).
    ops: int = 0
    forward_ops: int = 0  # of them in forward (0: unknown)
    convolutions: int = 0  # convolution calls, forward and backward
    conv_flops_share: float = 0.0  # share of the FLOPs in convolutions (TF32 in fp32 on a GPU)
    buffers: int | None = None  # buffer tensors; None: one per entry of buffer_bytes
    source: str = ""
    notes: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        """Refuse facts no model has, each error naming the field (the figures' types are
        kept: ``dpcost.plan`` and the presets give plain ints and floats)."""
        check_choice(self.precision, "precision", tuple(PRECISION_MODES))
        check_choice(self.attention, "attention", ATTENTIONS)
        _check_count(self.batch, "batch", 1, MAX_BATCH)
        for name in ("parameters", "frozen_elements", "output_elements", "tokens_per_sample",
                     "ops", "forward_ops", "convolutions"):
            _check_count(getattr(self, name), name, 0, MAX_ELEMENTS)
        for name in ("frozen_bytes", "forward_flops", "backward_flops", "activation_bytes",
                     "input_bytes", "output_bytes"):
            check_real(getattr(self, name), name, 0.0)
        if check_real(self.conv_flops_share, "conv_flops_share", 0.0) > 1:
            raise ValueError(f"conv_flops_share must be <= 1, got {self.conv_flops_share!r}")

    @property
    def parameter_bytes(self) -> float:
        """P: every parameter's bytes, frozen ones included (what DataParallel replicates)."""
        return self.gradient_bytes + self.frozen_bytes

    @property
    def gradient_bytes(self) -> float:
        """G: the trainable parameters' gradient bytes (what DDP all-reduces)."""
        if self.tensor_bytes is not None:
            return float(sum(self.tensor_bytes))
        return float(self.parameters * PRECISION_MODES[self.precision].gradient_bytes)

    @property
    def buffer_count(self) -> int:
        """Buffer tensors (DataParallel replicates each, DDP broadcasts each)."""
        return len(self.buffer_bytes) if self.buffers is None else self.buffers

    def per(self, value: float, samples: int) -> float:
        """``value`` (for ``batch`` samples) for ``samples`` samples."""
        return value if samples == self.batch else value * samples / self.batch

    def ready_bytes(self) -> list | None:
        """Gradient bytes in the order they become ready; None when the tensors are unknown."""
        if self.tensor_bytes is None:
            return None
        order = self.ready_order if self.ready_order is not None else \
            range(len(self.tensor_bytes) - 1, -1, -1)
        return [self.tensor_bytes[i] for i in order]


@dataclass(frozen=True)
class Setting:
    """A model on hardware with the knobs of one training run.

    ``batch`` is the global batch b: each DDP rank runs ceil(b/n) samples
    (``DistributedSampler`` pads), DataParallel cuts it with ``torch.chunk``. A planner that
    thinks per GPU passes b = n x its per-GPU batch.
    """

    model: ModelFacts
    gpus: int = defaults.GPUS
    gpus_per_node: int = defaults.GPUS_PER_NODE
    batch: int = 8
    gpu: GPUPreset = GPUS[defaults.GPU]
    intra_link: InterconnectPreset = INTERCONNECTS[defaults.INTRA_LINK[defaults.GPU]]
    inter_link: InterconnectPreset = INTERCONNECTS[defaults.INTER_LINK]
    optimizer: str = defaults.OPTIMIZER
    bucket_cap_mb: float | None = None  # None: DDP's own caps, 1 MiB then 25 MiB
    find_unused_parameters: bool = False
    gradient_as_bucket_view: bool = False
    # a measured forward + backward of one GPU's batch (seconds, at ddp_samples_per_rank);
    # None: modelled from FLOPs, bytes and ops (dpcost.gpu_time)
    compute_s: float | None = None
    peer_to_peer: bool = True  # False: NCCL stages through host memory (PCIe boards without P2P)

    def __post_init__(self):
        """Check every knob at construction, each error in one line naming the field; counts
        become plain ints (numpy integers too)."""
        _check_type(self.model, "model", ModelFacts)
        n = _check_count(self.gpus, "gpus", 1, MAX_GPUS)
        g = _check_count(self.gpus_per_node, "gpus_per_node", 1, MAX_GPUS)
        if n > g and n % g:
            raise ValueError(f"gpus ({n}) must be a multiple of gpus_per_node ({g}) beyond "
                             "one node")
        object.__setattr__(self, "gpus", n)
        object.__setattr__(self, "gpus_per_node", g)
        object.__setattr__(self, "batch", _check_count(self.batch, "batch", 1, MAX_BATCH))
        _check_type(self.gpu, "gpu", GPUPreset)
        _check_type(self.intra_link, "intra_link", InterconnectPreset)
        _check_type(self.inter_link, "inter_link", InterconnectPreset)
        check_choice(self.optimizer, "optimizer", OPTIMIZERS)
        for name in ("find_unused_parameters", "gradient_as_bucket_view", "peer_to_peer"):
            _check_flag(getattr(self, name), name)
        if self.compute_s is not None:
            seconds = check_real(self.compute_s, "compute_s", 0.0, strict=True)
            if seconds > MAX_COMPUTE_S:
                raise ValueError(f"compute_s must be <= {MAX_COMPUTE_S:g} s, got {seconds!r}")
        self._check_buckets()

    def _check_buckets(self):
        """bucket_cap_mb in (0, 2**20) MiB, at least a byte; and a model known only by its
        count cut into at most MAX_BUCKETS buckets (a tensor list gives one per tensor at
        most)."""
        if self.bucket_cap_mb is None:
            cap, name = defaults.BUCKET_CAP_MB * _MIB, "model.parameters"
        else:
            mb = check_real(self.bucket_cap_mb, "bucket_cap_mb", 0.0, strict=True)
            if mb >= _MIB or int(mb * _MIB) < 1:
                raise ValueError(f"bucket_cap_mb must be at least 2**-20 MiB (one byte) and "
                                 f"below 2**20 MiB, got {self.bucket_cap_mb!r}")
            cap, name = int(mb * _MIB), "bucket_cap_mb"
        if self.model.tensor_bytes is None and self.model.gradient_bytes / cap > MAX_BUCKETS:
            raise ValueError(f"{name}: {self.model.gradient_bytes:.3g} gradient bytes in "
                             f"buckets of {cap:,} B would make more than {MAX_BUCKETS:,} "
                             "buckets")

    @property
    def precision(self) -> str:
        return self.model.precision

    @property
    def attention(self) -> str:
        return self.model.attention

    @property
    def nodes(self) -> int:
        return max(1, self.gpus // self.gpus_per_node)


# --- presets as model facts ----------------------------------------------------------------


def _preset_tensors(model: ModelPreset):
    """(elements per tensor in registration order, elements in ready order) of a preset, or
    (None, None) for a bare count."""
    if model.parameter_elements is not None:  # a module traced by dpcost.plan
        order = model.ready_order
        elements = tuple(model.parameter_elements)
        ready = tuple(elements[i] for i in order) if order is not None else elements[::-1]
        return elements, ready
    preset = MODELS.get(model.name)
    if preset is None or preset.parameters != model.parameters:
        return None, None
    if model.name == "ResNet-50":
        elements = tuple(size for _, size in resnet50_parameter_bytes(dtype_bytes=1))
        return elements, tuple(resnet50_ready_order_bytes(dtype_bytes=1))
    if model.name in TRANSFORMER_SHAPES:
        # autograd delivers gradients in about reverse registration order
        elements = tuple(transformer_parameter_counts(model.name))
        return elements, elements[::-1]
    return None, None


def _preset_flops(model: ModelPreset) -> float:
    """Forward and backward FLOPs of one sample: 6 N T for the transformers (Kaplan et al.
    2020), 3 x 2 x 4.09e9 for a ResNet-50 image, a traced module's count, or 6 N (a network that
    uses each weight once per sample) for a bare count."""
    if model.training_flops_per_sample is not None:
        return model.training_flops_per_sample
    shape = TRANSFORMER_SHAPES.get(model.name)
    known = MODELS.get(model.name)
    if shape is not None and known is not None and known.parameters == model.parameters:
        return transformer_training_flops(model.parameters, shape.seq_len)
    if model.name == "ResNet-50" and known is not None and known.parameters == model.parameters:
        return resnet50_training_flops(1)
    return transformer_training_flops(model.parameters, 1)


def _input_bytes(model: ModelPreset, precision: str) -> float:
    """One sample's input: int64 token ids for the transformers, a 3 x 224 x 224 image at the
    parameters' width for ResNet-50, 0 (unknown) otherwise."""
    shape = TRANSFORMER_SHAPES.get(model.name)
    if shape is not None:
        return 8.0 * shape.seq_len
    if model.name == "ResNet-50":
        return 3 * 224 * 224 * PRECISION_MODES[precision].parameter_bytes
    return 0.0


def _buffer_bytes(model: ModelPreset, precision: str) -> tuple:
    """ResNet-50's BatchNorm running statistics (parameters' width) and counters (int64)."""
    if model.name != "ResNet-50":
        return ()
    counts = resnet50_counts()
    floats = counts["buffer_elements"] - counts["batchnorm_layers"]
    return (floats * PRECISION_MODES[precision].parameter_bytes
            + 8.0 * counts["batchnorm_layers"],)


def _indices_in_order(elements: tuple, ready: tuple) -> tuple:
    """Indices into ``elements`` that list them as ``ready`` does (equal sizes in turn)."""
    slots: dict = {}
    for i, e in enumerate(elements):
        slots.setdefault(e, []).append(i)
    return tuple(slots[e].pop(0) for e in ready)


@lru_cache(maxsize=256)
def facts_from_preset(model: ModelPreset, precision: str = defaults.PRECISION,
                      attention: str = defaults.ATTENTION) -> ModelFacts:
    """The facts of a ``ModelPreset`` (a preset, a custom count or a traced module's) at
    ``precision`` and ``attention``, for one sample."""
    mode = PRECISION_MODES[precision]
    g = mode.gradient_bytes
    elements, ready = _preset_tensors(model)
    order = None if elements is None else _indices_in_order(elements, ready)
    flops = _preset_flops(model)
    shape = TRANSFORMER_SHAPES.get(model.name)
    return ModelFacts(
        name=model.name, precision=precision, attention=attention,
        parameters=model.parameters,
        tensor_bytes=None if elements is None else tuple(e * g for e in elements),
        tensor_elements=elements,
        tensor_dtypes=None if elements is None else ("float32" if g == 4 else "bfloat16",)
        * len(elements),
        ready_order=order, frozen_elements=0, frozen_bytes=0.0,
        buffer_bytes=_buffer_bytes(model, precision), batch=1,
        buffers=3 * resnet50_counts()["batchnorm_layers"] if model.name == "ResNet-50"
        and elements is not None else None,
        conv_flops_share=CONV_FLOPS_SHARE.get(model.name, 0.0) if elements is not None
        else 0.0,
        forward_flops=flops / 3, backward_flops=2 * flops / 3,
        activation_bytes=activation_bytes_per_sample(model, precision, attention),
        input_bytes=_input_bytes(model, precision),
        output_elements=model.output_elements_per_sample,
        output_bytes=float(model.output_elements_per_sample * mode.activation_bytes),
        tokens_per_sample=shape.seq_len if shape is not None else 0, source=model.source)


def preset_facts(name: str, precision: str = defaults.PRECISION,
                 attention: str = defaults.ATTENTION, outputs: int | None = None) -> ModelFacts:
    """The facts of the preset ``name`` (``dpcost.presets.MODELS``), optionally with another
    count of output elements per sample."""
    from dataclasses import replace

    check_choice(name, "name", MODELS)
    check_choice(precision, "precision", tuple(PRECISION_MODES))
    check_choice(attention, "attention", ATTENTIONS)
    model = MODELS[name]
    if outputs is not None:
        outputs = _check_count(outputs, "outputs", 1, MAX_OUTPUTS)
        model = replace(model, output_elements_per_sample=outputs)
    return facts_from_preset(model, precision, attention)
