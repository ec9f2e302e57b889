"""Small process helpers shared by every part of the course that starts processes.

Standard library only, at the bottom of the package: the launcher of ranks
(``measure/launch.py``), the PowerSGD probe, the migration runner, the exercise checkers and the
tests all import these rather than keep copies.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import sys
import tempfile

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_parent() -> None:
    """In a child: get SIGKILL when the parent dies (Linux ``PR_SET_PDEATHSIG``), even if the
    parent had no time to clean up. Nothing elsewhere."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1 (the kernel picks it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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
        sys.stdout.flush()
    except StdoutFailed as failed:
        return _stdout_failed(prog, str(failed))
    except OSError as error:  # the final flush
        return _stdout_failed(prog, error.strerror or str(error))
    return status
