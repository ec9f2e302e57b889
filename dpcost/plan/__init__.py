"""Plan your own model: DDP's real buckets, DP's and DDP's bytes, step time and memory per GPU.

``plan(spec_or_module, gpus=8, ...)`` builds the module on the meta device (``build``), runs
one traced forward and backward (``trace``: FLOPs, saved bytes, gradient-ready order) and
composes the course's models for it (``costs``); ``report`` prints, serialises and draws the
result. ``python -m dpcost.plan --model SPEC`` is the command line (``__main__``).

Importing the user's module (``package.module:callable``) runs their code.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from dpcost import defaults
from dpcost.memory import PRECISION_MODES, TRAINING_PRECISIONS
from dpcost.plan.build import (
    MAX_GPUS,
    MAX_SIZE,
    PlanError,
    build_module,
    example_input,
    positive_count,
    time_limit,
)
from dpcost.plan.costs import Settings, costs, gpus_that_fit
from dpcost.setting import ModelFacts

__all__ = ["plan", "traced_facts", "PlanError", "PRECISIONS", "OPTIMIZERS", "GPU_NAMES",
           "LAYOUTS", "recommendation", "module_facts", "gpu_from_figures"]

# The course's training precisions, and PyTorch's own mixed precision (fp32 states) beside
# the ZeRO layout ("mixed") where dpcost.memory models it.
PRECISIONS = TRAINING_PRECISIONS + tuple(p for p in ("autocast",)
                                         if p in PRECISION_MODES and p not in TRAINING_PRECISIONS)
# The command line's names -> dpcost.memory's.
OPTIMIZERS = {"adam": "adam", "sgd": "sgd", "momentum": "sgd_momentum"}
# Short names for the GPU presets (dpcost.presets.GPUS).
GPU_NAMES = {"A100": "A100 SXM 80GB", "H100": "H100 SXM 80GB", "V100": "V100 SXM2 32GB",
             "H200": "H200 SXM 141GB"}
# The NVLink each board comes with, for the presets dpcost.defaults.INTRA_LINK does not name.
# What realises each precision's layout of the model states in PyTorch or DeepSpeed.
LAYOUTS = {
    "fp32": "fp32 parameters, gradients and Adam moments (plain PyTorch)",
    "mixed": "the ZeRO layout: bf16 parameters and gradients, an fp32 master copy in the "
             "optimizer (DeepSpeed's bf16 mode, \"bf16\": {\"enabled\": true}; Megatron)",
    "autocast": "PyTorch's mixed precision: fp32 parameters, gradients and all-reduce, bf16 "
                "math (torch.autocast(\"cuda\", dtype=torch.bfloat16))",
    "bf16": "pure bf16: model.to(torch.bfloat16), the optimizer's state in bf16 too",
}
# Bounds on the GPU's figures: far beyond any GPU, and every product stays a finite float.
_FIGURES = {"--gpu-tflops": (1e-3, 1e5, "TFLOP/s"), "--gpu-tflops-fp32": (1e-3, 1e5, "TFLOP/s"),
            "--gpu-memory-gb": (1e-3, 1e5, "GB"), "--gpu-bandwidth": (1e-3, 1e6, "GB/s"),
            "--step-ms": (1e-6, 3.6e6, "milliseconds")}


def _figure(parameter, value):
    """``value`` as a float in [low, high] of ``parameter``, None stays None."""
    if value is None:
        return None
    low, high, unit = _FIGURES[parameter]
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or not low <= value <= high:
        raise PlanError(parameter, f"must be a number of {unit} from {low:g} to {high:g}, got "
                        f"{value!r}")
    return float(value)


def gpu_from_figures(base, tflops=None, tflops_fp32=None, memory_gb=None, bandwidth_gbs=None):
    """``base`` (a GPUPreset) with the figures given: ``tflops`` the dense 16-bit matrix peak
    (bf16 and fp16; TF32 taken as half of it, as on A100 and H100; fp32 at ``base``'s ratio to
    16-bit unless ``tflops_fp32`` gives it), ``memory_gb`` (10^9 B), ``bandwidth_gbs`` the
    memory bandwidth (GB/s)."""
    tflops = _figure("--gpu-tflops", tflops)
    fp32 = _figure("--gpu-tflops-fp32", tflops_fp32)
    memory_gb = _figure("--gpu-memory-gb", memory_gb)
    bandwidth = _figure("--gpu-bandwidth", bandwidth_gbs)
    if tflops is None and fp32 is None and memory_gb is None and bandwidth is None:
        return base
    peak, given = dict(base.peak_flops), []
    if tflops is not None:
        ratio = base.peak_flops["fp32"] / base.peak_flops["bf16"]
        peak.update(bf16=tflops * 1e12, fp16=tflops * 1e12, tf32=tflops * 1e12 / 2,
                    fp32=tflops * 1e12 * ratio)
        given.append(f"{tflops:g} TFLOP/s 16-bit")
    if fp32 is not None:
        peak["fp32"] = fp32 * 1e12
        given.append(f"{fp32:g} TFLOP/s fp32")
    if memory_gb is not None:
        given.append(f"{memory_gb:g} GB")
    if bandwidth is not None:
        given.append(f"{bandwidth:g} GB/s")
    return replace(base, name=f"{base.name} with {', '.join(given)}", peak_flops=peak,
                   memory_bytes=base.memory_bytes if memory_gb is None else memory_gb * 1e9,
                   memory_bandwidth_bytes_per_s=base.memory_bandwidth_bytes_per_s
                   if bandwidth is None else bandwidth * 1e9,
                   source=f"given on the command line ({', '.join(given)}); the rest from "
                          f"{base.name}: {base.source}")


def _gpu(name):
    from dpcost.presets import GPUS

    if isinstance(name, str) and name in GPUS:
        return GPUS[name]
    if isinstance(name, str) and name in GPU_NAMES:
        return GPUS[GPU_NAMES[name]]
    raise PlanError("--gpu", f"must be one of {', '.join([*GPU_NAMES, *GPUS])}, got {name!r}")


def _intra_link(gpu_name: str):
    from dpcost.presets import INTERCONNECTS

    return INTERCONNECTS[defaults.INTRA_LINK[gpu_name]]


def _gpu_count(parameter, value):
    """A count of GPUs in [1, MAX_GPUS]: the plan lists a few figures per GPU."""
    n = positive_count(parameter, value)
    if n > MAX_GPUS:
        shown = f"{n:,}" if n < 10**30 else f"an integer of {len(str(n)):,} digits"
        raise PlanError(parameter, f"must be at most {MAX_GPUS:,} (4x the largest published "
                        f"training runs; the plan lists figures per GPU), got {shown}")
    return n


def _settings(gpus, gpus_per_node, gpu, precision, optimizer, bucket_cap_mb,
              find_unused_parameters, gradient_as_bucket_view, figures=(),
              step_ms=None) -> Settings:
    n = _gpu_count("--gpus", gpus)
    g = _gpu_count("--gpus-per-node", gpus_per_node)
    if n > g and n % g:
        raise PlanError("--gpus", f"{n} GPUs beyond one node must be a multiple of "
                        f"--gpus-per-node ({g})")
    if precision not in PRECISIONS:
        raise PlanError("--precision", f"must be one of {', '.join(PRECISIONS)}, got "
                        f"{precision!r}")
    if optimizer not in OPTIMIZERS:
        raise PlanError("--optimizer", f"must be one of {', '.join(OPTIMIZERS)}, got "
                        f"{optimizer!r}")
    if bucket_cap_mb is not None:
        if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) \
                or not 0 < bucket_cap_mb < 2**20 or int(bucket_cap_mb * 2**20) < 1:
            raise PlanError("--bucket-cap-mb", f"must be a number of MiB > 0 (below 2**20), "
                            f"got {bucket_cap_mb!r}")
    for name, flag in (("--find-unused-parameters", find_unused_parameters),
                       ("--gradient-as-bucket-view", gradient_as_bucket_view)):
        if not isinstance(flag, bool):
            raise PlanError(name, f"must be True or False, got {flag!r}")
    base = _gpu(gpu)
    step_ms = _figure("--step-ms", step_ms)
    return Settings(n, g, gpu_from_figures(base, *figures), precision, OPTIMIZERS[optimizer],
                    bucket_cap_mb, find_unused_parameters, gradient_as_bucket_view,
                    intra_link=_intra_link(base.name),
                    compute_s=None if step_ms is None else step_ms / 1e3)


def module_facts(module, example, name: str, notes: dict | None = None,
                 precision: str = defaults.PRECISION) -> ModelFacts:
    """Trace ``module`` on ``example`` once into the evaluator's ``ModelFacts`` (the
    tensors of ``example``'s batch, at ``precision``)."""
    from dpcost.plan.trace import ATTENTION_NOTE, DROPOUT_NOTE, ddp_parameters, trace_step

    try:
        traced = trace_step(module, example)
    except SystemExit as error:  # the user's forward called sys.exit: a failure all the same
        raise PlanError("--model", f"{name}'s forward called sys.exit({error.code!r})") from None
    except Exception as error:  # noqa: BLE001 - the user's forward: named, one line
        text = " ".join(str(error).split())[:300]
        raise PlanError("--input-shape", f"the forward rejected the input "
                        f"{tuple(example.shape)}: {type(error).__name__}: {text}") from None
    params = ddp_parameters(module)
    trainable = {id(p) for _, p in params}
    frozen = [p for p in module.parameters() if id(p) not in trainable]
    batch = example.shape[0]
    tokens = example.shape[1] if example.dim() == 2 and not example.is_floating_point() else 0
    notes = dict(notes or {})
    notes["activations"] = (
        "saved_tensors_hooks on the traced forward, deduplicated by storage, parameters "
        "excluded; " + (ATTENTION_NOTE if traced.sdpa_calls else "no SDPA call in the module")
        + "; " + DROPOUT_NOTE)
    notes["sdpa_calls"] = traced.sdpa_calls
    notes["ops"] = (f"{traced.ops:,} aten ops that are not views in the traced forward and "
                    f"backward ({traced.forward_ops:,} in forward), and {traced.views:,} views")
    notes["ready_order"] = "register_post_accumulate_grad_hook during the traced backward"
    if len(traced.ready_order) < len(params):
        notes["unused"] = (f"{len(params) - len(traced.ready_order)} trainable parameter(s) "
                           "got no gradient: DDP needs find_unused_parameters=True")
    forward, backward = float(traced.forward_flops), float(traced.backward_flops)
    if forward + backward <= 0:  # e.g. no matmul FlopCounterMode counts: 6 N per token
        from dpcost.step_time import transformer_training_flops

        total = transformer_training_flops(sum(p.numel() for _, p in params),
                                           batch * (tokens or 1))
        forward, backward = total / 3, 2 * total / 3
        notes["flops"] = (f"6 N x {'tokens' if tokens else 'samples'} (FlopCounterMode found "
                          "no FLOPs)")
    dtypes = [str(p.dtype).removeprefix("torch.") for _, p in params]
    return ModelFacts(
        name=name, precision=precision, attention=defaults.ATTENTION,
        parameters=sum(p.numel() for _, p in params),
        tensor_bytes=tuple(p.numel() * p.element_size() for _, p in params),
        tensor_elements=tuple(p.numel() for _, p in params), tensor_dtypes=tuple(dtypes),
        ready_order=tuple(traced.ready_order),
        frozen_elements=sum(p.numel() for p in frozen),
        frozen_bytes=float(sum(p.numel() * p.element_size() for p in frozen)),
        buffer_bytes=tuple(b.numel() * b.element_size() for b in module.buffers()),
        batch=int(batch), forward_flops=forward, backward_flops=backward,
        activation_bytes=float(traced.saved_bytes),
        input_bytes=float(example.numel() * example.element_size()),
        output_elements=traced.output_elements, output_bytes=float(traced.output_bytes),
        tokens_per_sample=int(tokens), tensor_names=tuple(n for n, _ in params),
        ops=traced.ops, forward_ops=traced.forward_ops, convolutions=traced.convolutions,
        conv_flops_share=traced.conv_flops_share,
        source=notes.get("built", ""), notes=notes)


