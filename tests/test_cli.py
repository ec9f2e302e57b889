import json
import subprocess
import sys

import pytest

from dpcost.cli import main


def run(*args):
    return subprocess.run([sys.executable, "-m", "dpcost", *args], capture_output=True, text=True,
                          timeout=60)


def test_known_case_text():
    result = run("--model-size", "1.5GB", "--gpus", "8")
    assert result.returncode == 0, result.stderr
    assert "21 GB" in result.stdout  # DP: 2 * 7 * 1.5 GB
    assert "2.625 GB" in result.stdout  # DDP: 2 * 7 / 8 * 1.5 GB = 2.625 GB
    assert "8x" in result.stdout


def test_json_fields(capsys):
    assert main(["--model-size", "512MiB", "--gpus", "4", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    size = 512 * 2**20
    assert figures == {
        "model_size_bytes": size,
        "num_gpus": 4,
        "dp_communication_volume_bytes": 6.0 * size,
        "ddp_communication_volume_bytes": 1.5 * size,
        "communication_reduction_factor": 4.0,
        "dp_gpu0_memory_multiplier": 4.0,
        "ddp_gpu0_memory_multiplier": 1.0,
    }


@pytest.mark.parametrize("args", [
    ["--model-size", "1.5XB", "--gpus", "8"],
    ["--model-size", "-3GB", "--gpus", "8"],
    ["--model-size", "1GB", "--gpus", "8.0"],
    ["--model-size", "1GB", "--gpus", "0"],
    ["--model-size", "1GB"],
    [],
    ["--model-size", "1GB", "--gpus", "2", "--bogus"],
])
def test_bad_arguments_exit_2_with_one_line(args):
    result = run(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "error" in result.stderr
