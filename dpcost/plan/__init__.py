"""Plan your own model: DDP's real buckets, DP's and DDP's bytes, step time and memory per GPU.

``plan(spec_or_module, gpus=8, ...)`` builds the module on the meta device (``build``), runs
one traced forward and backward (``trace``: FLOPs, saved bytes, gradient-ready order) and
composes the course's models for it (``costs``); ``report`` prints, serialises and draws the
result. ``python -m dpcost.plan --model SPEC`` is the command line (``__main__``).

Importing the user's module (``package.module:callable``) runs their code.
"""

from __future__ import annotations

import time

from dpcost import defaults
from dpcost.memory import TRAINING_PRECISIONS
from dpcost.plan.build import PlanError, build_module, example_input, positive_count
from dpcost.plan.costs import Settings, costs, gpus_that_fit
from dpcost.setting import ModelFacts

__all__ = ["plan", "traced_facts", "PlanError", "PRECISIONS", "OPTIMIZERS", "GPU_NAMES",
           "recommendation", "module_facts"]

PRECISIONS = TRAINING_PRECISIONS
# The command line's names -> dpcost.memory's.
OPTIMIZERS = {"adam": "adam", "sgd": "sgd", "momentum": "sgd_momentum"}
# Short names for the GPU presets (dpcost.presets.GPUS).
GPU_NAMES = {"A100": "A100 SXM 80GB", "H100": "H100 SXM 80GB"}


def _gpu(name):
    from dpcost.presets import GPUS

    if name in GPUS:
        return GPUS[name]
    if name in GPU_NAMES:
        return GPUS[GPU_NAMES[name]]
    raise PlanError("--gpu", f"must be one of {', '.join([*GPU_NAMES, *GPUS])}, got {name!r}")


def _settings(gpus, gpus_per_node, gpu, precision, optimizer, bucket_cap_mb,
              find_unused_parameters, gradient_as_bucket_view, utilisation) -> Settings:
    n = positive_count("--gpus", gpus)
    g = positive_count("--gpus-per-node", gpus_per_node)
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
    if isinstance(utilisation, bool) or not isinstance(utilisation, (int, float)) \
            or not 0 < utilisation <= 1:
        raise PlanError("--utilisation", f"must be in (0, 1], got {utilisation!r}")
    for name, flag in (("--find-unused-parameters", find_unused_parameters),
                       ("--gradient-as-bucket-view", gradient_as_bucket_view)):
        if not isinstance(flag, bool):
            raise PlanError(name, f"must be True or False, got {flag!r}")
    return Settings(n, g, _gpu(gpu), precision, OPTIMIZERS[optimizer], bucket_cap_mb,
                    find_unused_parameters, gradient_as_bucket_view, float(utilisation))


def module_facts(module, example, name: str, notes: dict | None = None,
                 precision: str = defaults.PRECISION) -> ModelFacts:
    """Trace ``module`` on ``example`` once into the evaluator's ``ModelFacts`` (the
    tensors of ``example``'s batch, at ``precision``)."""
    from dpcost.plan.trace import ATTENTION_NOTE, ddp_parameters, trace_step

    try:
        traced = trace_step(module, example)
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
        "excluded; " + (ATTENTION_NOTE if traced.sdpa_calls else "no SDPA call in the module"))
    notes["sdpa_calls"] = traced.sdpa_calls
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
        source=notes.get("built", ""), notes=notes)


def plan(model, gpus: int = defaults.GPUS, gpus_per_node: int = defaults.GPUS_PER_NODE,
         gpu: str = "H100", precision: str = defaults.PRECISION,
         optimizer: str = defaults.OPTIMIZER, bucket_cap_mb=None, input_shape=None, batch=None,
         seq=None, find_unused_parameters: bool = False, gradient_as_bucket_view: bool = False,
         utilisation: float = defaults.UTILISATION) -> dict:
    """The plan for ``model``: a preset name, ``"package.module:callable"`` (built on meta, CPU
    fallback), an ``nn.Module`` (planned on its own device), or ``ModelFacts`` already known
    (a preset's, ``dpcost.setting.preset_facts``: nothing is traced, and ``batch`` samples per
    GPU scale its per-sample figures). The input is the per-GPU batch: ``input_shape`` (one
    float input, batch first), or ``batch`` x ``seq`` tokens, or a preset's own input at
    ``batch`` samples (default 1). Returns a dict of plain values (``report.to_json`` writes
    it); raises PlanError naming the bad parameter.
    """
    started = time.perf_counter()
    settings = _settings(gpus, gpus_per_node, gpu, precision, optimizer, bucket_cap_mb,
                         find_unused_parameters, gradient_as_bucket_view, utilisation)
    if isinstance(model, ModelFacts):
        if model.precision != precision:
            raise PlanError("--precision", f"the model facts are for {model.precision}, got "
                            f"{precision!r}")
        facts = _scaled(model, positive_count("--batch", 1 if batch is None else batch))
        built_name, built_on = facts.name, "nothing (model facts given)"
    else:
        facts, built_name, built_on = traced_facts(model, precision, input_shape, batch, seq)
    result = costs(facts, settings)
    result.update({
        "model": built_name, "built_on": built_on, "notes": facts.notes,
        "settings": {"gpus": settings.gpus, "gpus_per_node": settings.gpus_per_node,
                     "gpu": settings.gpu.name, "precision": precision, "optimizer": optimizer,
                     "bucket_cap_mb": bucket_cap_mb, "batch_per_gpu": facts.batch,
                     "find_unused_parameters": find_unused_parameters,
                     "gradient_as_bucket_view": gradient_as_bucket_view,
                     "utilisation": settings.utilisation},
        "param_names": list(facts.tensor_names or ()),
        "param_bytes": list(facts.tensor_bytes or ()),
        "ready_order": list(facts.ready_order or ()),
        "activation_bytes": facts.activation_bytes,
        "output_elements_per_sample": facts.output_elements // facts.batch,
    })
    result["recommendation"] = recommendation(result, facts, settings)
    result["plan_s"] = time.perf_counter() - started
    return result


def _scaled(facts: ModelFacts, batch: int) -> ModelFacts:
    """``facts`` for ``batch`` samples (its figures are linear in the samples)."""
    from dataclasses import replace

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
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    device = next(built.module.parameters()).device
    example, input_note = example_input(built, device, dtype, input_shape, batch, seq)
    module = built.module
    if any(p.is_floating_point() and p.dtype != dtype for p in module.parameters()):
        if isinstance(model, torch.nn.Module):  # the caller's module stays as it was
            import copy

            module = copy.deepcopy(module)
        module = module.to(dtype)
    facts = module_facts(module, example, built.name,
                         {"built": built.note, "input": input_note}, precision)
    return facts, built.name, built.device


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
        names = {"zero1": "ZeRO-1 (ZeroRedundancyOptimizer)",
                 "zero2": "ZeRO-2 (FSDP SHARD_GRAD_OP)",
                 "zero3": "FSDP with full sharding (ZeRO-3)"}
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
