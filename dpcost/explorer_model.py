"""What the explorer shows for one setting of its controls: curves, bars and the verdict.

The explorer's model, torch-, matplotlib- and ipywidgets-free, so that a test, a notebook or a
page in the browser can compute what the widget (``dpcost.explorer``) draws. ``scenario(...)``
takes the controls' values and returns every number the views show: bytes per step on the
busiest link against n (DataParallel's copy path and NCCL path, a DDP rank), the step time
at the chosen n, memory per GPU for DP's GPU0, DDP and ZeRO-1/2/3 with a fits verdict, and
``verdict(...)`` says it in words; ``readout(...)`` gives every number of the readout table as
text and value. The choices the controls offer (``GPU_CHOICES``, ``PRECISION_CHOICES``, ...,
``controls()``) and ``DEFAULTS`` live here too. See ``dpcost.explorer`` for the views and for
what each number comes from.

Two faces call it: the ipywidgets explorer (``dpcost.explorer``) and the site's explorer page
(``site_explorer/``, built by ``book/build.py``), which runs this module on Pyodide in a Web
Worker and draws what ``explore(settings)`` returns: plain, JSON-able data (curves, bars,
readout, verdict, sources, the URL fragment, and for bad input the widget's messages by
control). The page computes nothing itself. Standard library only, so that it runs there.
"""


from __future__ import annotations

import math
import re
from dataclasses import replace
from functools import lru_cache

from dpcost import defaults
from dpcost.core import (
    _show,
    check_choice,
    check_int,
    check_num_gpus,
    check_real,
    ddp_communication_volume,
)
from dpcost.evaluate import CANNOT_SPAN, busiest_bytes_curve, evaluate, peak_flops
from dpcost.gpu_time import DDP_BUCKET_S, ddp_host_seconds
from dpcost.memory import ATTENTIONS, COMPONENTS, TRAINING_PRECISIONS, total_bytes
from dpcost.presets import GPUS, INTERCONNECTS, MODELS, ModelPreset, custom_model
from dpcost.registry import BY_KEY
from dpcost.setting import MAX_GPUS, MAX_OUTPUTS, ModelFacts, Setting, facts_from_preset
from dpcost.step_time import communication_hidden
from dpcost.units import format_bytes, format_seconds, parse_size

CUSTOM = "custom"
MAX_CUSTOM_PARAMETERS = 10**12
GPU_CHOICES = [2**k for k in range(11)]  # the slider: 1, 2, 4, ..., 1024
GPUS_PER_NODE_CHOICES = [1, 2, 4, 8, 16]  # DGX A100/H100 and HGX boards: 8 (the default)
# The curves: every n from 2 to 1024 that a log axis can tell apart, powers of two included.
CURVE_GPUS = sorted({round(2 ** (k / 16)) for k in range(16, 161)} | set(GPU_CHOICES[1:]))
PRECISION_CHOICES = TRAINING_PRECISIONS
INTRA_NODE_LINKS = ("NVLink 4 (H100)", "NVLink 3 (A100)", "PCIe 5.0 x16", "PCIe 4.0 x16")
INTER_NODE_LINKS = ("InfiniBand NDR", "InfiniBand HDR", "100 GbE")
OPTIMIZERS = [("SGD", "sgd"), ("SGD with momentum", "sgd_momentum"), ("Adam", "adam")]
# The rows of the step view and the readout, in order: which path or algorithm each number is for.
DP_COPY, DP_NCCL = "DP, copy path", "DP, NCCL path"
DDP_RING, DDP_TWO_LEVEL, DDP_FLAT = "DDP, ring", "DDP, two-level", "DDP, flat ring"
HSDP = "HSDP"
# The memory view's bars: DataParallel's GPU0, then the registry's entries the explorer shows.
STRATEGY_NAMES = {"dp_gpu0": "DP GPU0",
                  **{k: BY_KEY[k].label for k in ("ddp", "zero1", "zero2", "zero3", "hsdp")}}
VIEWED = ("dp_copy", "dp_nccl", "ddp", "zero1", "zero2", "zero3", "hsdp")
MAX_BATCH_SIZE = 2**20  # the global batch control's bounds: 1 .. MAX_BATCH_SIZE samples
DEFAULTS = {"model": "GPT-2 XL", "custom": "1.5e9", "precision": defaults.PRECISION,
            "attention": defaults.ATTENTION, "gpus": defaults.GPUS,
            "gpus_per_node": defaults.GPUS_PER_NODE,
            "intra_link": defaults.INTRA_LINK[defaults.GPU], "inter_link": defaults.INTER_LINK,
            "gpu": defaults.GPU, "bucket_cap_mb": defaults.BUCKET_CAP_MB,
            "optimizer": defaults.OPTIMIZER}
# DDP's bucket cap in MiB, as the control offers it; 25 is torch's _DEFAULT_BUCKET_CAP_MB.
BUCKET_CAP_CHOICES = [1, 5, 10, defaults.BUCKET_CAP_MB, 50, 100, 250]


