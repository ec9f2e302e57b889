"""What one CUDA GPU measurably does in a training step, beside dpcost.gpu_time's prediction.

It measures what the H200 calibration measured (``benchmarks/results/calibrate_h200.py`` and
``calibrate2_h200.py``; the fit is ``benchmarks/gpu_time_fit.py``) and prints the model's
prediction beside each, as one table (measured, predicted, measured / predicted):

- launch: the host's cost of one tiny op launched from Python (``x.add_(1)`` in a loop),
  beside ``HOST_OP_S`` (a step's host cost per op: the module's Python, autograd and the
  dispatcher come with each op, so a bare loop is expected below it; the H200: 10 us, 20 us);
- kernels: CUDA kernels of one forward + backward (``torch.profiler``) beside the non-view aten
  ops that ``benchmarks/gpu_time_counts.py``'s ``count`` finds on the CPU, the GPU's busy time
  beside the model's device clock, the wall time beside its step, and the model's bound;
- steps: forward + backward by model, batch and precision (fp32, bf16 autocast), timed with CUDA
  events, beside ``compute_time(...).total_s`` (FLOPs from ``FlopCounterMode`` on the step
  itself, ops, convolutions, their FLOP share and the saved activations from ``count``);
- ddp: DDP's own cost at world size 1 (NCCL): DDP with the default, 1 MiB and 100 MiB bucket
  caps less the plain model, in interleaved rounds, beside ``ddp_host_seconds``;
- replicate: DataParallel's ``replicate(module, [0])`` and ``[0, 0]`` beside
  ``replicate_seconds``.

The models are those of the calibration (``dpcost.torch_models``, loss ``y.float().sum()``).
Every step sets the gradients to None after backward (calibrate_h200.py's step, and what the
CPU counts see), except DDP's rounds, which accumulate them as calibrate2_h200.py's did (the
rounds that fitted DDP's constants). The GPU's figures are ``dpcost.presets.GPUS``'s when the
device's name contains H200, H100, A100 or V100, else those given with ``--gpu-tflops``,
``--gpu-tflops-fp32`` and ``--gpu-bandwidth`` (flagged in the table as given by the user; given,
they win over a preset). ``--budget-s`` skips what does not fit, saying so; the tables are
written after every section, so a run cut short still leaves what it measured.

The one prepared command for a GPU session (repository root, torch with CUDA): this table and
``benchmarks/gpu_memory_check.py``'s, within about 8 minutes by their budgets (240 s and 200 s,
plus imports and the item running when a budget ends; not yet run on a GPU). ``;``, so that the
second runs even if a row of the first fails:

    PYTHONPATH=. python3 benchmarks/gpu_time_check.py --budget-s 240 \\
        --json $OUT/gpu_time.json --markdown $OUT/gpu_time.md ; \\
    PYTHONPATH=. python3 benchmarks/gpu_memory_check.py --budget-s 200 \\
        --json $OUT/gpu_memory.json --markdown $OUT/gpu_memory.md

The CPU dry run (``--dry-run``, or any machine without CUDA; ``tests/test_gpu_time_check.py``
runs it): every section's code on the CPU, the small CNN and the encoder at batch 2 (DDP: the
small CNN only), gloo for DDP, the profiler's CPU events for kernels, ``replicate`` skipped (it
copies to CUDA devices); predictions for the H200 preset unless GPU figures are given. Its
times are not GPU times.

    .venv/bin/python benchmarks/gpu_time_check.py --dry-run --json /tmp/t.json --markdown /tmp/t.md
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch

# Import torch._dynamo BEFORE init_process_group: DDP's constructor imports it, and importing it
# after the default group exists makes torch/distributed/nn/functional.py's group=group.WORLD
# defaults hold that group forever (/work/shared/DESIGN.md, the PyTorch bug note).
import torch._dynamo  # noqa: F401 - imported for its side effect, before any process group
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.parallel import replicate
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from dpcost import gpu_time
from dpcost import torch_models as tm
from dpcost.presets import GPUS, GPUPreset

DRY_RUN_LABEL = "CPU dry run: times are not GPU times"
SECTIONS = ("launch", "kernels", "steps", "ddp", "replicate")
PRESET_KEYS = ("H200", "H100", "A100", "V100")  # a device name containing one takes its preset
COUNTS_SCRIPT = Path(__file__).resolve().parent / "gpu_time_counts.py"


def _load_counts():
    """benchmarks/gpu_time_counts.py as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gpu_time_counts", COUNTS_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_counts_module = _load_counts()
