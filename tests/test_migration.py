"""dpcost.migration: the comparison in words, the runners' clean-up, the script diff and the
caller's end taking torchrun along (the course cases run for real in lesson 09)."""

import os
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from process_marks import marked_processes

from dpcost import migration as m


def result(params, sample_ids, checksums=None, writes=0):
    checksums = checksums or [1.0] * len(sample_ids)
    return {"params": params, "sample_ids": sample_ids, "rank_checksums": checksums,
            "checkpoint_writes": writes, "samples_per_rank": [sum(map(len, r)) for r in sample_ids]}


REF = result([1.0, 2.0], [[[0, 1, 2, 3], [3, 2, 1, 0]]], writes=2)


def test_diagnose_equivalent_run_has_no_findings():
    ddp = result([1.0, 2.0 + 1e-7], [[[0, 2], [3, 1]], [[1, 3], [2, 0]]], writes=2)
    assert m.diagnose(REF, ddp) == []


def test_diagnose_names_each_mistake():
    same = result([1.0, 2.0], [[[0, 1, 2, 3], [3, 2, 1, 0]]] * 2)
    assert "did you use a DistributedSampler?" in m.diagnose(REF, same)[0]
    frozen = result([1.0, 2.0], [[[0, 2], [0, 2]], [[1, 3], [1, 3]]])
    assert any("set_epoch" in f for f in m.diagnose(REF, frozen))
    padded = result([1.0, 2.0], [[[0, 2, 1], [3, 1, 0]], [[3, 0], [2, 3]]])
    assert "1 seen twice" in m.diagnose(REF, padded)[0]
    apart = result([1.0, 2.0], [[[0, 2], [3, 1]], [[1, 3], [2, 0]]], checksums=[1.0, 1.5])
    assert "different parameters" in m.diagnose(REF, apart)[0]
    assert "forward run outside no_sync()" in m.diagnose(REF, apart)[0]  # the forward decides
    writes = result([1.0, 2.0], [[[0, 2], [3, 1]], [[1, 3], [2, 0]]], writes=4)
    assert "written 4 times, 2 in one process" in m.diagnose(REF, writes)[0]
    off = result([1.0, 2.1], [[[0, 2], [3, 1]], [[1, 3], [2, 0]]], writes=2)
    (finding,) = m.diagnose(REF, off)
    assert "up to 0.1" in finding and "mean, not sum" in finding


def test_max_param_diff_and_bad_inputs():
    assert m.max_param_diff(REF, result([1.0, 2.5], [[[0]]])) == 0.5
    assert m.max_param_diff(REF, result([1.0], [[[0]]])) == float("inf")
    with pytest.raises(ValueError, match="name must be an example script"):
        m.load_script("nope")
    with pytest.raises(TypeError, match="cases must be"):
        m.run_dp([])
    with pytest.raises(TypeError, match=r"cases\['a'\] must be a list of str"):
        m.run_ddp({"a": "--epochs 1"})
    with pytest.raises(ValueError, match="nproc must be an int"):
        m.torchrun_command(0, [])
    with pytest.raises(ValueError, match="names must be among"):
        m.compare_cases(names=["plain", "typo"])


def _descendants():
    # Compared before and after, not with []: earlier tests in the same session may have
    # started helpers that live for the session (multiprocessing's resource tracker).
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_a_hung_run_is_killed_with_its_children():
    code = ("import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)")
    before = _descendants()
    started = time.monotonic()
    with pytest.raises(m.MigrationRunError, match="timed out after 1 s"):
        m._run([sys.executable, "-c", code], timeout_s=1)
    assert time.monotonic() - started < 10
    assert _descendants() - before == set()


def test_a_failing_run_reports_its_output():
    with pytest.raises(m.MigrationRunError, match="exit status 3(.|\n)*boom"):
        m._run([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], timeout_s=30)


# Every course case run for real (compare_cases on 2 gloo ranks under one torchrun): lesson 09
# runs it and asserts it under nbval - the equivalent cases agree (parameters, samples, writes),
# the uneven dataset is padded and drop_last cuts it, BatchNorm differs, and each bug is named
# (the findings' words are in its checked outputs). A test here ran it again (issue 19 merged it).


