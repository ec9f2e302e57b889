"""Published measurements on real GPUs, each beside the course's prediction for it.

    .venv/bin/python benchmarks/published_gpu_runs.py [--markdown docs/gpu_published.md]

Each entry names its source, hardware and setting. ``kind`` "time": an absolute time, within
x0.75-1.33 of the prediction (``measured / predicted``); "ratio": a ratio of two times, whose
excess over 1 must have the published sign and lie within a factor 2 of it. ``expressed``
False marks a measurement the model cannot express, ``missed`` one it expresses and misses,
each with why (``docs/gpu.md`` lists them); tests/test_published_gpu_runs.py asserts the rest.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class Published:
    key: str
    what: str
    measured: float  # seconds, or a ratio
    kind: str  # "time" or "ratio"
    predict: Callable[[], float]
    source: str
    hardware: str
    setting: str
    expressed: bool = True
    why: str = ""
    missed: bool = False  # expressed, but the prediction falls outside the tolerance (why says)


def _setting(model, precision, gpu, gpus, per_gpu, link, attention="sdpa", **kw):
    from dpcost.presets import GPUS, INTERCONNECTS
    from dpcost.setting import Setting, preset_facts

    gpu = GPUS[gpu] if isinstance(gpu, str) else gpu
    link = INTERCONNECTS[link] if isinstance(link, str) else link
    per_node = kw.pop("gpus_per_node", max(gpus, 1) if gpus <= 8 else 8)
    return Setting(preset_facts(model, precision, attention), gpus=gpus, gpus_per_node=per_node,
                   batch=per_gpu * gpus, gpu=gpu, intra_link=link, **kw)


def _step(setting, key="ddp") -> float:
    from dpcost.evaluate import evaluate

    return evaluate(setting, keys=[key])[key].step.total_s


def _compute(setting) -> float:
    from dpcost.evaluate import _compute as compute

    return compute(setting, setting.batch // setting.gpus).total_s


def _allreduce(link_name, size, gpus) -> float:
    from dpcost.nccl_achieved import achieved_link
    from dpcost.presets import INTERCONNECTS
    from dpcost.step_time import ring_allreduce_time

    link = achieved_link(INTERCONNECTS[link_name])
    return ring_allreduce_time(size, gpus, link.bandwidth_bytes_per_s, link.latency_s)


def _busbw_time(size, gpus, busbw) -> float:
    """nccl-tests' all-reduce time from its bus bandwidth: busbw = 2 (n-1)/n x size / time."""
    return 2 * (gpus - 1) / gpus * size / busbw


def _titan_rtx():
    from dpcost.presets import GPUPreset, InterconnectPreset

    gpu = GPUPreset(name="TITAN RTX", peak_flops={"fp32": 16.3e12, "tf32": 16.3e12,
                                                  "bf16": 130e12, "fp16": 130e12},
                    memory_bytes=24e9, memory_bandwidth_bytes_per_s=672e9,
                    source="NVIDIA TITAN RTX datasheet: 16.3 TFLOPS fp32, 130 TFLOPS tensor, "
                           "672 GB/s")
    nvlink = InterconnectPreset(name="NVLink 2 x 2 (TITAN RTX)", bandwidth_bytes_per_s=50e9,
                                latency_s=3e-6, source="two NVLink 2 bridges, 25 GB/s each "
                                "per direction (NVIDIA TITAN RTX NVLink bridge)")
    pcie3 = InterconnectPreset(name="PCIe 3.0 x16", bandwidth_bytes_per_s=15.75e9,
                               latency_s=5e-6, source="PCIe 3.0 x16, 128b/130b")
    return gpu, nvlink, pcie3


def _a100_40gb():
    from dpcost.presets import GPUS

    return replace(GPUS["A100 SXM 80GB"], name="A100 SXM 40GB", memory_bytes=40e9,
                   memory_bandwidth_bytes_per_s=1555e9)


DLE = ("NVIDIA/DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5/README.md "
       "(commit 291f0d02), 'Training performance'; batch per GPU from configs.yml; "
       "pytorch-21.03 container")
DDP_BENCH = ("pytorch/pytorch benchmarks/distributed/ddp/README.md (commit bf69c149), example "
             "output, PyTorch 1.4.0a0, CUDA 10.0, NCCL; benchmark.py: synthetic inputs on the "
             "GPU, batch 32 per process, fp32, bucket 25 MB")
