"""The five core formulas: DP against DDP in bytes moved and GPU0 memory.

Symbols (used across the course): n = ``num_gpus``, P = ``model_size_bytes``.
Pure Python on purpose: ``import dpcost`` must stay light, so numpy scalars are
recognised through the ``numbers`` ABCs that numpy registers with, not by importing numpy.
"""

from __future__ import annotations

import math
import numbers

__all__ = [
    "dp_communication_volume",
    "ddp_communication_volume",
    "dp_gpu0_memory_multiplier",
    "ddp_gpu0_memory_multiplier",
    "communication_reduction_factor",
    "check_num_gpus",
    "check_model_size_bytes",
]


def _is_bool(value) -> bool:
    # numpy.bool_ is not an Integral, but name it so the error says "bool", not "type".
    return isinstance(value, bool) or type(value).__name__ in ("bool_", "bool")


def check_num_gpus(num_gpus) -> int:
    """Return ``num_gpus`` as a Python int; TypeError unless it is an int or a numpy integer."""
    if _is_bool(num_gpus) or not isinstance(num_gpus, numbers.Integral):
        raise TypeError(
            f"num_gpus must be an integer (int or numpy integer), got {type(num_gpus).__name__}"
            f" {num_gpus!r}"
        )
    return int(num_gpus)


def check_model_size_bytes(model_size_bytes) -> int | float:
    """Return ``model_size_bytes`` as a Python int or float, checked to be finite and >= 0.

    Accepts int, float and numpy integer or floating scalars; raises TypeError for anything
    else (bool, str such as "1GB", None, ...) and ValueError for negative, NaN or infinite.
    """
    value = model_size_bytes
    is_numpy_real = type(value).__module__ == "numpy" and isinstance(value, numbers.Real)
    if _is_bool(value) or not (
        isinstance(value, numbers.Integral) or isinstance(value, float) or is_numpy_real
    ):
        hint = " (parse strings with dpcost.units.parse_size)" if isinstance(value, str) else ""
        raise TypeError(
            "model_size_bytes must be a number of bytes (int, float or numpy number), got "
            f"{type(value).__name__} {value!r}{hint}"
        )
    value = int(value) if isinstance(value, numbers.Integral) else float(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"model_size_bytes must be finite, got {value!r}")
    if value < 0:
        raise ValueError(f"model_size_bytes must be >= 0, got {value!r}")
    return value


def _as_float(exact) -> float:
    """float(exact), saturating to inf where a huge exact integer does not fit a float."""
    try:
        return float(exact)
    except OverflowError:
        return math.inf


def dp_communication_volume(model_size_bytes, num_gpus) -> float:
    """Bytes through GPU0's link per training step under DataParallel: ``2 (n - 1) P``.

    Every forward, ``replicate`` broadcasts the P parameter bytes from GPU0 to the n - 1 other
    GPUs, and every backward ``ReduceAddCoalesced`` sums their n - 1 gradient copies back onto
    GPU0, so GPU0's link carries n - 1 copies of the model each way. Returns 0.0 for n <= 1.
    Units: bytes in, bytes out (float).
    """
    size = check_model_size_bytes(model_size_bytes)
    n = check_num_gpus(num_gpus)
    if n <= 1:
        return 0.0
    try:
        return _as_float(2 * (n - 1) * size)
    except OverflowError:
        return math.inf


def ddp_communication_volume(model_size_bytes, num_gpus) -> float:
    """Bytes each rank sends per training step under DDP: ``2 (n - 1) / n * P``.

    DDP all-reduces the P gradient bytes with a ring: a reduce-scatter then an all-gather, each
    of n - 1 steps in which every rank sends one chunk of P / n bytes to its neighbour (and
    receives as many). Returns 0.0 for n <= 1. Units: bytes in, bytes out (float).
    """
    size = check_model_size_bytes(model_size_bytes)
    n = check_num_gpus(num_gpus)
    if n <= 1:
        return 0.0
    try:
        return _as_float(2 * (n - 1) / n * size)
    except OverflowError:
        return math.inf


def dp_gpu0_memory_multiplier(num_gpus) -> float:
    """GPU0's memory relative to a single-GPU share under DataParallel: ``n`` (dimensionless).

    GPU0 gathers the outputs of all n replicas (and computes the loss over them), so the
    batch-sized part of its memory is n times what each other GPU holds. Returns float(n) as
    given, for every integer n.
    """
    return _as_float(check_num_gpus(num_gpus))


def ddp_gpu0_memory_multiplier(num_gpus) -> float:
    """Rank 0's memory relative to any other rank under DDP: ``1`` (dimensionless).

    Every DDP rank holds the same replica, optimizer state and 1/n of the batch, so rank 0
    carries nothing extra. Returns 1.0 for every integer n.
    """
    check_num_gpus(num_gpus)
    return 1.0


def communication_reduction_factor(model_size_bytes, num_gpus) -> float:
    """DP volume / DDP volume: ``2 (n - 1) P / (2 (n - 1) / n * P) = n`` (dimensionless).

    P cancels, so the factor is exactly n for every model size, 0 bytes included (where the
    naive ratio would be 0 / 0). Returns 1.0 for n <= 1, where neither moves any bytes.
    """
    check_model_size_bytes(model_size_bytes)
    n = check_num_gpus(num_gpus)
    if n <= 1:
        return 1.0
    return _as_float(n)
