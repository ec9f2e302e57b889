"""Run student code in a confined child process, with a time limit; only plain data comes back.

The child is forked from the notebook's kernel (so the functions a student defined need no
pickling) and confined by :mod:`dpcost.grading.confine`: an unprivileged uid of its own when
the kernel runs as root, new PID, mount and network namespaces where the system allows them,
resource limits and a bound on the memory of all its processes together always, and every
process it starts ended with it. ``protections()`` says what is in
force here. The kernel waits at most ``timeout`` seconds per call, then kills the child.
Exceptions (``SystemExit`` included), wrong return values, prints, warnings and infinite loops
all come back as an :class:`Outcome`; the kernel never dies and never hangs.

What the child can and cannot reach:

- **Not the kernel.** It cannot signal, trace or open the kernel's files (``/proc/<pid>/fd/1``
  included): another uid, another PID namespace with its own ``/proc``. Every descriptor it
  inherits (ipykernel's sockets too) points at /dev/null; its stdout and stderr go to a pipe
  that the kernel reads and keeps (capped), never to the kernel's streams.
- **Not the reference answers.** In the child, before any student code runs, every function of
  the dpcost package is disabled (calling it raises), the objects the checkers gave to
  :func:`withhold` (a battery's tests with their expected values, earlier reports) are emptied,
  the package cannot be imported again, and where a mount namespace exists its folder is
  hidden. Only the sandbox itself and what an exercise names in ``allowed`` (the ring
  simulator, say) keep working there. Verdicts are made in the kernel, from plain values.
- **Not the machine beyond its folder and its share.** Its files live in its own folder
  (removed afterwards; /tmp, /var/tmp, /dev/shm and /run are private tmpfs, or swept), its
  processes together stay within ``Limits.memory_bytes`` (else the whole child is stopped and
  the call reports it in one line), its environment holds none of the kernel's variables
  beyond PATH, the locale and Python's, and it reaches no socket but its own (a network
  namespace with only a loopback). :func:`protections` says which of these hold here.
- **Results cross as plain data only.** The child converts the returned value to None, a bool,
  an int, a float, a str, or a short list or tuple of those (numpy scalars become the Python
  number; at most :data:`MAX_ITEMS` items, :data:`MAX_DEPTH` levels), and sends it with the
  type's name and the first :data:`MAX_REPR` characters of its repr, as one line of JSON. The
  kernel parses JSON, never pickle. Every read is bounded in size (:data:`MAX_MESSAGE`) and
  time; a message that is not well formed makes that call "malformed".

The child can still lie about its own result (it writes the result message), so a forged
message needs the right answer, which it must compute itself: that is solving the exercise.

An interrupt (SIGINT, Jupyter's Stop) during a run kills the child and everything it started,
removes its folder, and then raises ``KeyboardInterrupt``: nothing is left half-done.

API, for any exercise: :func:`run_many` runs a list of ``(func, args, kwargs)`` in one child
(a fresh one after each time-out or crash) and returns one :class:`Outcome` per call;
:func:`run_sandboxed` runs one call. A ``func`` may be a wrapper defined in the exercise's
module that calls the student's code and returns plain data (``ring_step`` runs the simulator
that way); it keeps working in the child.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import io
import json
import math
import os
import reprlib
import select
import sys
import time
import types
import warnings
import weakref
from dataclasses import dataclass

from dpcost.grading import confine

DEFAULT_TIMEOUT = 2.0  # seconds per test; the reference solutions take microseconds
MAX_REPR = 200  # characters of a returned value's repr kept
MAX_TEXT = 500  # characters of an exception message, of captured output, of one warning kept
MAX_WARNINGS = 5  # distinct warnings kept per call
MAX_ITEMS = 20_000  # values (scalars and lists/tuples) in one returned value
MAX_DEPTH = 4  # nesting of lists and tuples in a returned value
MAX_STR = 10_000  # characters of one returned string
MAX_INT_BITS = 4096  # bits of one returned int (about 1,233 decimal digits)
MAX_MESSAGE = 2 * 2**20  # bytes of one message from the child (2 MiB); more is malformed

# Statuses in which the call gave no result; Outcome.detail says what the parent saw.
NO_RESULT = ("timeout", "crashed", "malformed", "skipped")

END_OF_CALL = b"\x00\x1edpcost: end of call\x1e\x00"  # in the output pipe, after each call
READY = b"ready\n"  # the child's first line: set up, about to run the first call
PACKAGE = "dpcost"
_ALWAYS_ALLOWED = ("dpcost.grading.sandbox", "dpcost.grading.confine")


def limits_for(timeout: float, calls: int) -> confine.Limits:
    """The child's limits for ``calls`` calls of ``timeout`` s: 1 GiB beyond the kernel's
    mappings a process and 1 GiB for all its processes together, 32 + 2 per CPU tasks (numpy's
    BLAS threads fit), CPU time for every call plus 10 s, 16 MiB a file, 64 MiB in each
    private /tmp, /var/tmp, /dev/shm and /run."""
    return confine.Limits(address_space_extra_bytes=2**30,
                          processes=32 + 2 * (os.cpu_count() or 1),
                          cpu_s=math.ceil(timeout * max(calls, 1)) + 10,
                          file_bytes=16 * 2**20, memory_bytes=2**30, tmp_bytes=64 * 2**20)


def protections() -> dict:
    """What confines the sandbox's children on this machine (see :mod:`confine`)."""
    return confine.protections()


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
    stdout: str = ""  # what the call printed (stdout and stderr together), warnings apart
    error_bases: tuple = ()  # names of the exception class and its bases (subclasses pass)
    detail: str = ""  # for "timeout"/"crashed"/"malformed"/"skipped": what the parent saw
    value_note: str = ""  # why value is None although the call returned, e.g. "not plain data"
    warnings: tuple = ()  # "RuntimeWarning: overflow encountered ...", whole, distinct, <= 5

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


