"""python -m dpcost.measure: one-line errors, a failing rank's status, SIGINT and SIGTERM.

The command's own behaviour (exit status, one-line errors, closed or full stdout, signals) is
tested on the program. The runs that only read what ``main()`` reports run it in this process
(``_main_here``): their ranks fork from this lane's warm process, which imports torch once per
lane instead of once per command (about 3.5 s of CPU each). The torchrun entry point is tested in
test_measure_torchrun.py."""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from process_marks import marked_processes, our_descendants

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")


def run(args, env=None, timeout=240):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, **(env or {})})


def _main_here(args) -> tuple[int, str, str]:
    """``python -m dpcost.measure ARGS`` as ``main(ARGS)`` in this process: (exit status, stdout,
    stderr). The program is ``sys.exit(main())`` (the tests above run it as one); main() sets
    its SIGTERM handler as the program does, and it is put back here."""
    from dpcost.measure.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    handler = signal.getsignal(signal.SIGTERM)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(args)
    finally:
        signal.signal(signal.SIGTERM, handler)
    return status, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("args, word", [
    (["--world-size", "1"], "--world-size"),
    (["--world-size", "two"], "--world-size"),
    (["--model-mb", "0.001"], "too small to matter"),
    (["--scenario", "ring"], "--scenario"),
    (["--steps", "0"], "--steps"),
    (["--model-mb", "inf"], "must be a finite number"),
    (["--model-mb", "nan"], "must be a finite number"),
    (["--model-mb", "1e300"], "MemAvailable"),
    (["--plot", "/no/such/folder/x.png"], "--plot"),
    (["--inject-fault", "١:raise"], "--inject-fault"),
    (["--trace", "t.json"], "--trace needs --scenario timeline"),
    (["--scenario", "timeline", "--trace", "/no/such/folder/t.json"], "--trace"),
    (["--model-mb", "1.7e308"], "--model-mb must be a finite number (bytes beyond"),
    (["--model-mb", "3e301"], "--model-mb: a model of 3e+307 B needs more than"),
    (["--world-size", "100000"], "--world-size: 100000 local ranks need at least"),
    (["--world-size", "100001"], "--world-size must be at most 100,000"),
    (["--world-size", "١٢"], "--world-size must be a whole number in digits 0-9"),
    (["--world-size", "８"], "--world-size must be a whole number in digits 0-9"),
    (["--steps", "٣"], "--steps must be a whole number in digits 0-9"),
    (["--model-mb", "４"], "--model-mb must be a number in digits 0-9"),
    (["--model-mb", "٢.٥"], "--model-mb must be a number in digits 0-9"),
    (["--timeout", "inf"], "--timeout must be a finite number"),
    (["--plot", ""], "--plot needs a file name"),
    (["--scenario", "timeline", "--trace", ""], "--trace needs a file name"),
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


def test_json_is_json_also_when_everything_is_skipped():
    result = run([sys.executable, "-m", "dpcost.measure", "--scenario", "dataparallel-cuda",
                  "--json"])
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["scenarios"] == {} and "dataparallel-cuda" in report["skipped"]


@pytest.mark.skipif(os.path.exists("/dev/nvidiactl"), reason="this machine may have CUDA GPUs")
def test_nccl_without_cuda_is_refused_before_any_rank_starts():
    started = time.monotonic()
    result = run([sys.executable, "-m", "dpcost.measure", "--backend", "nccl"])
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("python -m dpcost.measure: error: --backend nccl needs CUDA GPUs; "
                             "found 0\n")
    assert time.monotonic() - started < 30  # no rank started (they failed 3.5 s in, before)


def _closed_stdout():
    os.close(1)


@pytest.mark.parametrize("command", [
    ["dpcost.measure", "--scenario", "dataparallel-cuda", "--json"],
    ["dpcost.measure", "--help"],
    ["dpcost", "--model-size", "1GB", "--gpus", "8", "--json"],
    ["dpcost", "--help"],
])
@pytest.mark.parametrize("fault", ["/dev/full", "closed"])
def test_output_that_cannot_be_written_exits_1_with_one_line(command, fault):
    if fault == "/dev/full" and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with open(os.devnull if fault == "closed" else fault, "w") as stdout:
        result = subprocess.run([sys.executable, "-m", *command], stdout=stdout,
                                stderr=subprocess.PIPE, text=True, timeout=60, cwd=ROOT,
                                preexec_fn=_closed_stdout if fault == "closed" else None)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    words = "stdout is closed" if fault == "closed" else "could not write to stdout: No space"
    assert words in lines[0]


def test_a_failing_rank_exits_non_zero_naming_it_and_leaves_no_process():
    before = our_descendants()
    status, _, err = _main_here(["--world-size", "2", "--model-mb", "0.5", "--steps", "2",
                                 "--scenario", "dp", "--inject-fault", "0:raise"])
    assert status == 1
    assert "error: rank 0 failed: RuntimeError: injected fault on rank 0" in err
    assert our_descendants() - before == set()


@pytest.mark.parametrize("args", [["--model-mb", "1e300"], ["--model-mb", "4000"],
                                  ["--plot", "/no/such/folder/x.png"], ["--plot", "out.foo"]])
def test_impossible_runs_are_refused_before_any_rank_starts(args, monkeypatch, capsys):
    from dpcost.measure import __main__ as cli
    from dpcost.measure import launch

    def must_not_start(*args, **kwargs):
        raise AssertionError("the ranks were started")

    monkeypatch.setattr(launch, "launch", must_not_start)
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "error: --" in err


def _as_in_a_terminal():
    # A command typed in a shell starts with SIGINT at its default; one started from a background
    # job (`cmd &` in a script, as a CI runner may start pytest) inherits SIGINT ignored, and then
    # Python installs no KeyboardInterrupt handler and Ctrl-C cannot reach it. Seen here: the CLI
    # under `benchmarks/repeat.py ... &` ignored the test's SIGINT every time.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("signum, whole_group, status", [
    (signal.SIGINT, True, 130),  # Ctrl-C: the terminal signals the whole process group
    (signal.SIGTERM, False, 143),  # kill PID: the launcher alone
])
def test_a_signal_ends_every_rank_with_one_line_and_the_shell_status(signum, whole_group, status):
    mark = uuid.uuid4().hex
    command = [sys.executable, "-m", "dpcost.measure", "--world-size", "2", "--model-mb", "4",
               "--steps", "100000", "--scenario", "ddp"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True, preexec_fn=_as_in_a_terminal,
                               env={**os.environ, "DPCOST_TEST_MARK": mark})
    try:
        deadline = time.monotonic() + 120
        while len(marked_processes(mark)) < 5 and time.monotonic() < deadline:
            time.sleep(0.2)  # the CLI, its warm process, the helper and both ranks are up
        time.sleep(1.5)  # inside the run: the ranks set up or train (forked warm: ~0.5 s)
        if whole_group:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
        try:
            out, err = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # seen once in ~20 runs: say where it was stuck
            left = [" ".join(psutil.Process(pid).cmdline()[:4]) for pid in marked_processes(mark)]
            process.send_signal(signal.SIGUSR1)  # the CLI's faulthandler prints its stacks
            time.sleep(1)
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            pytest.fail(f"no exit 60 s after {signal.Signals(signum).name}; processes left: "
                        f"{left}; the CLI's stderr and stacks:\n{err[-6000:]}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == status, err
    assert len(err.strip().splitlines()) == 1, err
    assert f"interrupted by {signal.Signals(signum).name} while measuring ddp on 2 ranks" in err
    time.sleep(0.5)
    assert marked_processes(mark) == []


@pytest.fixture(scope="module")
def timeline_run(tmp_path_factory):
    """One timed run read by two tests: the trace goes to a file; the plot goes to /dev/full,
    which passes the check made before the run (a writable file), then fails to save."""
    path = tmp_path_factory.mktemp("timeline") / "trace.json"
    return _main_here(["--world-size", "2", "--model-mb", "1", "--steps", "2", "--scenario",
                       "timeline", "--json", "--trace", str(path), "--plot", "/dev/full"]), path


def test_the_timeline_is_written_as_chrome_trace_json(timeline_run):
    (_, _, err), path = timeline_run
    assert "--trace" not in err, err[-2000:]
    trace = json.loads(path.read_text())
    processes = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert processes == {f"{s}-timeline rank {r}" for s in ("ddp", "dp", "dp-nccl")
                         for r in (0, 1)}
    buckets = [e for e in trace["traceEvents"] if e["name"].startswith("bucket")]
    assert buckets and all(e["ph"] == "X" and e["dur"] >= 0 for e in buckets)


def test_a_plot_that_fails_to_save_keeps_the_report_and_says_so_in_one_line(timeline_run):
    (status, out, err), _ = timeline_run
    assert status == 1
    assert json.loads(out)["scenarios"]["ddp-timeline"]  # the measured report is kept
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "python -m dpcost.measure: error: --plot: could not save /dev/full:"), err


