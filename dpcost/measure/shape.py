"""The measured model's shape: a stack of ``depth`` Linear(width, width) layers in float32.

Its parameter (and gradient) bytes are P = 4 * depth * (width^2 + width). Torch-free, so the
launcher and the report can size the model without importing torch.
"""

from __future__ import annotations

import math

DEPTH = 4  # layers; enough for DDP to use more than one bucket from about 4 MB up


def model_shape(model_bytes: float, depth: int = DEPTH) -> tuple[int, int]:
    """(width, depth) of the Linear stack whose P comes closest to ``model_bytes`` bytes."""
    width = max(1, round(math.sqrt(model_bytes / (4 * depth))))
    return width, depth


def param_bytes_of(width: int, depth: int) -> int:
    """P = 4 * depth * (width^2 + width): bytes of the stack's float32 parameters."""
    return 4 * depth * (width * width + width)