HF = ("huggingface/transformers docs/source/en/perf_train_gpu_many.md (commit 032b32ab), "
      "'DP vs DDP'; train_runtime of 200 steps (includes data loading and warm-up)")


def runs() -> list[Published]:
    titan, nvlink2x2, pcie3 = _titan_rtx()
    a100_40 = _a100_40gb()
    v100 = "V100 SXM2 32GB"

    def rn50(gpu, gpus, per_gpu, precision="fp32", link="NVLink 2 (V100)", **kw):
        return _setting("ResNet-50", precision, gpu, gpus, per_gpu, link, **kw)

    def gpt2_hf(link=nvlink2x2, **kw):  # HF GPT-2 with transformers 4.3: eager attention, fp32
        return _setting("GPT-2 small", "fp32", titan, 2, 4, link, attention="eager",
                        gpus_per_node=2, **kw)

    def nanogpt(gpus, micro, accumulate):
        s = _setting("GPT-2 small", "autocast", a100_40, gpus, micro, "NVLink 3 (A100)")
        if gpus == 1:
            return accumulate * _compute(s)
        return (accumulate - 1) * _compute(s) + _step(s)

    return [
        Published("M2-fp32-1", "ResNet-50 fp32, 1 x V100 16GB, batch 112: step (367 img/s)",
                  112 / 367, "time", lambda: _step(rn50(v100, 1, 112)), DLE,
                  "DGX-1, 8 x V100 SXM2 16GB, NVLink", "fp32 (V100: no TF32), batch 112, SGD"),
        Published("M2-fp32-8", "ResNet-50 fp32, 8 x V100 16GB, batch 112 each: step (2855 img/s)",
                  8 * 112 / 2855, "time", lambda: _step(rn50(v100, 8, 112)), DLE,
                  "DGX-1, 8 x V100 SXM2 16GB, NVLink", "DDP, fp32, batch 112 per GPU"),
        Published("M3-fp32-1", "ResNet-50 fp32, 1 x V100 32GB, batch 112: step (356 img/s)",
                  112 / 356, "time", lambda: _step(rn50(v100, 1, 112)), DLE,
                  "DGX-1, 8 x V100 SXM2 32GB, NVLink", "fp32, batch 112"),
        Published("M3-fp32-8", "ResNet-50 fp32, 8 x V100 32GB, batch 112 each: step (2766 img/s)",
                  8 * 112 / 2766, "time", lambda: _step(rn50(v100, 8, 112)), DLE,
                  "DGX-1, 8 x V100 SXM2 32GB, NVLink", "DDP, fp32, batch 112 per GPU"),
        Published("M1-tf32-8", "ResNet-50 TF32, 8 x A100 80GB, batch 256 each: step (7248 img/s)",
                  8 * 256 / 7248, "time",
                  lambda: _step(rn50("A100 SXM 80GB", 8, 256, link="NVLink 3 (A100)")), DLE,
                  "DGX A100, 8 x A100 SXM 80GB, NVSwitch", "DDP, fp32 (TF32 convolutions), 256"),
        Published("M1-tf32-1", "ResNet-50 TF32, 1 x A100 80GB, batch 256: step (938 img/s)",
                  256 / 938, "time",
                  lambda: _step(rn50("A100 SXM 80GB", 1, 256, link="NVLink 3 (A100)")), DLE,
                  "DGX A100, A100 SXM 80GB", "fp32 (TF32 convolutions), batch 256",
                  missed=True, why="0.74, just outside: the TF32 convolution rate fitted on the "
                  "H200 (12.4 % of peak) is low for an A100, whose measured rate is 15 %"),
        Published("M5-plain-1", "ResNet-50 fp32, 1 x V100, batch 32, no DDP: p50 step",
                  0.097, "time", lambda: _compute(rn50(v100, 1, 32)), DDP_BENCH,
                  "DGX-1 V100, NVLink", "no DDP, fp32, batch 32"),
        Published("M5-ddp-1", "ResNet-50 fp32, DDP on 1 V100, batch 32: p50 step", 0.100,
                  "time", lambda: _step(rn50(v100, 1, 32)), DDP_BENCH, "DGX-1 V100",
                  "DDP world size 1, fp32, batch 32"),
        Published("M5-ddp-8", "ResNet-50 fp32, DDP on 8 V100s, batch 32 each: p50 step", 0.104,
                  "time", lambda: _step(rn50(v100, 8, 32)), DDP_BENCH,
                  "DGX-1, 8 x V100, NVLink", "DDP, fp32, batch 32 per GPU, bucket 25 MB"),
        Published("M5-ddp-16", "ResNet-50 fp32, DDP on 2 x 8 V100s, batch 32 each: p50 step",
                  0.104, "time", lambda: _step(rn50(v100, 16, 32, inter_link=_ib_4x100())),
                  DDP_BENCH, "2 DGX-1, 4 x 100 Gb/s InfiniBand per machine",
                  "DDP, fp32, batch 32 per GPU"),
        Published("M10", "GPT-2 124M, 1 x A100 40GB, 5 x 20 sequences of 1024: iteration",
                  0.755, "time", lambda: nanogpt(1, 20, 5),
                  "karpathy/nanoGPT transformer_sizing.ipynb (HEAD 3adf61e1): 'runs in about "
                  "755ms on a single A100 GPU'", "A100 SXM 40GB",
                  "bf16 autocast, flash attention (SDPA), torch.compile, AdamW"),
        Published("M11", "GPT-2 124M, DDP on 8 x A100, 5 x 12 sequences per rank: iteration",
                  0.562, "time", lambda: nanogpt(8, 12, 5),
                  "karpathy/nanoGPT issue #110: 'iter 1631: ... time 561.94ms'; train.py at "
                  "40f4d6ff", "8 x A100 (40 GB assumed), NVLink",
                  "bf16 autocast, SDPA, torch.compile, gradient accumulation 5, DDP sync on the "
                  "last micro-step"),
        Published("M4-dp-ddp", "GPT-2 124M on 2 x TITAN RTX: DataParallel / DDP (110.59 s / "
                  "101.90 s)", 110.5948 / 101.9003, "ratio",
                  lambda: _step(gpt2_hf(), "dp_nccl") / _step(gpt2_hf()), HF,
                  "2 x TITAN RTX 24GB, 2 NVLinks (NV2)",
                  "fp32, batch 4 per GPU, 1024 tokens, AdamW, bucket 25 MB", missed=True,
                  why="excess 0.19 against 0.085 (2.2x): DataParallel's bytes and host work "
                  "add about the measured 43 ms a step, but train_runtime includes the Trainer's "
                  "data loading and logging (the modelled DDP step is 0.6 of the measured), "
                  "which dilutes the measured ratio"),
        Published("M4-nop2p", "GPT-2 124M on 2 x TITAN RTX: DDP without / with NVLink "
                  "(131.44 s / 101.90 s)", 131.4367 / 101.9003, "ratio",
                  lambda: _step(gpt2_hf(pcie3, peer_to_peer=False))
                  / _step(gpt2_hf()), HF, "2 x TITAN RTX; NCCL_P2P_DISABLE=1 for 'without'",
                  "fp32, batch 4 per GPU", missed=True,
                  why="excess 0.13 against 0.29 (0.46x): host staging costs more here than "
                  "the 4 GB/s that 2 x RTX 2080 Ti measured on PCIe 3.0, or the buckets' "
                  "all-reduces hide less under backward than the model lets them"),
        Published("M13-1M", "all-reduce of 1 MiB on 8 x A100 (busbw 36.22 GB/s)",
                  _busbw_time(2**20, 8, 36.22e9), "time",
                  lambda: _allreduce("NVLink 3 (A100)", 2**20, 8),
                  "Azure/AI-benchmarking-guide Azure_Results/ND_A100_v4_results.md (3bb66cac), "
                  "nccl-tests all_reduce_perf", "8 x A100 80GB SXM4, NVSwitch, NCCL 2.18.5",
                  "in place, float sum"),
        Published("M14-1G", "all-reduce of 1 GiB on 8 x H200 (busbw 467.58 GB/s)",
                  _busbw_time(2**30, 8, 467.58e9), "time",
                  lambda: _allreduce("NVLink 4 (H200)", 2**30, 8),
                  "Azure/AI-benchmarking-guide Azure_Results/ND_H200_v5_results.md (7f20e5fa)",
                  "8 x H200, NVSwitch (NVLS), NCCL 2.20.5", "in place, float sum"),
        Published("M13-33M", "all-reduce of 32 MiB (a DDP bucket) on 8 x A100 (busbw 132.77 GB/s)",
                  _busbw_time(2**25, 8, 132.77e9), "time",
                  lambda: _allreduce("NVLink 3 (A100)", 2**25, 8),
                  "Azure ND A100 v4 results, as M13-1M", "8 x A100 80GB SXM4", "in place",
                  expressed=False,
                  why="between 1 MB and 1 GB NCCL switches protocols (LL, LL128, Simple) and "
                      "channel counts: the achieved rate climbs from 36 to 228 GB/s, which one "
                      "alpha and one beta cannot follow (the model is 1.5x fast here)"),
        Published("M1-amp-1", "ResNet-50 AMP, 1 x A100 80GB, batch 256: step (2470 img/s)",
                  256 / 2470, "time",
                  lambda: _step(rn50("A100 SXM 80GB", 1, 256, "autocast", "NVLink 3 (A100)")),
                  DLE, "DGX A100", "AMP, channels_last (nhwc), DALI", expressed=False,
                  why="channels_last 16-bit convolutions run about 3x faster than the NCHW "
                      "ones the H200 calibration measured; the model has no memory-format "
                      "knob"),
        Published("M2-amp-1", "ResNet-50 AMP, 1 x V100 16GB, batch 256: step (1200 img/s)",
                  256 / 1200, "time", lambda: _step(rn50(v100, 1, 256, "autocast")), DLE,
                  "DGX-1 V100", "AMP, channels_last (nhwc)", expressed=False,
                  why="as M1-amp-1: channels_last convolutions"),
        Published("M5-scaling", "ResNet-50 fp32 on V100: DDP on 8 GPUs / no DDP (0.104 / "
                  "0.097 s)", 0.104 / 0.097, "ratio",
                  lambda: _step(rn50(v100, 8, 32)) / _compute(rn50(v100, 1, 32)), DDP_BENCH,
                  "DGX-1 V100", "fp32, batch 32 per GPU", expressed=False,
                  why="the model hides DDP's host work and all but the last bucket under a "
                      "device-bound backward, so it predicts 1.00; the measured 7 % comes "
                      "from stream synchronisation and jitter it does not model"),
        Published("M1-scaling", "ResNet-50 TF32 on A100: step on 8 GPUs / on 1 (7.72x of 8)",
                  8 / 7.72, "ratio",
                  lambda: _step(rn50("A100 SXM 80GB", 8, 256, link="NVLink 3 (A100)"))
                  / _step(rn50("A100 SXM 80GB", 1, 256, link="NVLink 3 (A100)")), DLE,
                  "DGX A100", "DDP, TF32, batch 256 per GPU", expressed=False,
                  why="the 3.6 % lost at 8 GPUs is the input pipeline (8 ranks decode JPEGs on "
                      "one host's CPUs), which the model does not include"),
    ]


