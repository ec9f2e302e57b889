"""Byte sizes for people: parse "1.5GB" or "512MiB", print 1.5e9 as "1.50 GB".

Decimal units (kB, MB, GB, TB) are powers of 1000; binary units (KiB, MiB, GiB, TiB) are
powers of 1024. Code works in bytes; only input and output use these units.
"""

from __future__ import annotations

import math
import re

DECIMAL_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
MIB = 2**20  # one mebibyte, the unit of DDP's bucket caps and DataParallel's chunks
BINARY_UNITS = {"KIB": 2**10, "MIB": MIB, "GIB": 2**30, "TIB": 2**40}

MAX_SIZE_TEXT = 64  # characters: "1.5GB" needs 5; a bound keeps every parse short

# One way only to match each digit, so a failing text costs time linear in its length;
# re.ASCII: ASCII white space and digits only.
_SIZE_PATTERN = re.compile(
    r"\s*((?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", re.ASCII)
_NEGATIVE = re.compile(r"\s*-\s*\.?[0-9]", re.ASCII)


def parse_size(text: str) -> float:
    """Bytes in a size such as "1.5GB", "512 MiB", "4e6" or "1000" (plain bytes).

    Unit letters are case-insensitive, except that the "i" of KiB/MiB/GiB/TiB chooses powers
    of 1024. Digits are ASCII 0-9 only, and the text is at most MAX_SIZE_TEXT (64) characters.
    Raises ValueError naming the text when it is not a finite, non-negative size.
    """
    if not isinstance(text, str):
        raise TypeError(f"size must be a string such as '1.5GB', got {type(text).__name__}")
    if len(text) > MAX_SIZE_TEXT:
        raise ValueError(
            f"size text is {len(text)} characters long; at most {MAX_SIZE_TEXT} are accepted "
            f"(starts {text[:20]!r})"
        )
    if _NEGATIVE.match(text):
        raise ValueError(f"size {text!r} has a minus sign: a size cannot be negative")
    match = _SIZE_PATTERN.fullmatch(text)
    if not match:
        raise ValueError(
            f"size {text!r} is not a number with an optional unit "
            "(B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)"
        )
    number, unit = float(match.group(1)), match.group(2).upper()
    scale = DECIMAL_UNITS.get(unit or "B") or BINARY_UNITS.get(unit)
    if scale is None:
        raise ValueError(
            f"size {text!r} has an unknown unit {match.group(2)!r} "
            "(use B, kB, MB, GB, TB, KiB, MiB, GiB or TiB)"
        )
    value = number * scale
    if not math.isfinite(value):
        raise ValueError(f"size {text!r} is not finite")
    return value


def format_bytes(num_bytes: float, binary: bool = False, digits: int = 4) -> str:
    """A byte count in the largest unit that keeps the number >= 1, to `digits` significant
    digits: 2.625e9 -> "2.625 GB", 21e9 -> "21 GB", 3 * 2**30 with binary=True -> "3 GiB"."""
    if not math.isfinite(num_bytes):
        return f"{num_bytes} B"
    base = 1024 if binary else 1000
    names = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"] if binary else [
        "B", "kB", "MB", "GB", "TB", "PB"]
    value, index = float(num_bytes), 0
    while abs(value) >= base and index < len(names) - 1:
        value /= base
        index += 1
    if index == 0:
        return f"{value:.0f} B"
    return f"{value:.{digits}g} {names[index]}"


def format_seconds(seconds: float, digits: int = 3) -> str:
    """A duration for people, to ``digits`` significant digits: 0.0123 s -> "12.3 ms".

    Units: h, min, s, ms, µs, ns; 5400 s -> "1.5 h"."""
    if not math.isfinite(seconds):
        return f"{seconds} s"
    if seconds == 0:
        return "0 s"
    for scale, unit in ((3600.0, "h"), (60.0, "min"), (1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.{digits}g} {unit}"
    return f"{seconds / 1e-9:.{digits}g} ns"
