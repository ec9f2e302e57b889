"""dpcost.procs: kill_tree leaves nothing behind, child_env, write_all. Real processes (sh,
sleep and small Pythons without torch), no mocks; each test ends every process it started."""

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dpcost.procs import (
    REPO_ROOT,
    StdoutFailed,
    child_env,
    exit_cause,
    kill_tree,
    run_cli,
    write_all,
)

# Three ways a process can sit under a child that leads its own session: in the child's group,
# in a group of its own (setpgid), and in a session of its own (setsid), as torchrun's ranks are.
OWN_GROUP = "import os, time; os.setpgid(0, 0); time.sleep(300)"
FAMILY = f"""
sleep 300 &
echo $!
{sys.executable} -c '{OWN_GROUP}' &
echo $!
setsid sleep 300 &
echo $!
wait
"""


def gone(pid: int) -> bool:
    """Dead: no such process, or a zombie (an orphan whose reaper has not run yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state == "Z"


def wait_gone(pids, timeout_s=5.0) -> list:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not all(gone(p) for p in pids):
        time.sleep(0.02)
    return [p for p in pids if not gone(p)]


def start_family():
    process = subprocess.Popen(["sh", "-c", FAMILY], stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    pids = [int(process.stdout.readline()) for _ in range(3)]
    deadline = time.monotonic() + 10  # the Python child has set its own group
    while os.getpgid(pids[1]) != pids[1] and time.monotonic() < deadline:
        time.sleep(0.01)
    return process, pids


@pytest.fixture
def family():
    process, pids = start_family()
    yield process, pids
    for pid in pids:  # only if a test failed: nothing may outlive it
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)
    if process.returncode is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    process.stdout.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and setsid: Linux")
def test_kill_tree_ends_the_child_and_everything_under_it(family):
    process, (same_group, own_group, own_session) = family
    assert os.getpgid(own_group) == own_group != process.pid
    assert os.getsid(own_session) == own_session != process.pid  # out of the child's session
    assert os.getpgid(same_group) == process.pid
    kill_tree(process)
    assert process.returncode == -signal.SIGKILL  # reaped, and killed rather than exited
    assert wait_gone([same_group, own_group, own_session]) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and setsid: Linux")
def test_kill_tree_follows_a_multiprocessing_child(tmp_path):
    context = multiprocessing.get_context("fork")
    reader, writer = context.Pipe(duplex=False)
    child = context.Process(target=_session_with_a_sleeper, args=(writer,), daemon=True)
    child.start()
    sleeper = reader.recv()
    try:
        kill_tree(child)
        assert child.exitcode == -signal.SIGKILL
        assert wait_gone([sleeper]) == []
    finally:
        if not gone(sleeper):
            os.kill(sleeper, signal.SIGKILL)


def _session_with_a_sleeper(writer):
    os.setsid()
    sleeper = subprocess.Popen(["sleep", "300"])
    writer.send(sleeper.pid)
    time.sleep(300)


def test_kill_tree_gives_the_grace_asked_for_then_leaves_a_reaped_child_alone(tmp_path):
    marker = tmp_path / "cleaned"
    code = ("import pathlib, signal, sys, time\n"
            f"signal.signal(signal.SIGTERM, lambda *_: (pathlib.Path({str(marker)!r})"
            ".write_text('yes'), sys.exit(0)))\n"
            "print('ready', flush=True)\ntime.sleep(300)\n")
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        assert process.stdout.readline() == "ready\n"
        kill_tree(process, grace_s=30)
        assert process.returncode == 0 and marker.read_text() == "yes"  # cleaned up on SIGTERM
        kill_tree(process)  # reaped already: its pid may be someone else's now; no signal
        assert process.returncode == 0
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        process.stdout.close()
    assert exit_cause(-signal.SIGKILL) == "killed by signal SIGKILL"


def test_child_env_puts_this_repository_first_and_one_thread_per_process(tmp_path):
    env = child_env(EXTRA_SETTING="1")
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO_ROOT)
    assert env["OMP_NUM_THREADS"] == "1" and env["EXTRA_SETTING"] == "1"
    assert child_env(OMP_NUM_THREADS="2")["OMP_NUM_THREADS"] == "2"  # extra wins
    found = subprocess.run([sys.executable, "-c", "import dpcost; print(dpcost.__file__)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, check=True,
                           timeout=60)
    assert Path(found.stdout.strip()).parent == REPO_ROOT / "dpcost"


def test_write_all_delivers_more_than_a_pipe_holds_in_order():
    data = bytes(range(256)) * 4096  # 1 MiB, 16 times a Linux pipe's 64 KiB
    read_fd, write_fd = os.pipe()
    received = bytearray()

    def drain():
        while chunk := os.read(read_fd, 65536):
            received.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        write_all(write_fd, data)
    finally:
        os.close(write_fd)
        reader.join(30)
        os.close(read_fd)
    assert bytes(received) == data


def test_run_cli_blames_stdout_only_for_a_failed_write_to_it(capsys):
    """An OSError from the command's own work (here ESRCH, as from os.kill on a reaped pid) is
    not "could not write to stdout": it propagates. A failed write to stdout is that line."""
    def kills_a_reaped_pid():
        raise ProcessLookupError(3, "No such process")

    def writes_to_a_full_disk():
        raise StdoutFailed("No space left on device")

    with pytest.raises(ProcessLookupError):
        run_cli("prog", kills_a_reaped_pid)
    assert "stdout" not in capsys.readouterr().err
    assert run_cli("prog", writes_to_a_full_disk) == 1
    assert capsys.readouterr().err == ("prog: error: could not write to stdout: "
                                       "No space left on device\n")


def test_free_port_is_outside_the_range_the_kernel_gives_connections():
    """An ephemeral port can be handed to any outgoing connection between the probe and the
    store's bind (lesson 07 once failed so with EADDRINUSE); a port below the range cannot."""
    from dpcost.procs import free_port

    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(1024 < p < low for p in ports)
    assert len(ports) > 1  # random: two launchers seldom pick the same one
