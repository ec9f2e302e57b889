"""The sandbox: student code runs in a forked child; nothing it does reaches the caller."""

import builtins
import fcntl
import json
import os
import select
import signal
import stat
import struct
import subprocess
import sys
import textwrap
import time
import tracemalloc

import numpy as np
import psutil
import pytest

import dpcost
import dpcost.core
from dpcost.exercises import five_functions
from dpcost.grading import confine, sandbox
from dpcost.grading.sandbox import run_many, run_sandboxed


def multiply(a, b):
    return a * b


def noisy(x):
    print("python-level noise")
    os.write(1, b"fd-level noise\n")
    os.write(2, b"stderr noise\n")
    return x


def loop_forever():
    while True:
        pass


def test_returns_value_and_type():
    outcome = run_sandboxed(multiply, 6, 7)
    assert outcome.status == "returned" and outcome.value == 42
    assert outcome.value_type == "int" and outcome.value_repr == "42"


def test_exception_reported_with_type_message_and_bases():
    outcome = run_sandboxed(int, "not a number")
    assert outcome.status == "raised" and outcome.error_type == "ValueError"
    assert "not a number" in outcome.error_message
    assert "Exception" in outcome.error_bases


def test_system_exit_is_a_result_not_an_exit():
    outcome = run_sandboxed(exit, 3)
    assert outcome.status == "raised" and outcome.error_type == "SystemExit"


def test_print_noise_captured_not_shown(capfd):
    outcome = run_sandboxed(noisy, 5)
    assert outcome.value == 5
    for text in ("python-level noise", "fd-level noise", "stderr noise"):
        assert text in outcome.stdout
    out, err = capfd.readouterr()
    assert "noise" not in out + err


def test_infinite_loop_times_out_and_is_killed():
    start = time.perf_counter()
    outcome = run_sandboxed(loop_forever, timeout=0.3)
    assert outcome.status == "timeout" and "0.3 s" in outcome.detail
    assert time.perf_counter() - start < 5


def test_child_that_dies_is_reported():
    outcome = run_sandboxed(os._exit, 7)
    assert outcome.status == "crashed" and "code 7" in outcome.detail


def test_unpicklable_value_keeps_its_repr():
    outcome = run_sandboxed(lambda: (lambda: 1))
    assert outcome.status == "returned" and outcome.value is None
    assert outcome.value_type == "function"


def test_run_many_carries_on_after_a_timeout():
    calls = [(multiply, (2, 3), {}), (loop_forever, (), {}), (multiply, (4, 5), {})]
    outcomes = run_many(calls, timeout=0.3)
    assert [o.status for o in outcomes] == ["returned", "timeout", "returned"]
    assert outcomes[2].value == 20


def test_run_many_skips_after_max_timeouts():
    start = time.perf_counter()
    outcomes = run_many([(loop_forever, (), {})] * 6, timeout=0.2, max_timeouts=2)
    assert [o.status for o in outcomes] == ["timeout"] * 2 + ["skipped"] * 4
    assert time.perf_counter() - start < 5


def test_child_state_never_leaks_into_parent():
    state = []
    run_sandboxed(state.append, 1)
    assert state == []


@pytest.mark.parametrize("bad", [0, -1, "1", True])
def test_bad_timeout(bad):
    with pytest.raises(ValueError, match="timeout"):
        run_sandboxed(multiply, 1, 2, timeout=bad)


def test_not_callable():
    with pytest.raises(TypeError, match="func"):
        run_sandboxed(42)


# ---- Hostile return values, pipes and processes (issue 9, section 3) --------------------------
# Each scenario that could end or hang the caller runs in a fresh Python process: that process
# plays the notebook's kernel, and the test checks that it survives and reports a failure.

KERNEL_TIMEOUT = 30  # seconds; the scenarios take about one


