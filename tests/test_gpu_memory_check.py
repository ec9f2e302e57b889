"""benchmarks/gpu_memory_check.py: its CPU dry run (gloo, tiny shapes) and its predictions.

The GPU run itself (NCCL, torch.cuda.max_memory_allocated) needs a CUDA machine; this checks
everything up to the allocator's readings: the process group, every model, precision mode and
attention kind, the model-state census against dpcost.memory, the parameter counts and the
JSON and Markdown reports.
"""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dpcost.memory import (
    COMPONENTS,
    PHASES,
    PRECISIONS,
    rank_memory,
    rank_step_peak,
    resnet50_activation_bytes,
    total_bytes,
    transformer_layer_activation_bytes,
)
from dpcost.presets import MODELS, custom_model

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_memory_check.py"
CENSUS = ("parameters", "gradients", "optimizer state", "DDP bucket copy")


def _load_script():
    """The script as a module (benchmarks/ is not a package); dataclasses need it registered."""
    if "gpu_memory_check" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gpu_memory_check", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules["gpu_memory_check"] = module
        spec.loader.exec_module(module)
    return sys.modules["gpu_memory_check"]


# The three runs the tests read, in ONE interpreter: torch and torch._dynamo load once (about
# 2.5 s of CPU each time here), and each run is the script's own main() with its own arguments
# and process group (world size 1, created and destroyed by main).
RUNS = {"dry": (),
        "budget": ("--budget-s", "0.001", "--only", "GPT-2 small/bf16"),
        "sdpa": ("--sdpa-restrict", "always", "--only", "GPT-2 small/fp32")}
DRIVER = """
import json, sys
sys.argv = [sys.argv[1]]
import runpy
script = runpy.run_path(sys.argv[0], run_name="gpu_memory_check")
codes = {}
for name, args in json.loads(sys.stdin.read()).items():
    print(f"=== {name}", flush=True)
    codes[name] = script["main"](args)
print("codes", json.dumps(codes))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> (exit code, report, markdown); plus the process's stdout and stderr."""
    folder = tmp_path_factory.mktemp("gpu")
    argv = {name: ["--device", "cpu", "--tiny", "--json", str(folder / f"{name}.json"),
                   "--markdown", str(folder / f"{name}.md"), *args]
            for name, args in RUNS.items()}
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(SCRIPT)], input=json.dumps(argv),
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    codes = json.loads(proc.stdout.rsplit("codes ", 1)[1])
    return proc, {name: (codes[name], json.loads((folder / f"{name}.json").read_text()),
                         (folder / f"{name}.md").read_text()) for name in RUNS}


@pytest.fixture(scope="module")
def dry_run(runs):
    return runs[1]["dry"]


def test_dry_run_exits_cleanly(runs, dry_run):
    proc, _ = runs
    code, report, _ = dry_run
    assert code == 0, proc.stderr
    assert "terminate called" not in proc.stderr
    assert report["backend"] == "gloo" and report["world_size"] == 1 and report["tiny"]
    assert report["device"] == "cpu"
    assert report["measured_label"].startswith("not measured on CPU")


def test_full_size_parameter_counts_are_the_presets(dry_run):
    _, report, _ = dry_run
    checks = {c["model"]: c for c in report["parameter_checks"]}
    assert set(checks) == {"ResNet-50", "GPT-2 small", "GPT-2 XL"}
    for name, check in checks.items():
        assert check["counted"] == check["preset"] == MODELS[name].parameters
        assert check["equal"] and check["device"] == "meta"
        # transformers' own count where it is installed (the GPU machine), else None
        assert check["transformers_counted"] in (None, MODELS[name].parameters)


def test_every_precision_and_attention_is_a_case(dry_run):
    _, report, _ = dry_run
    seen = {(c["model"], c["precision"], c["attention"]) for c in report["cases"]}
    expected = {("ResNet-50", p, None) for p in PRECISIONS}
    expected |= {(m, p, a) for m in ("GPT-2 small", "GPT-2 XL") for p in PRECISIONS
                 for a in ("eager", "sdpa")}
    assert seen == expected and len(report["cases"]) == len(expected)
    assert set(report["precision_steps"]) == set(PRECISIONS)