def test_script_diff_shows_the_migration_without_the_bug_flags():
    import ast

    diff = m.script_diff()
    assert diff[:2] == ["--- examples/train_dp.py", "+++ examples/train_ddp.py"]
    added = [line[1:] for line in diff if line.startswith("+") and not line.startswith("+++")]
    assert not [line for line in added if "bug" in line.lower()]
    for needed in ("dist.init_process_group(backend)", "torch.cuda.set_device(local_rank)",
                   "DistributedSampler(dataset", "sampler.set_epoch(epoch)", "ddp.no_sync()",
                   "dist.barrier()", "dist.destroy_process_group()",
                   "nn.SyncBatchNorm.convert_sync_batchnorm(model)", "map_location"):
        assert any(needed in line for line in added), needed
    # Without its bug lines the DDP script is still valid Python: the migration alone.
    source = (m.EXAMPLES / "train_ddp.py").read_text().splitlines()
    ast.parse("\n".join(line for line in source if "bug" not in line.lower()))
    assert len(m.script_diff(without_bugs=False)) > len(diff)


def test_killing_the_caller_takes_torchrun_and_its_ranks_along(tmp_path):
    """SIGKILL the process that called run_ddp: torchrun and both ranks must go too."""
    import signal
    import subprocess

    code = ("from dpcost import migration as m\n"
            "m.run_ddp({'slow': ['--no-batchnorm', '--epochs', '100000']}, nproc=2)\n")
    # A process killed by SIGKILL cannot remove its temporary folder: keep it in tmp_path.
    mark = uuid.uuid4().hex  # in every process this test starts, and only in them
    caller = subprocess.Popen([sys.executable, "-c", code], cwd=m.ROOT,
                              env={**os.environ, "TMPDIR": str(tmp_path),
                                   "DPCOST_TEST_MARK": mark})
    deadline = time.monotonic() + 120
    ranks = []
    while time.monotonic() < deadline and len(ranks) < 2:
        time.sleep(0.5)
        ranks = [p for p in psutil.Process(caller.pid).children(recursive=True)
                 if "dpcost.migration" in " ".join(p.cmdline()) and "torchrun" not in
                 " ".join(p.cmdline())]
    assert len(ranks) == 2, "the ranks did not start"
    family = psutil.Process(caller.pid).children(recursive=True)
    caller.send_signal(signal.SIGKILL)
    caller.wait()
    gone, alive = psutil.wait_procs(family, timeout=20)
    assert alive == []
    assert marked_processes(mark) == []  # nothing of ours, anywhere (other lanes run these too)


def test_rounded_shows_floats_to_four_significant_digits_and_keeps_the_rest():
    line = {"final_loss": 0.3781767189502716, "param_checksum": 125.73381007976423,
            "samples_per_rank": [288], "steps": 18, "checkpoint_ok": None,
            "rank_checksums": [1.23456789, 2.0], "nested": {"x": 1.0e-7 + 1e-15}}
    shown = m.rounded(line)
    assert shown == {"final_loss": 0.3782, "param_checksum": 125.7, "samples_per_rank": [288],
                     "steps": 18, "checkpoint_ok": None, "rank_checksums": [1.235, 2.0],
                     "nested": {"x": 1e-07}}
    assert line["final_loss"] == 0.3781767189502716  # the line itself is left as it was
    assert m.rounded(line, digits=2)["param_checksum"] == 130.0


def test_render_rows_gives_a_verdict_per_case_and_the_findings_underneath():
    rows = [{"case": "plain", "max_param_diff": 1.2e-7, "samples_per_rank": [144, 144],
             "checkpoint_writes": 0, "findings": []},
            {"case": "bug_no_set_epoch", "max_param_diff": 0.0758, "samples_per_rank": [144, 144],
             "checkpoint_writes": 0, "findings": [m.SAME_ORDER]}]
    lines = m.render_rows(rows).splitlines()
    assert lines[2].split() == ["plain", "1.20e-07", "[144,", "144]", "0", "same", "as", "one",
                                "process"]
    assert lines[3].endswith("DIFFERENT") and lines[3].startswith("bug_no_set_epoch")
    assert lines[4:] == [f"  bug_no_set_epoch: {m.SAME_ORDER}"]


# python -m dpcost.migration check on any signal: a DP script that records at once, and a DDP
# script whose ranks sleep, so that each signal lands in the DDP phase with 2 ranks running.
QUICK_DP = ("import torch\nfrom dpcost.migration import record\n"
            "record.samples([0], epoch=0)\nrecord.result(loss=0.0, params=[torch.zeros(1)])\n")
SLEEPING_DDP = "import time\ntime.sleep(300)\n"
# A DP script that leaves a daemon: it forks, the child makes a session of its own and forks
# the grandchild that sleeps, then the child exits (the grandchild is an orphan).
DAEMON_DP = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
             "        time.sleep(300)\n    os._exit(0)\ntime.sleep(300)\n")


