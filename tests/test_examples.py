"""examples/: the two scripts agree (train_dp.py's main() in this process, train_ddp.py under
torchrun at n = 2 over gloo, as a user runs it; lesson 09 runs train_dp.py as a program and DDP at
n = 3), the DDP checkpoint resumes in the one-process script, bad flags are refused by name in one
line before training, a diverged loss fails, and the JSON line is printed before --result is
written. train_dp.py runs in this process because a program's only extra is its last line,
``sys.exit(main())``: Python prints the message of sys.exit(str) to stderr and exits 1. That
saves an interpreter and torch's import (about 2.5 s of CPU) per run."""

import contextlib
import io
import json
import os
import subprocess
import sys

import psutil
import pytest
import torch
import torch.nn as nn

from dpcost import migration as m
from dpcost.procs import scratch_tmpdir

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


def _train_dp_main(argv: list[str]) -> tuple[str | int | None, str]:
    """train_dp.py's main(argv) as its program runs it, argv[0] the script's path: (the code or
    message it exits with, None when it returns; what it printed). It writes nothing to stderr
    itself: Python writes an exit message there, so a program's stderr is that one line."""
    script, printed, warned = m.load_script("train_dp"), io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed), \
            contextlib.redirect_stderr(warned):
        patch.setattr(sys, "argv", [str(m.EXAMPLES / "train_dp.py"), *argv])
        try:
            script.main(argv)
            code = None
        except SystemExit as exiting:
            code = exiting.code
    assert warned.getvalue() == ""
    return code, printed.getvalue()


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scripts")
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    code, printed = _train_dp_main(FLAGS + ["--result", str(tmp / "dp.json"),
                                            "--checkpoint", str(tmp / "dp.pt")])
    assert code is None and printed.count("\n") == 1, (code, printed)
    dp_line = json.loads(printed)
    ddp_line = m.run_script("train_ddp", FLAGS + ["--result", str(tmp / "ddp.json"),
                                                  "--checkpoint", str(tmp / "ck.pt")], nproc=2)
    after = {c.pid for c in psutil.Process().children(recursive=True)}
    assert after - before == set()  # torchrun left nothing behind
    return {"dp_line": dp_line, "ddp_line": ddp_line, "tmp": tmp,
            "dp": json.loads((tmp / "dp.json").read_text()),
            "ddp": json.loads((tmp / "ddp.json").read_text())}


def test_each_script_prints_one_json_summary(scripts):
    dp, ddp = scripts["dp_line"], scripts["ddp_line"]
    assert set(dp) == set(ddp) == set(m.load_script("train_dp").SUMMARY)
    assert dp["samples_per_rank"] == [2 * 96] and ddp["samples_per_rank"] == [2 * 48] * 2
    assert dp["steps"] == ddp["steps"] == 2 * 96 // 12
    assert dp["checkpoint_writes"] == ddp["checkpoint_writes"] == 2  # once per epoch
    assert dp["checkpoint_ok"] is ddp["checkpoint_ok"] is True


def test_two_ranks_end_where_one_process_ends(scripts):
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


BAD_FLAGS = [
    (["--epochs", "0"], "--epochs must be >= 1"),
    (["--global-batch", "10", "--accum", "3"],
     "--global-batch (10) must divide by world size x --accum (1 x 3)"),
    (["--lr", "nan"], "--lr must be a finite number > 0, got nan"),
    (["--lr", "inf"], "--lr must be a finite number > 0, got inf"),
    (["--lr", "-1"], "--lr must be a finite number > 0, got -1.0"),
    (["--lr", "0"], "--lr must be a finite number > 0"),
    (["--seed", str(2**63)], "--seed must be in 0 to 2**63 - 1"),
    (["--seed", "-1"], "--seed must be in 0 to 2**63 - 1"),
    (["--dataset-size", "1"], "--dataset-size (1) leaves a batch of 1 sample"),
    (["--dataset-size", "17"], "--dataset-size (17) leaves a batch of 1 sample"),
    (["--dataset-size", "4", "--drop-last"], "--dataset-size (4) is less than one batch"),
    (["--resume"], "--resume needs --checkpoint FILE that exists, got ''"),
    (["--resume", "--checkpoint", "/nonexistent/x.pt"], "--resume needs --checkpoint FILE"),
    (["--checkpoint", "/nonexistent/x.pt"], "--checkpoint: cannot write a file at /nonexistent"),
    (["--result", "/nonexistent/x.json"], "--result: cannot write a file at /nonexistent"),
    (["--result", "/"], "--result: cannot write a file at /"),
    # issue 39: a traceback after 44 s; an error after the first epoch
    (["--dataset-size", "10000000000"], "--dataset-size must be <= 10000000"),
    (["--epochs", "1000000000"], "--epochs must be <= 100000"),
    (["--checkpoint", "/proc/x.pt"], "--checkpoint: cannot write a file at /proc/x.pt"),
]


