"""Small process helpers shared by every part of the course that starts processes.

Standard library only, at the bottom of the package: the launcher of ranks
(``measure/launch.py``), the PowerSGD probe, the migration runner, the exercise checkers and the
tests all import these rather than keep copies.
"""

from __future__ import annotations

import signal
import socket
import sys

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