def test_a_trace_that_fails_to_write_keeps_the_report_and_says_so_in_one_line():
    status, out, err = _main_here(["--world-size", "2", "--model-mb", "0.25", "--steps", "2",
                                   "--scenario", "timeline", "--json", "--trace", "/dev/full"])
    assert status == 1
    assert json.loads(out)["scenarios"]["ddp-timeline"]  # the report is kept
    assert err.strip().splitlines() == [
        "python -m dpcost.measure: error: --trace: could not write /dev/full: No space left on "
        "device"]


@pytest.mark.parametrize("args, words", [
    # issue 39: 14 GB in 45 s before it was stopped; the meta build counts 276 GB of parameters
    (["--model", "Llama-2 70B", "--world-size", "2"], ["--model: a model of", "MemAvailable"]),
    # issue 39: 19 s and a flattened traceback from rank 0 before
    (["--model", "nonexist.mod:f", "--input-shape", "2,3"],
     ["--model: cannot import 'nonexist.mod'"]),
    (["--model", "os:getcwd", "--input-shape", "2"], ["--model: 'os:getcwd' built a str"]),
])
def test_a_model_that_cannot_build_or_fit_is_refused_before_any_rank(args, words):
    """In this process, so that torch is imported once (the program's own one-line errors are
    tested above): exit 2, one line naming --model, no rank started, within seconds."""
    before = our_descendants()
    started = time.monotonic()
    status, out, err = _main_here(args)
    assert status == 2 and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith("python -m dpcost.measure: error: --model")
    for word in words:
        assert word in err, err
    assert time.monotonic() - started < 15
    assert our_descendants() - before == set()
