"""benchmarks/gpu_time_check.py: its CPU dry run and its predictions.

The GPU run (CUDA kernels, CUDA events, NCCL, replicate to a GPU) needs a CUDA machine; this
runs every section's code on the CPU (gloo, the small CNN and the encoder at batch 2) and checks
the table against dpcost.gpu_time, with one prediction's inputs counted here independently.
"""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from dpcost import gpu_time
from dpcost import torch_models as tm
from dpcost.presets import GPUS

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_time_check.py"
SECTIONS = ("launch", "kernels", "steps", "ddp", "replicate")
H200 = GPUS["H200 SXM 141GB"]


def _load(name, path):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


# Two runs in ONE interpreter (torch and torch._dynamo load once): the dry run, and one whose
# budget is spent before it starts, with GPU figures given by the user.
RUNS = {"dry": ("--dry-run",),
        "budget": ("--dry-run", "--budget-s", "1e-9", "--gpu-tflops", "100",
                   "--gpu-tflops-fp32", "10", "--gpu-bandwidth", "1000")}
DRIVER = """
import json, sys, runpy
sys.argv = [sys.argv[1]]
script = runpy.run_path(sys.argv[0], run_name="gpu_time_check")
codes = {}
for name, args in json.loads(sys.stdin.read()).items():
    print(f"=== {name}", flush=True)
    codes[name] = script["main"](args)
print("codes", json.dumps(codes))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpu_time")
    argv = {name: [*args, "--json", str(folder / f"{name}.json"),
                   "--markdown", str(folder / f"{name}.md")] for name, args in RUNS.items()}
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(SCRIPT)], input=json.dumps(argv),
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    codes = json.loads(proc.stdout.rsplit("codes ", 1)[1])
    return proc, {name: (codes[name], json.loads((folder / f"{name}.json").read_text()),
                         (folder / f"{name}.md").read_text()) for name in RUNS}


@pytest.fixture(scope="module")
def dry(runs):
    return runs[1]["dry"]


def _row(report, section, text):
    return next(r for r in report["rows"] if r["section"] == section and text in r["what"])


def test_dry_run_has_every_section_and_says_it_is_a_dry_run(runs, dry):
    proc, _ = runs
    code, report, md = dry
    assert code == 0 and "terminate called" not in proc.stderr
    assert report["dry_run"] and report["device"] == "cpu" and report["torch"] in md
    assert {r["section"] for r in report["rows"]} == set(SECTIONS)
    assert "CPU dry run: times are not GPU times" in md and report["command"] in md
    assert "GIVEN BY THE USER" not in md and report["gpu"] == H200.name
    table = [line for line in md.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(table) == 1 + len(report["rows"])
    assert table[0].split(" | ")[3:6] == ["measured", "predicted", "measured / predicted"]


def test_measured_rows_are_numbers_with_their_ratio(dry):
    _, report, _ = dry
    ok = [r for r in report["rows"] if r["status"] == "ok"]
    assert {r["section"] for r in ok} == {"launch", "kernels", "steps", "ddp"}
    for r in ok:
        assert isinstance(r["measured"], (int, float)) and math.isfinite(r["measured"]), r
        assert isinstance(r["predicted"], (int, float)) and r["predicted"] > 0, r
        assert r["ratio"] == pytest.approx(r["measured"] / r["predicted"])
    for r in ok:
        if r["section"] in ("kernels", "steps"):
            assert r["bound"].split()[0] in ("host", "device")
            if r["unit"] == "ms":
                assert r["measured"] > 0  # a step on this CPU takes time


def test_replicate_is_skipped_on_cpu_with_its_reason_and_still_predicted(dry):
    _, report, _ = dry
    rows = [r for r in report["rows"] if r["section"] == "replicate"]
    assert len(rows) == 4
    for r in rows:
        assert r["status"] == "skipped" and "CUDA" in r["note"] and r["measured"] is None
        assert r["predicted"] > 0


def test_one_step_prediction_from_inputs_counted_here(dry):
    """The small CNN, batch 2, fp32: FLOPs counted on a real CPU step here, ops and saved bytes
    by gpu_time_counts.count, then dpcost.gpu_time.compute_time for the H200."""
    _, report, _ = dry
    row = _row(report, "steps", "small CNN b2 fp32")
    torch.manual_seed(0)
    model = tm.small_cnn()
    with FlopCounterMode(display=False) as counter:
        model(torch.randn(2, 3, 32, 32)).float().sum().backward()
    counts = _load("gpu_time_counts", ROOT / "benchmarks" / "gpu_time_counts.py").count(
        "small CNN", False)
    expected = gpu_time.compute_time(
        counter.get_total_flops(), 2 * counts["saved_bytes_per_sample"], counts["ops"], H200,
        "fp32", conv_share=counts["conv_flops_share"], convolutions=counts["convolutions"],
        forward_ops=counts["forward_ops"])
    assert row["predicted"] == pytest.approx(expected.total_s * 1e3, rel=1e-12)
    assert row["bound"].startswith(expected.bound)
    assert row["inputs"]["flops"] == counter.get_total_flops()
    # batch 2 is host-bound (the step is the host's clock): the device clock, on its own row,
    # checks the FLOPs and the saved bytes too
    busy = _row(report, "kernels", "small CNN b2 fp32: CPU op self time")
    assert busy["predicted"] == pytest.approx(expected.device_s * 1e3, rel=1e-12)
    kernels = _row(report, "kernels", "small CNN b2 fp32: profiler CPU events")
    assert kernels["predicted"] == counts["ops"]  # non-view aten ops: the model's launches
    wall = _row(report, "kernels", "small CNN b2 fp32: wall")
    assert wall["predicted"] == pytest.approx(expected.total_s * 1e3, rel=1e-12)


def test_every_compute_prediction_is_compute_times(dry):
    _, report, _ = dry
    for r in report["rows"]:
        if r["section"] == "steps" and r["status"] == "ok":
            i = r["inputs"]
            t = gpu_time.compute_time(i["flops"], i["activation_bytes"], i["ops"], H200,
                                      i["precision"], conv_share=i["conv_share"],
                                      convolutions=i["convolutions"],
                                      forward_ops=i["forward_ops"])
            assert r["predicted"] == pytest.approx(t.total_s * 1e3, rel=1e-12)


def test_launch_ddp_and_replicate_predictions(dry):
    _, report, _ = dry
    assert _row(report, "launch", "x.add_(1)")["predicted"] == pytest.approx(
        gpu_time.HOST_OP_S * 1e6)
    model = tm.small_cnn()
    params, buffers = list(model.parameters()), list(model.buffers())
    assert (len(params), len(buffers)) == (13, 9)  # 3 convs, 3 BN (2 + 3 each), 2 linears
    ddp = {r["cap"]: r for r in report["rows"] if r["section"] == "ddp"}
    assert set(ddp) == {"default", "1 MiB", "100 MiB"}
    # 2.48 MB of fp32 parameters: one bucket under 100 MiB, more under 1 MiB
    assert ddp["100 MiB"]["inputs"]["buckets"] == 1 < ddp["1 MiB"]["inputs"]["buckets"]
    for r in ddp.values():
        assert r["predicted"] == pytest.approx(gpu_time.ddp_host_seconds(
            len(params), len(buffers), r["inputs"]["buckets"]) * 1e3)
    tensors = params + buffers
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    one = _row(report, "replicate", "small CNN: replicate(module, [0])")
    two = _row(report, "replicate", "small CNN: replicate(module, [0, 0])")
    assert two["predicted"] == pytest.approx(
        gpu_time.replicate_call_seconds(len(tensors), nbytes, 2) * 1e3)
    # one device: replicate()'s own cost, the fixed part and one device's copies
    assert one["predicted"] == pytest.approx(1e3 * (
        gpu_time.REPLICATE_S + len(tensors) * gpu_time.REPLICATE_TENSOR_S
        + nbytes * gpu_time.REPLICATE_BYTE_S))


def test_budget_skips_every_measurement_and_flags_given_figures(runs):
    proc, results = runs
    code, report, md = results["budget"]
    assert code == 0, proc.stderr
    assert {r["section"] for r in report["rows"]} == set(SECTIONS)
    for r in report["rows"]:
        assert r["status"] == "skipped" and r["measured"] is None and r["ratio"] is None
        if r["section"] != "replicate":
            assert "time budget" in r["note"]
    assert report["gpu_source"].startswith("GIVEN BY THE USER") and "GIVEN BY THE USER" in md
    assert report["gpu_figures"]["peak_flops"]["bf16"] == 100e12
    assert report["gpu_figures"]["memory_bandwidth_bytes_per_s"] == 1000e9


def test_gpu_figures_from_the_name_or_the_user():
    module = _load("gpu_time_check", SCRIPT)
    for name, preset in (("NVIDIA H200", "H200 SXM 141GB"), ("NVIDIA H100 80GB HBM3",
                                                             "H100 SXM 80GB"),
                         ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"),
                         ("Tesla V100-SXM2-32GB", "V100 SXM2 32GB")):
        assert module.choose_gpu(name, True)[0] is GPUS[preset]
    gpu, how = module.choose_gpu("NVIDIA L4", True, 121, 30.3, 300)
    assert "given by the user" in gpu.name and how.startswith("GIVEN BY THE USER")
    assert gpu.peak_flops == {"bf16": 121e12, "fp16": 121e12, "tf32": 30.3e12, "fp32": 30.3e12}
    with pytest.raises(ValueError, match="--gpu-tflops"):
        module.choose_gpu("NVIDIA L4", True)
    with pytest.raises(ValueError, match="--gpu-bandwidth"):
        module.choose_gpu("NVIDIA L4", True, 121, 30.3)
    with pytest.raises(ValueError, match="--gpu-tflops-fp32"):
        module.choose_gpu("NVIDIA L4", True, 121, -1, 300)


def test_bad_arguments_name_the_option(capsys):
    module = _load("gpu_time_check", SCRIPT)
    for argv, option in ((["--budget-s", "0"], "--budget-s"),
                         (["--gpu-tflops", "100"], "--gpu-tflops-fp32")):
        with pytest.raises(SystemExit) as exc:
            module.main(["--dry-run", *argv])
        assert exc.value.code == 2 and option in capsys.readouterr().err
