"""``python -m dpcost.migration check`` on a practitioner's own pair, not the course's scripts
(examples/own_migration: an MLP on synthetic data with Adam), run for real on 2 gloo ranks: a
missing ``set_epoch`` fails with its finding and leaves no process, and scripts that cannot be
compared exit 2 with one line naming the parameter. The correct pair (exit 0, the tolerance
scaled to Adam, the verdict) is lesson 09's cell, which runs the same command under nbval: one
torchrun here, one there."""

import os
import subprocess
import sys

import psutil

from dpcost import migration as m

OWN = m.EXAMPLES / "own_migration"


def check(*argv, timeout=300):
    """The check as a user runs it: its exit status, stdout lines and stderr lines."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(m.ROOT), os.environ.get("PYTHONPATH", "")])))
    done = subprocess.run([sys.executable, "-m", "dpcost.migration", "check", *map(str, argv)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    return done.returncode, done.stdout.splitlines(), done.stderr.splitlines()


def _descendants():
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_a_missing_set_epoch_fails_with_its_finding_and_leaves_no_process(tmp_path):
    """ddp.py with its ``sampler.set_epoch(epoch)`` line deleted, as a practitioner forgets it."""
    source = (OWN / "ddp.py").read_text().splitlines(keepends=True)
    kept = [line for line in source if "sampler.set_epoch(epoch)" not in line]
    assert len(kept) == len(source) - 1
    script = tmp_path / "ddp_no_set_epoch.py"
    script.write_text("".join(kept))
    before = _descendants()
    status, out, err = check(OWN / "dp.py", script)
    assert _descendants() - before == set()  # torchrun, its agent and the ranks are all gone
    assert status == 1 and err == [], err
    assert m.SAME_ORDER in out[1:]
    assert any(line.startswith("final parameters differ") for line in out[1:])


def _script(folder, name, source):
    path = folder / name
    path.write_text(source)
    return path


def test_scripts_that_cannot_be_compared_exit_2_in_one_line(tmp_path):
    failing = _script(tmp_path, "failing.py", "import sys\nprint('loading', file=sys.stderr)\n"
                      "raise ValueError('no such column: price')\n")
    silent = _script(tmp_path, "silent.py", "print('trained')\n")
    slow = _script(tmp_path, "slow.py", "import time\ntime.sleep(60)\n")
    dp, ddp = OWN / "dp.py", OWN / "ddp.py"
    cases = [
        ((tmp_path / "nope.py", ddp), "dp_script: no such file: "),
        ((dp, tmp_path / "nope.py"), "ddp_script: no such file: "),
        ((dp, ddp, "--nproc", "1"), "--nproc must be an int >= 2 (a DDP run to compare), got 1"),
        ((dp, ddp, "--nproc", "1000000"), "--nproc: at most "),  # issue 39: 205 ranks, 9.5 GB
        ((dp, ddp, "--atol", "0"), "--atol must be a finite number > 0, got 0.0"),
        ((dp, ddp, "--optimizer-tolerance", "nan"), "--optimizer-tolerance must be a finite"),
        ((dp, ddp, "--atol", "x"), "argument --atol: must be a number, got 'x'"),
        ((failing, ddp), "dp_script: failing.py exited with status 1: "
                         "ValueError: no such column: price"),
        ((silent, ddp), "dp_script: silent.py ran, but it never called record.result(): add "
                        "`from dpcost.migration import record`"),
        ((slow, ddp, "--timeout-s", "1"), "--timeout-s: slow.py ran past 1 s"),
    ]
    before = _descendants()
    for argv, words in cases:
        status, out, err = check(*argv, timeout=60)
        assert status == 2 and out == [] and len(err) == 1, (argv, out, err)
        assert err[0].startswith("python -m dpcost.migration check: error: "), err
        assert words in err[0], err
    assert _descendants() - before == set()


def test_a_correct_migration_with_dropout_passes_and_with_dropout_kept_names_dropout():
    """The practitioner's case (issue 38): a tiny transformer with dropout 0.1, migrated
    correctly, with Adam. The check turns dropout off in both runs and says so: it passes, with
    attention's key bias (zero gradient up to rounding) left out by name. With --keep-dropout it
    fails and names the dropout modules as the cause, not BatchNorm, which the model lacks."""
    pair = (OWN / "transformer_dp.py", OWN / "transformer_ddp.py")
    before = _descendants()
    status, out, err = check(*pair)
    assert status == 0 and err == [], (out, err)
    assert out[-1].startswith("the migration is right")
    assert any(line.startswith("dropout was off in both runs (") for line in out)
    assert any("self_attn.in_proj_bias" in line and "left out" in line for line in out)
    status, out, err = check(*pair, "--keep-dropout")
    assert status == 1 and err == [], (out, err)
    (finding,) = [line for line in out if line.startswith("final parameters differ")]
    assert "dropout (encoder.layers.0.self_attn (attention dropout 0.1)" in finding
    assert "BatchNorm" not in finding
    assert _descendants() - before == set()