def test_only_resnet_fp16_is_skipped_on_cpu_and_says_why(dry_run):
    _, report, _ = dry_run
    for case in report["cases"]:
        if (case["model"], case["precision"]) == ("ResNet-50", "fp16"):
            assert case["status"] == "skipped" and "fp16 convolutions" in case["message"]
            assert case["predicted_total_bytes"] > 0  # still predicted
        else:
            assert case["status"] == "ok", case
            assert case["finite_losses"] and case["message"] == ""


def test_nothing_is_measured_on_cpu(dry_run):
    _, report, _ = dry_run
    for case in report["cases"]:
        assert case["ratio"] is None and case["resident_ratio"] is None
        assert all(v is None for v in case.get("measured", {}).values())


def _gpt2_count(c):
    h = c["hidden"]
    return c["vocab"] * h + c["positions"] * h + c["layers"] * (12 * h * h + 13 * h) + 2 * h


def test_tiny_models_counts(dry_run):
    _, report, _ = dry_run
    for case in report["cases"]:
        if case["model"] == "ResNet-50":  # the real architecture at a small image size
            assert case["parameters"] == MODELS["ResNet-50"].parameters
        else:
            assert case["parameters"] == _gpt2_count(case["config"])


def test_predictions_come_from_dpcost_memory(dry_run):
    _, report, _ = dry_run
    for case in report["cases"]:
        b, precision = case["batch"], case["precision"]
        attention = case["attention"] or "eager"
        if case["model"] == "ResNet-50":
            outputs = 1000
            activations = b * resnet50_activation_bytes(case["image_size"], precision)
        else:
            c, s = case["config"], case["seq_len"]
            outputs = s * c["vocab"]
            activations = c["layers"] * transformer_layer_activation_bytes(
                s, c["hidden"], c["heads"], b, precision, attention)
        expected = rank_memory(custom_model(case["parameters"], outputs), 1, b, "ddp", "adam",
                               precision, attention=attention)
        expected["activations"] = activations
        assert case["predicted"] == pytest.approx(expected, rel=1e-12)
        assert list(case["predicted"]) == list(COMPONENTS)
        assert case["predicted_total_bytes"] == pytest.approx(total_bytes(expected))
        assert "dpcost.memory.rank_memory" in case["prediction_source"]


def test_one_prediction_by_hand(dry_run):
    # GPT-2 small (tiny), fp32, SDPA: 4 + 4 + 8 B per parameter, a 4 N bucket copy, activations
    # L (66 s b h + 4 a s b) (Korthikanti's count without the s x s terms, plus SDPA's fp32
    # logsumexp), outputs s b V x 4 B and twice that for the loss and the output gradient.
    _, report, _ = dry_run
    case = next(c for c in report["cases"] if (c["model"], c["precision"], c["attention"]) ==
                ("GPT-2 small", "fp32", "sdpa"))
    n, b, s, c = case["parameters"], case["batch"], case["seq_len"], case["config"]
    h, a, L, V = c["hidden"], c["heads"], c["layers"], c["vocab"]
    assert case["predicted"] == {
        "parameters": 4 * n, "gradients": 4 * n, "optimizer state": 8 * n,
        "DDP bucket copy": 4 * n, "DP reduce buffer": 0,
        "activations": L * (66 * s * b * h + 4 * a * s * b),
        "outputs": 4 * s * b * V, "loss and output grads": 8 * s * b * V}


@pytest.mark.parametrize("precision,per_param", [
    ("fp32", {"parameters": 4, "gradients": 4, "optimizer state": 8, "DDP bucket copy": 4}),
    ("mixed", {"parameters": 2, "gradients": 2, "optimizer state": 12, "DDP bucket copy": 2}),
    ("autocast", {"parameters": 4, "gradients": 4, "optimizer state": 8, "DDP bucket copy": 4}),
    ("bf16", {"parameters": 2, "gradients": 2, "optimizer state": 4, "DDP bucket copy": 2}),
    ("fp16", {"parameters": 2, "gradients": 2, "optimizer state": 4, "DDP bucket copy": 2}),
])
def test_census_of_the_real_step_is_the_models_bytes(dry_run, precision, per_param):
    # Real tensors of the run: parameters, gradients after backward, Adam's state (+ the fp32
    # master copy in mixed) and DDP's buckets, each equal to dpcost.memory's component.
    _, report, _ = dry_run
    ran = [c for c in report["cases"] if c["precision"] == precision and c["status"] == "ok"]
    assert ran
    for case in ran:
        n = case["parameters"]
        assert case["census"] == {k: v * n for k, v in per_param.items()}
        assert all(case["census"][k] == case["predicted"][k] for k in CENSUS)
        assert case["predicted_resident_bytes"] == pytest.approx(
            case["predicted"]["parameters"] + case["predicted"]["optimizer state"]
            + case["predicted"]["DDP bucket copy"])


