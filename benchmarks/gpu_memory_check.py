"""One DDP training step's peak GPU memory, measured, beside dpcost.memory's prediction.

The one command for a session with a GPU (run in the repository root; needs torch with CUDA
and nothing beyond the repository; ``--budget-s`` (270 s) caps the cases, so one run stays
under 5 minutes):

    PYTHONPATH=. python3 benchmarks/gpu_memory_check.py --json $OUT/gpu_memory.json \\
        --markdown $OUT/gpu_memory.md

The CPU dry run (gloo, tiny shapes, the same code path up to the CUDA allocator's readings;
a few seconds; ``tests/test_gpu_memory_check.py`` runs it):

    .venv/bin/python benchmarks/gpu_memory_check.py --device cpu --tiny --json /tmp/gpu.json

What it runs: world size 1, one process, backend NCCL on CUDA (gloo on CPU), the models of
``dpcost.torch_models`` (ResNet-50 at 224 x 224, GPT-2 small and GPT-2 XL at their 1024-token
context, each checked to have its preset's exact parameter count), every precision mode of
``dpcost.memory.PRECISION_MODES`` and, for GPT-2, both attention kinds. Each case builds the
model, wraps it in ``DistributedDataParallel`` (defaults: ``gradient_as_bucket_view=False``),
runs two warm-up steps (Adam creates its state, NCCL its communicator; the second rebuilds
DDP's buckets, ``Reducer::rebuild_buckets``) and then measures the peak of the third step with
``torch.cuda.max_memory_allocated`` minus what was allocated before the model was built (the
input batch is left out, as the model leaves it out). Before each reading the allocator is
settled: ProcessGroupNCCL keeps a collective's tensors (DDP's buckets) alive until its
watchdog retires the work, so without waiting the previous case's buckets sit in the baseline
and are freed during the next case (the H200 run of 2026-12-04, which measured the second step
without settling, read "between steps" up to 3.6 GB below the live tensors' census). The
prediction is ``dpcost.memory.step_peak`` of ``rank_memory(..., num_gpus=1, strategy="ddp",
optimizer="adam")``'s components (the same precision, attention and batch), with the model's
layers, Adam's foreach temporaries and autocast's cast cache; the ratio is measured / predicted
peak. A case that runs out of memory is reported as such and the run goes on.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.util
import json
import math
import shlex
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

import torch

# Import torch._dynamo BEFORE init_process_group: DDP's constructor imports it, and importing it
# after the default group exists makes torch/distributed/nn/functional.py's group=group.WORLD
# defaults hold that group forever (destroy_process_group cannot free it; gloo threads can then
# abort the process at exit).
import torch._dynamo  # noqa: F401 - imported for its side effect, before any process group
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.parallel import DistributedDataParallel as DDP

from dpcost.memory import (
    COMPONENTS,
    PRECISION_MODES,
    PRECISIONS,
    autocast_cast_cache_bytes,
    even_layers,
    model_state_bytes_per_parameter,
    optimizer_temporary_bytes,
    rank_memory,
    rank_step_peak,
    resnet50_activation_bytes,
    step_peak,
    total_bytes,
    transformer_layer_activation_bytes,
)
from dpcost.presets import MODELS, custom_model
from dpcost.torch_models import GPT2, GPT2_CONFIGS, GPT2Config, count_parameters, resnet50

CPU_FP16_CONV = ("on CPU only: fp16 convolutions have no fast CPU kernel (5-9 s per step "
                 "here); the fp16 step is the bf16 step with torch.float16, which the GPT-2 "
                 "cases run")
CENSUS = ("parameters", "gradients", "optimizer state", "DDP bucket copy")
# The dtype the model is cast to (autocast keeps fp32 parameters and casts per op).
DTYPES = {"fp32": torch.float32, "mixed": torch.bfloat16, "autocast": torch.float32,
          "bf16": torch.bfloat16, "fp16": torch.float16}

# What each precision mode's step runs, so that it holds what dpcost.memory's mode counts.
STEPS = {
    "fp32": "fp32 parameters, gradients, activations and DDP buckets; torch.optim.Adam on the "
            "parameters (fp32 exp_avg and exp_avg_sq): 4 + 4 + 8 B per parameter",
    "mixed": "the model cast to bf16 (parameters, gradients, activations, logits and DDP "
             "buckets bf16); an fp32 master copy of every parameter; torch.optim.Adam (fp32 "
             "moments) on the master copy, one parameter at a time: its bf16 gradient is cast "
             "to fp32, stepped, freed, and the result copied into the bf16 parameter (the ZeRO "
             "paper's Sec. 3.1 layout, 2 + 2 + 12 B per parameter)",
    "autocast": "PyTorch's mixed precision: fp32 parameters, gradients and DDP buckets (the "
                "all-reduce in fp32); forward and loss under torch.autocast(device, "
                "torch.bfloat16) with its weight cast cache (bf16 matmul/conv outputs, fp32 "
                "layer norm, softmax and log-softmax); torch.optim.Adam on the fp32 parameters: "
                "4 + 4 + 8 B per parameter",
    "bf16": "pure bf16: the model cast to bf16 and torch.optim.Adam on its parameters (bf16 "
            "moments, zeros_like(param) in torch/optim/adam.py): 2 + 2 + 4 B per parameter",
    "fp16": "pure fp16, as bf16 with torch.float16, Adam's eps 1e-4 (1e-8 is 0 in fp16) and "
            "no loss scaling (memory only): 2 + 2 + 4 B per parameter",
}

INCLUDED_NOT_MODELLED = [
    "transients beyond the model's per-layer pair (the gradient flowing into an op and the one "
    "it makes): eager attention's unmasked and masked s x s scores in forward, matmul and GeLU "
    "outputs before autograd frees them",
    "cuBLAS and cuDNN workspaces, which PyTorch takes from its caching allocator",
    "allocator rounding: every block is rounded up to a multiple of 512 B "
    "(c10/cuda/CUDACachingAllocator.cpp: round_size)",
    "small saved tensors outside the model's count: the layer norms' mean and rstd (4 s b "
    "values per layer), the embedding dropout's mask and output, the causal mask (s x s bool, "
    "shared by the layers), BatchNorm's running stats (buffers) and saved mean and invstd",
]
NOT_IN_MEASUREMENT = [
    "the CUDA context and the loaded kernels (a few hundred MB per GPU; not in "
    "max_memory_allocated, see nvidia-smi)",
    "NCCL's communicator buffers (allocated by NCCL with cudaMalloc, outside the caching "
    "allocator)",
    "the allocator's cached but free blocks and fragmentation (memory_reserved minus "
    "memory_allocated)",
    "the input batch (allocated before the baseline reading, as the model leaves it out)",
]
MODEL_UPPER_BOUND = (
    "The prediction is dpcost.memory.step_peak: the largest of the end of forward (activations, "
    "logits and log-softmax's output), the start of backward (log-softmax's output, its "
    "gradient and the logits' gradient), backward layer by layer (activations freed as the "
    "layers' gradients appear, plus the gradients flowing through the layer) and the optimizer "
    "step (gradients and Adam's foreach temporaries: one state-sized exp_avg_sq_sqrt, one "
    "tensor's in mixed); the sum of every component (the former prediction) is shown beside "
    "it")


@dataclass(frozen=True)
class Spec:
    """One model at one size: how to build it, its batch and what the prediction needs."""

    name: str  # the dpcost.presets.MODELS name the full-size model has
    kind: str  # "resnet" or "gpt2"
    batch: int
    image_size: int = 224  # ResNet-50
    seq_len: int = 1024  # GPT-2
    gpt2: GPT2Config | None = None
    full_size: bool = True  # the preset's own shape: predicted from MODELS[name] directly

    def build(self, attention: str):
        if self.kind == "resnet":
            return resnet50()
        return GPT2(self.gpt2, attention)

    def batch_tensors(self, device, dtype):
        generator = torch.Generator(device="cpu").manual_seed(0)
        if self.kind == "resnet":
            x = torch.randn(self.batch, 3, self.image_size, self.image_size, generator=generator)
            y = torch.randint(1000, (self.batch,), generator=generator)
            return x.to(device, dtype), y.to(device)
        tokens = torch.randint(self.gpt2.vocab, (self.batch, self.seq_len + 1),
                               generator=generator)
        return tokens[:, :-1].to(device), tokens[:, 1:].to(device)  # next-token targets

    @property
    def outputs_per_sample(self) -> int:
        return 1000 if self.kind == "resnet" else self.seq_len * self.gpt2.vocab

    @property
    def shape(self) -> str:
        if self.kind == "resnet":
            return f"{self.batch} x {self.image_size}^2 px"
        return f"{self.batch} x {self.seq_len} tokens"


def full_specs() -> list[Spec]:
    # Batches: the largest prediction (GPT-2 XL, fp32, eager) is 65.4 GB, so every case fits an
    # 80 GB GPU by the model; on an H200 (141 GB) there is room for the transients.
    return [Spec("ResNet-50", "resnet", batch=128),
            Spec("GPT-2 small", "gpt2", batch=8, gpt2=GPT2_CONFIGS["GPT-2 small"]),
            Spec("GPT-2 XL", "gpt2", batch=2, gpt2=GPT2_CONFIGS["GPT-2 XL"])]


def tiny_specs() -> list[Spec]:
    # ResNet-50 keeps its exact architecture (and parameter count) at 32 x 32 px; the GPT-2s
    # shrink, each keeping its head width (64) and its parity of heads.
    return [Spec("ResNet-50", "resnet", batch=2, image_size=32, full_size=False),
            Spec("GPT-2 small", "gpt2", batch=2, seq_len=32, full_size=False,
                 gpt2=GPT2Config(vocab=512, positions=64, hidden=128, layers=2, heads=2)),
            Spec("GPT-2 XL", "gpt2", batch=2, seq_len=32, full_size=False,
                 gpt2=GPT2Config(vocab=512, positions=64, hidden=192, layers=3, heads=3))]


# --- the prediction ---------------------------------------------------------------------------


def predict(spec: Spec, parameters: int, precision: str, attention: str | None):
    """dpcost.memory's bytes for one DDP rank at world size 1, by component, and its source.

    rank_memory of a preset knows its activations only at the preset's shape, so every case is
    predicted from a ``custom_model`` with the case's parameters and outputs and the activations
    of ``transformer_layer_activation_bytes`` (L layers) or ``resnet50_activation_bytes``. For a
    full-size case the result must equal ``rank_memory(MODELS[name], ...)``, checked here.
    """
    model_attention = attention or "eager"  # ResNet-50: the attention switch does not apply
    custom = custom_model(parameters, spec.outputs_per_sample, name=spec.name)
    parts = rank_memory(custom, 1, spec.batch, "ddp", "adam", precision,
                        attention=model_attention)
    if spec.kind == "resnet":
        parts["activations"] = spec.batch * resnet50_activation_bytes(spec.image_size, precision)
        how = f"resnet50_activation_bytes({spec.image_size}, {precision!r}) x {spec.batch}"
    else:
        c = spec.gpt2
        parts["activations"] = c.layers * transformer_layer_activation_bytes(
            spec.seq_len, c.hidden, c.heads, spec.batch, precision, model_attention)
        how = (f"{c.layers} x transformer_layer_activation_bytes({spec.seq_len}, {c.hidden}, "
               f"{c.heads}, {spec.batch}, {precision!r}, {model_attention!r})")
    call = (f"num_gpus=1, batch_size={spec.batch}, strategy='ddp', optimizer='adam', "
            f"precision={precision!r}, attention={model_attention!r}, "
            "gradient_as_bucket_view=False")
    if spec.full_size:
        exact = rank_memory(MODELS[spec.name], 1, spec.batch, "ddp", "adam", precision,
                            attention=model_attention)
        for c in COMPONENTS:
            if not math.isclose(parts[c], exact[c], rel_tol=1e-12):
                raise AssertionError(f"{spec.name} {c}: {parts[c]} != rank_memory's {exact[c]}")
        return parts, f"dpcost.memory.rank_memory(MODELS[{spec.name!r}], {call})"
    return parts, (f"dpcost.memory.rank_memory(custom_model({parameters}, "
                   f"{spec.outputs_per_sample}), {call}) with activations = {how}")


@functools.cache
def largest_tensor(spec: Spec) -> int:
    """Elements of the model's largest parameter (``mixed`` steps one at a time), counted on
    the meta device."""
    with torch.device("meta"):
        return max(p.numel() for p in spec.build("eager").parameters())


def predict_peak(spec: Spec, parameters: int, precision: str, attention: str | None,
                 parts: dict):
    """``dpcost.memory.step_peak`` of one case's components: its layers (a GPT-2's L blocks,
    each with its activations and its 12 h^2 + 13 h parameters' gradients; ResNet-50 as one
    layer, A + G at once), the layer transient (two s b 4h tensors, or eager attention's two
    a s^2 b), Adam's foreach temporaries and autocast's cast cache. For a full-size case the
    result must equal ``rank_step_peak(MODELS[name], ...)``, checked here."""
    mode = PRECISION_MODES[precision]
    model_attention = attention or "eager"
    layers, transient = None, 0.0
    if spec.kind == "gpt2":
        c, s, b, w = spec.gpt2, spec.seq_len, spec.batch, mode.activation_bytes
        layers = even_layers(parts["activations"],
                             c.layers * (12 * c.hidden ** 2 + 13 * c.hidden) * mode.gradient_bytes,
                             c.layers)
        transient = 2 * s * b * 4 * c.hidden * w
        if model_attention == "eager":
            transient = max(transient, 2 * c.heads * s * s * b * w)
    largest = largest_tensor(spec)
    peak = step_peak(parts, layers=layers, layer_transient=transient,
                     optimizer_temporaries=optimizer_temporary_bytes(parameters, precision,
                                                                     "adam", largest),
                     cast_cache=autocast_cast_cache_bytes(parameters, precision))
    if spec.full_size:
        exact = rank_step_peak(MODELS[spec.name], 1, spec.batch, "ddp", "adam", precision,
                               attention=model_attention, largest_tensor=largest)
        if not math.isclose(peak.bytes, exact.bytes, rel_tol=1e-12):
            raise AssertionError(f"{spec.name}: peak {peak.bytes} != rank_step_peak's "
                                 f"{exact.bytes}")
    return peak


# --- one case ---------------------------------------------------------------------------------


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _state_bytes(optimizers) -> int:
    """Bytes of the optimizers' per-element state; Adam's scalar ``step`` is left out."""
    return sum(_nbytes(v for k, v in state.items() if k != "step")
               for opt in optimizers for state in opt.state.values())


def _ddp_bucket_bytes(ddp) -> int:
    """The reducer's flat bucket bytes, from DDP's logging data ("bucket_sizes", in bytes)."""
    sizes = ddp._get_ddp_logging_data().get("bucket_sizes", "")
    return sum(int(s) for s in str(sizes).split(",") if s.strip())


class Allocator:
    """The CUDA caching allocator's readings, or None on CPU (there is no such reading)."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.base = 0
        self.max_reserved = None  # absolute: the allocator's segments, cached blocks included

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def settle(self, quiet_s: float = 0.5, limit_s: float = 5.0):
        """Wait until ``memory_allocated`` stops falling: ProcessGroupNCCL holds a collective's
        tensors (DDP's buckets) until its watchdog thread retires the finished work, so memory
        freed in Python can still count as allocated for a while after the step."""
        if not self.cuda:
            return
        gc.collect()
        self.sync()
        last = torch.cuda.memory_allocated()
        started = quiet_since = time.perf_counter()
        while (time.perf_counter() - quiet_since < quiet_s
               and time.perf_counter() - started < limit_s):
            time.sleep(0.05)
            now = torch.cuda.memory_allocated()
            if now != last:
                last, quiet_since = now, time.perf_counter()

    def start(self):
        if self.cuda:
            self.settle()
            self.base = torch.cuda.memory_allocated()

    def allocated(self):
        if not self.cuda:
            return None
        self.sync()
        return torch.cuda.memory_allocated() - self.base

    def reset_peak(self):
        if self.cuda:
            self.sync()
            torch.cuda.reset_peak_memory_stats()

    def peak(self):
        if not self.cuda:
            return None
        self.sync()
        self.max_reserved = max(self.max_reserved or 0, torch.cuda.max_memory_reserved())
        return torch.cuda.max_memory_allocated() - self.base

    def device_used(self):
        """Total minus free device memory (cudaMemGetInfo): the CUDA context, NCCL's buffers
        and the allocator's cache included; absolute, and shared with any other process."""
        if not self.cuda:
            return None
        free, total = torch.cuda.mem_get_info()
        return total - free