def parse_parameter_count(text: str) -> int:
    """A parameter count typed by a person: "1.5e9" or "350000000" -> int.

    Plain numbers only (parsed with dpcost.units.parse_size): a unit such as "GB" is a size in
    bytes, not a count, so it is refused. ValueError names the text otherwise. At most
    ``MAX_CUSTOM_PARAMETERS`` (1e12): the time model walks every 25 MiB bucket and 10 MiB chunk,
    which at 1e12 fp32 parameters (152,589 buckets) already takes seconds per change.
    """
    shown = repr(text if not isinstance(text, str) or len(text) <= 40 else text[:37] + "...")
    if re.search(r"[a-df-zA-DF-Z]", text or ""):
        raise ValueError(f"custom parameters {shown}: give a plain count such as 1.5e9")
    try:
        value = parse_size(text)
    except (TypeError, ValueError):
        raise ValueError(f"custom parameters {shown} is not a number such as 1.5e9") from None
    if value < 1:
        raise ValueError(f"custom parameters {shown} must be at least 1")
    if value > MAX_CUSTOM_PARAMETERS:
        raise ValueError(f"custom parameters {shown} must be at most 1e12 (a trillion)")
    return int(round(value))


def bucket_cap_setting(cap_mb):
    """The bucket-cap control's value as ``Setting.bucket_cap_mb``: 25 MiB, torch's default,
    is DDP left to its own caps (None: the first bucket 1 MiB, then 25 MiB, as when
    ``bucket_cap_mb`` is not passed); any other value is ``DDP(bucket_cap_mb=...)``, every
    bucket that cap (``dpcost.buckets.ddp_bucket_caps``)."""
    return None if cap_mb is None or cap_mb == defaults.BUCKET_CAP_MB else cap_mb


def setting_for(model, precision: str, num_gpus: int, gpus_per_node: int, intra_link, inter_link,
                gpu, bucket_cap_mb, optimizer: str, batch_size: int,
                attention: str = defaults.ATTENTION) -> Setting:
    """The ``dpcost.setting.Setting`` the controls describe, their values checked: at most
    ``MAX_GPUS`` GPUs (65,536, as ``dpcost.plan``) and ``MAX_BATCH_SIZE`` samples, so that
    every figure is finite and comes in well under a second; errors name the parameter.
    ``bucket_cap_mb`` is ``Setting``'s: None for DDP's own caps, else MiB for every bucket
    (the control's value goes through ``bucket_cap_setting``)."""
    check_choice(precision, "precision", PRECISION_CHOICES)
    check_choice(attention, "attention", ATTENTIONS)
    n = check_num_gpus(num_gpus)
    if n < 1:
        raise ValueError(f"num_gpus must be >= 1, got {n}")
    if n > MAX_GPUS:
        raise ValueError(f"num_gpus must be <= {MAX_GPUS:,}, got {_show(n)}")
    g = check_int(gpus_per_node, "gpus_per_node", 1)
    if g > MAX_GPUS:
        raise ValueError(f"gpus_per_node must be <= {MAX_GPUS:,}, got {_show(g)}")
    if n > g and n % g:
        raise ValueError(f"num_gpus ({n}) must be a multiple of gpus_per_node ({g}) beyond "
                         "one node")
    b = check_int(batch_size, "batch_size", 1)
    if b > MAX_BATCH_SIZE:
        raise ValueError(f"batch_size must be <= {MAX_BATCH_SIZE:,}, got {_show(b)}")
    if bucket_cap_mb is not None:
        bucket_cap_mb = check_real(bucket_cap_mb, "bucket_cap_mb", 0.0, strict=True)
    if not isinstance(model, (ModelFacts, ModelPreset)):
        raise TypeError(f"model must be a ModelPreset or ModelFacts, got "
                        f"{type(model).__name__}")
    facts = model if isinstance(model, ModelFacts) else facts_from_preset(model, precision,
                                                                             attention)
    return Setting(facts, gpus=n, gpus_per_node=g,
                   batch=b, gpu=gpu, intra_link=intra_link, inter_link=inter_link,
                   optimizer=optimizer, bucket_cap_mb=bucket_cap_mb)


@lru_cache(maxsize=512)
def _curve(facts: ModelFacts, batch: int, gpus_per_node: int, key: str) -> tuple:
    """Bytes per step against n (CURVE_GPUS): they depend on neither links nor the chosen n."""
    setting = Setting(facts, gpus=1, gpus_per_node=gpus_per_node, batch=batch)
    return busiest_bytes_curve(setting, key, CURVE_GPUS)


