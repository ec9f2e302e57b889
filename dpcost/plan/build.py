"""Build the module a plan is for, and its example input: a preset name or a user's spec.

``--model`` is either a preset of ``dpcost.presets.MODELS`` (built by
``dpcost.torch_models.PRESET_BUILDERS``) or ``package.module:callable``, called with no
arguments. Importing that module and calling the callable RUN THE USER'S CODE.

The module is built on PyTorch's meta device (``with torch.device("meta"):``): every tensor has
a shape and a dtype and no storage, so a 70B-parameter model costs no memory. A callable that
cannot run on meta is built on the CPU instead, when its parameters fit in MemAvailable; the
plan then says so (``BuiltModule.device``).
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from dataclasses import dataclass

from dpcost.presets import MODELS

__all__ = ["PlanError", "BuiltModule", "build_module", "example_input", "parse_input_shape",
           "mem_available_bytes", "time_limit", "MAX_GPUS", "MAX_SIZE", "MAX_ELEMENTS"]

from dpcost.setting import MAX_GPUS  # noqa: E402 (the evaluator's bound, one definition)

# One dimension of an input, and all of its elements: torch indexes sizes with int64, and a
# per-GPU batch of 2**40 elements (4 TB in fp32) is far beyond any GPU.
MAX_SIZE = 2**31 - 1
MAX_ELEMENTS = 2**40


class PlanError(ValueError):
    """Bad input to a plan: ``parameter`` names the option (``--model``), the text says why."""

    def __init__(self, parameter: str, message: str):
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter


@dataclass
class BuiltModule:
    """The module, where it was built ("meta" or "cpu", and why), and the preset it is, if any."""

    module: object
    name: str
    device: str
    note: str
    preset: str | None


class _OutOfTime(BaseException):
    """Raised in the main thread by time_limit's alarm: a BaseException, so that the user's
    ``except Exception`` cannot swallow it."""


@contextmanager
def time_limit(seconds, what: str):
    """Stop the body after ``seconds`` (None: no limit) with a PlanError naming ``--timeout``
    and ``what``. A SIGALRM timer, so the main thread only (elsewhere no limit); code that
    blocks in C without returning to Python is stopped when it returns."""
    import math
    import signal
    import threading

    if seconds is None:
        yield
        return
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
            or not math.isfinite(seconds) or not 0 < seconds <= 86_400:
        raise PlanError("--timeout", f"must be a number of seconds > 0 and at most 86400, got "
                        f"{seconds!r}")
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def alarm(signum, frame):
        raise _OutOfTime

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _OutOfTime:
        raise PlanError("--timeout", f"{what} took longer than {seconds:g} s to import, build "
                        "and trace; stopped") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}"[:300] if text else type(error).__name__


def _resolve(spec: str):
    """The callable that builds the module, its display name and preset name (or None)."""
    from dpcost.torch_models import PRESET_BUILDERS

    if spec in PRESET_BUILDERS:
        return PRESET_BUILDERS[spec].build, spec, spec
    if ":" not in spec:
        raise PlanError("--model", f"{spec!r} is neither a preset ({', '.join(MODELS)}) nor "
                        "package.module:callable")
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise PlanError("--model", f"{spec!r} must be package.module:callable")
    try:
        module = importlib.import_module(module_name)
    except SystemExit as error:  # sys.exit at import is a failure, whatever its code
        raise PlanError("--model", f"importing {module_name!r} called sys.exit({error.code!r})"
                        ) from None
    except Exception as error:  # noqa: BLE001 - the user's import: named, one line
        raise PlanError("--model", f"cannot import {module_name!r}: {_one_line(error)}") from None
    target = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise PlanError("--model", f"module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise PlanError("--model", f"{spec} is not callable")
    return target, spec, None


def mem_available_bytes() -> int:
    """MemAvailable from /proc/meminfo, in bytes (0 where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _check_module(module, spec):
    import torch

    if not isinstance(module, torch.nn.Module):
        raise PlanError("--model", f"{spec} returned {type(module).__name__}, not an nn.Module")
    if not any(p.requires_grad for p in module.parameters()):
        raise PlanError("--model", f"{spec} has no trainable parameters: DDP has nothing to "
                        "all-reduce")
    return module


def build_module(spec: str) -> BuiltModule:
    """Build ``spec`` on meta, else on the CPU when it fits in MemAvailable; PlanError else."""
    import torch

    if not isinstance(spec, str) or not spec.strip():
        raise PlanError("--model", f"give a preset name or package.module:callable, got {spec!r}")
    build, name, preset = _resolve(spec.strip())
    registered = []  # the meta tensors the build registered before it failed, if it does
    hooks = [torch.nn.modules.module.register_module_parameter_registration_hook(
                 lambda module, name, t: registered.append(t)),
             torch.nn.modules.module.register_module_buffer_registration_hook(
                 lambda module, name, t: registered.append(t))]
    try:
        with torch.device("meta"):
            module = build()
        if isinstance(module, torch.nn.Module) and any(
                not t.is_meta for t in (*module.parameters(), *module.buffers())):
            raise RuntimeError("the callable put tensors on a device of its own")
        return BuiltModule(_check_module(module, spec), name, "meta",
                           "built on the meta device (no memory allocated)", preset)
    except PlanError:
        raise
    except SystemExit as error:
        raise PlanError("--model", f"{spec} called sys.exit({error.code!r})") from None
    except Exception as error:  # noqa: BLE001 - the user's code; retried on the CPU
        meta_error = _one_line(error)
    finally:
        for hook in hooks:
            hook.remove()
    # Before building on the CPU: what the meta attempt registered must fit, 4 times over
    # (parameters, gradients and Adam's two moments).
    seen = {id(t): t for t in registered if t is not None}
    _check_fits(spec, meta_error, sum(t.numel() * t.element_size() for t in seen.values()))
    try:
        module = build()
    except SystemExit as error:
        raise PlanError("--model", f"{spec} called sys.exit({error.code!r})") from None
    except Exception as error:  # noqa: BLE001 - the user's code: named, one line
        raise PlanError("--model", f"{spec} raised {_one_line(error)}") from None
    module = _check_module(module, spec)
    _check_fits(spec, meta_error, sum(t.numel() * t.element_size()
                                      for t in (*module.parameters(), *module.buffers())))
    return BuiltModule(module, name, "cpu",
                       f"built on the CPU: it cannot be built on meta ({meta_error})", preset)


def _check_fits(spec, meta_error, need):
    available = mem_available_bytes()
    if available and 4 * need > available:  # parameters, gradients and Adam's two moments
        raise PlanError("--model", f"{spec} cannot be built on meta ({meta_error}) and its "
                        f"training state ({4 * need:,} B) does not fit in MemAvailable "
                        f"({available:,} B)")


def parse_input_shape(text) -> tuple[int, ...]:
    """"4,3,224,224" -> (4, 3, 224, 224): the whole per-GPU batch, batch first, each >= 1."""
    if not isinstance(text, str) or not text.strip():
        raise PlanError("--input-shape", f"give comma-separated sizes such as 4,3,224,224, got "
                        f"{text!r}")
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise PlanError("--input-shape", f"{text!r} must be comma-separated integers such as "
                        "4,3,224,224") from None
    return _checked_shape(shape)


def elements_of(shape) -> int:
    import math

    return math.prod(shape)


def _checked_shape(shape) -> tuple[int, ...]:
    """``shape`` if every size is in [1, MAX_SIZE] and they hold at most MAX_ELEMENTS."""
    if not shape or any(size < 1 for size in shape):
        raise PlanError("--input-shape", f"every size must be >= 1 (the batch first), got "
                        f"{shape}")
    if any(size > MAX_SIZE for size in shape):
        raise PlanError("--input-shape", f"every size must be at most 2**31 - 1, got one of "
                        f"{max(len(str(s)) for s in shape)} digits")
    elements = elements_of(shape)
    if elements > MAX_ELEMENTS:
        raise PlanError("--input-shape", f"the per-GPU input must hold at most 2**40 elements, "
                        f"got {elements:.3g}")
    return shape


def positive_count(parameter, value, limit=None):
    """``value`` if it is an int >= 1 (and at most ``limit``); PlanError naming ``parameter``
    (an option) otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        shown = repr(value) if not isinstance(value, int) or abs(value) < 10**30 \
            else f"an integer of {len(str(value)):,} digits"
        raise PlanError(parameter, f"must be an integer >= 1, got {shown}")
    if limit is not None and value > limit:
        shown = f"{value:,}" if value < 10**30 else f"an integer of {len(str(value)):,} digits"
        raise PlanError(parameter, f"must be at most {limit:,}, got {shown}")
    return value


def _first_embedding_rows(module) -> int:
    import torch

    for sub in module.modules():
        if isinstance(sub, torch.nn.Embedding):
            return sub.num_embeddings
    raise PlanError("--batch", "token input needs an nn.Embedding in the module to know the "
                    "vocabulary; give --input-shape for a float input instead")


def example_input(built: BuiltModule, device, dtype, input_shape=None, batch=None, seq=None):
    """The per-GPU input and its description: ``input_shape`` (float, batch first), or
    ``batch`` x ``seq`` integer tokens (zeros: below any embedding's size), or the preset's own
    input at ``batch`` samples (default 1)."""
    import torch

    from dpcost.torch_models import PRESET_BUILDERS

    if input_shape is not None and (batch is not None or seq is not None):
        raise PlanError("--input-shape", "give --input-shape or --batch/--seq, not both")
    if input_shape is not None:
        shape = parse_input_shape(input_shape) if isinstance(input_shape, str) \
            else _checked_shape(tuple(positive_count("--input-shape", s) for s in input_shape))
        need = 4 * elements_of(shape)
        if device.type == "cpu" and mem_available_bytes() and need > mem_available_bytes() / 2:
            raise PlanError("--input-shape", f"the module is on the CPU and its input of "
                            f"{need:,} B would take over half of MemAvailable")
        return (torch.zeros(shape, dtype=dtype, device=device),
                f"float input {tuple(shape)}, {str(dtype).removeprefix('torch.')}")
    if batch is not None:
        positive_count("--batch", batch, MAX_SIZE)
    if seq is not None:
        positive_count("--seq", seq, MAX_SIZE)
        _checked_shape((1 if batch is None else batch, seq))
        _first_embedding_rows(built.module)
        b = 1 if batch is None else batch
        return (torch.zeros((b, seq), dtype=torch.long, device=device),
                f"token ids ({b}, {seq}), int64")
    if built.preset is not None:
        spec = PRESET_BUILDERS[built.preset]
        b = 1 if batch is None else batch
        if spec.tokens:
            return (torch.zeros((b, *spec.sample_shape), dtype=torch.long, device=device),
                    f"token ids {(b, *spec.sample_shape)}, int64")
        return (torch.zeros((b, *spec.sample_shape), dtype=dtype, device=device),
                f"float input {(b, *spec.sample_shape)}, {str(dtype).removeprefix('torch.')}")
    raise PlanError("--input-shape", "a module of your own needs its input: --input-shape "
                    "B,... (one float input) or --batch B --seq S (tokens)")

