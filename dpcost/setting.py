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
from dpcost.dataparallel_traffic import (
    resnet50_counts,
    resnet50_parameter_bytes,
    resnet50_ready_order_bytes,
)
from dpcost.gpu_time import CONV_FLOPS_SHARE
from dpcost.memory import PRECISION_MODES, activation_bytes_per_sample
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

__all__ = ["ModelFacts", "Setting", "preset_facts", "facts_from_preset"]


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
    utilisation: float = defaults.UTILISATION
    bucket_cap_mb: float | None = None  # None: DDP's own caps, 1 MiB then 25 MiB
    find_unused_parameters: bool = False
    gradient_as_bucket_view: bool = False
    # a measured forward + backward of one GPU's batch (seconds, at ddp_samples_per_rank);
    # None: modelled from FLOPs, bytes and ops (dpcost.gpu_time)
    compute_s: float | None = None
    peer_to_peer: bool = True  # False: NCCL stages through host memory (PCIe boards without P2P)

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

    model = MODELS[name]
    if outputs is not None:
        model = replace(model, output_elements_per_sample=outputs)
    return facts_from_preset(model, precision, attention)