_counted: dict = {}


def counts(name: str, amp: bool) -> dict:
    """``gpu_time_counts.count(name, amp)``, once per run (a few seconds each for GPT-2)."""
    if (name, amp) not in _counted:
        _counted[name, amp] = _counts_module.count(name, amp)
    return _counted[name, amp]


# The calibration's models: builder and input of a batch (dpcost.torch_models, as calibrate_h200).
MODELS = {
    "ResNet-50": (tm.resnet50, lambda b, d: torch.randn(b, 3, 224, 224, device=d)),
    "GPT-2 small": (lambda: tm.GPT2(tm.GPT2_CONFIGS["GPT-2 small"]),
                    lambda b, d: torch.randint(0, 50257, (b, 1024), device=d)),
    "small CNN": (tm.small_cnn, lambda b, d: torch.randn(b, 3, 32, 32, device=d)),
    "encoder d256x4": (lambda: tm.transformer_encoder(256, 4),
                       lambda b, d: torch.randn(b, 512, 256, device=d)),
}


@dataclass(frozen=True)
class Plan:
    """What one run measures, and how many repetitions each timing takes."""

    kernels: tuple  # (model, batch, amp): calibrate2_h200.py's
    steps: tuple  # (model, batches): calibrate_h200.py's, each in fp32 and bf16 autocast
    ddp: tuple  # (model, batch, amp)
    replicate: tuple  # model names
    launch_ops: int
    warm: int
    timed: int
    ddp_warm: int  # >= 2: DDP rebuilds its buckets in the second forward
    ddp_rounds: int
    ddp_steps: int  # per round and variant


GPU_PLAN = Plan(
    kernels=(("ResNet-50", 8, False), ("ResNet-50", 32, False), ("GPT-2 small", 1, True),
             ("GPT-2 small", 4, True), ("small CNN", 32, False), ("small CNN", 256, False),
             ("encoder d256x4", 8, True)),
    steps=(("ResNet-50", (8, 32, 128)), ("GPT-2 small", (1, 4, 8)), ("small CNN", (32, 256)),
           ("encoder d256x4", (8,))),
    ddp=(("ResNet-50", 32, False), ("GPT-2 small", 4, True)),
    replicate=("ResNet-50", "GPT-2 small"),
    launch_ops=20000, warm=3, timed=10, ddp_warm=4, ddp_rounds=6, ddp_steps=5)
DRY_PLAN = Plan(
    kernels=(("small CNN", 2, False), ("encoder d256x4", 2, True)),
    steps=(("small CNN", (2,)), ("encoder d256x4", (2,))),
    # the small CNN's DDP (with buffers) runs the same code; the encoder's rounds would take
    # 6 s more here (16 steps of 0.4 s)
    ddp=(("small CNN", 2, False),),
    replicate=("small CNN", "encoder d256x4"),
    # warm 0: the step whose FLOPs are counted is the dry run's warm-up
    launch_ops=2000, warm=0, timed=2, ddp_warm=2, ddp_rounds=2, ddp_steps=1)


# --- the GPU's figures ------------------------------------------------------------------------


