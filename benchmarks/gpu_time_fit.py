"""Fit ``dpcost.gpu_time``'s constants on the H200's measurements and report the residuals on
the rows that did not fit them.

    .venv/bin/python benchmarks/gpu_time_fit.py [--markdown benchmarks/results/h200_fit.md]

Data (committed in benchmarks/results/): the two calibration runs (``calibrate_h200.py`` →
``h200_calibration_run1.json``, ``calibrate2_h200.py`` → ``_run2.json``; one H200, torch 2.11,
two machines) and the op counts of the same models on this CPU (``gpu_time_counts.py`` →
``h200_model_counts.json``). Roles: the efficiencies from the largest batch of ResNet-50 and
GPT-2 small (GPU-bound), the host's constants from the smallest batch of each model in one
precision (launch-bound); every other row is held out. DDP's constants come from run 2 (its
rounds interleave the variants) and are tested on run 1; replicate's from run 1's four rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
RATE_ROWS = {("ResNet-50", 128, False), ("ResNet-50", 128, True), ("GPT-2 small", 8, False),
             ("GPT-2 small", 8, True)}
HOST_ROWS = {("ResNet-50", 8, False), ("GPT-2 small", 1, True), ("small CNN", 32, False),
             ("encoder d256x4", 8, False)}
# parameter tensors and buffers of the calibration models (dpcost.torch_models; counted by
# tests/test_gpu_time.py with torch), and their fp32 bytes (parameters + buffers)
TENSORS = {"ResNet-50": (161, 159), "GPT-2 small": (148, 0)}
TENSOR_BYTES = {"ResNet-50": 4 * (25_557_032 + 53_120), "GPT-2 small": 4 * 124_439_808}


def load() -> dict:
    run1 = json.loads((RESULTS / "h200_calibration_run1.json").read_text())
    run2 = json.loads((RESULTS / "h200_calibration_run2.json").read_text())
    counts = json.loads((RESULTS / "h200_model_counts.json").read_text())
    compute = []
    for a in run1["A"]:
        amp = a["precision"] != "fp32"
        c = counts[f"{a['model']} | {'amp' if amp else 'fp32'}"]
        key = (a["model"], a["batch"], amp)
        compute.append({
            "model": a["model"], "batch": a["batch"], "amp": amp, "seconds": a["ms"] / 1e3,
            "flops": a["flops"], "ops": c["ops"], "forward_ops": c["forward_ops"],
            "convolutions": c["convolutions"], "conv_share": c["conv_flops_share"],
            "activation_bytes": c["saved_bytes_per_sample"] * a["batch"],
            "role": "rate" if key in RATE_ROWS else "host" if key in HOST_ROWS else "held out"})

    def ddp_row(model, plain, cap1, n1, cap100, n100, default, n_default):
        tensors, buffers = TENSORS[model]
        return {"model": model, "tensors": tensors, "buffers": buffers,
                "cap1_s": (cap1 - plain) / 1e3, "cap1_buckets": n1,
                "cap100_s": (cap100 - plain) / 1e3, "cap100_buckets": n100,
                "default_s": (default - plain) / 1e3, "default_buckets": n_default}

    ddp_fit = [ddp_row(r["model"], r["plain_ms"], r["ddp_1_ms"], len(r["ddp_1_buckets"].split(",")),
                       r["ddp_100_ms"], len(r["ddp_100_buckets"].split(",")), r["ddp_default_ms"],
                       len(r["ddp_default_buckets"].split(","))) for r in run2["ddp"]]
    ddp_test = [ddp_row(r["model"], r["plain_ms"], r["ddp_cap1_ms"], r["ddp_cap1_buckets"],
                        r["ddp_cap100_ms"], r["ddp_cap100_buckets"], r["ddp_capdefault_ms"],
                        r["ddp_capdefault_buckets"]) for r in run1["B"]]
    replicate = [{"model": r["model"], "tensors": r["tensors"], "bytes": TENSOR_BYTES[r["model"]],
                  "one_s": r["replicate_1dev_ms"] / 1e3,
                  "two_s": r["replicate_2dev_same_ms"] / 1e3} for r in run1["C"]]
    walls = [{**next(c for c in compute if (c["model"], c["batch"], c["amp"])
                     == (k["model"], k["batch"], k["amp"])), "seconds": k["wall_ms"] / 1e3}
             if any((c["model"], c["batch"], c["amp"]) == (k["model"], k["batch"], k["amp"])
                    for c in compute) else None for k in run2["kernels"]]
    return {"compute": compute, "ddp_fit": ddp_fit, "ddp_test": ddp_test,
            "replicate": replicate, "run2_walls": [w for w in walls if w is not None]}


def predicted_seconds(row) -> float:
    from dpcost.gpu_time import compute_time
    from dpcost.presets import GPUS

    t = compute_time(row["flops"], row["activation_bytes"], row["ops"], GPUS["H200 SXM 141GB"],
                     "bf16" if row["amp"] else "fp32", conv_share=row["conv_share"],
                     convolutions=row["convolutions"], forward_ops=row["forward_ops"])
    return t.total_s


def residuals(data: dict) -> list[dict]:
    """Measured / predicted for every held-out row (and the fitted ones, marked)."""
    from dpcost.gpu_time import ddp_host_seconds

    def name(row):
        return f"{row['model']} b{row['batch']} {'bf16 autocast' if row['amp'] else 'fp32'}"

    out = []
    for row in data["compute"]:
        out.append({"what": f"{name(row)} forward+backward (run 1)", "role": row["role"],
                    "measured_s": row["seconds"], "predicted_s": predicted_seconds(row)})
    for row in data["run2_walls"]:
        out.append({"what": f"{name(row)} forward+backward (run 2, another machine)",
                    "role": "held out", "measured_s": row["seconds"],
                    "predicted_s": predicted_seconds(row)})
    for row in data["ddp_test"]:
        for cap, n in (("cap1", row["cap1_buckets"]), ("default", row["default_buckets"]),
                       ("cap100", row["cap100_buckets"])):
            out.append({"what": f"{row['model']} DDP's own cost, {cap} ({n} buckets; run 1)",
                        "role": "held out", "measured_s": row[f"{cap}_s"],
                        "predicted_s": ddp_host_seconds(row["tensors"], row["buffers"], n)})
    return out


def markdown(constants: dict, rows: list[dict]) -> str:
    lines = ["| what | role | measured ms | predicted ms | measured / predicted |",
             "|---|---|---|---|---|"]
    for r in rows:
        ratio = r["measured_s"] / r["predicted_s"] if r["predicted_s"] else float("nan")
        lines.append(f"| {r['what']} | {r['role']} | {r['measured_s'] * 1e3:.1f} | "
                     f"{r['predicted_s'] * 1e3:.1f} | {ratio:.2f} |")
    fitted = ", ".join(f"{k} = {v}" for k, v in constants.items())
    return f"Fitted: {fitted}\n\n" + "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", help="write the residual table here")
    args = parser.parse_args(argv)
    from dpcost.gpu_time import fit_constants

    data = load()
    constants = fit_constants(data["compute"], data["ddp_fit"], data["replicate"])
    text = markdown(constants, residuals(data))
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