@dataclass
class Case:
    spec: Spec
    precision: str
    attention: str | None  # None for ResNet-50

    @property
    def label(self) -> str:
        return f"{self.spec.name}/{self.precision}/{self.attention or 'n/a'}"


def _attention_context(case: Case, restrict_sdpa: bool):
    """With ``restrict_sdpa`` (on CUDA by default), "sdpa" may use only the flash and
    memory-efficient kernels, neither of which stores the s x s scores: the math fallback
    would, and would measure as eager does. Without it, PyTorch chooses (on CPU: its flash
    kernel has no dropout, so training runs the math kernel)."""
    if case.attention == "sdpa" and restrict_sdpa:
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])
    return nullcontext()


def run_case(case: Case, device, restrict_sdpa: bool = False) -> dict:
    """One case: build, two warm-up steps, one measured step. Returns the readings."""
    spec, precision = case.spec, case.precision
    dtype = DTYPES[precision]
    mem = Allocator(device)
    torch.manual_seed(0)
    inputs, targets = spec.batch_tensors(device, dtype)
    mem.start()  # everything below, the input batch excepted
    with torch.device(device):
        model = spec.build(case.attention or "eager")
    model.to(dtype).train()
    params = list(model.parameters())
    ddp = DDP(model, device_ids=[device.index] if mem.cuda else None)
    if precision == "mixed":
        master = [p.detach().float() for p in params]  # fp32 master weights
        optimizers = [torch.optim.Adam([m], lr=1e-4) for m in master]
    else:
        master = []
        # fp16: Adam's default eps 1e-8 underflows to 0 in fp16 (smallest subnormal 6e-8), and
        # exp_avg / (sqrt(exp_avg_sq) + eps) is then 0/0 wherever a gradient is 0.
        eps = 1e-4 if precision == "fp16" else 1e-8
        optimizers = [torch.optim.Adam(params, lr=1e-4, eps=eps)]
    readings = {"allocated_after_setup_bytes": mem.allocated()}
    census = {}

    # autocast: forward and loss under torch.autocast, backward outside (the AMP recipe)
    amp = (torch.autocast(device.type, dtype=torch.bfloat16) if precision == "autocast"
           else nullcontext())

    def step(phases: dict | None):
        with _attention_context(case, restrict_sdpa), amp:
            logits = ddp(inputs)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        del logits  # as a training loop drops it: log_softmax has saved what backward needs
        loss.backward()
        if "gradients" not in census:
            census["gradients"] = _nbytes(p.grad for p in params if p.grad is not None)
        if phases is not None:
            phases["peak_forward_backward_bytes"] = mem.peak()
            mem.reset_peak()
        if precision == "mixed":
            for p, m, opt in zip(params, master, optimizers, strict=True):
                m.grad = p.grad.float()
                p.grad = None  # the bf16 gradient is consumed
                opt.step()
                m.grad = None
                with torch.no_grad():
                    p.copy_(m)
        else:
            optimizers[0].step()
            optimizers[0].zero_grad(set_to_none=True)
        if phases is not None:
            phases["peak_optimizer_bytes"] = mem.peak()
        return float(loss.detach())

    mem.reset_peak()
    losses = [step(None)]
    readings["peak_first_step_bytes"] = mem.peak()
    losses.append(step(None))  # DDP rebuilds its buckets in this step's forward
    mem.settle()  # the first set of buckets, held by NCCL's finished work, goes
    readings["allocated_between_steps_bytes"] = mem.allocated()
    mem.reset_peak()
    losses.append(step(readings))
    readings["peak_bytes"] = (None if not mem.cuda else
                              max(readings["peak_forward_backward_bytes"],
                                  readings["peak_optimizer_bytes"]))
    readings["peak_reserved_bytes"] = mem.max_reserved
    readings["device_used_bytes"] = mem.device_used()
    census.update({
        "parameters": _nbytes(params),
        "optimizer state": _nbytes(master) + _state_bytes(optimizers),
        "DDP bucket copy": _ddp_bucket_bytes(ddp),
    })
    return {"measured": readings, "census": census, "losses": losses,
            "finite_losses": all(math.isfinite(x) for x in losses),
            "parameters": count_parameters(model)}


