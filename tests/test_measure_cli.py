"""python -m dpcost.measure: one-line errors, the torchrun entry point, a failing rank's status."""

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")


def run(args, env=None, timeout=240):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args, word", [
    (["--world-size", "1"], "--world-size"),
    (["--world-size", "two"], "--world-size"),
    (["--model-mb", "0.001"], "too small to matter"),
    (["--scenario", "ring"], "--scenario"),
    (["--steps", "0"], "--steps"),
])
def test_bad_arguments_give_one_line_and_status_2(args, word):
    result = run([sys.executable, "-m", "dpcost.measure", *args])
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert word in result.stderr


def test_the_cuda_scenario_is_skipped_with_a_message_without_two_gpus():
    result = run([sys.executable, "-m", "dpcost.measure", "--scenario", "dataparallel-cuda"])
    assert result.returncode == 0
    assert "dataparallel-cuda skipped: needs 2 or more CUDA GPUs" in result.stdout


def test_torchrun_two_ranks_prints_one_json_report_that_matches_the_ring():
    result = run([str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "-m", "dpcost.measure",
                  "--backend", "gloo", "--scenario", "ddp", "--model-mb", "1", "--steps", "5",
                  "--json"])
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1  # rank 0 prints, rank 1 does not
    report = json.loads(lines[0])
    p = report["param_bytes"]
    assert report["world_size"] == 2 and p >= 1_000_000 and report["steps"] == 5
    for row in report["scenarios"]["ddp"]:
        assert row["counter"] == "tcp_info"
        assert row["hook_bytes"] == p
        for direction in ("sent", "received"):
            assert abs(row[f"{direction}_bytes"] / p - 1) < 0.005  # 2(n-1)/n P = P at n = 2
        assert row["peak_memory_bytes"] > 0


def test_a_failing_rank_exits_non_zero_naming_it_and_leaves_no_process():
    mark = uuid.uuid4().hex
    result = run([sys.executable, "-m", "dpcost.measure", "--world-size", "2", "--model-mb",
                  "0.5", "--steps", "2", "--scenario", "dp", "--inject-fault", "0:raise"],
                 env={"DPCOST_TEST_MARK": mark})
    assert result.returncode == 1
    assert "error: rank 0 failed: RuntimeError: injected fault on rank 0" in result.stderr
    left = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("DPCOST_TEST_MARK") == mark:
                left.append(process.pid)
        except (psutil.Error, OSError):
            continue
    assert left == []
