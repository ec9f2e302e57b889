"""examples/: the two scripts as a user runs them (python, torchrun at n = 3 over gloo) agree,
the DDP checkpoint resumes in the one-process script, and bad flags are refused by name."""

import json

import psutil
import pytest
import torch
import torch.nn as nn

from dpcost import migration as m

FLAGS = ["--no-batchnorm", "--epochs", "2", "--global-batch", "12", "--dataset-size", "96"]


def test_dataparallel_without_gpus_just_calls_the_module():
    """torch/nn/parallel/data_parallel.py: no device type -> device_ids = [], forward = module."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA devices")
    model = nn.Linear(2, 2)
    dp = nn.DataParallel(model)
    x = torch.randn(3, 2)
    assert dp.module is model and dp.device_ids == []
    assert torch.equal(dp(x), model(x))


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scripts")
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    dp_line = m.run_script("train_dp", FLAGS + ["--result", str(tmp / "dp.json"),
                                                "--checkpoint", str(tmp / "dp.pt")])
    ddp_line = m.run_script("train_ddp", FLAGS + ["--result", str(tmp / "ddp.json"),
                                                  "--checkpoint", str(tmp / "ck.pt")], nproc=3)
    after = {c.pid for c in psutil.Process().children(recursive=True)}
    assert after - before == set()  # torchrun left nothing behind
    return {"dp_line": dp_line, "ddp_line": ddp_line, "tmp": tmp,
            "dp": json.loads((tmp / "dp.json").read_text()),
            "ddp": json.loads((tmp / "ddp.json").read_text())}


def test_each_script_prints_one_json_summary(scripts):
    dp, ddp = scripts["dp_line"], scripts["ddp_line"]
    assert set(dp) == set(ddp) == set(m.load_script("train_dp").SUMMARY)
    assert dp["samples_per_rank"] == [2 * 96] and ddp["samples_per_rank"] == [2 * 32] * 3
    assert dp["steps"] == ddp["steps"] == 2 * 96 // 12
    assert dp["checkpoint_writes"] == ddp["checkpoint_writes"] == 2  # once per epoch
    assert dp["checkpoint_ok"] is ddp["checkpoint_ok"] is True


def test_three_ranks_end_where_one_process_ends(scripts):
    dp, ddp = scripts["dp"], scripts["ddp"]
    assert m.diagnose(dp, ddp) == []
    assert m.max_param_diff(dp, ddp) <= m.DEFAULT_ATOL
    assert len(set(ddp["rank_checksums"])) == 1  # bitwise equal on every rank
    assert abs(dp["param_checksum"] - ddp["param_checksum"]) < 1e-3
    assert abs(dp["final_loss"] - ddp["final_loss"]) < 1e-5


def test_the_ddp_checkpoint_resumes_in_the_one_process_script(scripts):
    """Saved from the unwrapped model (no "module." prefix), loaded with map_location."""
    checkpoint = str(scripts["tmp"] / "ck.pt")
    flags = FLAGS[:1] + ["--epochs", "3"] + FLAGS[3:]
    runs = m.run_dp({"resumed": flags + ["--checkpoint", checkpoint, "--resume"],
                     "straight": flags})
    assert m.max_param_diff(runs["resumed"], runs["straight"]) <= m.DEFAULT_ATOL
    assert runs["resumed"]["samples_per_rank"] == [96]  # only the third epoch ran


@pytest.mark.parametrize("flags, words", [
    (["--epochs", "0"], "--epochs must be >= 1"),
    (["--global-batch", "10", "--accum", "3"], "--global-batch (10) must divide by --accum"),
])
def test_bad_flags_name_the_flag(flags, words, capsys):
    script = m.load_script("train_dp")
    with pytest.raises(SystemExit):
        script.parse_args(flags)
    assert words in capsys.readouterr().err
