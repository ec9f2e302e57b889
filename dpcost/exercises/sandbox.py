"""Run student code in a forked child process, with a time limit; only plain data comes back.

A child process (multiprocessing's 'fork' context, so the student's functions defined in the
notebook need no pickling) calls the function and reports what happened. The parent (the
notebook's kernel) waits at most ``timeout`` seconds per call, then kills the child.
Exceptions (``SystemExit`` included), wrong return values, ``print`` noise and infinite loops
all come back as an :class:`Outcome`; the kernel never dies and never hangs.

Nothing the student's code made ever runs in the kernel:

- Results cross as **plain data only**. The child converts the returned value to None, a
  bool, an int, a float, a str, or a short list or tuple of those (numpy scalars become the
  Python number; at most :data:`MAX_ITEMS` items, :data:`MAX_DEPTH` levels), and sends it with
  the type's name and the first :data:`MAX_REPR` characters of its repr, as one line of JSON.
  A value that is not plain data comes back as ``None`` with its type and repr. The kernel
  parses JSON, never pickle, so no ``__reduce__``, ``__eq__`` or ``__float__`` of the student's
  runs there.
- Every read from the child is bounded in size (:data:`MAX_MESSAGE` bytes a message) and in
  time (``timeout``). Bytes that are not a well-formed message (say, a length header written
  into the result pipe) make that call's outcome "malformed"; a fresh child runs the next call.
- The child starts its own session (``os.setsid``), so the processes it forks share its process
  group and session; when the calls end - results, time-out or crash - the whole group is
  killed, and on Linux every process left in the session too. (A grandchild that starts a
  session of its own escapes; so does a determined student in general - see below.)
- Output written by the child (Python-level and to file descriptors 1 and 2) is captured,
  capped at :data:`MAX_TEXT` characters, and returned, never shown in the notebook.

This protects the kernel from mistakes and from hostile *return values*. It is not a security
boundary: code running in the child can still forge a result (it can read the expected values
and write a message of its own), so ``check`` and ``submit`` are self-checks for learning, and
grading belongs to hidden tests run elsewhere (nbgrader's).

API, for any exercise: :func:`run_many` runs a list of ``(func, args, kwargs)`` in one child
(a fresh one after each time-out or crash) and returns one :class:`Outcome` per call;
:func:`run_sandboxed` runs one call. A ``func`` may be a wrapper defined in the exercise's
module that calls the student's code and returns plain data (``ring_step`` runs the simulator
that way).
"""

from __future__ import annotations

import builtins
import io
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import reprlib
import signal
import sys
import tempfile
import time
from dataclasses import dataclass

DEFAULT_TIMEOUT = 2.0  # seconds per test; the reference solutions take microseconds
MAX_REPR = 200  # characters of a returned value's repr kept
MAX_TEXT = 500  # characters of an exception message or of captured output kept
MAX_ITEMS = 20_000  # values (scalars and lists/tuples) in one returned value
MAX_DEPTH = 4  # nesting of lists and tuples in a returned value
MAX_STR = 10_000  # characters of one returned string
MAX_INT_BITS = 4096  # bits of one returned int (about 1,233 decimal digits)
MAX_MESSAGE = 2 * 2**20  # bytes of one message from the child (2 MiB); more is malformed
_MAX_CAPTURED_FILE = 2**20  # bytes the child may write to its captured fds 1 and 2 (1 MiB)

# Statuses in which the call gave no result; Outcome.detail says what the parent saw.
NO_RESULT = ("timeout", "crashed", "malformed", "skipped")


@dataclass
class Outcome:
    """What one sandboxed call did; every field is plain data.

    status: "returned", "raised", "timeout" (killed after ``timeout`` s), "crashed" (the
    child died without reporting, e.g. ``os._exit`` or a segfault), "malformed" (what came
    back was not a well-formed message) or "skipped" (not run after too many time-outs).
    """

    status: str
    value: object = None  # the returned value as plain data; None when it was not plain data
    value_type: str = ""  # type(value)'s name: "float", or "numpy.float64", "__main__.Mine"
    value_repr: str = ""  # the first MAX_REPR characters of repr(value)
    error_type: str = ""  # exception class name, e.g. "TypeError"
    error_message: str = ""
    stdout: str = ""  # what the call printed (stdout and stderr together)
    error_bases: tuple = ()  # names of the exception class and its bases (subclasses pass)
    detail: str = ""  # for "timeout"/"crashed"/"malformed"/"skipped": what the parent saw
    value_note: str = ""  # why value is None although the call returned, e.g. "not plain data"

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