def choose_gpu(device_name: str, cuda: bool, tflops=None, tflops_fp32=None, bandwidth_gbs=None,
               tflops_tf32=None, memory_bytes: float = 0.0) -> tuple[GPUPreset, str]:
    """The GPU the predictions are for, and where its figures come from.

    Figures given (all three) win; else the preset whose key the device's name contains; else,
    on a CPU dry run, the H200 (the GPU the constants were fitted on). A CUDA device without a
    preset and without figures is a ValueError naming the options."""
    given = {"--gpu-tflops": tflops, "--gpu-tflops-fp32": tflops_fp32,
             "--gpu-bandwidth": bandwidth_gbs}
    if any(v is not None for v in given.values()) or tflops_tf32 is not None:
        missing = [k for k, v in given.items() if v is None]
        if missing:
            raise ValueError(f"GPU figures need {', '.join(missing)} too")
        for option, value in {**given, "--gpu-tflops-tf32": tflops_tf32}.items():
            if value is not None and not value > 0:
                raise ValueError(f"{option} must be > 0, got {value}")
        tf32 = tflops_tf32 if tflops_tf32 is not None else tflops_fp32
        gpu = GPUPreset(
            name=f"{device_name} (figures given by the user)",
            peak_flops={"bf16": tflops * 1e12, "fp16": tflops * 1e12, "tf32": tf32 * 1e12,
                        "fp32": tflops_fp32 * 1e12},
            memory_bytes=memory_bytes, memory_bandwidth_bytes_per_s=bandwidth_gbs * 1e9,
            source="given by the user")
        how = (f"GIVEN BY THE USER: --gpu-tflops {tflops} (bf16/fp16 dense), --gpu-tflops-fp32 "
               f"{tflops_fp32}, --gpu-tflops-tf32 {tf32}"
               + ("" if tflops_tf32 is not None else " (not given: fp32's, no TF32 cores)")
               + f", --gpu-bandwidth {bandwidth_gbs} GB/s")
        return gpu, how
    for key in PRESET_KEYS:
        if key in device_name.upper():
            name = next(n for n in GPUS if n.startswith(key))
            return GPUS[name], (f"dpcost.presets.GPUS[{name!r}] (the device's name contains "
                                f"{key!r})")
    if not cuda:
        return GPUS["H200 SXM 141GB"], ("dpcost.presets.GPUS['H200 SXM 141GB'] (a CPU dry run "
                                        "predicts the GPU the constants were fitted on)")
    raise ValueError(f"the device {device_name!r} matches no preset ({', '.join(PRESET_KEYS)}): "
                     "give its figures with --gpu-tflops, --gpu-tflops-fp32 and --gpu-bandwidth")


# --- measuring --------------------------------------------------------------------------------


class Budget:
    """Skips what would not fit: the run so far plus its longest item must stay in budget."""

    def __init__(self, seconds: float):
        self.seconds, self.started, self.longest = seconds, time.perf_counter(), 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def skip_reason(self) -> str | None:
        if self.elapsed() + self.longest > self.seconds:
            return (f"time budget of {self.seconds:g} s: {self.elapsed():.0f} s spent, the "
                    f"longest item so far took {self.longest:.1f} s")
        return None

    def took(self, seconds: float) -> None:
        self.longest = max(self.longest, seconds)


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def median_ms(fn, cuda: bool, timed: int, warm: int) -> float:
    """Median of ``timed`` calls after ``warm``: CUDA events on a GPU, perf_counter on a CPU."""
    for _ in range(warm):
        fn()
    _sync(cuda)
    times = []
    for _ in range(timed):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def step_fn(model, x, amp: bool, device_type: str, grads_to_none: bool = True):
    """One forward + backward with calibrate_h200.py's loss."""
    def step():
        with torch.autocast(device_type, torch.bfloat16, enabled=amp):
            loss = model(x).float().sum()
        loss.backward()
        if grads_to_none:
            for p in model.parameters():
                p.grad = None
    return step


