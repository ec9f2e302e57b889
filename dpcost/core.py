"""The five core formulas: DP against DDP in bytes moved and GPU0 memory.

Symbols (used across the course): n = ``num_gpus``, P = ``model_size_bytes``.
Pure Python on purpose: ``import dpcost`` must stay light, so numpy scalars are
recognised through the ``numbers`` ABCs that numpy registers with, not by importing numpy.
"""

from __future__ import annotations

import math
import numbers
import re
import sys
from fractions import Fraction

__all__ = [
    "dp_communication_volume",
    "ddp_communication_volume",
    "dp_gpu0_memory_multiplier",
    "ddp_gpu0_memory_multiplier",
    "communication_reduction_factor",
    "check_num_gpus",
    "check_model_size_bytes",
    "check_real",
    "parse_whole_number",
    "parse_decimal",
]


_FLOAT_MAX = sys.float_info.max
_SHOWN_CHARS = 60  # an error message shows at most this much of a bad value's repr


def _is_bool(value) -> bool:
    return isinstance(value, bool) or type(value).__name__ in ("bool_", "bool")


def _is_numpy_time(value) -> bool:
    # numpy registers timedelta64 as an integer; a duration is no count (numpy is loaded already)
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, (numpy.timedelta64, numpy.datetime64))


