"""dpcost.memory.step_peak against the H200's measured peaks, by hand, and against torch.

The measurements (benchmarks/results/gpu_memory_h200.md, copied from ../shared/gpu): one NVIDIA
H200 (141 GB), torch 2.11.0+cu130, NCCL, world size 1, 2026-12-04, command
``python3 benchmarks/gpu_memory_check.py --budget-s 330 --json $OUT/gpu_memory.json --markdown
$OUT/gpu_memory.md``: torch.cuda.max_memory_allocated() of the second DDP step minus the
allocation before the model was built. That run read its baseline without settling the
allocator, so some of the previous case's DDP buckets (held by ProcessGroupNCCL until its
watchdog retires the work) sat in the baseline and were freed during the case: its "between
steps" reading lies below the live tensors' census by a shortfall, and its peak at least as much
below the truth. docs/gpu.md ("Memory") explains each case.
"""

import csv
from pathlib import Path

import pytest
import torch
from torch import nn

from dpcost.memory import (
    COMPONENTS,
    PHASES,
    PRECISION_MODES,
    autocast_cast_cache_bytes,
    even_layers,
    model_state_bytes_per_parameter,
    optimizer_temporary_bytes,
    rank_memory,
    rank_step_peak,
    step_peak,
    total_bytes,
)
from dpcost.presets import MODELS

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def _rows():
    with open(RESULTS / "gpu_memory_h200.csv") as f:
        return [{**r, "batch": int(r["batch"]),
                 **{k: float(r[k]) for k in ("measured_peak_gb", "between_steps_measured_gb",
                                             "model_states_gb")}}
                for r in csv.DictReader(f)]


ROWS = _rows()
KEY = {(r["model"], r["precision"], r["attention"]): r for r in ROWS}


def _predicted_gb(row):
    attention = "eager" if row["attention"] == "n/a" else row["attention"]
    return rank_step_peak(MODELS[row["model"]], 1, row["batch"], "ddp", "adam",
                          row["precision"], attention=attention).bytes / 1e9


def _shortfall_gb(row):
    """How far the between-steps reading lies below the census of the live model states."""
    return max(0.0, row["model_states_gb"] - row["between_steps_measured_gb"])


# The one case whose peak (with the shortfall added back) lies above the prediction: by one
# set of DDP buckets (N x 2 B in fp16), what DDP's bucket rebuild in the measured second step
# leaves alive while NCCL still holds the first step's set. docs/gpu.md explains it.
REBUILD = ("GPT-2 XL", "fp16", "eager")


def test_the_csv_is_the_committed_table():
    md = (RESULTS / "gpu_memory_h200.md").read_text()
    assert "NVIDIA H200" in md and "torch 2.11.0+cu130" in md
    table = [[c.strip() for c in line.strip().strip("|").split("|")]
             for line in md.splitlines() if line.startswith(("| ResNet", "| GPT"))]
    assert len(table) == len(ROWS) == 20
    for cells, row in zip(table, ROWS, strict=True):
        measured, states = cells[7].split(" / ")
        assert (cells[0], cells[1], cells[2]) == (row["model"], row["precision"],
                                                  row["attention"])
        assert int(cells[3].split()[0]) == row["batch"]
        assert float(cells[4]) == row["measured_peak_gb"]
        assert (float(measured), float(states)) == (row["between_steps_measured_gb"],
                                                    row["model_states_gb"])
        assert cells[9] == "= model"  # the census: the model states are the model's bytes


def test_census_model_states_are_dpcost_memorys():
    for row in ROWS:
        attention = "eager" if row["attention"] == "n/a" else row["attention"]
        parts = rank_memory(MODELS[row["model"]], 1, row["batch"], "ddp", "adam",
                            row["precision"], attention=attention)
        states = sum(parts[c] for c in ("parameters", "optimizer state", "DDP bucket copy"))
        assert states / 1e9 == pytest.approx(row["model_states_gb"], abs=0.006)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: "/".join(
    (r["model"], r["precision"], r["attention"])))