def scenario(model, precision: str, num_gpus: int, gpus_per_node: int, intra_link, inter_link,
             gpu, bucket_cap_mb, optimizer: str, batch_size: int,
             attention: str = defaults.ATTENTION) -> dict:
    """Every number the explorer shows, for one setting of the controls: a view of
    ``dpcost.evaluate.evaluate``.

    ``model`` a ModelPreset, ``intra_link``/``inter_link`` InterconnectPresets (inside a node,
    between nodes), ``gpu`` a GPUPreset, ``bucket_cap_mb`` DDP's cap (``Setting``'s: None for
    DDP's own caps; the control's value through ``bucket_cap_setting``). Returns a dict: bytes
    per step on the busiest link
    (``dp`` per path, ``ddp``, ``hsdp`` inside and across nodes), the curves over CURVE_GPUS,
    the modelled steps (``steps``: row name -> dpcost.step_time.StepTime), whether DDP's
    communication can hide under its backward (``hidden``; DDP's backward with its own host
    work, ``ddp_backward_s``), DDP's buckets (``ddp_buckets``, ``bucket_cap_mb``) and host work
    (``ddp_host_s``), DataParallel's host work (``dp_host``: ``replicate`` and the one
    interpreter that launches every replica's forward), memory per GPU (``memory``: strategy
    -> components) and the fit verdicts against the GPU's capacity (``fits``). DataParallel's
    entries are None beyond one node (``dp_available`` False). ``result``: the evaluator's
    Result behind it all (``result.compute.bound``: the clock that sets one GPU's compute).
    """
    setting = setting_for(model, precision, num_gpus, gpus_per_node, intra_link, inter_link,
                          gpu, bucket_cap_mb, optimizer, batch_size, attention)
    r = evaluate(setting, keys=VIEWED)
    n, g = setting.gpus, setting.gpus_per_node
    dp_available = r["dp_copy"].available
    curve = (setting.model, setting.batch, g)
    ddp = r["ddp"]
    steps = {}
    if dp_available:
        steps[DP_COPY], steps[DP_NCCL] = r["dp_copy"].step, r["dp_nccl"].step
    ddp_name = DDP_RING if n <= g else DDP_TWO_LEVEL
    steps[ddp_name] = ddp.step
    if "flat ring" in ddp.alternatives:
        steps[DDP_FLAT] = ddp.alternatives["flat ring"]
    steps[HSDP] = r["hsdp"].step
    # DDP's backward carries its own host work (hooks, one launch per bucket): the buckets'
    # all-reduces can hide under all of it
    ddp_backward = _phase_s(ddp.step, "backward")
    hidden = {name: communication_hidden(ddp_backward, st.communication_s)
              for name, st in steps.items() if name not in (DP_COPY, DP_NCCL, HSDP)}
    hidden[HSDP] = r["hsdp"].hidden
    m = setting.model
    ddp_host = ddp_host_seconds(len(m.tensor_bytes) if m.tensor_bytes is not None else 0,
                                m.buffer_count, len(r.buckets))
    dp_host = None
    if dp_available and len(r.dp_split) > 1:  # replicate, then k replicas from one interpreter
        st = r["dp_nccl"].step
        forward = _phase_s(st, "forward")  # r.forward_s: one rank's, on the same ceil(b/n)
        dp_host = {"replicate_s": _phase_s(st, "replicate (host)"), "replicas": len(r.dp_split),
                   "interpreter_s": forward - r.forward_s
                   if forward > r.forward_s * (1 + 1e-9) else 0.0}
    memory = {key: r[key].memory for key in STRATEGY_NAMES
              if key != "dp_gpu0" and r[key].available}
    if dp_available:
        memory = {"dp_gpu0": r["dp_copy"].memory, **memory}
    return {"model_size_bytes": r.parameter_bytes, "gradient_bytes": r.gradient_bytes,
            "num_gpus": n, "gpus_per_node": g, "nodes": setting.nodes,
            "batch_size": setting.batch, "dp_available": dp_available,
            "capacity_bytes": gpu.memory_bytes, "curve_gpus": CURVE_GPUS,
            "dp_copy_curve": _curve(*curve, "dp_copy"),
            "dp_nccl_curve": _curve(*curve, "dp_nccl"),
            "ddp_curve": _curve(*curve, "ddp"),
            "ddp_bytes": ddp.busiest_bytes, "ddp_allreduce_bytes": ddp_communication_volume(
                r.gradient_bytes, n),
            "hsdp_bytes": {"intra": r["hsdp"].busiest_bytes if n > 1 else 0.0,
                           "inter": r["hsdp"].inter_node_bytes or 0.0},
            "ddp_per_rank_samples": r.ddp_samples_per_rank, "ddp_buckets": len(r.buckets),
            "bucket_cap_mb": setting.bucket_cap_mb, "ddp_host_s": ddp_host,
            "ddp_backward_s": ddp_backward, "hidden": hidden, "dp_host": dp_host,
            "dp_split": list(r.dp_split) if dp_available else None,
            "dp_gpus_used": len(r.dp_split) if dp_available else 0,
            "dp_bytes": {"copy": r["dp_copy"].busiest_bytes, "nccl": r["dp_nccl"].busiest_bytes}
            if dp_available else None,
            "steps": steps, "ddp_name": ddp_name, "memory": memory,
            "fits": {key: (r["dp_copy"] if key == "dp_gpu0" else r[key]).fits for key in memory},
            "result": r}


def _phase_s(step, name: str) -> float:
    """Seconds of the phase ``name`` of a modelled step (0 when it has none)."""
    return sum(i.end_s - i.start_s for i in step.intervals if i.name == name)