class Run:
    """One run's device, models, FLOP counts and rows."""

    def __init__(self, device, plan: Plan, gpu: GPUPreset, budget: Budget):
        self.device, self.plan, self.gpu, self.budget = device, plan, gpu, budget
        self.cuda = device.type == "cuda"
        self.models: dict = {}
        self.flops: dict = {}
        self.rows: list[dict] = []

    def model(self, name: str):
        if name not in self.models:
            torch.manual_seed(0)
            self.models[name] = MODELS[name][0]().to(self.device)
        return self.models[name]

    def inputs(self, name: str, batch: int):
        torch.manual_seed(1)
        return MODELS[name][1](batch, self.device)

    def counted_flops(self, name: str, batch: int, amp: bool, step) -> int:
        """FLOPs of one forward + backward, counted (FlopCounterMode) on a real step here."""
        if (name, batch, amp) not in self.flops:
            with FlopCounterMode(display=False) as counter:
                step()
            self.flops[name, batch, amp] = counter.get_total_flops()
        return self.flops[name, batch, amp]

    def predict(self, name: str, batch: int, amp: bool):
        """compute_time of one forward + backward, and the inputs it was given."""
        c = counts(name, amp)
        inputs = {"flops": self.flops[name, batch, amp],
                  "activation_bytes": c["saved_bytes_per_sample"] * batch, "ops": c["ops"],
                  "precision": "bf16" if amp else "fp32", "conv_share": c["conv_flops_share"],
                  "convolutions": c["convolutions"], "forward_ops": c["forward_ops"]}
        t = gpu_time.compute_time(inputs["flops"], inputs["activation_bytes"], inputs["ops"],
                                  self.gpu, inputs["precision"], conv_share=inputs["conv_share"],
                                  convolutions=inputs["convolutions"],
                                  forward_ops=inputs["forward_ops"])
        return t, inputs

    def add(self, section: str, what: str, unit: str, measured, predicted, *, status="ok",
            note="", bound=None, inputs=None, **fields) -> dict:
        ratio = (measured / predicted if measured is not None and predicted else None)
        row = {"section": section, "what": what, "unit": unit, "measured": measured,
               "predicted": predicted, "ratio": ratio, "bound": bound, "status": status,
               "note": note, "inputs": inputs or {}, **fields}
        self.rows.append(row)
        print(_row_line(row), flush=True)
        return row

    def attempt(self, fn):
        """Run one item within the budget: (result, None), or (None, (status, why))."""
        reason = self.budget.skip_reason()
        if reason:
            return None, ("skipped", reason)
        t = time.perf_counter()
        try:
            return fn(), None
        except torch.cuda.OutOfMemoryError as exc:
            return None, ("out of memory", _first_line(exc))
        except Exception as exc:  # noqa: BLE001  (a GPU run must report every item)
            return None, ("error", _first_line(exc))
        finally:
            self.budget.took(time.perf_counter() - t)
            if self.cuda:
                torch.cuda.empty_cache()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _bound(t) -> str:
    return f"{t.bound} (host {t.host_s * 1e3:.3g} ms, device {t.device_s * 1e3:.3g} ms)"


def _label(name: str, batch: int, amp: bool) -> str:
    return f"{name} b{batch} {'bf16 autocast' if amp else 'fp32'}"


# --- the sections -----------------------------------------------------------------------------