def test_h200_peak_within_5_percent(row):
    # The measured peak with the baseline's shortfall added back (a lower bound on the true
    # peak), against step_peak: within 5 % for all 20 cases, the rebuild case with its extra
    # bucket set.
    predicted = _predicted_gb(row)
    key = (row["model"], row["precision"], row["attention"])
    if key == REBUILD:
        predicted += model_state_bytes_per_parameter("fp16")["gradients"] \
            * MODELS["GPT-2 XL"].parameters / 1e9
    ratio = (row["measured_peak_gb"] + _shortfall_gb(row)) / predicted
    assert 0.95 <= ratio <= 1.05, ratio


def test_h200_raw_readings():
    # As read, 14 of 20 lie within 5 % (the summed model had 9). Each of the other six is an
    # under-reading with a baseline shortfall of at least 0.99 GB, within 0.85 of the model.
    inside, under = [], []
    for row in ROWS:
        ratio = row["measured_peak_gb"] / _predicted_gb(row)
        (inside if abs(ratio - 1) <= 0.05 else under).append((row, ratio))
    assert len(inside) == 14
    for row, ratio in under:
        assert 0.84 <= ratio < 0.95 and _shortfall_gb(row) >= 0.99, (row, ratio)


def test_resnet50_within_1_percent():
    for row in ROWS:
        if row["model"] == "ResNet-50":
            assert row["measured_peak_gb"] / _predicted_gb(row) == pytest.approx(1, abs=0.01)


# --- by hand --------------------------------------------------------------------------------


def _components(**values):
    return {c: float(values.get(c.split()[0], 0.0)) for c in COMPONENTS}


def test_phases_by_hand():
    # R = 10 + 30 + 10 = 50; A = 100 in 4 layers of 25 with 2.5 B of gradients each, G = 20 so
    # 10 B of gradients outside the layers (a head's, from the start); O = 7, loss term 14.
    c = _components(parameters=10, optimizer=30, DDP=10, activations=100, gradients=20,
                    outputs=7, loss=14)
    peak = step_peak(c, layers=even_layers(100, 10, 4), layer_transient=3,
                     optimizer_temporaries=40)
    assert peak.phases == {"forward end": 50 + 100 + 7 + 7,
                           "backward start": 50 + 100 + 7 + 14,
                           "backward": 50 + 100 + 10 + 2.5 + 3,  # the last layer's backward
                           "backward end": 50 + 20,
                           "optimizer step": 50 + 20 + 40}
    assert peak.phase == "backward start" and peak.bytes == 171
    assert peak.bytes == total_bytes(peak.held) + peak.transient
    assert set(peak.phases) == set(PHASES)


def test_more_gradient_than_activation_per_layer_peaks_at_the_end_of_backward():
    c = _components(activations=8, gradients=40)
    peak = step_peak(c, layers=even_layers(8, 40, 4))
    # layer 1's backward: its 2 B of activations, all 40 B of gradients
    assert peak.phases["backward"] == 2 + 40
    assert peak.held["activations"] == 2 and peak.held["gradients"] == 40
    assert step_peak(c).phases["backward"] == 48  # no layers: everything at once


def test_dp_gpu0_reduce_buffer_at_the_end_of_backward():
    c = _components(gradients=30, DP=30, activations=10)
    peak = step_peak(c, layers=even_layers(10, 30, 2))
    assert peak.phase == "backward end" and peak.bytes == 60


def test_optimizer_temporaries_from_torch_source():
    n = 1000
    assert optimizer_temporary_bytes(n, "fp32", "adam") == 4 * n  # exp_avg_sq_sqrt, fp32
    assert optimizer_temporary_bytes(n, "bf16", "adam") == 2 * n
    assert optimizer_temporary_bytes(n, "autocast", "adam") == 4 * n
    assert optimizer_temporary_bytes(n, "mixed", "adam", largest_tensor=100) == 8 * 100
    assert optimizer_temporary_bytes(n, "fp32", "sgd_momentum") == 0


