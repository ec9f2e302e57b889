"""What each GPU holds during one training step under DataParallel (DP) and DDP.

Symbols: n GPUs, b the global batch, N parameters, w bytes per element of ``dtype``,
O = b * (output elements per sample) * w the bytes of the whole batch's outputs.

Where DP puts things (torch/nn/parallel/):
- ``data_parallel.py: DataParallel.forward`` calls ``replicate`` every forward, so GPUs 1..n-1
  hold a copy of the parameters during the step (``replicate.py: replicate`` ->
  ``_functions.py: Broadcast``). Their gradients are computed there and held until
  ``Broadcast.backward`` -> ``ReduceAddCoalesced`` sums them onto GPU0's parameters.
- the optimizer is built on the original module's parameters, so its state lives on GPU0 only.
- ``scatter_gather.py: gather`` concatenates all n replicas' outputs on the output device
  (GPU0) and the loss is computed there; ``_functions.py: Gather.backward`` scatters the output
  gradient back, 1/n of it to each GPU.
Under DDP every rank holds the same: its parameters, gradients, its own optimizer state, and
activations, outputs and loss for its b/n samples.

The loss term is 2 x the outputs: cross-entropy saves its log-softmax output for backward
(``log_softmax`` backward uses its result) and produces the outputs' gradient, each as big as
the outputs. Each component counts the tensors held at some point of the step, summed: a
simple upper bound on the peak. Left out: the CUDA context (a few hundred MB per GPU), the
caching allocator's fragmentation, cuDNN/cuBLAS workspaces, temporaries (the flattened buckets
``broadcast_coalesced``/``reduce_add_coalesced`` build during ``replicate`` and backward),
the input batch, buffers (BatchNorm running stats), a mixed-precision fp32 master copy, and
DDP's gradient buckets (``ddp_bucket_buffer_bytes``: with the default
``gradient_as_bucket_view=False`` they are a second copy of the gradients).
"""

from __future__ import annotations

import numbers

from dpcost.core import check_num_gpus
from dpcost.presets import DTYPE_BYTES, ModelPreset

__all__ = [
    "OPTIMIZER_STATE_BYTES_PER_PARAM",
    "COMPONENTS",
    "memory_per_gpu",
    "gpu0_memory_ratio",
    "total_bytes",
    "ddp_bucket_buffer_bytes",
    "format_memory_table",
]

# fp32 state per parameter: SGD none, momentum one buffer, Adam two moments (exp_avg, exp_avg_sq).
OPTIMIZER_STATE_BYTES_PER_PARAM = {"sgd": 0, "sgd_momentum": 4, "adam": 8}

COMPONENTS = ("parameters", "gradients", "optimizer state", "activations", "outputs",
              "loss and output grads")


def _check_inputs(model, num_gpus, batch_size, optimizer, dtype):
    if not isinstance(model, ModelPreset):
        raise TypeError("model must be a dpcost.presets.ModelPreset (see MODELS or "
                        f"custom_model), got {type(model).__name__}")
    n = check_num_gpus(num_gpus)
    if n < 1:
        raise ValueError(f"num_gpus must be >= 1, got {n}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral):
        raise TypeError(f"batch_size must be an integer, got {type(batch_size).__name__} "
                        f"{batch_size!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
    if optimizer not in OPTIMIZER_STATE_BYTES_PER_PARAM:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_STATE_BYTES_PER_PARAM)}, "
                         f"got {optimizer!r}")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    return n, int(batch_size)