def _shorten(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---- in the child: turn what the student's code produced into plain data ---------------------

class _NotPlain(Exception):
    """The value cannot be sent as plain data (the message says why)."""


def type_name(cls) -> str:
    """``cls.__name__`` for a builtin type, else ``module.qualname``: a class of the student's
    named ``float`` reads ``__main__.float``, never ``float``."""
    try:
        name = cls.__name__
        module = cls.__module__
        if getattr(builtins, name, None) is cls or (
                module == "builtins" and not hasattr(builtins, name)):  # function, NoneType
            return name
        return f"{module}.{cls.__qualname__}"
    except Exception:  # a metaclass can make even these raise
        return "<unknown type>"


def to_plain(value):
    """``value`` as JSON-ready plain data; raises _NotPlain when it is not plain data.

    Lists become JSON arrays and tuples ``{"t": [...]}``, so the kernel can tell them apart.
    Subclasses of int, float, str, list and tuple become the base type; numpy scalars become
    the Python number. Runs in the child: the student's code may run here, not in the kernel.
    """
    budget = [MAX_ITEMS]
    numpy = sys.modules.get("numpy")  # never imported here: only present if in use already

    def convert(v, depth):
        budget[0] -= 1
        if budget[0] < 0:
            raise _NotPlain(f"more than {MAX_ITEMS} values")
        cls = type(v)
        if v is None or cls is bool:
            return v
        if cls is float:
            return v
        if cls is int:
            if v.bit_length() > MAX_INT_BITS:
                raise _NotPlain(f"an int of more than {MAX_INT_BITS} bits")
            return v
        if cls is str:
            if len(v) > MAX_STR:
                raise _NotPlain(f"a string of more than {MAX_STR} characters")
            return v
        if isinstance(v, (list, tuple)):
            if depth >= MAX_DEPTH:
                raise _NotPlain(f"lists or tuples nested more than {MAX_DEPTH} deep")
            base = list if isinstance(v, list) else tuple
            if base.__len__(v) > budget[0]:
                raise _NotPlain(f"more than {MAX_ITEMS} values")
            items = [convert(item, depth + 1) for item in base.__iter__(v)]
            return items if base is list else {"t": items}
        if numpy is not None and isinstance(v, numpy.generic):
            if isinstance(v, numpy.bool_):
                return bool(v)
            if isinstance(v, numpy.integer):
                return int(v)  # at most 64 bits
            if isinstance(v, numpy.floating):
                return float(v)
        if isinstance(v, int):  # int subclasses (IntEnum ...); bool cannot be subclassed
            return convert(int.__int__(v), depth)
        if isinstance(v, float):
            return float.__float__(v)
        if isinstance(v, str):
            return convert(str.__str__(v), depth)
        raise _NotPlain(f"{type_name(cls)} is not plain data")

    return convert(value, 0)


_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxlist, _repr.maxtuple = 4, 50, 50
_repr.maxdict = _repr.maxset = _repr.maxfrozenset = _repr.maxdeque = _repr.maxarray = 20
_repr.maxstring = _repr.maxlong = _repr.maxother = MAX_REPR


def _safe_repr(value) -> str:
    try:
        text = _repr.repr(value)
        if type(text) is not str:
            text = str.__str__(text)
    except Exception as exc:  # a student's __repr__ can raise too
        return f"<repr failed: {type_name(type(exc))}>"
    return _shorten(text, MAX_REPR)


class _CappedText(io.TextIOBase):
    """A text stream that keeps the first MAX_TEXT characters written to it."""

    def __init__(self):
        self.kept = []
        self.size = 0

    def writable(self):
        return True

    def write(self, text):
        if self.size < MAX_TEXT:
            piece = str(text)[: MAX_TEXT - self.size]
            self.kept.append(piece)
            self.size += len(piece)
        return len(text)

    def getvalue(self):
        return "".join(self.kept)


def _call(func, args, kwargs, captured) -> dict:
    """Call func in this (child) process; what happened, as a JSON-ready dict."""
    buffer = _CappedText()
    sys.stdout = sys.stderr = buffer
    captured.seek(0)
    captured.truncate()
    try:
        value = func(*args, **kwargs)
        result = {"status": "returned", "value_type": type_name(type(value)),
                  "value_repr": _safe_repr(value), "value": None, "value_note": ""}
        try:
            result["value"] = to_plain(value)
        except _NotPlain as exc:
            result["value_note"] = str(exc)
        except Exception as exc:  # a student's __len__, __iter__ or __int__ raised
            result["value_note"] = f"converting it raised {type_name(type(exc))}"
    except BaseException as exc:  # noqa: B036 - SystemExit and KeyboardInterrupt are results too
        try:
            message = str(exc)
            if type(message) is not str:
                message = str.__str__(message)
        except BaseException:  # noqa: B036 - the student's __str__ can raise anything
            message = "<str failed>"
        try:
            bases = [type_name(cls) for cls in type(exc).__mro__]
        except Exception:
            bases = [type_name(type(exc))]
        result = {"status": "raised", "error_type": type_name(type(exc)),
                  "error_message": _shorten(message), "error_bases": bases}
    try:
        sys.stdout.flush()
        captured.seek(0)
        low_level = captured.read(4 * MAX_TEXT).decode("utf-8", "replace")
    except Exception:
        low_level = ""
    result["stdout"] = _shorten(buffer.getvalue() + low_level)
    return result


def _encode(index: int, result: dict) -> bytes:
    """One message: a line of JSON (ASCII, so no raw newline inside), within MAX_MESSAGE."""
    result["index"] = index
    line = json.dumps(result, ensure_ascii=True).encode("ascii") + b"\n"
    if len(line) > MAX_MESSAGE:  # a value near the limits, full of escaped characters
        result["value"], result["value_note"] = None, "too large to send back"
        line = json.dumps(result, ensure_ascii=True).encode("ascii") + b"\n"
    return line


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _child(result_fd: int, read_fd: int, first: int, calls) -> None:
    os.setsid()  # a session and process group of our own: the parent kills all of it at the end
    os.close(read_fd)
    # Silence file descriptors 1 and 2 too: C code or os.write would otherwise reach the
    # kernel's streams, and ipykernel forwards those into the notebook nondeterministically.
    # The file is capped (writes past the cap fail with EFBIG instead of filling the disk).
    captured = tempfile.TemporaryFile(mode="w+b")
    try:
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (_MAX_CAPTURED_FILE, _MAX_CAPTURED_FILE))
    except (ImportError, OSError, ValueError):
        pass
    os.dup2(captured.fileno(), 1)
    os.dup2(captured.fileno(), 2)
    try:
        for offset, (func, args, kwargs) in enumerate(calls):
            _write_all(result_fd, _encode(first + offset, _call(func, args, kwargs, captured)))
    except OSError:  # the parent stopped listening
        os._exit(1)
    os._exit(0)  # skip atexit handlers and the kernel's inherited state


