import json
import subprocess
import sys
import time

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


# The edges (issue 9, section 4): each test below failed before its fix.
def run_main(capsys, *args):
    """main() in this process: (exit status, stdout, stderr)."""
    try:
        status = main(list(args))
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    return status, out, err


def refused(capsys, *args):
    status, out, err = run_main(capsys, *args)
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and len(err) < 300
    return err


@pytest.mark.parametrize("args, parameter", [
    (["--model-size", "1.5XB", "--gpus", "8"], "--model-size"),
    *[(["--model-size", size, "--gpus", "8"], "--model-size")  # ASCII digits only
      for size in ["١GB", "８GB", "8_0", "1\u2003GB"]],
    *[(["--model-size", "1GB", "--gpus", gpus], "--gpus")
      for gpus in ["8.0", "0", "-8", "1000000001", "9" * 100_000,  # a count, 1 to 10**9
                   "١٢٣", "８", "8_0", " 8", "+8", "0x8"]],  # ASCII digits only
    (["--model-size", "1GB"], "--gpus"),
    ([], "--model-size"),
    (["--model-size", "1GB", "--gpus", "2", "--bogus"], "--bogus"),
])
def test_bad_arguments_name_the_parameter(capsys, args, parameter):
    """Status 2 and one short line naming the argument, never a traceback."""
    assert parameter in refused(capsys, *args)


def test_gpus_at_the_bound_works(capsys):
    status, out, _ = run_main(capsys, "--model-size", "1GB", "--gpus", "1000000000", "--json")
    assert status == 0 and json.loads(out)["num_gpus"] == 10**9


def strict_json(text):
    def no_constant(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=no_constant)


@pytest.mark.parametrize("size, gpus", [("1e308", "2"), ("1e300", "1000000000"),
                                        ("1.7e308", "2")])
def test_figures_beyond_float_range_are_refused_not_printed_as_infinity(capsys, size, gpus):
    for mode in (["--json"], []):
        err = refused(capsys, "--model-size", size, "--gpus", gpus, *mode)
        assert "dp_communication_volume_bytes beyond a float's range" in err


@pytest.mark.parametrize("size", ["0", "1", "1.5GB", "1e300", "8.9e307", "1TiB"])
@pytest.mark.parametrize("gpus", ["1", "2", "8", "1000000000"])
def test_json_output_is_always_valid_json(capsys, size, gpus):
    status, out, err = run_main(capsys, "--model-size", size, "--gpus", gpus, "--json")
    if status == 0:
        figures = strict_json(out)
        assert figures["num_gpus"] == int(gpus)
    else:
        assert status == 2 and out == "" and "beyond a float's range" in err


@pytest.mark.parametrize("args", [
    ["--model-size", "-1GB", "--gpus", "8"], ["--model-size=-1GB", "--gpus", "8"],
    ["--gpus", "8", "--model-size", "-1e9"], ["--model", "-0.5MB", "--gpus", "8"],
    ["--model-size", "-.5", "--gpus", "8", "--json"], ["--model-size", "-1", "--gpus", "8"],
])
def test_a_negative_model_size_reaches_the_size_parser(capsys, args):
    """argparse would read "-1GB" as an option ("expected one argument"); it is joined."""
    err = refused(capsys, *args)
    assert "--model-size" in err and "expected one argument" not in err


def test_negative_model_size_from_the_shell():
    result = run("--model-size", "-1GB", "--gpus", "8")
    assert result.returncode == 2 and "a size cannot be negative" in result.stderr


def test_huge_model_size_is_refused_at_once(capsys):
    start = time.perf_counter()
    err = refused(capsys, "--model-size", "0" * 100_000 + "!", "--gpus", "8")
    assert time.perf_counter() - start < 0.5
    assert "--model-size" in err