def memory_per_gpu(model: ModelPreset, num_gpus: int, batch_size: int, optimizer: str = "adam",
                   dtype: str = "fp32") -> dict[str, dict[str, float]]:
    """Bytes held during one training step, per GPU and per component.

    Returns {"dp_gpu0": {...}, "dp_other": {...}, "ddp_rank": {...}}, each an insertion-ordered
    dict component -> bytes with exactly these component keys in this order: "parameters",
    "gradients", "optimizer state", "activations", "outputs", "loss and output grads".
    (A component a GPU does not hold is present with 0.0.)

    ``batch_size`` is the global batch b: DP scatters b/n samples to each GPU, each DDP rank
    holds b/n (a fraction when n does not divide b: a smooth model). ``dtype`` sets the
    bytes w of parameters, gradients, activations (scaled from the fp32 estimate by w/4) and
    outputs; optimizer state stays fp32. With O the whole batch's output bytes:

    ============  ======  ======  ======  ==============  ======  ======
    GPU           params  grads   optim   activations     outputs loss+grads
    ============  ======  ======  ======  ==============  ======  ======
    DP GPU0       N*w     N*w     N*s     A*w/4*b/n       O       2*O
    DP other      N*w     N*w     0       A*w/4*b/n       O/n     O/n
    DDP rank      N*w     N*w     N*s     A*w/4*b/n       O/n     2*O/n
    ============  ======  ======  ======  ==============  ======  ======

    (s = OPTIMIZER_STATE_BYTES_PER_PARAM[optimizer], A = activation bytes per sample.) DP's
    other GPUs hold their replica's output until ``gather`` and the output gradient
    ``Gather.backward`` sends back; with n = 1 there is no other GPU and "dp_other" is all 0.0.
    """
    n, b = _check_inputs(model, num_gpus, batch_size, optimizer, dtype)
    w = DTYPE_BYTES[dtype]
    params = float(model.parameters * w)
    grads = float(model.parameters * w)
    optim = float(model.parameters * OPTIMIZER_STATE_BYTES_PER_PARAM[optimizer])
    activations = model.activation_bytes_per_sample * (w / 4) * b / n
    outputs = float(model.output_elements_per_sample * b * w)  # the whole batch's, O

    def gpu(p, g, s, a, o, loss):
        return dict(zip(COMPONENTS, (p, g, s, a, o, loss), strict=True))

    dp_gpu0 = gpu(params, grads, optim, activations, outputs, 2 * outputs)
    if n == 1:
        dp_other = gpu(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    else:
        dp_other = gpu(params, grads, 0.0, activations, outputs / n, outputs / n)
    ddp_rank = gpu(params, grads, optim, activations, outputs / n, 2 * outputs / n)
    return {"dp_gpu0": dp_gpu0, "dp_other": dp_other, "ddp_rank": ddp_rank}


def total_bytes(components: dict[str, float]) -> float:
    """Sum of one GPU's components, in bytes."""
    return float(sum(components.values()))


def gpu0_memory_ratio(model: ModelPreset, num_gpus: int, batch_size: int,
                      optimizer: str = "adam", dtype: str = "fp32") -> float:
    """total(DP GPU0) / total(DDP rank), dimensionless.

    Only the outputs and loss terms differ (3*O on DP's GPU0 against 3*O/n on a DDP rank), so
    with X = params + grads + optimizer state + activations the ratio is
    (X + 3*O) / (X + 3*O/n): between 1 and n, near n only when the outputs dominate.
    """
    memory = memory_per_gpu(model, num_gpus, batch_size, optimizer, dtype)
    return total_bytes(memory["dp_gpu0"]) / total_bytes(memory["ddp_rank"])


def ddp_bucket_buffer_bytes(model: ModelPreset, dtype: str = "fp32") -> float:
    """Bytes of DDP's gradient buckets per rank: N*w with ``gradient_as_bucket_view=False``.

    ``torch/nn/parallel/distributed.py: DistributedDataParallel`` (argument
    ``gradient_as_bucket_view``, default False): gradients are copied into flat all-reduce
    buckets; setting it True makes the gradients views into the buckets and saves "the total
    gradients size". Not part of ``memory_per_gpu``; add it to a DDP rank for the default.
    """
    if not isinstance(model, ModelPreset):
        raise TypeError(f"model must be a dpcost.presets.ModelPreset, got {type(model).__name__}")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    return float(model.parameters * DTYPE_BYTES[dtype])


_SHORT_NAMES = {"parameters": "params", "gradients": "grads", "optimizer state": "optim",
                "activations": "activ.", "outputs": "outputs", "loss and output grads": "loss+og"}
_GPU_NAMES = {"dp_gpu0": "DP GPU0", "dp_other": "DP other", "ddp_rank": "DDP rank"}


def format_memory_table(model: ModelPreset, configs, optimizer: str = "adam",
                        dtype: str = "fp32", unit: str = "GB") -> str:
    """A text table of ``memory_per_gpu`` in ``unit`` ("GB" or "MB", decimal), one row per GPU
    per (n, batch) in ``configs``.

    Columns: n, global batch, GPU, the six components, the total, and for DP's GPU0 its ratio
    to a DDP rank (``gpu0_memory_ratio``).
    """
    scales = {"GB": 1e9, "MB": 1e6}
    if unit not in scales:
        raise ValueError(f"unit must be one of {sorted(scales)}, got {unit!r}")
    scale = scales[unit]
    header = (f"{'n':>3} {'batch':>6}  {'GPU':<9}"
              + "".join(f"{_SHORT_NAMES[c]:>10}" for c in COMPONENTS) + f"{'total':>10}  ratio")
    lines = [f"{model.name}, {dtype}, {optimizer}: {unit} (decimal) held per GPU during one step",
             header, "-" * len(header)]
    for n, batch in configs:
        memory = memory_per_gpu(model, n, batch, optimizer, dtype)
        for gpu, components in memory.items():
            cells = "".join(f"{components[c] / scale:10.3f}" for c in COMPONENTS)
            ratio = (f"  {gpu0_memory_ratio(model, n, batch, optimizer, dtype):.3f}x"
                     if gpu == "dp_gpu0" else "")
            lines.append(f"{n:>3} {batch:>6}  {_GPU_NAMES[gpu]:<9}{cells}"
                         f"{total_bytes(components) / scale:10.3f}{ratio}")
    return "\n".join(lines)