def run_kernel(*parts: str) -> dict:
    """Run the script ``parts`` in a fresh Python (the "kernel"); the JSON it prints last.

    Fails the test if the kernel hangs, dies, or exits non-zero.
    """
    process = subprocess.Popen([sys.executable, "-c", "".join(map(textwrap.dedent, parts))],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=KERNEL_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the kernel hung for {KERNEL_TIMEOUT} s")
    finally:  # whatever happens (pytest-timeout too), leave no process behind
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    assert process.returncode == 0, f"the kernel exited {process.returncode}: {err[-2000:]}"
    return json.loads(out.strip().splitlines()[-1])


CHECK_AND_PRINT = """
    import json
    report = check(dp_communication_volume)
    print(json.dumps({"passed": report.passed, "total": report.total,
                      "reasons": [r.reason for r in report.results],
                      "got": [r.got for r in report.results]}))
"""


class RightAnswerOnUnpickling:
    """Not a float; unpickled, it becomes the right float (computed by the package)."""

    def __init__(self, size, n):
        self.args = (size, n)

    def __reduce__(self):
        return (dpcost.core.dp_communication_volume, self.args)


def test_reduce_that_unpickles_to_the_right_float_does_not_pass():
    def dp_communication_volume(model_size_bytes, num_gpus):
        return RightAnswerOnUnpickling(model_size_bytes, num_gpus)

    report = five_functions.check(dp_communication_volume)
    assert report.passed == 0
    assert all("must return a Python float, got test_exercises_sandbox.RightAnswerOnUnpickling"
               in r.reason for r in report.results), report


def test_reduce_that_exits_cannot_end_the_kernel():
    result = run_kernel("""
        import os
        from dpcost.exercises.five_functions import check

        class Exit:
            def __reduce__(self):
                return (os._exit, (3,))

        def dp_communication_volume(model_size_bytes, num_gpus):
            return Exit()
    """, CHECK_AND_PRINT)
    assert result["passed"] == 0 and result["total"] == 3
    assert all("got __main__.Exit" in reason for reason in result["reasons"])


def test_reduce_that_hangs_cannot_hang_the_kernel():
    start = time.perf_counter()
    result = run_kernel("""
        import time
        from dpcost.exercises.five_functions import check

        class Hang:
            def __reduce__(self):
                return (time.sleep, (3600,))

        def dp_communication_volume(model_size_bytes, num_gpus):
            return Hang()
    """, CHECK_AND_PRINT)
    assert result["passed"] == 0 and "got __main__.Hang" in result["reasons"][0]
    assert time.perf_counter() - start < 30


def test_int_subclass_whose_int_exits_cannot_end_the_kernel():
    # The ring checker turns each send's entries into ints; int() calls __int__.
    result = run_kernel("""
        import json
        import os
        from dpcost.exercises.ring_step import check

        class Chunk(int):
            def __int__(self):
                os._exit(4)

            def __index__(self):
                os._exit(5)

        def reduce_scatter_sends(num_ranks, step):
            n = num_ranks
            return [(r, (r + 1) % n, Chunk((r - step) % n)) for r in range(n)]

        report = check(reduce_scatter_sends)
        print(json.dumps({"passed": report.passed, "total": report.total}))
    """)
    assert result == {"passed": 5, "total": 5}  # the int's value is the right chunk


class EqualsEverything:
    """Looks like a float to isinstance, equals anything, converts to any float wanted."""

    __class__ = property(lambda self: float)

    def __eq__(self, other):
        return True

    __hash__ = object.__hash__

    def __float__(self):
        return 21e9


class float(builtins.float):  # noqa: A001 - a student's class called float, on purpose
    def __eq__(self, other):
        return True

    __hash__ = builtins.float.__hash__


def test_eq_and_float_tricks_do_not_pass():
    def dp_communication_volume(model_size_bytes, num_gpus):
        return EqualsEverything()

    report = five_functions.check(dp_communication_volume)
    assert report.passed == 0 and "got test_exercises_sandbox.EqualsEverything" in (
        report.results[0].reason)

    def dp_communication_volume(model_size_bytes, num_gpus):  # noqa: F811
        return float(-1.0)

    outcome = run_sandboxed(dp_communication_volume, 1.5e9, 8)
    assert outcome.value_type == "test_exercises_sandbox.float" and outcome.value == -1.0
    assert five_functions.check(dp_communication_volume).passed == 0


def test_only_plain_data_comes_back():
    outcome = run_sandboxed(lambda: [1, (2.5, "x", None, True), np.int64(7), np.float32(0.5)])
    assert outcome.value == [1, (2.5, "x", None, True), 7, 0.5]
    assert [type(v) for v in outcome.value] == [int, tuple, int, builtins.float]
    outcome = run_sandboxed(np.float64, 2.0)
    assert outcome.value == 2.0 and type(outcome.value) is builtins.float
    assert outcome.value_type == "numpy.float64"
    for value, note in [(np.zeros(3), "numpy.ndarray is not plain data"),
                        (list(range(30_000)), "more than 20000 values"),
                        ([[[[[1]]]]], "nested more than 4 deep"),
                        (2**5000, "more than 4096 bits"),
                        ({"a": 1}, "dict is not plain data")]:
        outcome = run_sandboxed(lambda v=value: v)
        assert outcome.returned and outcome.value is None and note in outcome.value_note


def find_result_pipes() -> list[int]:
    """What an attacker in the child does: look up the call stack for the result channel (an
    object with a fileno(), or an int) that is a pipe open for writing, besides fds 0-2."""
    fds = set()
    frame = sys._getframe(1)
    while frame is not None:
        for value in list(frame.f_locals.values()):
            try:
                fd = value if type(value) is int else value.fileno()
                mode = os.fstat(fd).st_mode
                flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            except Exception:
                continue
            if fd > 2 and stat.S_ISFIFO(mode) and flags & os.O_ACCMODE == os.O_WRONLY:
                fds.add(fd)
        frame = frame.f_back
    return sorted(fds)


def length_header_then_sleep():
    for fd in find_result_pipes():
        os.write(fd, struct.pack("!i", 2**31 - 1))  # "a 2 GiB message follows"
    time.sleep(60)


def garbage_then_return():
    for fd in find_result_pipes():
        os.write(fd, b"\xff\xff\xff\x7fgarbage")
    return 1.0


def flood_without_newline():
    for fd in find_result_pipes():
        chunk = b"x" * 2**16
        for _ in range(48):  # 3 MiB, more than any message may be
            os.write(fd, chunk)
    return 1.0


def test_length_header_in_the_result_pipe_cannot_hang_the_caller():
    start = time.perf_counter()
    outcomes = run_many([(length_header_then_sleep, (), {}), (multiply, (6, 7), {})],
                        timeout=0.5)
    assert [o.status for o in outcomes] == ["timeout", "returned"]
    assert outcomes[1].value == 42
    assert time.perf_counter() - start < 10


def test_garbage_in_the_result_pipe_is_a_malformed_result():
    outcomes = run_many([(garbage_then_return, (), {}), (multiply, (6, 7), {})])
    assert [o.status for o in outcomes] == ["malformed", "returned"]
    assert "malformed" in outcomes[0].detail and outcomes[0].value is None
    assert outcomes[1].value == 42


def test_flood_in_the_result_pipe_is_cut_at_the_size_cap():
    outcomes = run_many([(flood_without_newline, (), {}), (multiply, (6, 7), {})])
    assert [o.status for o in outcomes] == ["malformed", "returned"]
    assert "longer than 2097152 bytes" in outcomes[0].detail


def test_forged_or_out_of_order_messages_are_malformed():
    def forge():
        for fd in find_result_pipes():
            os.write(fd, b'{"index": 5, "status": "returned", "value": 1.0}\n')
        return 1.0

    assert run_sandboxed(forge).status == "malformed"


def test_hostile_pipe_writes_end_as_per_test_failures_in_check():
    def dp_communication_volume(model_size_bytes, num_gpus):
        garbage_then_return()
        return 0.0

    report = five_functions.check(dp_communication_volume)
    assert report.passed == 0
    assert all("malformed" in r.reason for r in report.results), report


def sandbox_processes(uids) -> list[int]:
    """Processes of the sandboxes' ``uids`` (``confine.UID_BASE`` + a keeper's pid) still
    alive. Only the sandboxes a test started: other tests may run sandboxes meanwhile."""
    left = []
    for process in psutil.process_iter(["uids", "status"]):
        try:
            if (process.info["uids"].real in uids
                    and process.info["status"] != psutil.STATUS_ZOMBIE):
                left.append(process.pid)
        except (psutil.Error, TypeError, AttributeError):
            continue
    return left


@pytest.fixture
def started_uids(monkeypatch) -> list[int]:
    """The uids of the sandboxes this test starts, in order."""
    uids = []
    real_start = confine.Confined._start

    def start(self):
        real_start(self)
        uids.append(self.protections["uid"])

    monkeypatch.setattr(confine.Confined, "_start", start)
    return uids


# Prepended to a "kernel" script: the kernel prints each sandbox's uid as it starts one.
RECORD_UIDS = """
    from dpcost.grading import confine as _confine

    _real_start = _confine.Confined._start

    def _start(self):
        _real_start(self)
        print("sandbox uid", self.protections["uid"], flush=True)

    _confine.Confined._start = _start
"""


def printed_uids(text: str) -> list[int]:
    return [int(line.split()[-1]) for line in text.splitlines()
            if line.startswith("sandbox uid ")]


def fork_sleepers(count=3, how=""):
    """Fork ``count`` children that sleep 60 s (in their own group or session if asked)."""
    for _ in range(count):
        if os.fork() == 0:
            if how == "group":
                os.setpgid(0, 0)  # leave the sandbox's process group
            elif how == "session":
                os.setsid()  # and its session
            time.sleep(60)
            os._exit(0)
    return count


@pytest.mark.parametrize("how", ["", "group", "session"])
def test_forked_grandchildren_are_killed_after_check(how, started_uids):
    def dp_communication_volume(model_size_bytes, num_gpus):
        print("forked", fork_sleepers(how=how))
        return builtins.float(0.0 if num_gpus <= 1 else 2 * (num_gpus - 1) * model_size_bytes)

    report = five_functions.check(dp_communication_volume)
    assert report.all_passed and all(r.printed == "forked 3\n" for r in report.results), report
    assert report.protections == sandbox.protections()
    assert started_uids and sandbox_processes(started_uids) == []


def test_grandchildren_are_killed_after_a_timeout_or_a_crash(started_uids):
    def fork_then_loop():
        fork_sleepers(count=2, how="session")
        while True:
            pass

    def fork_then_exit():
        fork_sleepers(count=2, how="session")
        os._exit(9)

    start = time.perf_counter()
    outcomes = run_many([(fork_then_loop, (), {}), (fork_then_exit, (), {})], timeout=0.5)
    assert [o.status for o in outcomes] == ["timeout", "crashed"]
    assert "code 9" in outcomes[1].detail
    # The crash is seen when the child exits, though its children hold the pipe open.
    assert time.perf_counter() - start < 0.5 + 4
    assert len(started_uids) == 2 and sandbox_processes(started_uids) == []


def test_submit_of_huge_return_values_keeps_little():
    huge = "x" * (100 * 2**20)  # made once, before the fork: the children share its pages

    def ddp_gpu0_memory_multiplier(num_gpus):
        return huge  # 100 MiB per call

    tracemalloc.start()
    try:
        report = five_functions.submit(ddp_gpu0_memory_multiplier)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.passed == 0 and report.total == 16
    assert all(len(r.got) <= 250 for r in report.results)
    assert "must return a Python float, got str" in report.results[0].reason
    assert peak < 20 * 2**20, f"the caller held {peak / 2**20:.0f} MiB"
    outcome = run_sandboxed(ddp_gpu0_memory_multiplier, 8)
    assert outcome.value is None and len(outcome.value_repr) <= 200
    assert "more than 10000 characters" in outcome.value_note


# ---- The child cannot reach the kernel (issue 23, section 1) ----------------------------------
# Each attack is a function a student could write; the "kernel" is a fresh Python whose stdout
# is a file, so a write into it or a truncation would show.

ATTACKS = """
    import json, os, signal, sys
    from dpcost import core
    from dpcost.exercises.five_functions import check

    KERNEL = os.getpid()
    results = {}

    def attack(name, fn):
        report = check(fn)
        results[name] = {"passed": report.passed, "total": report.total,
                         "reasons": [r.reason for r in report.results]}

    def right(P, n):
        return 0.0 if n <= 1 else float(2 * (n - 1) * P)

    def dp_communication_volume(P, n):
        os.kill(os.getppid(), signal.SIGKILL)
    attack("kill the parent", dp_communication_volume)

    def dp_communication_volume(P, n):
        os.kill(KERNEL, signal.SIGKILL)
    attack("kill the kernel's pid", dp_communication_volume)

    def dp_communication_volume(P, n):
        for target in (KERNEL, os.getppid()):
            try:
                os.kill(target, signal.SIGINT)
            except OSError:
                pass
        return right(P, n)
    attack("SIGINT to the kernel", dp_communication_volume)

    def dp_communication_volume(P, n):
        for target in (KERNEL, os.getppid(), 1):
            for fd in (1, 2):
                try:
                    with open(f"/proc/{target}/fd/{fd}", "w") as out:
                        out.write("STUDENT WROTE THIS\\n" * 83)
                except OSError:
                    pass
        return right(P, n)
    attack("write to /proc/<kernel>/fd/1", dp_communication_volume)

    def dp_communication_volume(P, n):
        return core.dp_communication_volume(P, n)
    attack("a wrapper around dpcost.core", dp_communication_volume)

    def serve_frame():
        frame = sys._getframe()
        while frame is not None and frame.f_code.co_name != "_serve":
            frame = frame.f_back
        return frame

    def dp_communication_volume(P, n):  # forge every result with the package's answers
        frame = serve_frame()
        fd, first, calls = (frame.f_locals[k] for k in ("result_fd", "first", "calls"))
        for k, (_, args, _) in enumerate(calls):
            message = {"index": first + k, "status": "returned", "value_type": "float",
                       "value_repr": "x", "value": core.dp_communication_volume(*args)}
            os.write(fd, json.dumps(message).encode() + b"\\n")
        os._exit(0)
    attack("frame walk, results from dpcost.core", dp_communication_volume)

    def dp_communication_volume(P, n):  # read the battery's expected values up the stack
        frame = sys._getframe()
        while frame is not None:
            for test in frame.f_locals.get("tests", []):
                for case in test.cases:
                    if case.args == (P, n):
                        return case.expect.value
            frame = frame.f_back
        return 0.0
    attack("frame walk, expected values", dp_communication_volume)

    def dp_communication_volume(P, n):  # search the child's whole memory for them
        import gc
        for obj in gc.get_objects():
            if type(obj).__name__ in ("Case", "TestResult") and (
                    getattr(obj, "args", None) == (P, n) or getattr(obj, "expected", None)):
                return float(getattr(obj, "expected", None) or obj.expect.value)
        return 0.0
    attack("gc search, expected values", dp_communication_volume)

    def dp_communication_volume(P, n):  # patch the child's encoder to send the right value
        namespace = serve_frame().f_globals
        real = namespace["_encode"]

        def forged(index, result):
            result["value"] = core.dp_communication_volume(P, n)
            return real(index, result)

        namespace["_encode"] = forged
        return 0.0
    attack("patch sandbox._encode", dp_communication_volume)

    def dp_communication_volume(P, n):
        return 0.0
    attack("an honest 0.0", dp_communication_volume)

    print(json.dumps(results))
    print("kernel survived")
"""


def test_attacks_on_the_kernel_leave_it_and_its_output_untouched(tmp_path):
    out, scratch = tmp_path / "stdout.txt", tmp_path / "tmp"
    scratch.mkdir()
    with open(out, "w") as stdout:
        script = textwrap.dedent(RECORD_UIDS) + textwrap.dedent(ATTACKS)
        process = subprocess.run([sys.executable, "-c", script],
                                 stdout=stdout, stderr=subprocess.PIPE, text=True,
                                 timeout=KERNEL_TIMEOUT * 2, env={**os.environ,
                                                                  "TMPDIR": str(scratch)})
    assert process.returncode == 0, process.stderr[-2000:]
    uids = printed_uids(out.read_text())
    lines = [line for line in out.read_text().splitlines() if not line.startswith("sandbox uid")]
    assert len(lines) == 2 and lines[1] == "kernel survived", lines[:5]  # nothing else
    assert "STUDENT" not in process.stderr
    results = json.loads(lines[0])
    total = results["an honest 0.0"]["total"]

    def reasons(name):
        return " | ".join(results[name]["reasons"])

    assert results["kill the parent"]["passed"] == 0  # pid 1's parent is 0: nothing to kill
    assert "got NoneType" in reasons("kill the parent")
    assert results["kill the kernel's pid"]["passed"] == 0
    assert "ProcessLookupError" in reasons("kill the kernel's pid") or "PermissionError" in (
        reasons("kill the kernel's pid"))
    for name in ("SIGINT to the kernel", "write to /proc/<kernel>/fd/1"):
        assert results[name]["passed"] == total, results[name]  # right answers, scored right
    assert results["a wrapper around dpcost.core"]["passed"] == 0
    assert "is the dpcost package's: it does not run in the checker's sandbox" in reasons(
        "a wrapper around dpcost.core")
    assert results["frame walk, results from dpcost.core"]["passed"] == 0
    assert results["frame walk, expected values"]["passed"] == 0  # emptied in the child
    assert "'Test' object has no attribute 'cases'" in reasons("frame walk, expected values")
    assert results["gc search, expected values"] == results["an honest 0.0"]  # found nothing
    assert results["patch sandbox._encode"]["passed"] <= results["an honest 0.0"]["passed"]
    assert len(uids) >= len(results) and sandbox_processes(uids) == []
    assert list(scratch.iterdir()) == []  # every sandbox folder removed


INTERRUPTED = """
    import json, sys
    from dpcost.exercises.five_functions import check

    def dp_communication_volume(P, n):
        while True:
            pass

    print("started", flush=True)
    try:
        check(dp_communication_volume, timeout=60)
        print(json.dumps({"interrupted": False}), flush=True)
    except KeyboardInterrupt:
        print(json.dumps({"interrupted": True}), flush=True)

    def dp_communication_volume(P, n):
        return 0.0 if n <= 1 else float(2 * (n - 1) * P)

    report = check(dp_communication_volume)
    print(json.dumps({"after": [report.passed, report.total]}))
"""


def _sigint_as_in_a_terminal():
    # A job started with & by a script inherits SIGINT ignored, and Python then installs no
    # KeyboardInterrupt handler: the kernel stand-in gets SIGINT's default, as a kernel does.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_sigint_during_check_cleans_up_then_raises_keyboard_interrupt(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    script = textwrap.dedent(RECORD_UIDS) + textwrap.dedent(INTERRUPTED)
    process = subprocess.Popen([sys.executable, "-c", script],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "TMPDIR": str(scratch)},
                               start_new_session=True, preexec_fn=_sigint_as_in_a_terminal)
    try:
        assert process.stdout.readline() == "started\n"
        uid = printed_uids(process.stdout.readline())[0]  # the looping child has started
        time.sleep(0.2)
        process.send_signal(signal.SIGINT)  # what Jupyter's Stop button does
        out, err = process.communicate(timeout=KERNEL_TIMEOUT)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    assert process.returncode == 0, err[-2000:]
    uids = [uid, *printed_uids(out)]
    lines = [json.loads(line) for line in out.splitlines() if not line.startswith("sandbox")]
    assert lines[0] == {"interrupted": True}
    assert lines[1]["after"][0] == lines[1]["after"][1]  # the next check runs, all pass
    assert sandbox_processes(uids) == [] and list(scratch.iterdir()) == []