def test_bad_input_names_the_parameter():
    c = _components(activations=1)
    with pytest.raises(ValueError, match="components"):
        step_peak({"activations": 1.0})
    with pytest.raises(ValueError, match="layers"):
        step_peak(c, layers=[(2.0, 0.0)])  # more than the components' activations
    with pytest.raises(ValueError, match="layer_transient"):
        step_peak(c, layer_transient=-1)
    with pytest.raises(ValueError, match="largest_tensor"):
        optimizer_temporary_bytes(10, "mixed", "adam", largest_tensor=-1)


def test_peak_is_below_the_sum_and_fits_llama_70b_zero3():
    model = MODELS["Llama-2 70B"]
    peak = rank_step_peak(model, 64, 64, "zero3", "adam", "mixed", attention="sdpa")
    parts = rank_memory(model, 64, 64, "zero3", "adam", "mixed", attention="sdpa")
    assert 0 < peak.bytes <= total_bytes(parts) + peak.transient


# --- autocast against torch -----------------------------------------------------------------


def test_autocast_layout_measured_on_a_real_step():
    # A small MLP trained under torch.autocast("cpu", torch.bfloat16) with Adam: the bytes of
    # the real parameters, gradients and optimizer state per parameter are the mode's, and the
    # matmul outputs autocast produces are bf16 (the mode's 2-byte activations).
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters())
    n = sum(p.numel() for p in model.parameters())
    outputs = []
    hook = model[0].register_forward_hook(lambda m, i, o: outputs.append(o.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(torch.randn(8, 32))
        loss = nn.functional.cross_entropy(logits, torch.randint(10, (8,)))
    loss.backward()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    opt.step()
    hook.remove()
    state = sum(v.numel() * v.element_size() for s in opt.state.values()
                for k, v in s.items() if k != "step")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    per = model_state_bytes_per_parameter("autocast", "adam")
    assert (params, grads, state) == (per["parameters"] * n, per["gradients"] * n,
                                      per["optimizer state"] * n) == (4 * n, 4 * n, 8 * n)
    mode = PRECISION_MODES["autocast"]
    assert outputs == [torch.bfloat16] and torch.finfo(torch.bfloat16).bits // 8 == \
        mode.activation_bytes
    # log_softmax runs in fp32 under autocast (its fp32 list): the loss term's element width
    assert loss.dtype == torch.float32 and mode.loss_element_bytes == 4
    assert autocast_cast_cache_bytes(n, "autocast") == 2 * n
    assert autocast_cast_cache_bytes(n, "mixed") == 0


def test_autocast_cast_cache_holds_a_bf16_copy_of_each_weight():
    # With cache_enabled (the default) autocast casts each weight once per region and keeps
    # the copy; the linear layer saves that bf16 copy for its backward: one 2-byte copy per
    # weight element, the same tensor however often the layer runs.
    layer = nn.Linear(16, 24)
    saved = []

    def pack(tensor):
        saved.append((tuple(tensor.shape), tensor.dtype, tensor.data_ptr()))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            # inputs that need a gradient, as every layer's but the first: the weight is saved
            layer(torch.randn(2, 16, requires_grad=True)).sum()
            layer(torch.randn(3, 16, requires_grad=True)).sum()
    weights = {s for s in saved if s[0] in ((24, 16), (16, 24))}
    assert {dtype for _, dtype, _ in weights} == {torch.bfloat16}
    assert len({ptr for _, _, ptr in weights}) == 1  # cached: one copy for both calls
    copy_bytes = 24 * 16 * torch.finfo(torch.bfloat16).bits // 8
    assert copy_bytes == PRECISION_MODES["autocast"].cast_copy_bytes * layer.weight.numel()
