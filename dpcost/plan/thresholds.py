"""When the answer changes: the batch from which DataParallel is acceptable, and the model size
from which DDP's model states no longer fit a GPU. Each threshold is computed from the models,
not asserted (lesson 10)."""

from __future__ import annotations

__all__ = ["step_ratios", "dp_acceptable_from", "ddp_state_limit_parameters"]


def step_ratios(model, batches, input_shape_of=None, **plan_kwargs) -> list[dict]:
    """For each per-GPU batch b: {"batch", "nccl", "copy"}, DataParallel's modelled step time
    over DDP's on that path (``plan``'s ``steps``). ``input_shape_of(b)`` gives the
    ``input_shape`` text for a float input; without it ``batch=b`` is passed (a preset, or
    with ``seq=`` in ``plan_kwargs`` tokens)."""
    from dpcost.plan import plan

    rows = []
    for b in batches:
        shape = {"input_shape": input_shape_of(b)} if input_shape_of else {"batch": b}
        steps = plan(model, **shape, **plan_kwargs)["steps"]
        ddp = steps["ddp"]["total_s"]
        rows.append({"batch": b, "nccl": steps["dp_nccl"]["total_s"] / ddp,
                     "copy": steps["dp_copy"]["total_s"] / ddp})
    return rows


def dp_acceptable_from(rows, tolerance: float = 0.1, path: str = "nccl"):
    """The smallest batch of ``step_ratios``' rows from which every larger one keeps
    DataParallel's step within ``tolerance`` of DDP's on ``path``; None if none does."""
    found = None
    for row in sorted(rows, key=lambda r: r["batch"], reverse=True):
        if row[path] > 1 + tolerance:
            break
        found = row["batch"]
    return found


def ddp_state_limit_parameters(capacity_bytes: float, precision: str = "mixed",
                               optimizer: str = "adam",
                               gradient_as_bucket_view: bool = False) -> int:
    """The most parameters whose DDP model states fit ``capacity_bytes``, before activations:
    capacity / (p + g + k + the bucket copy g), with p, g, k from
    ``memory.model_state_bytes_per_parameter`` (mixed Adam: 2 + 2 + 12 + 2 = 18 B)."""
    from dpcost.memory import model_state_bytes_per_parameter

    per = model_state_bytes_per_parameter(precision, optimizer)
    bytes_per_parameter = sum(per.values()) + (0 if gradient_as_bucket_view
                                               else per["gradients"])
    return int(capacity_bytes // bytes_per_parameter)