# --- the run ----------------------------------------------------------------------------------


def _transformers_count(config: GPT2Config):
    """transformers' GPT2LMHeadModel at the same config, on the meta device, where it is
    installed (the GPU machine): an independent count. None where it is not installed."""
    if importlib.util.find_spec("transformers") is None:
        return None
    try:
        from transformers import GPT2Config as HFConfig
        from transformers import GPT2LMHeadModel

        hf = HFConfig(vocab_size=config.vocab, n_positions=config.positions,
                      n_embd=config.hidden, n_layer=config.layers, n_head=config.heads)
        with torch.device("meta"):
            return count_parameters(GPT2LMHeadModel(hf))  # tied head: counted once
    except Exception as exc:  # noqa: BLE001  (a cross-check must not stop the run)
        return _first_line(exc)


def parameter_checks() -> list[dict]:
    """Each full-size model's parameter count, on the meta device, against its preset (and,
    for GPT-2, transformers' count where transformers is installed)."""
    rows = []
    builders = {"ResNet-50": (resnet50, None),
                **{name: (lambda c=c: GPT2(c), c) for name, c in GPT2_CONFIGS.items()}}
    for name, (build, config) in builders.items():
        with torch.device("meta"):
            counted = count_parameters(build())
        rows.append({"model": name, "counted": counted, "preset": MODELS[name].parameters,
                     "equal": counted == MODELS[name].parameters, "device": "meta",
                     "transformers_counted": _transformers_count(config) if config else None})
    return rows