# ---- in the parent (the kernel): read plain data, bounded in size and time -------------------

class _Malformed(Exception):
    """What came from the child is not a well-formed message (the message says why)."""


def from_plain(data, depth: int = 0):
    """The inverse of :func:`to_plain`, checking that ``data`` (parsed JSON) is plain data."""
    if depth > MAX_DEPTH:
        raise _Malformed(f"value nested more than {MAX_DEPTH} deep")
    cls = type(data)
    if data is None or cls in (bool, int, float, str):
        return data
    if cls is list:
        return [from_plain(item, depth + 1) for item in data]
    if cls is dict and list(data) == ["t"] and type(data["t"]) is list:
        return tuple(from_plain(item, depth + 1) for item in data["t"])
    raise _Malformed(f"value holds a {cls.__name__}")


def _text(message: dict, key: str, limit: int = MAX_TEXT) -> str:
    value = message.get(key, "")
    if type(value) is not str:
        raise _Malformed(f"{key} is not a string")
    return _shorten(value, limit)


def _outcome(line: bytes, index: int) -> Outcome:
    """The Outcome that one line from the child describes; raises _Malformed."""
    try:
        message = json.loads(line.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _Malformed(f"not a JSON message ({type(exc).__name__})") from None
    if type(message) is not dict:
        raise _Malformed("not a JSON object")
    if type(message.get("index")) is not int or message["index"] != index:
        raise _Malformed(f"out of order: expected the result of call {index}")
    status = message.get("status")
    stdout = _text(message, "stdout")
    if status == "returned":
        return Outcome("returned", value=from_plain(message.get("value")),
                       value_type=_text(message, "value_type", MAX_REPR),
                       value_repr=_text(message, "value_repr", MAX_REPR),
                       value_note=_text(message, "value_note"), stdout=stdout)
    if status == "raised":
        bases = message.get("error_bases", [])
        if type(bases) is not list or len(bases) > 100 or any(type(b) is not str for b in bases):
            raise _Malformed("error_bases is not a short list of strings")
        return Outcome("raised", error_type=_text(message, "error_type", MAX_REPR),
                       error_message=_text(message, "error_message"),
                       error_bases=tuple(_shorten(b, MAX_REPR) for b in bases), stdout=stdout)
    raise _Malformed("unknown status")


def _exit_status(pid: int) -> int | None:
    """None while the child runs; else its exit code (-signal if killed). Does not reap it,
    so its pid - the id of its group and session - stays reserved until join()."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return 0
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


class _Channel:
    """The reading end of the result pipe: whole lines, each within MAX_MESSAGE and a deadline."""

    _POLL = 0.05  # seconds between checks that the child still runs

    def __init__(self, fd: int, process):
        self.fd, self.pid = fd, process.pid
        # The sentinel wakes us at once when the child exits; the child (or a process it
        # forked) can also write into it, so a false alarm demotes it to polling.
        self.watch = [fd, process.sentinel]
        self.buffer = bytearray()
        self.eof = False
        self.exit_status: int | None = None

    def read_line(self, timeout: float) -> bytes | str:
        """The next line, or "timeout", "dead" (the child exited) or "too long"."""
        deadline = time.monotonic() + timeout
        while True:
            end = self.buffer.find(b"\n")
            if end >= 0:
                line = bytes(self.buffer[:end])
                del self.buffer[: end + 1]
                return line if len(line) <= MAX_MESSAGE else "too long"
            if len(self.buffer) > MAX_MESSAGE:
                return "too long"
            if self.eof:  # every writer closed the pipe: the child is exiting, or has
                for _ in range(20):
                    self.exit_status = _exit_status(self.pid)
                    if self.exit_status is not None:
                        break
                    time.sleep(self._POLL)
                return "dead"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            ready = multiprocessing.connection.wait(self.watch, min(remaining, self._POLL))
            if self.fd in ready:
                try:
                    chunk = os.read(self.fd, min(2**16, MAX_MESSAGE + 1 - len(self.buffer)))
                except BlockingIOError:
                    continue
                if chunk:
                    self.buffer += chunk
                else:
                    self.eof = True
                continue
            # No data. Has the child exited? (A process it forked may hold the pipe open, so
            # end-of-file need not come.) What it wrote before exiting is readable by now.
            self.exit_status = _exit_status(self.pid)
            if self.exit_status is not None:
                if not multiprocessing.connection.wait([self.fd], 0):
                    return "dead"
            elif len(ready) > 0:  # the sentinel fired, yet the child runs: written into
                self.watch = [self.fd]


def _session_members(sid: int) -> list[int]:
    """Pids of the processes in session ``sid`` (Linux: /proc; elsewhere: none found)."""
    members = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return members
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After "(comm)" come state, ppid, pgrp, session.
        if len(fields) > 3 and fields[3] == str(sid).encode():
            members.append(int(entry))
    return members


def _kill_session(process) -> None:
    """Kill the child, then its process group and whatever else is left in its session.

    The child is killed first, so it cannot fork any more; its pid (the group's and the
    session's id) stays reserved until it is reaped by join(), so no other process is hit.
    """
    pid = process.pid
    try:
        os.kill(pid, signal.SIGKILL)  # the child, a zombie already perhaps: not reaped yet
    except ProcessLookupError:
        pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # no group: the child never got to setsid, so it forked nothing
    for member in _session_members(pid):  # grandchildren that moved to a group of their own
        try:
            os.kill(member, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    process.join()


def run_many(calls, timeout: float = DEFAULT_TIMEOUT, max_timeouts: int | None = None
             ) -> list[Outcome]:
    """Run ``calls`` (a list of ``(func, args, kwargs)``) one after another in a forked child.

    Each call gets ``timeout`` seconds (> 0). A call that times out, kills the child or sends
    back a malformed message is reported, the child is killed, and a fresh child carries on
    with the next call - so one fork serves a whole battery of fast tests. After
    ``max_timeouts`` time-outs the remaining calls are not run (status "skipped"), so a
    function that always loops costs seconds. Returns one :class:`Outcome` per call, in order.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
            timeout > 0 and math.isfinite(timeout)):
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
    if max_timeouts is not None and (isinstance(max_timeouts, bool) or not isinstance(
            max_timeouts, int) or max_timeouts < 1):
        raise ValueError(f"max_timeouts must be None or an int >= 1, got {max_timeouts!r}")
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
        read_fd, write_fd = os.pipe()
        first = len(outcomes)
        process = context.Process(target=_child, args=(write_fd, read_fd, first, calls[first:]),
                                  daemon=True)
        try:
            process.start()
            os.close(write_fd)  # the parent keeps only the reading end
            write_fd = -1
            os.set_blocking(read_fd, False)
            channel = _Channel(read_fd, process)
            while len(outcomes) < len(calls):
                line = channel.read_line(timeout)
                if line == "timeout":
                    timeouts += 1
                    outcomes.append(Outcome(
                        "timeout", detail=f"no result within {timeout:g} s (infinite loop?)"))
                    break
                if line == "dead":
                    outcomes.append(Outcome("crashed",
                                            detail=_crash_detail(channel.exit_status)))
                    break
                if line == "too long":
                    outcomes.append(Outcome("malformed", detail=(
                        f"the result message was longer than {MAX_MESSAGE} bytes (something "
                        "wrote into the sandbox's result pipe?)")))
                    break
                try:
                    outcomes.append(_outcome(line, len(outcomes)))
                except _Malformed as exc:
                    outcomes.append(Outcome("malformed", detail=(
                        f"the result message was malformed: {exc} (something wrote into the "
                        "sandbox's result pipe?)")))
                    break
        finally:
            if write_fd >= 0:
                os.close(write_fd)
            if process.pid is not None:
                _kill_session(process)
            os.close(read_fd)
    return outcomes


def run_sandboxed(func, *args, timeout: float = DEFAULT_TIMEOUT, **kwargs) -> Outcome:
    """Call ``func(*args, **kwargs)`` in a forked child; return its :class:`Outcome`.

    ``timeout`` (seconds, > 0) bounds the call; a child still running then is killed.
    """
    return run_many([(func, args, kwargs)], timeout)[0]


def _crash_detail(exitcode) -> str:
    if exitcode is None:
        return "the process closed its result pipe before returning"
    if exitcode is not None and exitcode < 0:
        return f"the process died from signal {-exitcode} before returning"
    return f"the process exited (code {exitcode}) before returning"


def _package_callables() -> dict[int, object]:
    """{id: object} of every function and class defined in a loaded dpcost module."""
    found = {}
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "dpcost" or module_name.startswith("dpcost.")):
            continue
        for value in list(vars(module).values()):
            if callable(value) and getattr(value, "__module__", None) == module_name:
                found[id(value)] = value  # kept, so the ids stay those of live objects
    return found