def plan(model, gpus: int = defaults.GPUS, gpus_per_node: int = defaults.GPUS_PER_NODE,
         gpu: str = "H100", precision: str = defaults.PRECISION,
         optimizer: str = defaults.OPTIMIZER, bucket_cap_mb=None, input_shape=None, batch=None,
         seq=None, find_unused_parameters: bool = False, gradient_as_bucket_view: bool = False,
         gpu_tflops=None, gpu_tflops_fp32=None,
         gpu_memory_gb=None, gpu_bandwidth=None, step_ms=None, timeout=None) -> dict:
    """The plan for ``model``: a preset name, ``"package.module:callable"`` (built on meta, CPU
    fallback), an ``nn.Module`` (planned on its own device), or ``ModelFacts`` already known
    (a preset's, ``dpcost.setting.preset_facts``: nothing is traced, and ``batch`` samples per
    GPU scale its per-sample figures). The input is the per-GPU batch: ``input_shape`` (one
    float input, batch first), or ``batch`` x ``seq`` tokens, or a preset's own input at
    ``batch`` samples (default 1). ``gpu`` is a preset, whose figures ``gpu_tflops`` (dense
    16-bit), ``gpu_tflops_fp32``, ``gpu_memory_gb`` and ``gpu_bandwidth`` (GB/s) replace;
    ``step_ms``, a measured forward and backward of one GPU's batch, replaces the modelled
    compute. ``timeout`` (seconds) stops importing, building and tracing a module that takes
    longer (main thread only). Returns a dict of plain values (``report.to_json`` writes it);
    raises PlanError naming the bad parameter.
    """
    started = time.perf_counter()
    settings = _settings(gpus, gpus_per_node, gpu, precision, optimizer, bucket_cap_mb,
                         find_unused_parameters, gradient_as_bucket_view,
                         (gpu_tflops, gpu_tflops_fp32, gpu_memory_gb, gpu_bandwidth), step_ms)
    if isinstance(model, ModelFacts):
        if model.precision != precision:
            raise PlanError("--precision", f"the model facts are for {model.precision}, got "
                            f"{precision!r}")
        facts = _scaled(model, positive_count("--batch", 1 if batch is None else batch,
                                              MAX_SIZE))
        built_name, built_on = facts.name, "nothing (model facts given)"
    else:
        with time_limit(timeout, model if isinstance(model, str) else "the module"):
            facts, built_name, built_on = traced_facts(model, precision, input_shape, batch,
                                                       seq)
    result = costs(facts, settings)
    result.update({
        "model": built_name, "built_on": built_on, "notes": facts.notes,
        "settings": {"gpus": settings.gpus, "gpus_per_node": settings.gpus_per_node,
                     "gpu": settings.gpu.name, "precision": precision, "optimizer": optimizer,
                     "bucket_cap_mb": bucket_cap_mb, "batch_per_gpu": facts.batch,
                     "find_unused_parameters": find_unused_parameters,
                     "gradient_as_bucket_view": gradient_as_bucket_view,
                     "step_ms": None if settings.compute_s is None else settings.compute_s * 1e3,
                     "layout": LAYOUTS.get(precision, precision)},
        "param_names": list(facts.tensor_names or ()),
        "param_bytes": list(facts.tensor_bytes or ()),
        "ready_order": list(facts.ready_order or ()),
        "activation_bytes": facts.activation_bytes,
        "output_elements_per_sample": facts.output_elements // facts.batch,
    })
    result["compute"] = _compute_source(result, settings)
    if settings.gpu.name.startswith("V100") and precision != "fp32":
        result["gpu_note"] = (f"{settings.gpu.name} has no bf16: its 16-bit modes are fp16 "
                              "(with loss scaling), the same bytes, at fp16's rate")
    result["recommendation"] = recommendation(result, facts, settings)
    result["plan_s"] = time.perf_counter() - started
    return result