def launch_section(run: Run) -> None:
    def measure():
        x = torch.zeros(1, device=run.device)
        for _ in range(run.plan.launch_ops // 20):
            x.add_(1)
        _sync(run.cuda)
        t = time.perf_counter()
        for _ in range(run.plan.launch_ops):
            x.add_(1)
        _sync(run.cuda)
        return (time.perf_counter() - t) / run.plan.launch_ops * 1e6

    us, failed = run.attempt(measure)
    run.add("launch", f"one tiny op from Python (x.add_(1) x {run.plan.launch_ops})", "us", us,
            gpu_time.HOST_OP_S * 1e6, status=failed[0] if failed else "ok",
            note=failed[1] if failed else "predicted: HOST_OP_S, a step's host cost per op "
            "(module, autograd, dispatcher); a bare loop carries less of it")


def kernels_section(run: Run) -> None:
    cuda = run.cuda
    for name, batch, amp in run.plan.kernels:
        label = _label(name, batch, amp)

        def measure(name=name, batch=batch, amp=amp):
            step = step_fn(run.model(name), run.inputs(name, batch), amp, run.device.type)
            run.counted_flops(name, batch, amp, step)
            for _ in range(run.plan.warm):
                step()
            _sync(cuda)
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            with profile(activities=activities) as prof:
                step()
                _sync(cuda)
            kind = "CUDA" if cuda else "CPU"
            events = [e for e in prof.events() if str(e.device_type).endswith(kind)]
            busy_us = sum(e.device_time_total if cuda else e.self_cpu_time_total
                          for e in events)
            _sync(cuda)
            t = time.perf_counter()
            for _ in range(run.plan.timed):
                step()
            _sync(cuda)
            wall_ms = (time.perf_counter() - t) / run.plan.timed * 1e3
            return len(events), busy_us / 1e3, wall_ms

        result, failed = run.attempt(measure)
        status, why = failed or ("ok", "")
        kernels = busy = wall = ops = device_ms = total_ms = bound = None
        inputs, share = {}, ""
        if result is not None:
            kernels, busy, wall = result
            t, inputs = run.predict(name, batch, amp)
            ops, device_ms, total_ms = inputs["ops"], t.device_s * 1e3, t.total_s * 1e3
            bound = _bound(t)
            share = f"; busy {busy / wall:.0%} of wall" if wall else ""
        common = {"model": name, "batch": batch, "amp": amp, "bound": bound, "inputs": inputs,
                  "status": status}
        run.add("kernels", f"{label}: {'CUDA kernels' if cuda else 'profiler CPU events'} "
                "per forward+backward", "kernels" if cuda else "events", kernels, ops,
                note=why or "predicted: non-view aten ops counted on the CPU "
                "(gpu_time_counts.count)", **common)
        run.add("kernels", f"{label}: {'GPU busy' if cuda else 'CPU op self time'}", "ms", busy,
                device_ms, note=why or f"predicted: the model's device clock{share}", **common)
        run.add("kernels", f"{label}: wall (perf_counter, {run.plan.timed} steps)", "ms", wall,
                total_ms, note=why or "predicted: compute_time(...).total_s", **common)


def steps_section(run: Run) -> None:
    for name, batches in run.plan.steps:
        for batch in batches:
            for amp in (False, True):
                def measure(name=name, batch=batch, amp=amp):
                    step = step_fn(run.model(name), run.inputs(name, batch), amp,
                                   run.device.type)
                    run.counted_flops(name, batch, amp, step)
                    return median_ms(step, run.cuda, run.plan.timed, run.plan.warm)

                ms, failed = run.attempt(measure)
                status, why = failed or ("ok", "")
                predicted, inputs, bound = None, {}, None
                if ms is not None:
                    t, inputs = run.predict(name, batch, amp)
                    predicted = t.total_s * 1e3
                    bound = _bound(t)
                timer = "CUDA events" if run.cuda else "perf_counter"
                run.add("steps", f"{_label(name, batch, amp)} forward+backward", "ms", ms,
                        predicted, status=status, bound=bound, inputs=inputs,
                        note=why or f"median of {run.plan.timed} ({timer}); FLOPs "
                        "counted on this step", model=name, batch=batch, amp=amp)


def _buckets(ddp) -> int:
    """DDP's buckets after its rebuild (its logging data's sizes, as calibrate_h200.py read)."""
    data = ddp._get_ddp_logging_data()
    sizes = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes")
    if sizes:
        return len(str(sizes).split(","))
    return len(ddp.reducer._get_zeros_like_grad_buckets())


DDP_CAPS = {"default": None, "1 MiB": 1, "100 MiB": 100}  # bucket_cap_mb


def ddp_section(run: Run) -> None:
    backend = "nccl" if run.cuda else "gloo"
    try:
        store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)  # port 0: a free port
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
    except Exception as exc:  # noqa: BLE001  (the other sections' rows must still come back)
        for name, batch, amp in run.plan.ddp:
            run.add("ddp", f"{_label(name, batch, amp)}: DDP's own cost", "ms", None, None,
                    status="error", note=f"init_process_group({backend!r}): "
                    f"{_first_line(exc)}", model=name, batch=batch, amp=amp)
        return
    try:
        for name, batch, amp in run.plan.ddp:
            def measure(name=name, batch=batch, amp=amp):
                plain = run.model(name)
                variants = {"plain": plain}
                for cap_name, cap in DDP_CAPS.items():
                    torch.manual_seed(0)
                    copy = MODELS[name][0]().to(run.device)
                    copy.load_state_dict(plain.state_dict())
                    variants[cap_name] = DDP(copy, bucket_cap_mb=cap) if cap else DDP(copy)
                x = run.inputs(name, batch)
                steps = {k: step_fn(v, x, amp, run.device.type, grads_to_none=False)
                         for k, v in variants.items()}
                for step in steps.values():
                    for _ in range(run.plan.ddp_warm):
                        step()
                times = {k: [] for k in steps}
                for _ in range(run.plan.ddp_rounds):  # interleaved: drifts hit every variant
                    for k, step in steps.items():
                        _sync(run.cuda)
                        t = time.perf_counter()
                        for _ in range(run.plan.ddp_steps):
                            step()
                        _sync(run.cuda)
                        times[k].append((time.perf_counter() - t) / run.plan.ddp_steps * 1e3)
                for p in plain.parameters():
                    p.grad = None
                ms = {k: statistics.median(v) for k, v in times.items()}
                return ms, {k: _buckets(variants[k]) for k in DDP_CAPS}

            result, failed = run.attempt(measure)
            gc.collect()  # the DDP copies' reference cycles, before the next model's
            status, why = failed or ("ok", "")
            module = run.model(name)
            tensors = sum(p.requires_grad for p in module.parameters())
            buffers = sum(1 for _ in module.buffers())
            for cap_name in DDP_CAPS:
                measured = predicted = None
                inputs = {"tensors": tensors, "buffers": buffers}
                note = why
                if result is not None:
                    ms, buckets = result
                    measured = ms[cap_name] - ms["plain"]
                    inputs["buckets"] = buckets[cap_name]
                    predicted = gpu_time.ddp_host_seconds(tensors, buffers,
                                                          buckets[cap_name]) * 1e3
                    note = (f"DDP {ms[cap_name]:.2f} ms - plain {ms['plain']:.2f} ms, median "
                            f"of {run.plan.ddp_rounds} interleaved rounds of "
                            f"{run.plan.ddp_steps}; {backend}")
                run.add("ddp", f"{_label(name, batch, amp)}: DDP's own cost, bucket cap "
                        f"{cap_name} (buckets: {inputs.get('buckets', '?')})", "ms", measured,
                        predicted, status=status, note=note, inputs=inputs, model=name,
                        batch=batch, amp=amp, cap=cap_name)
    finally:
        dist.destroy_process_group()