def _samples(k: int) -> str:
    return f"{k} sample{'s' if k != 1 else ''}"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3g}x" if b > 0 else "n/a"


def verdict(s: dict) -> str:
    """The scenario's outcome in words: which side wins, on what, and on which path."""
    n, g = s["num_gpus"], s["gpus_per_node"]
    steps = s["steps"]
    ddp = steps[s["ddp_name"]]
    if n <= 1:
        return "One GPU: nothing to communicate, so DP and DDP take the same time."
    if not s["dp_available"]:
        text = (f"{CANNOT_SPAN}: {n} GPUs are {s['nodes']} nodes of {g}, so only DDP runs "
                f"here, {format_seconds(ddp.total_s)} per step with the two-level all-reduce "
                f"against {format_seconds(steps[DDP_FLAT].total_s)} with a flat ring")
        return text + "."
    nccl, copy = steps[DP_NCCL], steps[DP_COPY]
    faster = "faster" if ddp.total_s < nccl.total_s else "not faster"
    nccl_ratio = _ratio(s["dp_bytes"]["nccl"], s["ddp_bytes"])
    copy_ratio = _ratio(s["dp_bytes"]["copy"], s["ddp_bytes"])
    return (f"DDP is {faster} than DP on the NCCL path (every Linux CUDA build): "
            f"{format_seconds(ddp.total_s)} against {format_seconds(nccl.total_s)} per step "
            f"({_ratio(nccl.total_s, ddp.total_s)}), with "
            f"{format_seconds(ddp.exposed_communication_s)} of communication exposed against "
            f"{format_seconds(nccl.exposed_communication_s)}. On that path GPU0's link carries "
            f"only {nccl_ratio} a DDP rank's bytes, so DDP wins by time (overlap, no broadcast "
            f"of the parameters each step), not by bytes; the copy path (no NCCL) carries "
            f"{copy_ratio} and takes "
            f"{format_seconds(copy.total_s)}.")


# --- the readout: every number in words, for the widget and the page alike -----------------

READOUT_COLUMNS = ("per step", "busiest link", "step time", "exposed comm.", "comm. hidden?")
SPAN_NOTE = "(one process, device_ids of one machine: data_parallel.py)"


def model_for(name: str, custom: str, outputs: int) -> ModelPreset:
    """The ModelPreset the controls describe: a preset with ``outputs`` output elements per
    sample, or for ``name == CUSTOM`` the parsed count of ``custom`` (no activations)."""
    if name == CUSTOM:
        parameters = parse_parameter_count(custom)
        return custom_model(parameters, output_elements_per_sample=outputs,
                            name=f"custom ({parameters:.3g} parameters)")
    return replace(MODELS[name], output_elements_per_sample=outputs)


def batch_line(s: dict) -> str:
    """How each side splits the global batch, in whole samples."""
    n, b = s["num_gpus"], s["batch_size"]
    per_rank = s["ddp_per_rank_samples"]
    ddp = f"DDP: {_samples(per_rank)} per rank"
    if per_rank * n != b:
        ddp += f" (ceil({b}/{n}): DistributedSampler pads the data to {per_rank * n})"
    if not s["dp_available"]:
        return ddp + "."
    split = s["dp_split"]
    k, chunk = len(split), split[0]
    if n == 1:
        return f"DP and DDP: all {_samples(b)} on the one GPU."
    dp = f"DP: torch.chunk gives {_samples(chunk)} to each of {split.count(chunk)} GPUs"
    if split[-1] != chunk:
        dp += f" and {_samples(split[-1])} to 1"
    if k < n:
        dp += (f", so only {k} of the {n} GPUs are used (DataParallel replicates to "
               "device_ids[:len(inputs)], data_parallel.py)")
    return f"{dp}. {ddp}."


def bucket_cap_text(bucket_cap_mb) -> str:
    """The cap in words: ``Setting.bucket_cap_mb`` None is DDP's default, 25 MiB after a first
    bucket of 1 MiB."""
    if bucket_cap_mb is None:
        return f"{defaults.BUCKET_CAP_MB} MiB (DDP's default; its first bucket 1 MiB)"
    return f"{bucket_cap_mb:g} MiB (bucket_cap_mb={bucket_cap_mb:g}: every bucket)"