def _compute_source(result: dict, settings: Settings) -> str:
    """Which compute the step times used: the user's measurement or the model."""
    from dpcost.units import format_seconds

    if settings.compute_s is None:
        return "modelled (from the traced FLOPs and the GPU's figures)"
    used = result["steps"]["ddp"]["compute_s"]
    if math.isclose(used, settings.compute_s, rel_tol=1e-9):
        return f"measured by the user (--step-ms: {format_seconds(settings.compute_s)})"
    return (f"modelled: the evaluator did not use --step-ms's "
            f"{format_seconds(settings.compute_s)} (it gives {format_seconds(used)})")


def _scaled(facts: ModelFacts, batch: int) -> ModelFacts:
    """``facts`` for ``batch`` samples (its figures are linear in the samples)."""
    return replace(facts, batch=batch, **{name: facts.per(getattr(facts, name), batch)
                                          for name in ("forward_flops", "backward_flops",
                                                       "activation_bytes", "input_bytes",
                                                       "output_bytes")},
                   output_elements=facts.output_elements * batch // facts.batch,
                   notes={**facts.notes, "built": facts.source or "model facts",
                          "input": f"{batch} sample(s) per GPU",
                          "activations": "the preset's formula (dpcost.memory)"})


def traced_facts(model, precision, input_shape, batch, seq):
    """(ModelFacts, name, where it was built) from one traced step of ``model``."""
    import torch

    if isinstance(model, torch.nn.Module):
        from dpcost.plan.build import BuiltModule

        if not any(p.requires_grad for p in model.parameters()):
            raise PlanError("--model", "the module has no trainable parameters: DDP has "
                            "nothing to all-reduce")
        device = next(model.parameters()).device
        built = BuiltModule(model, type(model).__name__, str(device.type),
                            f"the module as given, on {device.type}", None)
    else:
        built = build_module(model)
    # autocast traces in bf16, as its matrix math runs (some of its activations, layer norms'
    # and softmax's, stay fp32), and keeps its parameters and gradients fp32 (below)
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    device = next(built.module.parameters()).device
    example, input_note = example_input(built, device, dtype, input_shape, batch, seq)
    module = built.module
    fp32_buffers = tuple(b.numel() * (4 if b.is_floating_point() else b.element_size())
                         for b in module.buffers())
    if any(p.is_floating_point() and p.dtype != dtype for p in module.parameters()):
        if isinstance(model, torch.nn.Module):  # the caller's module stays as it was
            import copy

            module = copy.deepcopy(module)
        module = module.to(dtype)
    facts = module_facts(module, example, built.name,
                         {"built": built.note, "input": input_note}, precision)
    if precision == "autocast":
        elements = facts.tensor_elements
        facts = replace(facts, tensor_bytes=tuple(4 * e for e in elements),
                        tensor_dtypes=("float32",) * len(elements),
                        frozen_bytes=4.0 * facts.frozen_elements, buffer_bytes=fp32_buffers,
                        notes={**facts.notes, "activations": facts.notes["activations"]
                               + "; traced in bf16 (autocast keeps layer norms' and softmax's "
                               "outputs in fp32)"})
    return facts, built.name, built.device