def cases_for(specs) -> list[Case]:
    out = []
    for spec in specs:
        for precision in PRECISIONS:
            for attention in ((None,) if spec.kind == "resnet" else ("eager", "sdpa")):
                out.append(Case(spec, precision, attention))
    return out


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def run(device, tiny: bool, budget_s: float, only: str | None,
        sdpa_restrict: str = "auto") -> dict:
    started = time.perf_counter()
    checks = parameter_checks()
    bad = [c for c in checks if not c["equal"]]
    if bad:
        raise AssertionError(f"parameter counts differ from dpcost.presets: {bad}")
    cases = cases_for(tiny_specs() if tiny else full_specs())
    if only:
        cases = [c for c in cases if only.lower() in c.label.lower()]
    cuda = device.type == "cuda"
    restrict = sdpa_restrict == "always" or (sdpa_restrict == "auto" and cuda)
    # The collections between cases free one case's tensors before the next; torch's own
    # ~300,000 objects are never garbage, and without this each collection walks them (0.17 s).
    gc.collect()  # the parameter checks' meta models go first
    gc.freeze()
    rows = []
    for case in cases:
        row = {"model": case.spec.name, "precision": case.precision,
               "attention": case.attention, "batch": case.spec.batch,
               "shape": case.spec.shape, "full_size": case.spec.full_size,
               "image_size": case.spec.image_size if case.spec.kind == "resnet" else None,
               "seq_len": case.spec.seq_len if case.spec.kind == "gpt2" else None,
               "config": asdict(case.spec.gpt2) if case.spec.gpt2 else None}
        skip = None
        if time.perf_counter() - started > budget_s:
            skip = f"time budget of {budget_s:.0f} s spent"
        elif not cuda and case.spec.kind == "resnet" and case.precision == "fp16":
            skip = CPU_FP16_CONV
        t0 = time.perf_counter()
        if skip:
            row.update(status="skipped", message=skip)
        else:
            try:
                try:
                    row.update(run_case(case, device, restrict), status="ok", message="")
                except RuntimeError as exc:
                    if "No available kernel" not in str(exc):
                        raise
                    gc.collect()
                    row.update(run_case(case, device, restrict_sdpa=False), status="ok",
                               message="flash and memory-efficient SDPA refused "
                               f"({_first_line(exc)}); ran with PyTorch's choice of kernel")
                if not row["finite_losses"]:  # pure fp16 without loss scaling can overflow
                    row["message"] = (f"non-finite loss {row['losses']}; the memory readings "
                                      "stand (the step allocates the same tensors)")
            except torch.cuda.OutOfMemoryError as exc:
                row.update(status="out of memory", message=_first_line(exc))
            except Exception as exc:  # noqa: BLE001  (a GPU run must report every case)
                row.update(status="error", message=_first_line(exc))
        row["seconds"] = round(time.perf_counter() - t0, 3)
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        parameters = row.get("parameters")
        if parameters is None:  # not run or failed: count on the meta device
            with torch.device("meta"):
                parameters = count_parameters(case.spec.build(case.attention or "eager"))
            row["parameters"] = parameters
        predicted, source = predict(case.spec, parameters, case.precision, case.attention)
        row["predicted"] = predicted
        row["predicted_total_bytes"] = total_bytes(predicted)  # every component summed
        peak_model = predict_peak(case.spec, parameters, case.precision, case.attention,
                                  predicted)
        row["predicted_peak_bytes"] = peak_model.bytes
        row["predicted_phase"] = peak_model.phase
        row["predicted_phases"] = peak_model.phases
        resident = ("parameters", "optimizer state", "DDP bucket copy")
        row["predicted_resident_bytes"] = sum(predicted[c] for c in resident)
        row["prediction_source"] = source
        measured = row.get("measured", {})
        peak, between = measured.get("peak_bytes"), measured.get("allocated_between_steps_bytes")
        row["ratio"] = None if peak is None else peak / row["predicted_peak_bytes"]
        row["resident_ratio"] = (None if between is None
                                 else between / row["predicted_resident_bytes"])
        rows.append(row)
        print(_row_line(row), flush=True)
    return {
        "command": shlex.join(["python3", *sys.argv]),
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": (f"cuda:{device.index} ({torch.cuda.get_device_name(device)}, "
                   f"{torch.cuda.get_device_properties(device).total_memory} B)"
                   if cuda else "cpu"),
        "backend": dist.get_backend(),
        "world_size": dist.get_world_size(),
        "tiny": tiny,
        "measured_label": ("torch.cuda.max_memory_allocated() of the third step minus "
                           "memory_allocated() before the model was built (the input batch "
                           "excepted); peak_reserved_bytes (max_memory_reserved) and "
                           "device_used_bytes (cudaMemGetInfo: total - free, the CUDA context "
                           "and NCCL included) are absolute" if cuda
                           else "not measured on CPU (no caching-allocator reading)"),
        "precision_steps": {p: STEPS[p] for p in PRECISIONS},
        "precision_modes": {p: PRECISION_MODES[p].description for p in PRECISIONS},
        "bytes_per_parameter": {p: model_state_bytes_per_parameter(p, "adam")
                                for p in PRECISIONS},
        "measurement_includes_not_modelled": INCLUDED_NOT_MODELLED,
        "measurement_leaves_out": NOT_IN_MEASUREMENT,
        "model_is_an_upper_bound": MODEL_UPPER_BOUND,
        "parameter_checks": checks,
        "cases": rows,
        "seconds": round(time.perf_counter() - started, 1),
    }