def time_line(s: dict) -> tuple[str, dict]:
    """What sets the step time, in words and numbers: the clock that bounds one GPU's compute
    (``dpcost.gpu_time``: the host launching kernels, or the device running them), DDP's
    buckets and its own host work, and DataParallel's host work (``replicate`` and one
    interpreter launching every replica's forward)."""
    compute = s["result"].compute
    bound = {"host": "host (launch-bound)", "device": "device"}.get(compute.bound, compute.bound)
    per_rank = _samples(s["ddp_per_rank_samples"])
    if compute.bound == "host":
        clocks = (f"{format_seconds(compute.host_s)} of kernel launches against "
                  f"{format_seconds(compute.device_s)} of GPU work")
    else:
        clocks = (f"{format_seconds(compute.device_s)} of GPU work against "
                  f"{format_seconds(compute.host_s)} of kernel launches")
    buckets = s["ddp_buckets"]
    text = (f"Compute, one GPU on {per_rank} (dpcost.gpu_time): "
            f"{format_seconds(compute.total_s)}, bound by the {bound}: {clocks}. "
            f"DDP: bucket cap {bucket_cap_text(s['bucket_cap_mb'])}: {buckets} "
            f"bucket{'s' if buckets != 1 else ''}, each about {DDP_BUCKET_S * 1e3:.2g} ms of "
            f"host work; "
            f"{format_seconds(s['ddp_host_s'])} of DDP's own host work in backward (hooks, "
            f"buckets, buffers).")
    values = {"bound": compute.bound, "compute_s": compute.total_s, "host_s": compute.host_s,
              "device_s": compute.device_s, "bucket_cap_mb": s["bucket_cap_mb"],
              "buckets": buckets, "ddp_host_s": s["ddp_host_s"]}
    dp = s["dp_host"]
    if dp is not None:
        total = dp["replicate_s"] + dp["interpreter_s"]
        launches = (f" and {format_seconds(dp['interpreter_s'])} more forward: its "
                    f"{dp['replicas']} replicas' kernels launched through one interpreter"
                    if dp["interpreter_s"] > 0 else
                    f" (its {dp['replicas']} replicas' launches through one interpreter stay "
                    "under the GPU's work)")
        text += (f" DataParallel: {format_seconds(total)} of its step is host work, "
                 f"replicate {format_seconds(dp['replicate_s'])} each step{launches}.")
        values |= {"dp_replicate_s": dp["replicate_s"], "dp_interpreter_s": dp["interpreter_s"]}
    return text, values


def readout(s: dict, precision: str, intra_link, inter_link, gpu) -> dict:
    """The readout of scenario ``s`` as plain text and numbers, one table row per path.

    Returns {"n": "n = 8", "head": the sentence after it, "columns": READOUT_COLUMNS,
    "rows": [{"name", "cells": 4 texts, "values": the numbers behind them} or {"name",
    "span": why there are none}], "time_line": what sets the time (``time_line``),
    "time": its numbers, "memory": [{"key", "strategy", "bytes", "fits", "text"}],
    "memory_line", "verdict"}: bytes in B, times in s, as the widget and the page show them.
    """
    n, g = s["num_gpus"], s["gpus_per_node"]
    place = (f"one node of {g}" if n <= g else f"{s['nodes']} nodes of {g}, "
             f"{inter_link.name} between nodes")
    head = (f"GPUs ({place}; {gpu.name}, {intra_link.name} in a node), P = "
            f"{format_bytes(s['model_size_bytes'], digits=3)} ({precision}), "
            f"global batch {s['batch_size']}. {batch_line(s)}")
    rows = []
    steps, ddp_bytes = s["steps"], s["ddp_bytes"]
    for name, path in ((DP_COPY, "copy"), (DP_NCCL, "nccl")):
        if not s["dp_available"]:
            rows.append({"name": name, "span": f"{CANNOT_SPAN} {SPAN_NOTE}"})
            continue
        st, busy = steps[name], s["dp_bytes"][path]
        rows.append({"name": name, "cells": [
            f"GPU0 {format_bytes(busy, digits=3)} ({_ratio(busy, ddp_bytes)} DDP's)",
            format_seconds(st.total_s), format_seconds(st.exposed_communication_s),
            "no: phases in series"],
            "values": {"busiest_bytes": busy, "total_s": st.total_s,
                       "exposed_s": st.exposed_communication_s,
                       "communication_s": st.communication_s, "hidden": False}})
    for name in (DDP_RING, DDP_TWO_LEVEL, DDP_FLAT):
        if name not in steps:
            continue
        st, hidden = steps[name], s["hidden"][name]
        rows.append({"name": name, "cells": [
            f"per rank {format_bytes(ddp_bytes, digits=3)}", format_seconds(st.total_s),
            format_seconds(st.exposed_communication_s),
            f"{'yes' if hidden else 'no'}: backward {format_seconds(s['ddp_backward_s'])}, "
            f"{s['ddp_buckets']} all-reduce{'s' if s['ddp_buckets'] != 1 else ''} "
            f"{format_seconds(st.communication_s)}"],
            "values": {"busiest_bytes": ddp_bytes, "total_s": st.total_s,
                       "exposed_s": st.exposed_communication_s,
                       "communication_s": st.communication_s,
                       "backward_s": s["ddp_backward_s"], "buckets": s["ddp_buckets"],
                       "hidden": hidden}})
    if n > 1:
        st, hb = steps[HSDP], s["hsdp_bytes"]
        across = (f", across nodes {format_bytes(hb['inter'], digits=3)}" if hb["inter"] > 0
                  else "")
        rows.append({"name": HSDP, "cells": [
            f"per rank {format_bytes(hb['intra'], digits=3)}{across}",
            format_seconds(st.total_s), format_seconds(st.exposed_communication_s),
            f"{'yes' if s['hidden'][HSDP] else 'no'}: all-gathers and reduce-scatters in a "
            f"node of {min(n, g)}, then the shards all-reduced across {s['nodes']} node(s)"],
            "values": {"busiest_bytes": hb["intra"], "inter_node_bytes": hb["inter"],
                       "total_s": st.total_s, "exposed_s": st.exposed_communication_s,
                       "communication_s": st.communication_s, "hidden": s["hidden"][HSDP]}})
    memory = []
    for key, parts in s["memory"].items():
        total, fit = total_bytes(parts), s["fits"][key]
        memory.append({"key": key, "strategy": STRATEGY_NAMES[key], "bytes": total, "fits": fit,
                       "text": f"{STRATEGY_NAMES[key]} {format_bytes(total, digits=3)} "
                               f"{'fits' if fit else 'does not fit'}"})
    fit_text = "; ".join(item["text"] for item in memory)
    if not s["dp_available"]:
        fit_text = f"DP GPU0: none ({CANNOT_SPAN}); " + fit_text
    line, values = time_line(s)
    return {"n": f"n = {n}", "head": head, "columns": list(READOUT_COLUMNS), "rows": rows,
            "time_line": line, "time": values, "memory": memory,
            "memory_line": f"Memory per GPU on {gpu.name} ({gpu.memory_bytes / 1e9:g} GB): "
                           f"{fit_text}.",
            "verdict": verdict(s)}


