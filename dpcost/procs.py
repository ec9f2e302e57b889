"""Small process helpers shared by every part of the course that starts processes.

Standard library only, at the bottom of the package: the launcher of ranks
(``measure/launch.py``), the PowerSGD probe, the migration runner, the exercise checkers and the
tests all import these rather than keep copies: the parent-death signal, a free port, the
environment of a child that runs the course (``child_env``), killing a child with everything
under it (``kill_tree``), an exit status in words, writing all of a buffer to a file
descriptor (``write_all``), and a keeper that runs a command and ends everything it started,
orphans included (``keep``, ``python -m dpcost.procs keep -- COMMAND``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
REPO_ROOT = Path(__file__).resolve().parents[1]  # the folder that holds dpcost/


def die_with_parent() -> None:
    """In a child: get SIGKILL when the parent dies (Linux ``PR_SET_PDEATHSIG``), even if the
    parent had no time to clean up. Nothing elsewhere."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _ephemeral_low() -> int:
    """The lowest port the kernel hands to outgoing connections (Linux's default 32768)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port free a moment ago on 127.0.0.1, chosen below the kernel's ephemeral range.

    A port the kernel picks (bind to 0) is ephemeral: between this probe and the rendezvous
    store's bind, any outgoing connection on the machine (gloo opens many) may be given it, and
    the store fails with EADDRINUSE. Ports below the range are never handed out that way; a
    random one, checked free, makes two launchers' choices collide rarely."""
    import random

    low = _ephemeral_low()
    if low > 12_000:
        for _ in range(64):
            port = random.randrange(10_000, low)
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child Python that runs the course's code: this process's, with
    the repository first on PYTHONPATH (the child imports this ``dpcost``, installed or not),
    OMP_NUM_THREADS=1 (ranks share the cores; each using all of them slows every one), and
    ``extra`` on top."""
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **extra}


def _proc_stats() -> dict[int, tuple[int, int, int, int]]:
    """{pid: (parent pid, process group, session, start time)} of every process /proc shows
    (Linux; none elsewhere). After "(comm)" in /proc/PID/stat come state, ppid, pgrp, session;
    the start time (clock ticks after boot) is the 20th field there, and tells a process from
    a later one that reused its pid."""
    rows = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return rows
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
            rows[int(entry)] = tuple(int(fields[i]) for i in (1, 2, 3, 19))
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return rows


def _descendants(pid: int, stats) -> dict[int, int]:
    """{pid: start time} of the children, grandchildren, ... of ``pid``, by parent links: they
    reach processes that moved to a session of their own (torchrun starts each rank with
    ``start_new_session``)."""
    children: dict[int, list[int]] = {}
    for child, (parent, _, _, _) in stats.items():
        children.setdefault(parent, []).append(child)
    found, frontier = {}, [pid]
    while frontier:
        frontier = [c for p in frontier for c in children.get(p, [])]
        found.update((c, stats[c][3]) for c in frontier)
    return found


def _unreaped(process) -> bool:
    """Running, or a zombie not yet waited for: its pid (and a group or session it leads)
    cannot belong to another process yet. ``multiprocessing`` polls in ``exitcode``, so a
    zombie there is reaped and counts as gone."""
    if isinstance(process, subprocess.Popen):
        return process.returncode is None
    return process.exitcode is None


def _reap(process, timeout_s: float | None = None) -> bool:
    """Wait for ``process`` (a Popen or a multiprocessing Process); True once it has exited."""
    if isinstance(process, subprocess.Popen):
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True
    process.join(timeout_s)
    return process.exitcode is not None


def _sigkill(kill, target: int) -> None:
    try:
        kill(target, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # gone already, or no such group


def kill_tree(process, grace_s: float = 0.0) -> None:
    """End ``process`` (a ``subprocess.Popen`` or a ``multiprocessing`` Process) and every
    process under it, then wait for it: nothing it started outlives this call.

    With ``grace_s`` > 0 it first gets SIGTERM and that many seconds to clean up (torchrun
    passes SIGTERM on to its ranks). Then SIGKILL, in this order: the child itself (a dead
    child forks no more, and its pid stays reserved until it is reaped, so no stranger is
    hit); its process group and every process of its session (a child started with
    ``start_new_session``/``os.setsid`` leads both; a grandchild may have moved to a group of
    its own); and every descendant found by parent links before the kill (one that moved to
    a session of its own). A child already reaped is left alone, with its group: its pid may
    belong to someone else by now.
    """
    if not _unreaped(process):
        return
    pid = process.pid
    family = _descendants(pid, _proc_stats())  # before the kill: orphans lose the link
    if grace_s > 0:
        _sigterm_and_wait(process, grace_s)
    if _unreaped(process):
        _sigkill(os.kill, pid)
        _sigkill(os.killpg, pid)
        for member, (_, _, session, _) in _proc_stats().items():
            if session == pid and member != pid:
                _sigkill(os.kill, member)
    now = _proc_stats()
    for member, start in family.items():
        if member in now and now[member][3] == start:  # the same process, not a new one
            _sigkill(os.kill, member)
    _reap(process)


def _sigterm_and_wait(process, grace_s: float) -> None:
    try:
        os.kill(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    _reap(process, grace_s)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to file descriptor ``fd``: ``os.write`` may write fewer
    bytes than asked (a pipe nearly full, a signal), so it loops until none is left."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def exit_cause(code: int) -> str:
    """A process's exit status in words, as ``Popen.returncode`` or ``Process.exitcode`` give it
    (negative: killed by that signal)."""
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"exited with status {code}"


@contextlib.contextmanager
def scratch_tmpdir(prefix: str = "dpcost-run-"):
    """A fresh folder, removed with all inside on the way out: give it to a child as TMPDIR.

    torchrun leaves a log folder per run, ``tempfile.mkdtemp(prefix="torchelastic_")`` in
    torch/distributed/elastic/multiprocessing/api.py, which no one removes; mkdtemp honours
    TMPDIR, so a child run with this folder as TMPDIR leaves nothing in /tmp.
    """
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class StdoutFailed(Exception):
    """A write to stdout failed (a full disk, ``>/dev/full``, a closed pipe)."""


def print_out(text: str) -> None:
    """``print(text)`` and flush, so that a failed write is known here, as ``StdoutFailed``:
    argparse swallows OSError from its help text, and a buffer that fails at exit is too late."""
    try:
        print(text, flush=True)
    except (OSError, ValueError) as error:
        raise StdoutFailed(getattr(error, "strerror", None) or str(error)) from None


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, with errors in one line (its default prints the usage too) and ``--help`` that
    fails loudly when stdout cannot be written."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")

    def _print_message(self, message, file=None):
        if message and (file is None or file is sys.stdout):
            print_out(message.rstrip("\n"))
        elif message:
            super()._print_message(message, file)


def _stdout_failed(prog: str, reason: str) -> int:
    try:  # point stdout at /dev/null, so that Python's own flush at exit stays quiet
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
    print(f"{prog}: error: could not write to stdout: {reason}", file=sys.stderr)
    return 1


def run_cli(prog: str, main, *args) -> int:
    """``main(*args)``'s exit status, made honest about stdout: a command whose output could not
    be written exits 1 with one line, never 0 and never with a traceback.

    - stdout closed at start (``cmd >&-``): Python sets ``sys.stdout`` to None and ``print``
      writes nothing, silently; refused before ``main`` runs.
    - a write that fails (``>/dev/full``, a full disk): ``main`` prints with ``print_out`` and
      its parser is a ``OneLineErrorParser`` (``--help`` included), which raise
      ``StdoutFailed``.
    """
    if sys.stdout is None:
        print(f"{prog}: error: stdout is closed, so nothing could be printed", file=sys.stderr)
        return 1
    try:
        status = main(*args)
    except StdoutFailed as failed:
        return _stdout_failed(prog, str(failed))
    try:  # only the flush: any other OSError from main is not about stdout, and is not hidden
        sys.stdout.flush()
    except (OSError, ValueError) as error:
        return _stdout_failed(prog, getattr(error, "strerror", None) or str(error))
    return status


# A keeper: one process that runs a command and leaves nothing of it behind.
PR_SET_CHILD_SUBREAPER = 36  # from <linux/prctl.h>
KEEPER_GRACE_S = 3.0  # SIGTERM to the command, then this long before SIGKILL to all


def _prctl(option: int, value: int) -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value)


def _reap_any() -> None:
    """Wait for every child of this process that has exited (orphans adopted as a subreaper
    included), without blocking."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _end_descendants(rounds: int = 200) -> None:
    """SIGKILL every descendant of this process until none is left. As a subreaper this
    process adopts the orphans of its tree, so a grandchild that double-forked into a session
    of its own is still found by parent links; a process that forks meanwhile is found in
    the next round."""
    import time

    me = os.getpid()
    for _ in range(rounds):
        _reap_any()
        family = _descendants(me, _proc_stats())
        if not family:
            return
        now = _proc_stats()
        for member, start in family.items():
            if member in now and now[member][3] == start:
                _sigkill(os.kill, member)
        time.sleep(0.01)
    _reap_any()