# --- output -----------------------------------------------------------------------------------


def _gb(x) -> str:
    return "-" if x is None else f"{x / 1e9:.2f}"


def _ratio(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _row_line(row: dict) -> str:
    m = row.get("measured", {})
    return (f"{row['model']:<12} {row['precision']:<6} {row['attention'] or 'n/a':<6} "
            f"{row['shape']:<18} {row['status']:<14} peak {_gb(m.get('peak_bytes'))} GB, "
            f"predicted {_gb(row['predicted_peak_bytes'])} GB ({row['predicted_phase']}), "
            f"ratio {_ratio(row['ratio'])}; "
            f"between steps {_gb(m.get('allocated_between_steps_bytes'))} GB / predicted "
            f"{_gb(row['predicted_resident_bytes'])} GB {row['message']}")


def _census_cell(row: dict) -> str:
    """'= model' when every censused model state equals its predicted bytes, else the ratios."""
    census = row.get("census")
    if not census:
        return "-"
    ratios = {c: census[c] / row["predicted"][c] if row["predicted"][c] else math.nan
              for c in CENSUS}
    if all(census[c] == row["predicted"][c] for c in CENSUS):
        return "= model"
    return ", ".join(f"{c} {r:.4f}" for c, r in ratios.items())


def markdown(report: dict) -> str:
    lines = [
        f"Measured on {report['device']}, torch {report['torch']} (CUDA {report['cuda']}), "
        f"backend {report['backend']}, world size {report['world_size']}, "
        f"{report['date_utc']}, command `{report['command']}` ({report['seconds']} s). "
        f"Measured: {report['measured_label']}. GB = 10^9 bytes.",
        "",
        "| model | precision | attention | batch | measured peak (GB) | predicted peak (GB) "
        "| phase | ratio | sum of components (GB) | between steps: measured / predicted (GB) "
        "| ratio | model-state census | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["cases"]:
        m = row.get("measured", {})
        status = row["status"] + (f": {row['message']}" if row["message"] else "")
        status = status.replace("|", "/")  # an error message must not split the table
        lines.append(
            f"| {row['model']} | {row['precision']} | {row['attention'] or 'n/a'} | "
            f"{row['shape']} | {_gb(m.get('peak_bytes'))} | "
            f"{_gb(row['predicted_peak_bytes'])} | {row['predicted_phase']} | "
            f"{_ratio(row['ratio'])} | {_gb(row['predicted_total_bytes'])} | "
            f"{_gb(m.get('allocated_between_steps_bytes'))} / "
            f"{_gb(row['predicted_resident_bytes'])} | {_ratio(row['resident_ratio'])} | "
            f"{_census_cell(row)} | {status} |")
    counts = [f"{c['model']} {c['counted']:,} ({'=' if c['equal'] else '!='} the preset"
              + (f"; transformers: {c['transformers_counted']:,}"
                 if isinstance(c["transformers_counted"], int) else "") + ")"
              for c in report["parameter_checks"]]
    lines += ["", "Parameter counts of the full-size models (meta device): " + ", ".join(counts)
              + "."]
    lines += ["", "Between steps: parameters + optimizer state (+ master copy) + DDP's bucket "
              "copy, gradients freed; predicted from the same rank_memory components. "
              "Model-state census: the bytes of the parameters, of the gradients after "
              "backward, of the optimizer's state tensors (+ master copy) and of DDP's buckets "
              "(its logging data's bucket_sizes), each against its rank_memory component.", "",
              "What each precision mode's step runs:", ""]
    lines += [f"- `{p}`: {s}" for p, s in report["precision_steps"].items()]
    lines += ["", "The measured peak includes, and the model does not:", ""]
    lines += [f"- {s}" for s in report["measurement_includes_not_modelled"]]
    lines += ["", "The measured peak leaves out:", ""]
    lines += [f"- {s}" for s in report["measurement_leaves_out"]]
    lines += ["", report["model_is_an_upper_bound"] + ".", ""]
    return "\n".join(lines)


def _init_process_group(device) -> None:
    # World size 1 in this process: a TCPStore on localhost, port 0 = a free port from the OS.
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=store, rank=0, world_size=1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda: NCCL and max_memory_allocated; cpu: gloo, a dry run")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (for the CPU dry run)")
    parser.add_argument("--json", metavar="FILE", help="write the report as JSON")
    parser.add_argument("--markdown", metavar="FILE", help="write the table as Markdown")
    parser.add_argument("--budget-s", type=float, default=270.0,
                        help="skip the remaining cases after this many seconds (default 270)")
    parser.add_argument("--only", metavar="TEXT",
                        help="run only cases whose 'model/precision/attention' contains TEXT")
    parser.add_argument("--sdpa-restrict", choices=("auto", "always"), default="auto",
                        help="hold 'sdpa' to the flash and memory-efficient kernels: auto on "
                        "CUDA only; always also on CPU, where training then falls back (a "
                        "test of the fallback)")
    args = parser.parse_args(argv)
    if args.budget_s <= 0:
        parser.error(f"--budget-s must be > 0, got {args.budget_s}")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            parser.error("--device cuda: torch.cuda.is_available() is False (torch "
                         f"{torch.__version__}); use --device cpu --tiny for the dry run")
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)  # a dry run: tiny shapes, and polite on a shared machine
    _init_process_group(device)
    try:
        report = run(device, args.tiny, args.budget_s, args.only, args.sdpa_restrict)
    finally:
        dist.destroy_process_group()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.json}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(report))
        print(f"wrote {args.markdown}")
    counts = {s: sum(r["status"] == s for r in report["cases"]) for s in
              ("ok", "out of memory", "skipped", "error")}
    print(f"{len(report['cases'])} cases in {report['seconds']} s: "
          + ", ".join(f"{n} {s}" for s, n in counts.items()))
    errors = [r for r in report["cases"] if r["status"] == "error"]
    for r in errors:
        print(f"error in {r['model']}/{r['precision']}/{r['attention']}: {r['message']}",
              file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