def is_package_function(fn) -> bool:
    """Whether ``fn`` is one of the dpcost package's own functions (or classes), by identity.

    Not by name: a student's module may well be called ``dpcost_mine``.
    """
    return id(fn) in _package_callables()


def student_function_name(fn, allowed, example: str, what: str = "function",
                          name: str | None = None, accepts_name: bool = False) -> str:
    """The exercise name of the student's ``fn`` (or ``name``), checked to be one of ``allowed``.

    Refuses what is not callable, and the dpcost package's own functions: the checker tests what
    the student wrote, never the reference. ``example`` shows the right call in the message;
    ``accepts_name``: the caller takes ``name=...``, so the message offers it.
    """
    if not callable(fn):
        raise TypeError(f"pass your function itself, e.g. {example}; got "
                        f"{type(fn).__name__} {fn!r}")
    if is_package_function(fn):
        raise ValueError(f"{getattr(fn, '__qualname__', fn)!r} is the dpcost package's own "
                         f"{what}; check the one you wrote in the notebook instead")
    name = name or getattr(fn, "__name__", "")
    if name not in allowed:
        hint = " (or pass name=...)" if accepts_name else ""  # only where the caller takes it
        raise ValueError(f"the function must be named one of {', '.join(allowed)}{hint}; "
                         f"got {name!r}")
    return name