def replicate_section(run: Run) -> None:
    for name in run.plan.replicate:
        module = run.model(name)
        tensors = list(module.parameters()) + list(module.buffers())
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        for devices in ([0], [0, 0]):
            if run.cuda:
                ms, failed = run.attempt(lambda m=module, d=devices: median_ms(
                    lambda: replicate(m, d), True, run.plan.timed, run.plan.warm))
            else:
                ms, failed = None, ("skipped", "replicate() copies to CUDA devices "
                                    "(comm.broadcast_coalesced); a CPU has none")
            status, why = failed or ("ok", "")
            predicted = gpu_time.replicate_call_seconds(len(tensors), nbytes, len(devices)) * 1e3
            run.add("replicate", f"{name}: replicate(module, {devices})", "ms", ms, predicted,
                    status=status, inputs={"tensors": len(tensors), "bytes": nbytes,
                                           "devices": len(devices)},
                    note=why or f"median of {run.plan.timed}; predicted: replicate_seconds"
                    + (" at one device (its line extended: DataParallel skips replicate there)"
                       if len(devices) == 1 else ""), model=name)


# --- output -----------------------------------------------------------------------------------


def _num(x, unit: str) -> str:
    if x is None:
        return "-"
    if unit in ("kernels", "events"):
        return f"{x:,.0f}"
    return f"{x:.3g}" if abs(x) < 10 else f"{x:,.1f}"


def _row_line(row: dict) -> str:
    ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
    return (f"{row['section']:<9} {row['what']:<70} measured {_num(row['measured'], row['unit'])}"
            f" {row['unit']}, predicted {_num(row['predicted'], row['unit'])}, ratio {ratio}, "
            f"{row['status']}")


def markdown(report: dict) -> str:
    lines = []
    if report["dry_run"]:
        lines += [f"**{DRY_RUN_LABEL}.** The CPU ran every section's code at tiny sizes; the "
                  "predictions are for the GPU named below.", ""]
    lines += [
        f"Measured on {report['device']}, torch {report['torch']} (CUDA {report['cuda']}), "
        f"{report['date_utc']}, command `{report['command']}` ({report['seconds']} s, budget "
        f"{report['budget_s']:g} s). Predicted by dpcost.gpu_time ({report['calibration']}) for "
        f"{report['gpu']}, figures from {report['gpu_source']}. TF32: matmul "
        f"{report['matmul_allow_tf32']}, cuDNN {report['cudnn_allow_tf32']} (the model assumes "
        "torch's defaults: False, True). GB = 10^9 bytes.", "",
        "| section | what | unit | measured | predicted | measured / predicted "
        "| model's bound | status | note |",
        "|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        cells = [r["section"], r["what"], r["unit"], _num(r["measured"], r["unit"]),
                 _num(r["predicted"], r["unit"]), ratio, r["bound"] or "-", r["status"],
                 r["note"]]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    lines += ["", "Sections: " + "; ".join(f"{k}: {v}" for k, v in SECTION_NOTES.items()), ""]
    return "\n".join(lines)