def sources(model, gpu, precision: str, intra_link, inter_link) -> list[list[str]]:
    """Where each preset's numbers come from: [[name, what and source], ...]."""
    lines = [[model.name, f"{model.parameters:,} parameters (source: {model.source})"],
             [gpu.name, f"{gpu.memory_bytes / 1e9:g} GB, peak "
                        f"{peak_flops(gpu, precision) / 1e12:g} TFLOP/s dense for {precision} "
                        f"(source: {gpu.source})"]]
    for link in (intra_link, inter_link):
        lines.append([link.name, f"{format_bytes(link.bandwidth_bytes_per_s, digits=3)}/s per "
                                 f"direction, {format_seconds(link.latency_s)} per message "
                                 f"(source: {link.source})"])
    lines.append(["All-reduce algorithm", "rings are modelled (the two-level one beyond a node); "
                  "NCCL picks ring, tree or NVLS per call from the size and the topology "
                  "(github.com/NVIDIA/nccl/issues/754; dpcost.step_time.NCCL_ALGORITHM_NOTE)"])
    return lines


# --- the explorer as plain data: what the page in the browser (Pyodide) draws -------------

# The controls in the order the page shows them, each with its label (as the widget's).
CONTROL_LABELS = {"model": "model", "custom": "custom parameters", "precision": "precision",
                  "attention": "attention", "gpus": "GPUs, n", "gpus_per_node": "GPUs per node",
                  "intra_link": "link in a node", "inter_link": "link between nodes",
                  "gpu": "GPU", "bucket_cap_mb": "DDP bucket cap (MiB)", "optimizer": "optimizer",
                  "batch_size": "global batch", "outputs": "outputs / sample"}
# The legends' names for the curves and the step view's parts.
CURVE_NAMES = {"dp_copy": "DP copy path: GPU0 (star)", "dp_nccl": "DP NCCL path: GPU0 (chains)",
               "ddp": "DDP: per rank, 2(n-1)/n G"}
STEP_PARTS = ("compute (forward, backward)", "exposed communication")


def _defaults_for(model: str) -> dict:
    preset = MODELS.get(model)
    return {"batch_size": preset.default_batch_size if preset else 8,
            "outputs": preset.output_elements_per_sample if preset else 1000}


def controls() -> dict:
    """What each control offers, as plain data: {"order", "labels", "options": name ->
    [[label, value], ...] (None for a text field), "defaults", "model_defaults": model ->
    {"batch_size", "outputs"} (a new model brings its own, as in the widget), "limits"}."""
    options = {
        "model": [[m, m] for m in [*MODELS, CUSTOM]], "custom": None,
        "precision": [[p, p] for p in PRECISION_CHOICES],
        "attention": [[a, a] for a in ATTENTIONS],
        "gpus": [[str(n), n] for n in GPU_CHOICES],
        "gpus_per_node": [[str(g), g] for g in GPUS_PER_NODE_CHOICES],
        "intra_link": [[x, x] for x in INTRA_NODE_LINKS],
        "inter_link": [[x, x] for x in INTER_NODE_LINKS],
        "gpu": [[x, x] for x in GPUS],
        "bucket_cap_mb": [[f"{c} (default)" if c == defaults.BUCKET_CAP_MB else str(c), c]
                          for c in BUCKET_CAP_CHOICES],
        "optimizer": [[label, value] for label, value in OPTIMIZERS],
        "batch_size": None, "outputs": None}
    return {"order": list(CONTROL_LABELS), "labels": dict(CONTROL_LABELS), "options": options,
            "defaults": {**DEFAULTS, **_defaults_for(DEFAULTS["model"])},
            "model_defaults": {m: _defaults_for(m) for m in [*MODELS, CUSTOM]},
            "limits": {"batch_size": [1, MAX_BATCH_SIZE], "outputs": [1, MAX_OUTPUTS]},
            "components": list(COMPONENTS), "curves": list(CURVE_NAMES.values()),
            "step_parts": list(STEP_PARTS), "strategies": list(STRATEGY_NAMES.values())}


