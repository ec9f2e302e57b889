"""The sandbox keeps to its folder and its share (issue 39): each test replays an attack that
worked on the sandbox before, in the confinement this machine gives (namespaces, a memory
cgroup) and in the fallbacks (no namespaces, no cgroup) that other machines get."""

import contextlib
import ctypes
import os
import posix
import secrets
import socket
import threading
import time

import psutil
import pytest

from dpcost.grading import confine, sandbox
from dpcost.grading.sandbox import run_sandboxed

SHARED = ("/tmp", "/var/tmp", "/dev/shm")
ROOT = os.geteuid() == 0
# namespaces, cgroup: what this machine gives, then each fallback (without namespaces the
# worker is told apart from the kernel only by a uid of its own, which needs root)
SETUPS = [(True, True), (True, False)] + ([(False, True), (False, False)] if ROOT else [])
MiB = 2**20


def run_confined(target, limits=None, *, namespaces=True, cgroup=True,
                 timeout=20.0):
    """Run ``target()`` confined; (what it wrote on stdout, the sandbox) once it has ended.
    Without namespaces the worker cannot import what the kernel has not (Python's folder may
    be closed to its uid): targets use only modules imported above."""
    limits = limits or confine.Limits()
    box = confine.Confined(target, limits, namespaces=namespaces, cgroup=cgroup).start()
    output = bytearray()
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = os.read(box.output_fd, 1 << 16)
            except BlockingIOError:
                time.sleep(0.01)
                continue
            if not chunk:
                break
            output += chunk
        box.wait_exit(2.0)
    finally:
        box.stop()
    return bytes(output).decode("utf-8", "replace"), box


def names_in_shared_folders(tag: str) -> list[str]:
    return [f"{folder}/{name}" for folder in SHARED for name in os.listdir(folder)
            if tag in name]


# ---- (1) files in /tmp, /var/tmp and /dev/shm outlived the check ------------------------------

def test_files_a_solution_writes_in_tmp_var_tmp_and_dev_shm_do_not_survive_the_check():
    tag = f"dpcost-attack-{secrets.token_hex(4)}"

    def dp_communication_volume(model_size_bytes, num_gpus):  # the attack, in a check
        written = []
        for folder in SHARED:
            with open(f"{folder}/{tag}", "wb") as f:
                f.write(b"x" * (16 * MiB if folder == "/dev/shm" else 4096))
            written.append(os.path.getsize(f"{folder}/{tag}"))
        return written

    outcome = run_sandboxed(dp_communication_volume, 1, 2, timeout=10)
    assert sandbox.protections()["mount_namespace"]
    assert outcome.status == "returned" and outcome.value == [4096, 4096, 16 * MiB]
    assert names_in_shared_folders(tag) == []


@pytest.mark.skipif(not ROOT, reason="without namespaces only a uid of its own tells its files")
@pytest.mark.parametrize("cgroup", [True, False])
def test_without_a_mount_namespace_what_the_sandbox_writes_there_is_refused_or_removed(cgroup):
    tag = f"dpcost-attack-{secrets.token_hex(4)}"

    def target():
        libc = ctypes.CDLL(None, use_errno=True)
        for folder in SHARED:
            try:  # Python's open: the audit hook refuses
                open(f"{folder}/{tag}-python", "wb").close()
                os.write(1, b"python wrote\n")
            except PermissionError:
                os.write(1, b"python refused\n")
            # C's open passes by any audit hook: the keeper's sweep removes it afterwards
            fd = libc.open(f"{folder}/{tag}-libc".encode(), os.O_WRONLY | os.O_CREAT, 0o644)
            if fd >= 0 and libc.write(fd, b"x" * 4096, 4096) == 4096:
                os.write(1, b"libc wrote\n")
            with contextlib.suppress(PermissionError):  # refused too
                os.mkdir(f"{folder}/{tag}-folder")
            if libc.mkdir(f"{folder}/{tag}-libc-folder".encode(), 0o755) == 0:
                libc.close(libc.open(f"{folder}/{tag}-libc-folder/inside".encode(),
                                     os.O_WRONLY | os.O_CREAT, 0o644))

    output, box = run_confined(target, namespaces=False, cgroup=cgroup)
    assert box.protections["audit_hook"] and not box.protections["mount_namespace"]
    assert output.count("python refused") == 3 and output.count("libc wrote") == 3, output
    assert names_in_shared_folders(tag) == []


# ---- (2) memory was bounded per process only: 8 children took 8.1 GB ----------------------------

def fork_children(count: int, each_bytes: int, hold_s: float = 20.0) -> int:
    """Fork ``count`` children that each touch ``each_bytes`` and hold them ``hold_s``; wait."""
    children = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            block = bytearray(each_bytes)
            for offset in range(0, each_bytes, 4096):
                block[offset] = 1
            time.sleep(hold_s)
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)
    return count