SECTION_NOTES = {
    "launch": "a bare in-place op from a Python loop, synchronised at the end",
    "kernels": "one profiled forward + backward; the model counts non-view aten ops (each a "
               "launch) and its bound is the later of its host and device clocks",
    "steps": "forward + backward, gradients set to None; predicted compute_time(...).total_s",
    "ddp": "world size 1, so every cost is DDP's own (hooks, bucket copies, one collective per "
           "bucket, buffer broadcast); host work, it lengthens a step only where the host is "
           "the later clock",
    "replicate": "DataParallel's per-forward copy of the module, to one device and twice to "
                 "the same device",
}


def write(report: dict, json_path, markdown_path) -> None:
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=1))
    if markdown_path:
        Path(markdown_path).write_text(markdown(report))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="run on the CPU at tiny sizes (automatic without CUDA)")
    parser.add_argument("--json", metavar="FILE", help="write the report as JSON")
    parser.add_argument("--markdown", metavar="FILE", help="write the table as Markdown")
    parser.add_argument("--budget-s", type=float, default=240.0,
                        help="skip what would not fit in this many seconds (default 240)")
    parser.add_argument("--only", choices=SECTIONS, action="append",
                        help="run only this section (repeatable)")
    parser.add_argument("--gpu-tflops", type=float, help="dense bf16/fp16 TFLOP/s of the GPU "
                        "(with --gpu-tflops-fp32 and --gpu-bandwidth: wins over a preset)")
    parser.add_argument("--gpu-tflops-fp32", type=float, help="fp32 TFLOP/s of the GPU")
    parser.add_argument("--gpu-tflops-tf32", type=float,
                        help="dense TF32 TFLOP/s (default: the fp32 figure, no TF32 cores)")
    parser.add_argument("--gpu-bandwidth", type=float, help="memory bandwidth, GB/s (10^9)")
    args = parser.parse_args(argv)
    if not args.budget_s > 0:
        parser.error(f"--budget-s must be > 0, got {args.budget_s}")
    dry_run = args.dry_run or not torch.cuda.is_available()
    if dry_run:
        device, name, memory = torch.device("cpu"), "cpu", 0.0
        torch.set_num_threads(1)  # tiny shapes, and polite on a shared machine
        if not args.dry_run:
            print("no CUDA device: a CPU dry run", flush=True)
    else:
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
        name = torch.cuda.get_device_name(device)
        memory = float(torch.cuda.get_device_properties(device).total_memory)
    try:
        gpu, gpu_source = choose_gpu(name, not dry_run, args.gpu_tflops, args.gpu_tflops_fp32,
                                     args.gpu_bandwidth, args.gpu_tflops_tf32, memory)
    except ValueError as exc:
        parser.error(str(exc))
    budget = Budget(args.budget_s)
    run = Run(device, DRY_PLAN if dry_run else GPU_PLAN, gpu, budget)
    report = {
        "command": shlex.join(["python3", *sys.argv]),
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "device": name if dry_run else f"cuda:0 ({name}, {memory / 1e9:.1f} GB)",
        "dry_run": dry_run, "label": DRY_RUN_LABEL if dry_run else "",
        "gpu": gpu.name, "gpu_source": gpu_source,
        "gpu_figures": {"peak_flops": gpu.peak_flops,
                        "memory_bandwidth_bytes_per_s": gpu.memory_bandwidth_bytes_per_s},
        "calibration": gpu_time.CALIBRATION, "budget_s": args.budget_s,
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "rows": run.rows, "seconds": 0.0}
    sections = {"launch": launch_section, "kernels": kernels_section, "steps": steps_section,
                "ddp": ddp_section, "replicate": replicate_section}
    for section, fn in sections.items():
        if args.only and section not in args.only:
            continue
        fn(run)
        report["seconds"] = round(budget.elapsed(), 1)
        write(report, args.json, args.markdown)  # a run cut short keeps what it measured
    report["seconds"] = round(budget.elapsed(), 1)
    write(report, args.json, args.markdown)
    for path in (args.json, args.markdown):
        if path:
            print(f"wrote {path}")
    statuses = [r["status"] for r in run.rows]
    print(f"{len(statuses)} rows in {report['seconds']} s: "
          + ", ".join(f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses)))
    return 1 if "error" in statuses else 0


if __name__ == "__main__":
    sys.exit(main())