def test_ratio_is_against_the_step_peak(dry_run):
    # The prediction is step_peak of the components (what the step holds at its peak), at most
    # their sum plus the temporaries it adds, and for the full-size models rank_step_peak's.
    _, report, _ = dry_run
    for case in report["cases"]:
        assert case["predicted_phase"] in PHASES
        assert case["predicted_peak_bytes"] == max(case["predicted_phases"].values())
        assert 0 < case["predicted_peak_bytes"]
    module = _load_script()
    for spec in module.full_specs():
        for precision in PRECISIONS:
            attention = None if spec.kind == "resnet" else "sdpa"
            parts, _ = module.predict(spec, MODELS[spec.name].parameters, precision, attention)
            peak = module.predict_peak(spec, MODELS[spec.name].parameters, precision,
                                       attention, parts)
            assert peak.bytes == rank_step_peak(
                MODELS[spec.name], 1, spec.batch, "ddp", "adam", precision,
                attention=attention or "eager",
                largest_tensor=module.largest_tensor(spec)).bytes


def test_markdown_has_a_row_per_case_and_the_caveats(dry_run):
    _, report, md = dry_run
    rows = [line for line in md.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + len(report["cases"])  # the header
    assert "= model" in md and "CUDA context" in md and "cuBLAS" in md
    assert "GPT-2 XL 1,557,611,200 (= the preset" in md
    assert report["command"] in md


def test_budget_skips_every_case_but_still_predicts(runs):
    proc, results = runs
    code, report, _ = results["budget"]
    assert code == 0, proc.stderr
    assert [(c["precision"], c["attention"]) for c in report["cases"]] == [
        ("bf16", "eager"), ("bf16", "sdpa")]
    for case in report["cases"]:
        assert case["status"] == "skipped" and "time budget" in case["message"]
        assert math.isfinite(case["predicted_total_bytes"]) and case["predicted_total_bytes"] > 0


def test_sdpa_held_to_fused_kernels_falls_back_and_says_so(runs):
    # On CUDA "sdpa" may use only the flash and memory-efficient kernels. On this CPU neither
    # takes dropout, so SDPA refuses ("No available kernel") and the case reruns with PyTorch's
    # choice, saying so: the path a GPU whose kernels refuse a case takes.
    proc, results = runs
    code, report, _ = results["sdpa"]
    assert code == 0, proc.stderr
    cases = {c["attention"]: c for c in report["cases"]}
    assert cases["sdpa"]["status"] == "ok"
    assert "SDPA refused (RuntimeError: No available kernel" in cases["sdpa"]["message"]
    assert cases["eager"]["status"] == "ok" and cases["eager"]["message"] == ""


def test_full_size_predictions_are_rank_memory_of_the_presets():
    module = _load_script()
    for spec in module.full_specs():
        for precision in PRECISIONS:
            for attention in (None,) if spec.kind == "resnet" else ("eager", "sdpa"):
                parts, source = module.predict(spec, MODELS[spec.name].parameters, precision,
                                               attention)
                exact = rank_memory(MODELS[spec.name], 1, spec.batch, "ddp", "adam", precision,
                                    attention=attention or "eager")
                assert parts == pytest.approx(exact, rel=1e-12)
                assert f"MODELS[{spec.name!r}]" in source
                # The chosen batches fit an 80 GB GPU by the model (the largest: 65.4 GB).
                assert total_bytes(parts) < 70e9


def test_bad_arguments_name_the_option(capsys):
    module = _load_script()
    with pytest.raises(SystemExit) as exc:
        module.main(["--device", "cpu", "--budget-s", "0"])
    assert exc.value.code == 2 and "--budget-s" in capsys.readouterr().err
    if not module.torch.cuda.is_available():
        with pytest.raises(SystemExit) as exc:
            module.main(["--device", "cuda"])
        assert exc.value.code == 2 and "--device cuda" in capsys.readouterr().err