class PeakMemory:
    """The largest total unique memory (USS, as psutil reads it) that the sandboxes' processes
    (uids from confine.UID_BASE on) held at once, sampled every 10 ms in a thread."""

    def __init__(self):
        self.peak, self.running = 0, True
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        while self.running:
            total = 0
            for process in psutil.process_iter(["uids"]):
                uids = process.info["uids"]
                if uids and uids.real >= confine.UID_BASE:
                    with contextlib.suppress(psutil.Error):
                        total += process.memory_full_info().uss
            self.peak = max(self.peak, total)
            time.sleep(0.01)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()


@pytest.mark.skipif(not ROOT, reason="the peak is read by the sandbox's own uid")
def test_a_check_that_forks_children_past_the_total_is_stopped_in_one_line(monkeypatch):
    limit = 300 * MiB  # 4 children of 100 MiB: each within the per-process limit, not together
    monkeypatch.setattr(sandbox, "limits_for", lambda timeout, calls: confine.Limits(
        memory_bytes=limit))

    def dp_communication_volume(model_size_bytes, num_gpus):
        return fork_children(4, 100 * MiB)

    start = time.monotonic()
    with PeakMemory() as memory:
        outcome = run_sandboxed(dp_communication_volume, 1, 2, timeout=15)
    assert outcome.status == "crashed" and "memory" in outcome.detail, outcome
    assert "\n" not in outcome.describe() and "MiB" in outcome.describe()
    assert time.monotonic() - start < 10
    assert 0 < memory.peak < limit + 32 * MiB, memory.peak / MiB

    def within_the_total(model_size_bytes, num_gpus):  # the same within it: not stopped
        return fork_children(4, 40 * MiB, hold_s=0.5)

    assert run_sandboxed(within_the_total, 1, 2, timeout=15).value == 4


@pytest.mark.parametrize("namespaces, cgroup", SETUPS)
def test_the_total_holds_in_every_setup(namespaces, cgroup):
    limits = confine.Limits(memory_bytes=300 * MiB)
    start = time.monotonic()
    output, box = run_confined(lambda: os.write(1, b"%d" % fork_children(4, 100 * MiB)),
                               limits, namespaces=namespaces, cgroup=cgroup)
    assert output == "" and box.exit_status == -9 and "300 MiB" in box.stopped_for
    assert bool(box.protections["memory_cgroup"]) == cgroup
    assert time.monotonic() - start < 10
    output, box = run_confined(lambda: os.write(1, b"%d" % fork_children(4, 40 * MiB, 0.5)),
                               limits, namespaces=namespaces, cgroup=cgroup)
    assert output == "4" and box.exit_status == 0 and box.stopped_for == ""


# ---- (3) the kernel's environment was visible to the child --------------------------------------

@pytest.mark.parametrize("namespaces, cgroup", SETUPS[::2])
def test_the_kernels_environment_does_not_reach_the_child(monkeypatch, namespaces, cgroup):
    marker = f"kernel-secret-{secrets.token_hex(8)}"
    monkeypatch.setenv("DPCOST_KERNEL_TOKEN", marker)
    posix.environ[b"DPCOST_KERNEL_TOKEN"] = marker.encode()

    def target():  # every copy of the environment the child can find, to a world-readable file
        with open("environment.txt", "w") as copy:
            copy.write(repr(dict(os.environ)) + repr(dict(posix.environ)))
            start, end = confine._environment_block()
            copy.write(repr(ctypes.string_at(start, end - start)))  # what /proc/self/environ reads
            with contextlib.suppress(OSError), open("/proc/self/environ", "rb") as environ:
                copy.write(repr(environ.read()))
        os.chmod("environment.txt", 0o644)
        with open("environment.txt") as copy:
            os.write(1, copy.read().encode())

    output, box = run_confined(target, namespaces=namespaces, cgroup=cgroup)
    assert "PATH" in output and box.folder is None  # it ran, and its folder is gone
    assert marker not in output and "DPCOST_KERNEL_TOKEN" not in output
    assert os.environ["DPCOST_KERNEL_TOKEN"] == marker  # the kernel keeps its own


# ---- (4) a Unix socket in /tmp was reachable ---------------------------------------------------

@pytest.mark.parametrize("namespaces, cgroup", SETUPS[::2])
def test_a_unix_socket_server_in_tmp_is_out_of_reach(namespaces, cgroup):
    path = f"/tmp/dpcost-server-{secrets.token_hex(4)}.sock"

    def target():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            try:
                client.connect(path)
                os.write(1, b"connected")
            except OSError as exc:
                os.write(1, type(exc).__name__.encode())

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        try:
            os.chmod(path, 0o777)  # anyone may connect: only the confinement keeps it out
            server.listen()
            server.settimeout(2.0)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as outside:
                outside.connect(path)  # the server works for a process outside the sandbox
                server.accept()[0].close()
            output, _ = run_confined(target, namespaces=namespaces, cgroup=cgroup)
            server.settimeout(0.1)
            with pytest.raises(TimeoutError):
                server.accept()
        finally:
            os.unlink(path)
    assert output in ("FileNotFoundError", "PermissionError"), output