@pytest.mark.parametrize("name", ["train_dp", "train_ddp"])
@pytest.mark.parametrize("flags, words", BAD_FLAGS)
def test_bad_flags_are_refused_in_one_line_naming_the_flag(name, flags, words, capsys,
                                                           monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    script = m.load_script(name)
    with pytest.raises(SystemExit) as exiting:
        script.parse_args(flags)
    assert exiting.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


@pytest.mark.parametrize("name", ["train_dp", "train_ddp"])
def test_resume_reads_the_checkpoint_before_training(name, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    script = m.load_script(name)
    checkpoint, garbage = tmp_path / "ck.pt", tmp_path / "garbage.pt"
    torch.save({"epoch": 1}, checkpoint)  # epochs 0 and 1 done
    garbage.write_text("not a checkpoint\n")
    for flags, words in [(["--epochs", "2"], "--epochs (2): the checkpoint has 2 done already"),
                         (["--checkpoint", str(garbage)], f"--resume: cannot read {garbage}")]:
        with pytest.raises(SystemExit):
            script.parse_args(["--checkpoint", str(checkpoint), "--resume", *flags])
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
    assert script.parse_args(["--checkpoint", str(checkpoint), "--resume"]).epochs == 3


@pytest.mark.parametrize("flags", [["--dataset-size", "1", "--no-batchnorm"],
                                   ["--dataset-size", "17", "--drop-last"],
                                   ["--seed", str(2**63 - 1), "--lr", "1e-3"]])
def test_the_same_flags_pass_where_they_can_train(flags, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    m.load_script("train_dp").parse_args(flags)


def test_ddp_checks_the_global_batch_against_torchruns_world_size(monkeypatch, capsys):
    script = m.load_script("train_ddp")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")  # the other ranks say nothing: one line in all
    with pytest.raises(SystemExit):
        script.parse_args(["--global-batch", "15"])
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit):
        script.parse_args(["--global-batch", "15"])
    assert "--global-batch (15) must divide by world size x --accum (2 x 1)" in \
        capsys.readouterr().err
    # 97 samples: 2 ranks of 49 (DistributedSampler pads), in batches of 8, the last of 1
    with pytest.raises(SystemExit):
        script.parse_args(["--dataset-size", "97"])
    assert "leaves a batch of 1 sample" in capsys.readouterr().err
    script.parse_args(["--dataset-size", "100"])


def test_a_bad_flag_under_torchrun_gives_one_line_and_no_rank_traceback():
    """One rank: the world size comes from torchrun's environment (a second rank only stays
    silent, which the test above checks with RANK=1)."""
    with scratch_tmpdir() as tmp:
        result = subprocess.run(
            m.torchrun_command(1, [str(m.EXAMPLES / "train_ddp.py"), "--global-batch", "10",
                                   "--accum", "3"]),
            capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": tmp})
    assert result.returncode != 0
    ours = [line for line in result.stderr.splitlines() if "train_ddp.py" in line]
    # the script's one line, then torchrun's own report (it names the script as FAILED)
    assert ours[0] == ("train_ddp.py: error: --global-batch (10) must divide by world size x "
                       "--accum (1 x 3)"), result.stderr
    assert sum("error:" in line and "train_ddp" in line for line in ours) == 1
    assert "usage:" not in result.stderr and 'File "' + str(m.EXAMPLES) not in result.stderr


def test_a_diverged_loss_exits_non_zero_in_one_line_without_json():
    code, printed = _train_dp_main(["--epochs", "1", "--lr", "1e10"])
    assert printed == ""
    assert code == (f"{m.EXAMPLES / 'train_dp.py'}: error: the loss diverged to nan; try a "
                    "smaller --lr")  # one line, status 1


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
def test_the_json_line_is_printed_before_a_result_file_that_cannot_be_written():
    # passes the check before training, then the disk is full
    code, printed = _train_dp_main(["--epochs", "1", "--result", "/dev/full"])
    assert json.loads(printed)["samples_per_rank"] == [96]  # the result is kept
    assert code == (f"{m.EXAMPLES / 'train_dp.py'}: error: --result: could not write /dev/full: "
                    "No space left on device")


def test_run_removes_torchruns_log_folders_with_its_tmpdir():
    code = "import tempfile; d = tempfile.mkdtemp(prefix='torchelastic_'); print(d)"
    made = m._run([sys.executable, "-c", code], timeout_s=60).strip()
    assert os.path.basename(os.path.dirname(made)).startswith("dpcost-migration-run-")
    assert not os.path.exists(os.path.dirname(made))  # the TMPDIR went, and all in it


def test_the_clean_template_holds_the_six_steps_only():
    source = (m.EXAMPLES / "ddp_template.py").read_text()
    assert len(source.splitlines()) <= 60
    assert "bug" not in source.lower() and "record" not in source and "json" not in source
    for step in ("# 1. Launch", "# 2. Data", "# 3. Model", "# 4. Step", "# 5. Checkpoint",
                 "# 6. Exit"):
        assert step in source, step
    assert "shuffle=True" not in source.replace("no shuffle=True", "")


def test_the_clean_template_trains_under_torchrun(tmp_path):
    """2 gloo ranks: rank 0 alone logs and saves; the checkpoint loads into the plain model."""
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    status, out, err = m._spawn(m.torchrun_command(2, [str(m.EXAMPLES / "ddp_template.py")]),
                                timeout_s=180, cwd=tmp_path, merge=False)
    assert {c.pid for c in psutil.Process().children(recursive=True)} - before == set()
    assert status == 0, err[-3000:]
    logged = [line for line in out.splitlines() if line.startswith("epoch")]
    assert [line.split(":")[0] for line in logged] == ["epoch 0", "epoch 1", "epoch 2"]
    losses = [float(line.split()[-1]) for line in logged]
    assert losses[-1] < losses[0]  # it learns: x[:, :4].sum() is within an MLP's reach
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    model.load_state_dict(state)  # no "module." prefix: saved from the model, not the DDP


@pytest.mark.parametrize("script", ["train_ddp.py", "ddp_template.py"])
def test_a_ddp_script_outside_torchrun_says_so_in_one_line(script, tmp_path):
    """issue 39: KeyError: 'LOCAL_RANK' and a traceback, before."""
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE")}
    done = subprocess.run([sys.executable, str(m.EXAMPLES / script)], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env=env)
    assert done.returncode == 1 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and "torchrun" in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []  # no checkpoint.pt: it trained nothing


@pytest.mark.parametrize("stdout", ["closed", "/dev/full"])
def test_a_summary_that_cannot_be_printed_fails_in_one_line(stdout):
    """issue 39: exit 0 with no summary on a closed stdout; a traceback on /dev/full."""
    command = [sys.executable, str(m.EXAMPLES / "train_dp.py"), "--epochs", "1"]
    if stdout == "closed":
        done = subprocess.run(command, stderr=subprocess.PIPE, text=True, timeout=120,
                              preexec_fn=lambda: os.close(1))
    else:
        with open("/dev/full", "w") as full:
            done = subprocess.run(command, stdout=full, stderr=subprocess.PIPE, text=True,
                                  timeout=120)
    assert done.returncode == (2 if stdout == "closed" else 1)  # closed: refused, untrained
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "summary could not be printed" in done.stderr or \
        "could not print the summary" in done.stderr, done.stderr