def _show(value) -> str:
    """A bad value for an error message: short, and never an error itself."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        magnitude = abs(value)
        digits = int(magnitude.bit_length() * math.log10(2))  # digits - 1 or digits
        digits += magnitude >= 10**digits
        return f"{'-' if value < 0 else ''}(an integer of {digits} digits)"
    try:
        text = repr(value)
    except Exception:  # a failing __repr__ must not hide which parameter was wrong
        return f"<{type(value).__name__} object>"
    if len(text) > _SHOWN_CHARS:
        text = text[: _SHOWN_CHARS - 3] + "..."
    return text


def check_num_gpus(num_gpus) -> int:
    """Return ``num_gpus`` as a Python int; TypeError unless it is an int or a numpy integer."""
    if (_is_bool(num_gpus) or _is_numpy_time(num_gpus)
            or not isinstance(num_gpus, numbers.Integral)):
        raise TypeError(
            f"num_gpus must be an integer (int or numpy integer), got {type(num_gpus).__name__}"
            f" {_show(num_gpus)}"
        )
    return int(num_gpus)


def check_real(value, name: str, minimum: float = -math.inf, strict: bool = False) -> float:
    """``value`` as a finite float >= ``minimum`` (> if ``strict``), or an error naming ``name``."""
    kind = type(value)  # the common case first: the models check thousands of sizes a call
    if (kind is float or kind is int) and -_FLOAT_MAX <= value <= _FLOAT_MAX and (
            value > minimum or (value == minimum and not strict)):
        return float(value)
    if _is_bool(value) or _is_numpy_time(value) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {_show(value)}")
    try:
        value = float(value)
    except OverflowError:  # an exact int too large for a float
        value = math.inf
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if value < minimum or (strict and value == minimum):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {minimum:g}, got {value!r}")
    return value


def check_int(value, name: str, minimum: int) -> int:
    """``value`` (an int or numpy integer) as an int >= ``minimum``, or an error naming ``name``."""
    if _is_bool(value) or _is_numpy_time(value) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {_show(value)}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {_show(value)}")
    return int(value)


def check_choice(value, name: str, choices):
    """``value`` if it is one of ``choices``; ValueError naming ``name`` and the choices."""
    try:
        allowed = value in choices
    except TypeError:  # unhashable, for a dict or set of choices
        allowed = False
    if not allowed:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {_show(value)}")
    return value


_DIGITS = re.compile(r"[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"\+?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)
_NOT_FINITE = ("inf", "+inf", "-inf", "infinity", "+infinity", "-infinity", "nan", "+nan",
               "-nan")


def _shown_text(text: str) -> str:
    return repr(text) if len(text) <= 20 else repr(text[:20]) + "..."


def parse_whole_number(text: str, name: str, minimum: int, maximum: int) -> int:
    """A command-line count such as ``--gpus 8``: ASCII digits 0-9 only (``int()`` would take
    "８" or "8_0"), ``minimum`` to ``maximum``; ValueError naming ``name`` otherwise."""
    shown = _shown_text(text)
    if re.fullmatch(r"-[0-9]+", text, re.ASCII):
        raise ValueError(f"{name} must be at least {minimum}, got {shown}")
    if not _DIGITS.fullmatch(text):
        raise ValueError(f"{name} must be a whole number in digits 0-9, got {shown}")
    if len(text.lstrip("0")) > len(str(maximum)):  # too long for int() to be worth it
        raise ValueError(f"{name} must be at most {maximum:,}, got a number of {len(text)} "
                         f"digits")
    value = int(text.lstrip("0") or "0")  # int() refuses over 4,300 digits, zeros included
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    if value > maximum:
        raise ValueError(f"{name} must be at most {maximum:,}, got {value}")
    return value


def parse_decimal(text: str, name: str, minimum: float, scale: float = 1.0,
                  unit: str = "", minimum_why: str = "") -> float:
    """A command-line number such as ``--model-mb 2.5`` or ``4e6``: ASCII digits, at least
    ``minimum``, finite even times ``scale``; ValueError naming ``name`` otherwise."""
    shown = _shown_text(text)
    if text.strip().lower() in _NOT_FINITE:
        raise ValueError(f"{name} must be a finite number, got {shown}")
    if text.startswith("-") and _DECIMAL.fullmatch(text[1:]):
        raise ValueError(f"{name} must be at least {minimum:g}{minimum_why}, got {shown}")
    if not _DECIMAL.fullmatch(text):
        raise ValueError(f"{name} must be a number in digits 0-9 (such as 2.5 or 4e6), "
                         f"got {shown}")
    value = float(text)
    if not math.isfinite(value * scale):
        beyond = f" ({unit} beyond a float's range)" if unit else ""
        raise ValueError(f"{name} must be a finite number{beyond}, got {shown}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum:g}{minimum_why}, got {shown}")
    return value


def check_ranks(num_gpus) -> int:
    """``num_gpus`` as an int >= 1 (a model with ranks in it)."""
    n = check_num_gpus(num_gpus)
    if n < 1:
        raise ValueError(f"num_gpus must be >= 1, got {_show(num_gpus)}")
    return n


def check_model_size_bytes(model_size_bytes) -> int | float:
    """``model_size_bytes`` (an int, float or numpy number) as a finite int or float >= 0, or
    an error naming it."""
    value = model_size_bytes
    is_numpy_real = type(value).__module__ == "numpy" and isinstance(value, numbers.Real)
    if _is_bool(value) or _is_numpy_time(value) or not (
        isinstance(value, numbers.Integral) or isinstance(value, float) or is_numpy_real
    ):
        hint = " (parse strings with dpcost.units.parse_size)" if isinstance(value, str) else ""
        raise TypeError(
            "model_size_bytes must be a number of bytes (int, float or numpy number), got "
            f"{type(value).__name__} {_show(value)}{hint}"
        )
    if not isinstance(value, numbers.Integral):
        # in the value's own type: float() makes a finite numpy.longdouble inf
        if value != value or value in (math.inf, -math.inf):
            raise ValueError(f"model_size_bytes must be finite, got {_show(float(value))}")
    if value < 0:
        raise ValueError(f"model_size_bytes must be >= 0, got {_show(value)}")
    if isinstance(value, numbers.Integral):
        return int(value)
    result = float(value) + 0.0  # -0.0 becomes 0.0
    if math.isinf(result):  # finite in its own type, beyond a float's range
        raise ValueError(
            f"model_size_bytes {_show(value)} is too large for a float (out of range: the "
            f"largest float is {_FLOAT_MAX!r})"
        )
    return result


def _as_float(exact) -> float:
    """float(exact), saturated to inf with its sign beyond a float's range."""
    try:
        return float(exact)
    except OverflowError:
        return math.inf if exact > 0 else -math.inf


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
        return float(2 * (n - 1) * size)
    except OverflowError:  # n or P does not fit a float: the exact product decides
        return _as_float(2 * (n - 1) * Fraction(size))


def ddp_communication_volume(model_size_bytes, num_gpus) -> float:
    """Bytes each rank sends per training step under DDP: ``2 (n - 1) / n * P``.

    DDP all-reduces the P gradient bytes with a ring: a reduce-scatter then an all-gather, each
    of n - 1 steps in which every rank sends one chunk of P / n bytes to its neighbour (and
    receives as many). Returns 0.0 for n <= 1 and for P = 0; a product beyond float range
    gives inf. Units: bytes in, bytes out (float).
    """
    size = check_model_size_bytes(model_size_bytes)
    n = check_num_gpus(num_gpus)
    if n <= 1:
        return 0.0
    try:
        return float(2 * (n - 1) / n * size)
    except OverflowError:  # P does not fit a float: the exact product decides
        return _as_float(Fraction(2 * (n - 1), n) * Fraction(size))


def dp_gpu0_memory_multiplier(num_gpus) -> float:
    """GPU0's memory relative to a single-GPU share under DataParallel: ``n`` (dimensionless).

    GPU0 gathers the outputs of all n replicas (and computes the loss over them), so the
    batch-sized part of its memory is n times what each other GPU holds. Returns float(n) for
    every integer n, saturated to inf with n's sign beyond a float's range.
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
