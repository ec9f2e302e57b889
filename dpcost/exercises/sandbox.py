"""Run student code in a forked child process, with a time limit, so nothing it does hurts us.

A child process (multiprocessing's 'fork' context, so the student's functions defined in the
notebook need no pickling) calls the function and sends back what happened. The parent waits
at most ``timeout`` seconds, then kills the child. Exceptions (``SystemExit`` included), wrong
return values, ``print`` noise and infinite loops all come back as an :class:`Outcome`; the
kernel never dies and never hangs. Output written by the child (Python-level and to file
descriptors 1 and 2) is captured and returned, never shown in the notebook.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import sys
import tempfile
from dataclasses import dataclass

DEFAULT_TIMEOUT = 2.0  # seconds per test; the reference solutions take microseconds
_MAX_TEXT = 500  # characters of a repr, message or captured output kept


@dataclass
class Outcome:
    """What one sandboxed call did.

    status: "returned", "raised", "timeout" (killed after ``timeout`` s), "crashed" (the
    child died without reporting, e.g. ``os._exit`` or a segfault) or "skipped" (not run
    after too many time-outs).
    """

    status: str
    value: object = None  # the returned value, when it could be pickled back
    value_type: str = ""  # type(value).__name__
    value_repr: str = ""
    error_type: str = ""  # exception class name, e.g. "TypeError"
    error_message: str = ""
    stdout: str = ""  # what the call printed (stdout and stderr together)
    error_bases: tuple = ()  # names of the exception class and its bases (subclasses pass)
    detail: str = ""  # for "timeout"/"crashed": what the parent saw

    @property
    def returned(self) -> bool:
        return self.status == "returned"

    def describe(self) -> str:
        """One short line for a results table: the value, the exception, or what went wrong."""
        if self.status == "returned":
            return f"{self.value_repr} ({self.value_type})"
        if self.status == "raised" and self.error_type == "NotImplementedError":
            return "NotImplementedError"  # the stub's long friendly message is for the student
        if self.status == "raised":
            return f"{self.error_type}: {self.error_message}" if self.error_message else (
                self.error_type)
        return self.detail


def _shorten(text: str) -> str:
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 3] + "..."


def _call(func, args, kwargs, captured) -> dict:
    """Call func in this (child) process; what happened, as a picklable dict."""
    buffer = io.StringIO()
    sys.stdout = sys.stderr = buffer
    captured.seek(0)
    captured.truncate()
    try:
        value = func(*args, **kwargs)
        result = {"status": "returned", "value_type": type(value).__name__}
        try:
            result["value_repr"] = _shorten(repr(value))
        except Exception as exc:  # a student's __repr__ can raise too
            result["value_repr"] = f"<repr failed: {type(exc).__name__}>"
        try:
            pickle.dumps(value)
            result["value"] = value
        except Exception:
            result["value"] = None
    except BaseException as exc:  # noqa: B036 - SystemExit and KeyboardInterrupt are results too
        try:
            message = str(exc)
        except Exception:
            message = "<str failed>"
        result = {"status": "raised", "error_type": type(exc).__name__,
                  "error_message": _shorten(message),
                  "error_bases": tuple(cls.__name__ for cls in type(exc).__mro__)}
    try:
        sys.stdout.flush()
        captured.seek(0)
        low_level = captured.read().decode("utf-8", "replace")
    except Exception:
        low_level = ""
    result["stdout"] = _shorten(buffer.getvalue() + low_level)
    return result


def _child(conn, calls) -> None:
    # Silence file descriptors 1 and 2 too: C code or os.write would otherwise reach the
    # kernel's streams, and ipykernel forwards those into the notebook nondeterministically.
    captured = tempfile.TemporaryFile(mode="w+b")
    os.dup2(captured.fileno(), 1)
    os.dup2(captured.fileno(), 2)
    for func, args, kwargs in calls:
        conn.send(_call(func, args, kwargs, captured))
    conn.close()
    os._exit(0)  # skip atexit handlers and the kernel's inherited state


def run_many(calls, timeout: float = DEFAULT_TIMEOUT, max_timeouts: int | None = None
             ) -> list[Outcome]:
    """Run ``calls`` (a list of ``(func, args, kwargs)``) one after another in a forked child.

    Each call gets ``timeout`` seconds (> 0). A call that times out or kills the child is
    reported, the child is killed, and a fresh child carries on with the next call - so one
    fork serves a whole battery of fast tests. After ``max_timeouts`` time-outs the remaining
    calls are not run (status "skipped"), so a function that always loops costs seconds.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    calls = [(func, tuple(args), dict(kwargs)) for func, args, kwargs in calls]
    for func, _, _ in calls:
        if not callable(func):
            raise TypeError(f"func must be callable, got {type(func).__name__}")
    outcomes: list[Outcome] = []
    timeouts = 0
    context = multiprocessing.get_context("fork")
    while len(outcomes) < len(calls):
        if max_timeouts is not None and timeouts >= max_timeouts:
            outcomes += [Outcome("skipped", detail=f"not run: {timeouts} earlier calls timed out")
                         for _ in calls[len(outcomes):]]
            break
        receiver, sender = context.Pipe(duplex=False)
        process = context.Process(target=_child, args=(sender, calls[len(outcomes):]),
                                  daemon=True)
        process.start()
        sender.close()  # the parent keeps only the reading end, so a dead child reads as EOF
        try:
            while len(outcomes) < len(calls):
                if not receiver.poll(timeout):
                    timeouts += 1
                    outcomes.append(Outcome(
                        "timeout", detail=f"no result within {timeout:g} s (infinite loop?)"))
                    break
                try:
                    outcomes.append(Outcome(**receiver.recv()))
                except (EOFError, OSError, pickle.UnpicklingError):
                    process.join(1.0)
                    outcomes.append(Outcome("crashed", detail=_crash_detail(process.exitcode)))
                    break
        finally:
            if process.is_alive():
                process.kill()
            process.join()
            receiver.close()
    return outcomes


def run_sandboxed(func, *args, timeout: float = DEFAULT_TIMEOUT, **kwargs) -> Outcome:
    """Call ``func(*args, **kwargs)`` in a forked child; return its :class:`Outcome`.

    ``timeout`` (seconds, > 0) bounds the call; a child still running then is killed.
    """
    return run_many([(func, args, kwargs)], timeout)[0]


def _crash_detail(exitcode) -> str:
    if exitcode is not None and exitcode < 0:
        return f"the process died from signal {-exitcode} before returning"
    return f"the process exited (code {exitcode}) before returning"


def student_function_name(fn, allowed, example: str, what: str = "function",
                          name: str | None = None) -> str:
    """The exercise name of the student's ``fn`` (or ``name``), checked to be one of ``allowed``.

    Refuses what is not callable, and the dpcost package's own functions: the checker tests what
    the student wrote, never the reference. ``example`` shows the right call in the message.
    """
    if not callable(fn):
        raise TypeError(f"pass your function itself, e.g. {example}; got "
                        f"{type(fn).__name__} {fn!r}")
    if getattr(fn, "__module__", "").startswith("dpcost"):
        raise ValueError(f"{getattr(fn, '__qualname__', fn)!r} is the dpcost package's own "
                         f"{what}; check the one you wrote in the notebook instead")
    name = name or getattr(fn, "__name__", "")
    if name not in allowed:
        hint = " (or pass name=...)" if what == "function" else ""
        raise ValueError(f"the function must be named one of {', '.join(allowed)}{hint}; "
                         f"got {name!r}")
    return name
