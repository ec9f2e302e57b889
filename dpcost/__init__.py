"""dpcost: why DistributedDataParallel beats DataParallel, in bytes and GPU0 memory.

The five core functions live in :mod:`dpcost.core` and are re-exported here. Everything
heavier (numpy, sympy, matplotlib, ipywidgets, torch) is imported only by the module that
needs it, so ``import dpcost`` stays fast.
"""

from dpcost.core import (
    communication_reduction_factor,
    ddp_communication_volume,
    ddp_gpu0_memory_multiplier,
    dp_communication_volume,
    dp_gpu0_memory_multiplier,
)

__version__ = "0.1.0"

__all__ = [
    "dp_communication_volume",
    "ddp_communication_volume",
    "dp_gpu0_memory_multiplier",
    "ddp_gpu0_memory_multiplier",
    "communication_reduction_factor",
]