# What realises each sharded strategy: in the ZeRO layout ("mixed") DeepSpeed's stages (their
# optimizer keeps the fp32 master copy); otherwise PyTorch's own (ZeroRedundancyOptimizer
# shards the optimizer's state and keeps no master copy).
SHARDED_NAMES = {
    "mixed": {"zero1": "ZeRO-1 (DeepSpeed ZeRO stage 1, bf16)",
              "zero2": "ZeRO-2 (DeepSpeed ZeRO stage 2, bf16)",
              "zero3": "ZeRO-3 (DeepSpeed ZeRO stage 3, bf16; FSDP with a bf16 MixedPrecision "
                       "shards the same states)"},
    "torch": {"zero1": "ZeRO-1 (ZeroRedundancyOptimizer)",
              "zero2": "ZeRO-2 (FSDP SHARD_GRAD_OP)",
              "zero3": "FSDP with full sharding (ZeRO-3)"},
}


def _gb(x: float) -> str:
    from dpcost.units import format_bytes

    return format_bytes(x, digits=3)


def recommendation(r: dict, facts: ModelFacts, settings: Settings) -> str:
    """One paragraph that follows from the numbers: which strategy, and when the answer would
    change (the batch from which DDP hides its all-reduces, the GPUs sharding needs)."""
    from dpcost.units import format_seconds

    n, b = settings.gpus, facts.batch
    cap, totals, fit = r["capacity_bytes"], r["memory_totals"], r["fits"]
    ddp = r["steps"]["ddp"]
    text = []
    if fit["ddp"]:
        text.append(f"DDP: a rank holds {_gb(totals['ddp'])} of the GPU's {_gb(cap)}, and a "
                    f"step takes {format_seconds(ddp['total_s'])} with "
                    f"{format_seconds(ddp['exposed_communication_s'])} of communication "
                    "exposed.")
        hidden = r["ddp_hidden_from_batch"]
        if n > 1 and hidden is not None:
            where = "so at" if b >= hidden else "not yet at"
            text.append(f"Its all-reduces take no longer than backward from {hidden} "
                        f"sample(s) per GPU up ({where} {b}).")
        elif n > 1:
            text.append("Its all-reduces take longer than backward at every batch up to 4096 "
                        "per GPU: communication bound.")
        if r["dp_available"] and n > 1:
            nccl, copy = r["steps"]["dp_nccl"], r["steps"]["dp_copy"]
            ratio = nccl["total_s"] / ddp["total_s"]
            verdict = ("acceptable here (within 10 % of DDP)" if ratio <= 1.1
                       else "slower")
            dp_fits = "fits" if fit.get("dp_gpu0") else "does not fit"
            text.append(f"DataParallel on one node is {verdict}: {ratio:.3g}x DDP's step on "
                        f"the NCCL path, {copy['total_s'] / ddp['total_s']:.3g}x on the copy "
                        f"path, and its GPU0 {dp_fits} ({_gb(totals['dp_gpu0'])}).")
        elif not r["dp_available"]:
            text.append("DataParallel cannot span machines.")
    else:
        order = [k for k in ("zero1", "zero2", "zero3") if fit[k]]
        names = SHARDED_NAMES["mixed" if settings.precision == "mixed" else "torch"]
        text.append(f"Does not fit under DDP: a rank needs {_gb(totals['ddp'])} of "
                    f"{_gb(cap)}.")
        if order:
            text.append(f"Use {names[order[0]]}: {_gb(totals[order[0]])} per GPU on {n} GPUs.")
        else:
            need = gpus_that_fit(facts, settings, "zero3")
            if need is None:
                text.append(f"Not even FSDP with full sharding fits at {b} sample(s) per GPU: "
                            f"the activations alone take {_gb(facts.activation_bytes)}; lower the "
                            "batch or recompute activations (checkpointing).")
            else:
                text.append(f"Not even FSDP with full sharding fits on {n} GPUs "
                            f"({_gb(totals['fsdp'])}); it fits from {need} GPUs up.")
    return " ".join(text)
