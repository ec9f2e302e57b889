"""Which GPU holds what after a DDP migration, with and without set_device and map_location.

The rules (what PyTorch does, per rank r of n, one GPU each):

- ``torch.cuda.set_device(r)`` makes cuda:r the current device. Without it the current device
  stays 0, and whatever the rank creates on "cuda" without an index - its CUDA context first,
  ``torch.cuda.synchronize()``, a tensor made with ``device="cuda"`` - lands on GPU0 (what NCCL
  sets up may go there too; not modelled: it depends on the PyTorch and NCCL versions). The
  model itself still goes to cuda:r when the script says ``.to(f"cuda:{r}")`` and
  ``device_ids=[r]``, so rank r holds one context on GPU r AND one on GPU0.
- ``torch.load`` without ``map_location`` puts every tensor back on the device it was saved
  from (``torch/serialization.py``: ``default_restore_location`` -> ``_deserialize``, which
  checks the location with ``_validate_device(location, "cuda")`` and moves the storage
  there): a checkpoint saved by rank 0 from cuda:0 is read onto GPU0 by every rank, n copies
  at once, each opening a context there.

Sizes in bytes; the context size is an assumption you pass (it depends on the GPU, the driver
and the CUDA libraries loaded; read yours with ``nvidia-smi``), not something measured here.
"""

from __future__ import annotations

from matplotlib.figure import Figure

from dpcost.memory import model_state_bytes_per_parameter
from dpcost.plots import style
from dpcost.presets import MODELS

SETUPS = ("set_device and map_location", "no set_device", "no map_location")
ITEMS = ("CUDA context", "model states", "checkpoint read back")
ITEM_COLORS = {"CUDA context": "#7f8c8d", "model states": style.DDP_COLOR,
               "checkpoint read back": style.DP_COLOR}


def gpu_placement(num_gpus: int, setup: str, context_bytes: float, state_bytes: float,
                  checkpoint_bytes: float) -> list[dict[str, float]]:
    """Bytes on each GPU (index = GPU) while every rank reads the checkpoint back, by item.

    ``state_bytes``: one rank's model states (parameters, gradients, optimizer state);
    ``checkpoint_bytes``: what torch.load materialises (saved parameters + optimizer state).
    """
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1:
        raise ValueError(f"num_gpus must be an int >= 1, got {num_gpus!r}")
    if setup not in SETUPS:
        raise ValueError(f"setup must be one of {', '.join(map(repr, SETUPS))}; got {setup!r}")
    for name, value in (("context_bytes", context_bytes), ("state_bytes", state_bytes),
                        ("checkpoint_bytes", checkpoint_bytes)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
            raise ValueError(f"{name} must be a number of bytes >= 0, got {value!r}")
    gpus = [{item: 0.0 for item in ITEMS} for _ in range(num_gpus)]
    for rank in range(num_gpus):
        gpus[rank]["CUDA context"] += context_bytes  # the rank's own GPU, always
        gpus[rank]["model states"] += state_bytes  # .to(cuda:r), device_ids=[r]
        if setup == "no set_device" and rank != 0:
            gpus[0]["CUDA context"] += context_bytes  # current device 0: a second context
        reader = 0 if setup == "no map_location" else rank
        gpus[reader]["checkpoint read back"] += checkpoint_bytes
        if setup == "no map_location" and rank != 0:
            gpus[0]["CUDA context"] += context_bytes  # restoring onto cuda:0 opens one there
    return gpus


# ResNet-50 with Adam in fp32: model states (weights, gradients, moments) and a checkpoint's
# (weights and moments), from dpcost.presets and dpcost.memory.
_RESNET50 = MODELS["ResNet-50"].parameters
_FP32_ADAM = model_state_bytes_per_parameter("fp32", "adam")


def gpu_placement_figure(num_gpus: int = 4, context_bytes: float = 0.5e9,
                         state_bytes: float = _RESNET50 * sum(_FP32_ADAM.values()),
                         checkpoint_bytes: float = _RESNET50 * (
                             _FP32_ADAM["parameters"] + _FP32_ADAM["optimizer state"])):
    """Stacked bars in GB (decimal): what each GPU holds, one panel per set-up.

    Defaults: n = 4; an assumed 0.5 GB CUDA context; ResNet-50 (25,557,032 parameters) with
    Adam in fp32 - 16 B per parameter of model states, 12 B per parameter in the checkpoint
    (weights and the two moments). Returns (figure, {setup: gpu_placement(...)}).
    """
    style.apply()
    data = {setup: gpu_placement(num_gpus, setup, context_bytes, state_bytes, checkpoint_bytes)
            for setup in SETUPS}
    fig = Figure(figsize=(12.8, 5.6), layout="constrained")  # not pyplot's: shown once
    axes = fig.subplots(1, len(SETUPS), sharey=True)
    for ax, (setup, gpus) in zip(axes, data.items(), strict=True):
        bottoms = [0.0] * num_gpus
        for item in ITEMS:
            heights = [gpu[item] / 1e9 for gpu in gpus]
            ax.bar(range(num_gpus), heights, bottom=bottoms, color=ITEM_COLORS[item],
                   label=item, edgecolor="white")
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
        ax.set_title(setup, fontsize=13)
        ax.set_xticks(range(num_gpus), [f"GPU{g}" for g in range(num_gpus)])
        ax.set_xlabel("GPU (rank r uses GPU r)")
    axes[0].set_ylabel("memory held (GB, decimal)")
    axes[0].legend(loc="upper right")
    fig.suptitle(f"DDP on {num_gpus} GPUs while reading a checkpoint back (ResNet-50, Adam, "
                 f"fp32; {context_bytes / 1e9:g} GB context assumed)")
    return fig, data