def test_resource_limits_bound_memory_processes_and_files(started_uids):
    limits = sandbox.protections()["limits"]

    def allocate():
        return len(bytearray(3 * 2**30))  # beyond the 1 GiB the child may add

    def fork_bomb():  # bounded, should the limit not hold: 200 sleepers at most
        count = 0
        for _ in range(200):
            try:
                pid = os.fork()
            except BlockingIOError:
                break
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            count += 1
        return count

    def big_file():
        with open("big", "wb") as f:
            f.write(b"x" * (limits["file_bytes"] + 1))

    outcomes = run_many([(allocate, (), {}), (fork_bomb, (), {}), (big_file, (), {})],
                        timeout=10)
    assert outcomes[0].status == "raised" and outcomes[0].error_type == "MemoryError"
    assert outcomes[1].status == "returned" and 0 < outcomes[1].value < limits["processes"]
    assert outcomes[2].status == "raised" and "File too large" in outcomes[2].error_message
    assert sandbox_processes(started_uids) == []


def test_the_child_runs_as_another_uid_without_the_package():
    protections = sandbox.protections()

    def inside():
        import importlib

        found = [os.getuid(), os.getppid()]
        for name in ("dpcost.core", "dpcost"):
            try:
                importlib.import_module(name)
                found.append("imported")
            except ImportError:
                found.append("refused")
        sys.meta_path[:] = [f for f in sys.meta_path if "NoPackage" not in type(f).__name__]
        try:
            importlib.import_module("dpcost.core")
            found.append("imported")
        except ImportError:
            found.append("refused")
        try:
            open(dpcost.core.__file__).read()
            found.append("read")
        except OSError:
            found.append("hidden")
        return found

    value = run_sandboxed(inside).value
    if os.geteuid() == 0:
        assert protections["unprivileged_uid"] and value[0] >= confine.UID_BASE  # its own
    if protections["pid_namespace"]:
        assert value[1] == 0  # pid 1 of its own namespace
    assert value[2:4] == ["refused", "refused"]
    if protections.get("package_hidden"):
        assert value[4:] == ["refused", "hidden"]