def parse_whole_number(value, name: str, maximum: int) -> int:
    """A count typed into a field ("64", or an int) -> int in 1 .. maximum; the errors name
    ``name`` as ``scenario`` does ("batch_size must be >= 1, got 0")."""
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, str):
        if not re.fullmatch(r"[+-]?[0-9]{1,30}", text):
            shown = repr(text if len(text) <= 40 else text[:37] + "...")
            raise ValueError(f"{name} must be a whole number such as 64, got {shown}")
        text = int(text)
    number = check_int(text, name, 1)
    if number > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {_show(number)}")
    return number


def _choice(value, name: str, choices: list):
    """``value`` (or its text, as a page sends it) if it names one of ``choices``."""
    for choice in choices:
        if value == choice or (isinstance(value, str) and value == str(choice)):
            return choice
        if isinstance(choice, (int, float)) and isinstance(value, str):
            try:  # "25" and "25.0" both name the cap 25, as a page may write either
                if float(value) == choice:
                    return choice
            except ValueError:
                pass
    raise ValueError(f"{name} must be one of {[str(c) for c in choices]}, got {_show(value)}")


def settings_to_hash(settings: dict) -> str:
    """The settings that differ from the opening ones, as a URL fragment without '#':
    "model=Llama-2%207B&gpus=64" (a link to one case, e.g. from a slide)."""
    from urllib.parse import quote

    base = {**DEFAULTS, **_defaults_for(settings.get("model", DEFAULTS["model"]))}
    parts = []
    for name in CONTROL_LABELS:
        if name in settings and _text(settings[name]) != str(base[name]):
            parts.append(f"{name}={quote(_text(settings[name]), safe='')}")
    return "&".join(parts)


def settings_from_hash(fragment: str) -> dict:
    """The settings a URL fragment names (the inverse of ``settings_to_hash``); unknown names
    are ignored, values stay text (``explore`` checks them)."""
    from urllib.parse import unquote

    settings = {}
    for part in fragment.lstrip("#").split("&"):
        name, sep, value = part.partition("=")
        if sep and name in CONTROL_LABELS:
            settings[name] = unquote(value)
    return settings


def _plain(value):
    """NaN and infinities -> None, recursively, so that JSON (which has neither) carries the
    data (a field typed as inf comes back empty)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _text(value) -> str:
    """A text field's value as text; an integer too long for ``str`` is described instead."""
    if isinstance(value, int) and value.bit_length() > 200:
        return _show(value)
    return str(value)


def explore(settings: dict | None = None) -> dict:
    """Everything the explorer shows for one setting of its controls, as plain data.

    ``settings``: control name -> value (those of ``controls()``; text as a page sends it, or
    numbers); missing ones take the opening values, and a model's batch and outputs its own.
    Returns a JSON-able dict: "ok", "errors" (control -> the message the widget shows, for
    bad input), "settings" (checked: choices as values, text fields as typed), "hash" (for the
    URL), and when ok "readout" (``readout``), "sources", "volume" (bytes per step on the
    busiest link against n: "rows" {n, bytes, series} in B, "markers" at the chosen n, "n",
    "gpus_per_node"), "steps" (seconds per step: "parts", "communication", "labels" per row)
    and "memory" (bytes per GPU: "parts" per strategy and component, "totals" with fits,
    "capacity_bytes"). The page draws these and computes nothing.
    """
    if settings is not None and not isinstance(settings, dict):
        raise TypeError(f"settings must be a dict of control name -> value, got "
                        f"{type(settings).__name__}")
    raw = dict(settings or {})
    model_name = raw.get("model", DEFAULTS["model"])
    known = isinstance(model_name, str) and model_name in MODELS
    base = {**DEFAULTS, **_defaults_for(model_name if known else CUSTOM)}
    raw = {name: raw.get(name, base[name]) for name in CONTROL_LABELS}
    errors, checked = {}, {}
    choices = {name: [value for _, value in opts] for name, opts in controls()["options"].items()
               if opts is not None}
    for name, options in choices.items():
        try:
            checked[name] = _choice(raw[name], name, options)
        except ValueError as error:
            errors[name] = str(error)
            checked[name] = DEFAULTS.get(name, options[0])  # the form needs a valid choice
    for name, maximum in (("batch_size", MAX_BATCH_SIZE), ("outputs", MAX_OUTPUTS)):
        checked[name] = raw[name]
        try:
            checked[name] = parse_whole_number(raw[name], name, maximum)
        except (TypeError, ValueError) as error:
            errors[name] = str(error)
    checked["custom"] = _text(raw["custom"])
    model = None
    if "outputs" not in errors and "model" not in errors:
        try:
            model = model_for(checked["model"], checked["custom"], checked["outputs"])
        except (TypeError, ValueError) as error:
            errors["custom"] = str(error)
    out = {"ok": False, "errors": errors, "settings": checked,
           "hash": settings_to_hash(checked)}
    if errors:
        return _plain(out)
    intra, inter = INTERCONNECTS[checked["intra_link"]], INTERCONNECTS[checked["inter_link"]]
    gpu, precision = GPUS[checked["gpu"]], checked["precision"]
    try:
        s = scenario(model, precision, checked["gpus"], checked["gpus_per_node"], intra, inter,
                     gpu, bucket_cap_setting(checked["bucket_cap_mb"]), checked["optimizer"],
                     checked["batch_size"], checked["attention"])
    except (TypeError, ValueError) as error:  # e.g. n not a multiple of the node's GPUs
        out["errors"] = {_control_named(str(error), checked["model"]): str(error)}
        return _plain(out)
    out.update(ok=True, readout=readout(s, precision, intra, inter, gpu),
               sources=sources(model, gpu, precision, intra, inter),
               volume=_volume_data(s), steps=_step_data(s), memory=_memory_data(s))
    return _plain(out)