def keep(command: list[str], remove=(), grace_s: float = KEEPER_GRACE_S) -> int:
    """Run ``command`` in a session of its own and end everything it started, in every case.

    This process becomes a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``): every orphan of
    the command's tree, a daemon that double-forked with ``setsid`` or a rank whose torchrun
    died, is re-parented to it rather than to init, so it can still be found and ended. It gets
    SIGTERM when its parent dies (``PR_SET_PDEATHSIG``), and SIGTERM, SIGINT or SIGHUP end the
    command: SIGTERM to it (torchrun passes it on to its ranks), ``grace_s`` seconds, then
    SIGKILL to every descendant left. When the command exits on its own, whatever it left
    running is killed too. If the parent died, the folders in ``remove`` are deleted (the
    parent can no longer do it). Returns the command's exit status (128 + N for a signal N).
    """
    import time

    parent = os.getppid()
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    stopped: list[int] = []

    def stop(signum, _frame):
        stopped.append(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    if os.getppid() != parent:  # the parent died before the signal was asked for
        stopped.append(signal.SIGTERM)
    child = subprocess.Popen(command, start_new_session=True, preexec_fn=die_with_parent)
    while not stopped and child.poll() is None:
        time.sleep(0.05)
    if stopped and child.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    if child.poll() is None:
        _sigkill(os.kill, child.pid)
    child.wait()  # reaped by Popen first, which keeps its status; then the rest
    _end_descendants()
    if os.getppid() != parent:
        for folder in remove:
            shutil.rmtree(folder, ignore_errors=True)
    if stopped:
        return 128 + stopped[0]
    return child.returncode if child.returncode >= 0 else 128 - child.returncode


def keeper_command(command: list[str], remove=()) -> list[str]:
    """``command`` run under :func:`keep` (``python -m dpcost.procs keep``)."""
    return [sys.executable, "-m", "dpcost.procs", "keep",
            *(f"--remove={folder}" for folder in remove), "--", *command]


def _main(argv: list[str]) -> int:
    if argv[:1] != ["keep"] or "--" not in argv:
        print("usage: python -m dpcost.procs keep [--remove=FOLDER ...] -- COMMAND ...",
              file=sys.stderr)
        return 2
    split = argv.index("--")
    remove = [a.removeprefix("--remove=") for a in argv[1:split] if a.startswith("--remove=")]
    if not argv[split + 1:]:
        print("python -m dpcost.procs keep: error: no command after --", file=sys.stderr)
        return 2
    return keep(argv[split + 1:], remove)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