def test_warnings_come_back_whole_and_apart_from_prints():
    def overflow():
        print("a print")
        return np.float64(1e308) * 10

    outcome = run_sandboxed(overflow)
    assert outcome.value == builtins.float("inf") and outcome.stdout == "a print\n"
    assert outcome.warnings == ("RuntimeWarning: overflow encountered in scalar multiply",)


@pytest.mark.skipif(os.geteuid() != 0, reason="the sweep by uid needs root")
def test_without_namespaces_another_uid_and_a_sweep_still_hold():
    def target():  # the worker, without namespaces: the keeper is its parent, as root
        try:
            os.kill(os.getppid(), 0)
            verdict = "reached"
        except PermissionError:
            verdict = "refused"
        fork_sleepers(count=2, how="session")
        os.write(1, f"{verdict}\n".encode())
        time.sleep(60)

    sandbox_ = confine.Confined(target, namespaces=False).start()
    uids = [sandbox_.protections["uid"]]
    try:
        assert not sandbox_.protections["pid_namespace"], sandbox_.protections
        assert sandbox_.protections["unprivileged_uid"]
        output, deadline = b"", time.monotonic() + 20
        while not output.endswith(b"\n") and time.monotonic() < deadline:
            if select.select([sandbox_.output_fd], [], [], 0.1)[0]:
                output += os.read(sandbox_.output_fd, 100)
        assert output == b"refused\n"
        assert len(sandbox_processes(uids)) == 3  # the worker, two sleepers in new sessions
    finally:
        sandbox_.stop()
    assert sandbox_processes(uids) == []