def _start_check(tmp_path, dp_source, ddp_source, *flags):
    """The check as a user starts it, its TMPDIR in ``tmp_path``/tmp, every process it starts
    marked; (process, mark, the TMPDIR)."""
    import subprocess

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    (tmp_path / "dp.py").write_text(dp_source)
    (tmp_path / "ddp.py").write_text(ddp_source)
    mark = uuid.uuid4().hex
    env = {**os.environ, "TMPDIR": str(scratch), "DPCOST_TEST_MARK": mark,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(m.ROOT),
                                                       os.environ.get("PYTHONPATH", "")]))}
    process = subprocess.Popen([sys.executable, "-m", "dpcost.migration", "check",
                                str(tmp_path / "dp.py"), str(tmp_path / "ddp.py"), *flags],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env, cwd=tmp_path)
    return process, mark, scratch


def _wait_for(condition, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def _ranks_running(mark):
    """How many of the marked processes are ranks of the sleeping DDP script."""
    count = 0
    for pid in marked_processes(mark):
        try:
            line = psutil.Process(pid).cmdline()
        except psutil.Error:
            continue
        if not line:  # a zombie: its command line is gone
            continue
        count += line[1:] == ["-u", str(Path(line[-1]).parent / "ddp.py")]  # torchrun's way
    return count


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_a_signal_during_the_ddp_phase_leaves_no_process_and_no_folder(tmp_path, signum):
    """SIGINT and SIGTERM: one line, exit 128 + N, nothing left. SIGKILL of the check itself
    (its parent killed, for the processes it started): the keeper of the run notices, ends
    torchrun and both ranks, each in a session of its own, and removes the folders."""
    import signal

    process, mark, scratch = _start_check(tmp_path, QUICK_DP, SLEEPING_DDP)
    assert _wait_for(lambda: _ranks_running(mark) == 2, 120), process.communicate(timeout=30)
    assert [p.name for p in scratch.iterdir()]  # the check's folders exist meanwhile
    process.send_signal(getattr(signal, signum))
    out, err = process.communicate(timeout=60)
    if signum == "SIGKILL":
        assert process.returncode == -signal.SIGKILL
    else:
        assert process.returncode == 128 + getattr(signal, signum) and out == ""
        assert len(err.splitlines()) == 1 and f"stopped by {signum}" in err, err
        assert marked_processes(mark) == [] and list(scratch.iterdir()) == []
    assert _wait_for(lambda: marked_processes(mark) == [], 20), marked_processes(mark)
    assert _wait_for(lambda: list(scratch.iterdir()) == [], 5), list(scratch.iterdir())


def test_a_daemon_of_the_dp_script_goes_at_the_time_limit_and_a_failure_leaves_nothing(
        tmp_path):
    """The DP script double-forks a grandchild into a session of its own, then hangs:
    --timeout-s ends the script, and the grandchild, which no parent link leads to any more
    (its parent exited), goes too. Then a DDP script that fails: exit 2, nothing left."""
    process, mark, scratch = _start_check(tmp_path, DAEMON_DP, SLEEPING_DDP, "--timeout-s", "3")
    started = time.monotonic()
    out, err = process.communicate(timeout=60)
    assert process.returncode == 2 and "--timeout-s: dp.py ran past 3 s" in err, err
    assert time.monotonic() - started < 30
    assert marked_processes(mark) == [] and list(scratch.iterdir()) == []
    (tmp_path / "tmp").rmdir()
    process, mark, scratch = _start_check(tmp_path, QUICK_DP, "raise SystemExit('no data')\n")
    out, err = process.communicate(timeout=120)
    assert process.returncode == 2 and "ddp.py exited with status 1" in err, err
    assert marked_processes(mark) == [] and list(scratch.iterdir()) == []


def test_a_checker_killed_outright_between_runs_leaves_no_folder(tmp_path):
    """Between the DataParallel and the DDP run no run's keeper is alive; the check's own guard
    removes its folder when the checker dies by SIGKILL (no time to clean up)."""
    import subprocess
    import textwrap

    folder = tmp_path / "dpcost-migration-check-killed"
    folder.mkdir()
    (folder / "dp").mkdir()
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, signal, sys, time
        from dpcost import migration
        with migration.folder_guard({str(folder)!r}):
            time.sleep(1.0)  # the keeper is up (it removes only after its parent is gone)
            print("guarded", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    """)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "guarded"
    child.wait(30)
    deadline = time.monotonic() + 15
    while folder.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not folder.exists()