def _control_named(message: str, model: str) -> str:
    """The control a setting's refusal is about: the bucket cap (too many buckets for the
    model), the model's size at DDP's own caps, or else the GPUs (n against the node)."""
    if message.startswith("bucket_cap_mb"):
        return "bucket_cap_mb"
    if message.startswith("model.parameters"):
        return "custom" if model == CUSTOM else "model"
    return "gpus"


def _volume_data(s: dict) -> dict:
    rows = [{"n": n, "bytes": value, "series": CURVE_NAMES[key]}
            for key in ("dp_copy", "dp_nccl", "ddp")
            for n, value in zip(s["curve_gpus"], s[f"{key}_curve"], strict=True)
            if not math.isnan(value) and value > 0]
    n, markers = s["num_gpus"], []
    if n > 1:
        if s["dp_available"]:
            markers += [{"n": n, "bytes": s["dp_bytes"][path], "series": CURVE_NAMES[key]}
                        for key, path in (("dp_copy", "copy"), ("dp_nccl", "nccl"))]
        markers.append({"n": n, "bytes": s["ddp_allreduce_bytes"], "series": CURVE_NAMES["ddp"]})
    rules = [{"n": s["gpus_per_node"], "what": "one node (DP's limit)"},
             {"n": n, "what": f"the chosen n = {n}"}]
    return {"rows": rows, "markers": markers, "rules": rules, "n": n,
            "gpus_per_node": s["gpus_per_node"], "series": list(CURVE_NAMES.values())}


def _step_data(s: dict) -> dict:
    steps = s["steps"]
    names = [DP_COPY, DP_NCCL, s["ddp_name"]] + ([DDP_FLAT] if DDP_FLAT in steps else []) \
        + [HSDP]
    parts, communication, labels = [], [], []
    for order, name in enumerate(names):
        st = steps.get(name)
        if st is None:
            labels.append({"row": name, "order": order, "seconds": 0.0,
                           "label": f" {CANNOT_SPAN}"})
            continue
        parts += [{"row": name, "order": order, "part": STEP_PARTS[0], "stack": 0,
                   "seconds": st.compute_s},
                  {"row": name, "order": order, "part": STEP_PARTS[1], "stack": 1,
                   "seconds": st.exposed_communication_s}]
        communication.append({"row": name, "order": order, "seconds": st.communication_s})
        labels.append({"row": name, "order": order, "seconds": st.total_s,
                       "label": f" {format_seconds(st.total_s)}"})
    return {"rows": names, "parts": parts, "communication": communication, "labels": labels}


def _memory_data(s: dict) -> dict:
    parts, totals = [], []
    for key, strategy in STRATEGY_NAMES.items():
        components = s["memory"].get(key)
        if components is None:
            totals.append({"strategy": strategy, "bytes": 0.0, "fits": None, "label": "one node"})
            continue
        for component, value in components.items():
            if value > 0:  # stacked bottom to top in dpcost.memory.COMPONENTS' order
                parts.append({"strategy": strategy, "component": component,
                              "order": COMPONENTS.index(component), "bytes": float(value)})
        total, fit = total_bytes(components), s["fits"][key]
        totals.append({"strategy": strategy, "bytes": total, "fits": fit,
                       "label": f"{format_bytes(total, digits=3)} {'✓' if fit else '✗'}"})
    return {"strategies": list(STRATEGY_NAMES.values()), "parts": parts, "totals": totals,
            "capacity": [{"bytes": s["capacity_bytes"], "what": "GPU capacity"}],
            "capacity_bytes": s["capacity_bytes"]}


def explore_json(settings_json: str) -> str:
    """``explore`` for a caller that speaks JSON (the page's Web Worker): JSON in, JSON out.

    Nothing raises: an unexpected error comes back as {"ok": false, "errors": {"": message}}
    so that the page shows it and the worker keeps running."""
    import json

    try:
        result = explore(json.loads(settings_json))
    except Exception as error:  # noqa: BLE001 - the worker must answer every request
        result = {"ok": False, "errors": {"": f"{type(error).__name__}: {error}"}}
    return json.dumps(result, allow_nan=False)