def _ib_4x100():
    from dpcost.presets import InterconnectPreset

    return InterconnectPreset(name="InfiniBand EDR 4 x 100 Gb/s per 8 GPUs",
                              bandwidth_bytes_per_s=4 * 100e9 / 8 / 8, latency_s=1.5e-6,
                              source="4 x 100 Gb/s NICs per DGX-1 shared by 8 GPUs "
                                     "(pytorch benchmarks/distributed/ddp README)")


def within(entry: Published, predicted: float) -> bool:
    """The issue's tolerance: x0.75-1.33 for a time; for a ratio, its excess over 1 of the
    published sign and within a factor 2 of it."""
    if entry.kind == "time":
        return 0.75 <= entry.measured / predicted <= 1.33
    excess, model = entry.measured - 1, predicted - 1
    return excess * model > 0 and 0.5 <= model / excess <= 2


def table(entries=None) -> list[dict]:
    out = []
    for e in entries or runs():
        p = e.predict()
        out.append({"entry": e, "predicted": p, "within": within(e, p)})
    return out


def markdown(rows) -> str:
    lines = ["| id | measurement | hardware | measured | predicted | measured / predicted | "
             "within tolerance | note |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        e, p = r["entry"], r["predicted"]
        fmt = (lambda x: f"{x * 1e3:.3g} ms") if e.kind == "time" else (lambda x: f"{x:.3f}")
        status = "yes" if r["within"] else "not expressed" if not e.expressed else "NO (miss)"
        lines.append(f"| {e.key} | {e.what} | {e.hardware} | {fmt(e.measured)} | {fmt(p)} | "
                     f"{e.measured / p:.2f} | {status} | {e.why or e.setting} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", help="write the table here")
    args = parser.parse_args(argv)
    text = markdown(table())
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