def _shorten_words(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` within ``limit`` characters, cut between words (never mid-word)."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 4]
    return (cut.rsplit(None, 1)[0] if " " in cut else cut) + " ..."


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


def _warning_lines(caught) -> list[str]:
    """Distinct warnings as "Category: message", whole words, at most MAX_WARNINGS."""
    lines = []
    for warning in caught:
        try:
            line = f"{type_name(warning.category)}: {warning.message}"
        except Exception:
            line = "<a warning whose message failed>"
        line = _shorten_words(line)
        if line not in lines:
            lines.append(line)
    return lines[:MAX_WARNINGS]


def _call(func, args, kwargs) -> dict:
    """Call func in this (child) process; what happened, as a JSON-ready dict."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
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
        except BaseException as exc:  # noqa: B036 - SystemExit and KeyboardInterrupt are results
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
    result["warnings"] = _warning_lines(caught)
    for stream in (sys.stdout, sys.stderr):  # what it printed is in the output pipe first
        try:
            stream.flush()
        except Exception:
            pass
    return result


def _encode(index: int, result: dict) -> bytes:
    """One message: a line of JSON (ASCII, so no raw newline inside), within MAX_MESSAGE."""
    result["index"] = index
    line = json.dumps(result, ensure_ascii=True).encode("ascii") + b"\n"
    if len(line) > MAX_MESSAGE:  # a value near the limits, full of escaped characters
        result["value"], result["value_note"] = None, "too large to send back"
        line = json.dumps(result, ensure_ascii=True).encode("ascii") + b"\n"
    return line


class _NoPackage:
    """An import hook (first on ``sys.meta_path``) that refuses the dpcost package."""

    def find_spec(self, name, path=None, target=None):
        if name == PACKAGE or name.startswith(PACKAGE + "."):
            raise ImportError(f"{name}: the checker runs your code without the dpcost package, "
                              "whose reference answers you are to write yourself")
        return None


def _refused(*args, **kwargs):
    raise PermissionError("<message>")  # only builtins: it runs with another module's globals


def _refusing_code(qualname: str):
    message = (f"{qualname} is the dpcost package's: it does not run in the checker's sandbox "
               "- write your own")
    code = _refused.__code__
    return code.replace(co_name=qualname.rsplit(".", 1)[-1], co_qualname=qualname,
                        co_consts=tuple(message if c == "<message>" else c
                                        for c in code.co_consts))


def _disable(function) -> None:
    """Make ``function`` raise PermissionError when called, wherever it is referenced."""
    function = getattr(function, "__func__", function)  # staticmethod, classmethod, method
    if isinstance(function, types.FunctionType) and not function.__code__.co_freevars:
        function.__code__ = _refusing_code(function.__qualname__)
    wrapped = getattr(function, "__wrapped__", None)  # functools.lru_cache and wraps
    if hasattr(function, "cache_clear"):
        function.cache_clear()
    if wrapped is not None and wrapped is not function:
        _disable(wrapped)


_WITHHELD: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # id: object


def withhold(*objects) -> None:
    """Objects that hold expected values (a battery's tests, a report and its results): the
    child empties them (``vars(obj).clear()``) before student code runs. Registering them is
    cheaper than searching the child's memory for them, which copies every page it touches."""
    for obj in objects:
        _WITHHELD[id(obj)] = obj


def withdraw_package(allowed=(), refused=()) -> None:
    """In the child, before student code runs: the dpcost package stops working, except the
    sandbox and ``allowed`` (module names, or functions).

    Every function and method defined in a dpcost module is disabled (the checkers' formulas
    too), every object given to :func:`withhold` is emptied, and the package cannot be
    imported again. ``refused`` functions are disabled even in an allowed module.
    """
    modules = set(_ALWAYS_ALLOWED) | {a for a in allowed if isinstance(a, str)}
    kept = {id(a) for a in allowed if not isinstance(a, str)}

    def disable(value):
        if id(value) in kept:
            return
        if isinstance(value, type):
            for member in list(vars(value).values()):
                if isinstance(member, property):
                    for accessor in (member.fget, member.fset, member.fdel):
                        if accessor is not None and id(accessor) not in kept:
                            _disable(accessor)
                elif callable(getattr(member, "__func__", member)) and not isinstance(
                        member, type):
                    if id(getattr(member, "__func__", member)) not in kept:
                        _disable(member)
        elif callable(value):
            _disable(value)

    for name, module in list(sys.modules.items()):
        if module is None or not (name == PACKAGE or name.startswith(PACKAGE + ".")):
            continue
        if name not in modules:
            for value in list(vars(module).values()):
                if getattr(value, "__module__", None) == name:
                    disable(value)
        del sys.modules[name]
    for obj in list(_WITHHELD.values()):  # a battery's tests, earlier reports
        with contextlib.suppress(TypeError):
            vars(obj).clear()
    for function in refused:
        _disable(function)
    sys.meta_path.insert(0, _NoPackage())


def _serve(result_fd: int, first: int, calls, allowed, refused) -> None:
    """The child's work: the calls in order, one result message each on ``result_fd``."""
    kept = list(allowed)
    for func, _, _ in calls:  # the calls' own functions and objects (grade's StudentCode)
        module = getattr(type(func), "__module__", "")
        if isinstance(func, types.FunctionType):
            kept.append(func)
        elif type(module) is str and module.startswith(PACKAGE):
            kept.append(module)
    withdraw_package(kept, refused)
    confine._write_all(result_fd, READY)  # the calls' clocks start now
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                  errors="replace", write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                  errors="replace", write_through=True)
    try:
        for offset, (func, args, kwargs) in enumerate(calls):
            result = _call(func, args, kwargs)
            try:
                confine._write_all(1, END_OF_CALL)  # what came before is this call's output
            except OSError:  # the student's code closed or filled its stdout
                pass
            confine._write_all(result_fd, _encode(first + offset, result))
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


def _warnings(message: dict) -> tuple:
    lines = message.get("warnings", [])
    if type(lines) is not list or len(lines) > MAX_WARNINGS or any(
            type(line) is not str for line in lines):
        raise _Malformed("warnings is not a short list of strings")
    return tuple(_shorten_words(line) for line in lines)


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
    warned = _warnings(message)
    if status == "returned":
        return Outcome("returned", value=from_plain(message.get("value")),
                       value_type=_text(message, "value_type", MAX_REPR),
                       value_repr=_text(message, "value_repr", MAX_REPR),
                       value_note=_text(message, "value_note"), warnings=warned)
    if status == "raised":
        bases = message.get("error_bases", [])
        if type(bases) is not list or len(bases) > 100 or any(type(b) is not str for b in bases):
            raise _Malformed("error_bases is not a short list of strings")
        return Outcome("raised", error_type=_text(message, "error_type", MAX_REPR),
                       error_message=_text(message, "error_message"),
                       error_bases=tuple(_shorten(b, MAX_REPR) for b in bases), warnings=warned)
    raise _Malformed("unknown status")


class _Channel:
    """What comes back from one child: result lines (each within MAX_MESSAGE and a deadline)
    and its output, split by call at the child's end-of-call marks (kept up to MAX_TEXT
    characters a call; the rest is read and dropped)."""

    def __init__(self, fd: int, sandbox: confine.Confined, first: int):
        self.fd, self.sandbox = fd, sandbox
        self.buffer = bytearray()
        self.outputs: dict[int, bytearray] = {}
        self.call, self.tail = first, b""  # the call printing now; a mark's possible start
        self.eof = self.output_eof = False

    def _keep(self, data: bytes) -> None:
        kept = self.outputs.setdefault(self.call, bytearray())
        if len(kept) < 4 * MAX_TEXT:
            kept += data[: 4 * MAX_TEXT - len(kept)]

    def _drain_output(self) -> None:
        while not self.output_eof:
            try:
                chunk = os.read(self.sandbox.output_fd, 2**16)
            except BlockingIOError:
                return
            if not chunk:
                self.output_eof = True
                self._keep(self.tail)
                return
            *done, rest = (self.tail + chunk).split(END_OF_CALL)
            for part in done:
                self._keep(part)
                self.call += 1
            keep = len(rest) - (len(END_OF_CALL) - 1)
            if keep > 0:
                self._keep(rest[:keep])
            self.tail = rest[max(keep, 0):]

    def take_output(self, index: int) -> str:
        """What call ``index`` printed (the child wrote it, and its mark, before its result)."""
        self._drain_output()
        text = _shorten(bytes(self.outputs.pop(index, b"")).decode("utf-8", "replace"))
        return text

    def _read_result(self) -> None:
        try:
            chunk = os.read(self.fd, min(2**16, MAX_MESSAGE + 1 - len(self.buffer)))
        except BlockingIOError:
            return
        if chunk:
            self.buffer += chunk
        else:
            self.eof = True

    def read_line(self, timeout: float) -> bytes | str:
        """The next line, or "timeout", "dead" (the child exited) or "too long". Stops at the
        deadline whoever holds the pipe open."""
        deadline = time.monotonic() + timeout
        while True:
            end = self.buffer.find(b"\n")
            if end >= 0:
                line = bytes(self.buffer[:end])
                del self.buffer[: end + 1]
                return line if len(line) <= MAX_MESSAGE else "too long"
            if len(self.buffer) > MAX_MESSAGE:
                return "too long"
            if self.eof:
                self.sandbox.wait_exit(2.0)
                return "dead"
            if self.sandbox.poll() is not None:  # exited: what it wrote is readable by now
                self._read_result()
                if b"\n" not in self.buffer:
                    return "dead"
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            watch = [self.fd, self.sandbox.status_fd]
            if not self.output_eof:
                watch.append(self.sandbox.output_fd)
            ready = select.select(watch, [], [], remaining)[0]
            if self.sandbox.output_fd in ready:
                self._drain_output()
            if self.fd in ready:
                self._read_result()


def run_many(calls, timeout: float = DEFAULT_TIMEOUT, max_timeouts: int | None = None, *,
             allowed=(), refused=()) -> list[Outcome]:
    """Run ``calls`` (a list of ``(func, args, kwargs)``) one after another in a confined child.

    Each call gets ``timeout`` seconds (> 0). A call that times out, kills the child or sends
    back a malformed message is reported, the child is killed, and a fresh child carries on
    with the next call - so one fork serves a whole battery of fast tests. After
    ``max_timeouts`` time-outs the remaining calls are not run (status "skipped"), so a
    function that always loops costs seconds. ``allowed``: dpcost modules (names) or functions
    that keep working in the child (the calls' own functions always do); ``refused``: functions
    of an allowed module disabled all the same (a reference answer). Returns one
    :class:`Outcome` per call, in order. SIGINT: the child is ended, then KeyboardInterrupt.
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
    while len(outcomes) < len(calls):
        if max_timeouts is not None and timeouts >= max_timeouts:
            outcomes += [Outcome("skipped", detail=f"not run: {timeouts} earlier calls timed out")
                         for _ in calls[len(outcomes):]]
            break
        first = len(outcomes)
        read_fd, write_fd = os.pipe()
        rest = calls[first:]
        sandbox = confine.Confined(functools.partial(_serve, write_fd, first, rest, allowed,
                                                     refused),
                                   limits_for(timeout, len(rest)), keep_fds=[write_fd],
                                   hide_package=True)
        try:
            try:
                sandbox.start()
            finally:
                os.close(write_fd)  # the parent keeps only the reading end
            os.set_blocking(read_fd, False)
            channel = _Channel(read_fd, sandbox, first)
            ready = channel.read_line(confine.SETUP_TIMEOUT_S)
            if ready != READY.strip():
                raise confine.SandboxError(f"the sandbox's child did not get ready: {ready!r}")
            while len(outcomes) < len(calls):
                line = channel.read_line(timeout)
                if line == "timeout":
                    timeouts += 1
                    outcome = Outcome(
                        "timeout", detail=f"no result within {timeout:g} s (infinite loop?)")
                elif line == "dead":
                    outcome = Outcome("crashed", detail=sandbox.stopped_for or _crash_detail(
                        sandbox.exit_status))
                elif line == "too long":
                    outcome = Outcome("malformed", detail=(
                        f"the result message was longer than {MAX_MESSAGE} bytes (something "
                        "wrote into the sandbox's result pipe?)"))
                else:
                    try:
                        outcome = _outcome(line, len(outcomes))
                    except _Malformed as exc:
                        outcome = Outcome("malformed", detail=(
                            f"the result message was malformed: {exc} (something wrote into "
                            "the sandbox's result pipe?)"))
                outcome.stdout = channel.take_output(len(outcomes))
                outcomes.append(outcome)
                if outcome.status in NO_RESULT:
                    break
        finally:
            sandbox.stop()
            os.close(read_fd)
    return outcomes


def run_sandboxed(func, *args, timeout: float = DEFAULT_TIMEOUT, **kwargs) -> Outcome:
    """Call ``func(*args, **kwargs)`` in a confined child; return its :class:`Outcome`.

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
