"""Exercise 3: migrate a DataParallel training function to DDP; the checker runs it on 2 ranks.

The student gets :func:`train_dp` (one process, ``nn.DataParallel``) and writes
``train_ddp(dataset, epochs, global_batch, seed, checkpoint)``, called on every rank as a
torchrun worker would be: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` are set, and the function joins the process group itself (gloo), trains, saves
the checkpoint, leaves the group and returns the trained model.

``check(train_ddp)`` runs one setting and shows a table, one row per thing a migration must get
right; ``submit(train_ddp)`` runs two settings and scores them. Each run happens for real:

- a child process is forked (the notebook's function needs no pickling) and confined
  (:mod:`dpcost.grading.confine`); it forks 2 ranks that call the student's function, and only
  then draws the run's data from a secret key, which it serves to each rank batch by batch:
  real samples for the rank's own share (what ``DistributedSampler`` gives it), decoys for the
  rest. So ranks that each train alone cannot match the one-process run, which the caller
  trains on the same secret data once the sandbox has ended;
- what is judged comes from where the student's code cannot write it: the batches each rank
  fetched are recorded by the serving process; the bytes the ranks sent each other are counted
  by the kernel (the loopback of the sandbox's network namespace); the parameters must match
  the secret run's. What only a rank can say (who called ``torch.save``, whether the process
  group was left) comes as one line of JSON on a pipe, the last line counting, written after
  the student's function returned; a report file in the folder counts for nothing;
- a rank that raises, dies (exit, signal) or hangs past the time limit is reported by rank, in
  words; the others are then stopped. The caller only ever parses JSON (nothing is unpickled).

Ranks and child run one torch thread each: forking after torch's intra-op threads have run
(as they have in a notebook that trained) and then using several threads in the child hangs
in OpenMP, with one thread it does not.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import importlib
import json
import math
import os
import select
import signal
import sys
import sysconfig
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch._dynamo  # noqa: F401 - imported once here, not in every sandboxed run (see below)
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Sampler

from dpcost.exercises import hints as _hints
from dpcost.exercises.report import Report, TestResult
from dpcost.grading import confine
from dpcost.grading.sandbox import student_function_name
from dpcost.migration import SAME_ORDER, SAME_SAMPLES, same_order_every_epoch, same_samples
from dpcost.procs import die_with_parent, free_port

WORLD_SIZE = 2
DEFAULT_TIMEOUT = 30.0  # seconds for a whole run (reference + 2 ranks); ~2-4 s when right
GRACE_S = 3.0  # after one rank fails, how long the others get to finish or fail too
ATOL = 1e-5  # |parameter difference| accepted as equal (float32)
SETTINGS = {  # name: (dataset size, epochs, global batch, seed)
    "32 samples, 2 epochs, global batch 8": (32, 2, 8, 0),
    "48 samples, 3 epochs, global batch 12": (48, 3, 12, 1),
}
CHECK_SETTING = "32 samples, 2 epochs, global batch 8"
_TIMEOUT = [DEFAULT_TIMEOUT]  # the current run's limit, for the stuck ranks' stack dumps


def setting_timeout() -> float:
    """When each rank dumps its Python stacks, if it is still running: 1 s before the limit."""
    return max(0.5, _TIMEOUT[0] - 1.0)


# ----------------------------------------------------------------------------------------------
# What the student starts from (the notebook shows these).

def make_dataset(size: int = 32):
    """A generated, seeded 4-class problem: ``size`` samples (x: 8 floats, y: a class)."""
    g = torch.Generator().manual_seed(4321)
    x = torch.randn(size, 8, generator=g)
    y = (x @ torch.randn(8, 4, generator=g)).argmax(dim=1)
    return torch.utils.data.TensorDataset(x, y)


def make_model():
    """The model to train (no BatchNorm, so DDP on CPU can match one process exactly)."""
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


class ShuffleEachEpoch(Sampler):
    """A new order each epoch, drawn from seed + epoch (the order DistributedSampler uses)."""

    def __init__(self, dataset, seed=0):
        self.size, self.seed, self.epoch = len(dataset), seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.size, generator=g).tolist())

    def __len__(self):
        return self.size


def train_dp(dataset, epochs=2, global_batch=8, seed=0, checkpoint="checkpoint.pt"):
    """The DataParallel training to migrate: one process, the whole global batch per step."""
    torch.manual_seed(seed)
    model = nn.DataParallel(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = ShuffleEachEpoch(dataset, seed)
    loader = DataLoader(dataset, batch_size=global_batch, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    torch.save(model.module.state_dict(), checkpoint)
    return model.module


# ----------------------------------------------------------------------------------------------
# Running it.

class RecordingDataset(Dataset):
    """Wraps a dataset and records every batch of indices a DataLoader fetches from it (in the
    process that fetches: the reference's, which reads with ``num_workers=0``)."""

    def __init__(self, dataset):
        self.dataset, self.batches = dataset, []

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        self.batches.append([int(index)])
        return self.dataset[index]

    def __getitems__(self, indices):  # DataLoader's fetcher calls this for a whole batch
        self.batches.append([int(i) for i in indices])
        return [self.dataset[i] for i in indices]


# ---- The evidence: secret data, served by the worker, one rank's share each --------------------
#
# The ranks run the student's code, so whatever a rank says about itself can be made up. The
# verdict rests on what a rank cannot make up:
# - the data is drawn from a secret key that the worker picks after forking the ranks (so no
#   rank's memory holds it) and serves on request: real samples only for the indices of the
#   rank's share (those DistributedSampler gives that rank in some epoch), decoys otherwise. A
#   rank that trains alone on the whole dataset trains on decoys for half of it: its parameters
#   miss the one-process run's, which the caller trains on the real data afterwards;
# - the worker records each batch a rank fetches: the reads are what the rank did;
# - the kernel counts the bytes on the loopback of the sandbox's network namespace: ranks that
#   never all-reduced their gradients cannot have sent one gradient's worth per step.

def secret_dataset(size: int, key: int):
    """The data of one run: ``size`` samples drawn from ``key`` (as ``make_dataset`` draws its
    own from 4321), so only who knows the key can compute on all of it."""
    g = torch.Generator().manual_seed(key)
    x = torch.randn(size, 8, generator=g)
    y = (x @ torch.randn(8, 4, generator=g)).argmax(dim=1)
    return torch.utils.data.TensorDataset(x, y)


def rank_share(size: int, epochs: int, seed: int, rank: int) -> set[int]:
    """The indices that ``DistributedSampler(dataset, seed=seed)`` gives ``rank`` of
    ``WORLD_SIZE`` in any of ``epochs`` epochs (its order: torch/utils/data/distributed.py)."""
    share = set()
    for epoch in range(epochs):
        g = torch.Generator().manual_seed(seed + epoch)
        order = torch.randperm(size, generator=g).tolist()
        order += order[: (-size) % WORLD_SIZE]  # padded to a multiple of the world size
        share.update(order[rank::WORLD_SIZE])
    return share


class ServedDataset(Dataset):
    """A rank's dataset: each batch is fetched from the sandbox's worker over a socket (the
    worker records it and answers with the samples). A DataLoader's worker processes, forked
    from the rank, share the socket: a per-process lock keeps each request with its answer."""

    def __init__(self, size: int, sock_fd: int, lock_fd: int):
        self.size, self.sock_fd, self.lock_fd = size, sock_fd, lock_fd

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.__getitems__([index])[0]

    def __getitems__(self, indices):
        indices = [int(i) for i in indices]
        if any(not 0 <= i < self.size for i in indices):
            raise IndexError(f"index out of range for a dataset of {self.size} samples")
        import fcntl

        request = json.dumps(indices).encode() + b"\n"
        fcntl.lockf(self.lock_fd, fcntl.LOCK_EX)
        try:
            confine._write_all(self.sock_fd, request)
            answer = _read_exactly(self.sock_fd, len(indices) * SAMPLE_BYTES)
        finally:
            fcntl.lockf(self.lock_fd, fcntl.LOCK_UN)
        x = torch.frombuffer(bytearray(answer[: len(indices) * 32]), dtype=torch.float32)
        y = torch.frombuffer(bytearray(answer[len(indices) * 32:]), dtype=torch.int64)
        x = x.reshape(len(indices), 8)
        return [(x[k], y[k]) for k in range(len(indices))]


SAMPLE_BYTES = 8 * 4 + 8  # 8 float32 features and an int64 label
MAX_REQUEST = 1 << 16  # bytes of one batch request; a longer line ends the rank's service


def _read_exactly(fd: int, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = os.read(fd, count - len(data))
        if not chunk:
            raise ConnectionError("the checker's data server closed the connection")
        data += chunk
    return bytes(data)


class _Server:
    """In the worker: one rank's data service and its record of reads."""

    def __init__(self, sock: int, data, real: set[int], decoys):
        self.sock, self.data, self.real, self.decoys = sock, data, real, decoys
        self.buffer, self.batches, self.open = b"", [], True

    def serve(self) -> None:
        """Answer every whole request that has arrived (called when the socket is readable)."""
        try:
            chunk = os.read(self.sock, 1 << 16)
        except OSError:
            chunk = b""
        if not chunk:
            self.close()
            return
        self.buffer += chunk
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            try:
                indices = json.loads(line)
                if type(indices) is not list or not all(
                        type(i) is int and 0 <= i < len(self.data[0]) for i in indices):
                    raise ValueError
            except ValueError:
                self.close()
                return
            self.batches.append(indices)
            x, y = self.data
            dx, dy = self.decoys
            xs = torch.stack([x[i] if i in self.real else dx[i] for i in indices])
            ys = torch.stack([y[i] if i in self.real else dy[i] for i in indices])
            try:
                confine._write_all(self.sock, xs.numpy().tobytes() + ys.numpy().tobytes())
            except OSError:
                self.close()
                return
        if len(self.buffer) > MAX_REQUEST:
            self.close()

    def close(self) -> None:
        if self.open:
            os.close(self.sock)
            self.open = False


def loopback_bytes() -> int:
    """Bytes sent on ``lo`` in this process's network namespace, as the kernel counts them."""
    try:
        with open("/proc/net/dev") as table:
            for line in table:
                name, _, counters = line.partition(":")
                if name.strip() == "lo":
                    return int(counters.split()[8])  # the first transmit column: bytes
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _flat_params(model) -> list[float]:
    return torch.cat([p.detach().flatten().double() for p in model.parameters()]).tolist()


def _counting_save(counter: list):
    real_save = torch.save

    def save(*args, **kwargs):
        counter.append(1)
        return real_save(*args, **kwargs)

    return save


# The student's frame is the innermost one outside these packages' folders (not any path that
# merely contains "dpcost" or "torch": a course cloned into a folder named dpcost holds both).
_LIBRARY_DIRS = tuple(str(Path(module.__file__).resolve().parent) + os.sep
                      for module in (sys.modules["dpcost"], torch))


# Python's own library and the installed packages: code no student wrote.
_NOT_STUDENT_DIRS = _LIBRARY_DIRS + tuple(
    str(Path(path).resolve()) + os.sep for path in {sysconfig.get_paths()[key] for key in (
        "stdlib", "platstdlib", "purelib", "platlib")})
# What joins gloo's or a loader's threads when freed (see _rank_main's keep_locals).
_HOLDS_THREADS = (nn.parallel.DistributedDataParallel, DataLoader,
                  *([torch.distributed.ProcessGroup] if torch.distributed.is_available() else []))


def _describe_error(exc: BaseException) -> dict:
    frames = traceback.extract_tb(exc.__traceback__)
    where = next((f"line {f.lineno} of {f.name}" for f in reversed(frames)
                  if not str(Path(f.filename).resolve()).startswith(_LIBRARY_DIRS)), "")
    try:
        message = str(exc)
    except Exception:
        message = "<str failed>"
    return {"error_type": type(exc).__name__, "error_message": message[:400], "where": where}


def _rank_main(fn, rank, port, setting, folder, dataset, report_fd) -> None:
    """One rank: torchrun's environment, the student's function, then one line of JSON on
    ``report_fd`` with what it returned (the worker takes the last line: ours, written after
    the student's code has returned)."""
    die_with_parent()
    torch.set_num_threads(1)
    # A rank still running just before the limit writes where it is (the worker reads it)
    stacks = open(os.path.join(folder, f"rank{rank}.stacks"), "w")  # noqa: SIM115 - until exit
    faulthandler.dump_traceback_later(setting_timeout(), file=stacks)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    size, epochs, global_batch, seed = setting
    saves = []
    torch.save = _counting_save(saves)
    out = {"rank": rank, "status": "returned"}
    # Keep the student's locals (DDP, the process group, the loader) alive after the call: their
    # C++ destructors join gloo's threads, which can block once the other rank has left. We
    # write the result, then os._exit skips them.
    kept, error = [], None
    if type(fn).__name__ == "StudentCode":  # the grader's: the notebook's cells, run here
        try:
            fn = fn.load()
        except Exception as exc:
            error = exc
    code = getattr(getattr(fn, "func", fn), "__code__", None)
    students = {}  # code object -> whether it is the student's (outside dpcost and torch)

    def keep_locals(frame, event, arg):
        # The function's locals, and those of any function of the student's that returns
        # holding DDP, a process group or a loader (a helper that builds DDP): dropped with the
        # GIL held, DDP's reducer joins gloo's thread, which needs the GIL to finish (deadlock).
        if event != "return":
            return
        if frame.f_code is code:
            kept.append(dict(frame.f_locals))
            return
        student = students.get(frame.f_code)
        if student is None:
            name = frame.f_code.co_filename
            student = students[frame.f_code] = not (name.startswith("<frozen") or str(
                Path(name).resolve()).startswith(_NOT_STUDENT_DIRS))
        if student and any(issubclass(type(value), _HOLDS_THREADS)  # type(): no __class__
                           for value in frame.f_locals.values()):
            kept.append(dict(frame.f_locals))

    sys.setprofile(keep_locals)
    try:
        if error is not None:
            raise error
        model = fn(dataset, epochs=epochs, global_batch=global_batch, seed=seed,
                   checkpoint=os.path.join(folder, "checkpoint.pt"))
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model, out["returned_ddp"] = model.module, True
        if isinstance(model, nn.Module):
            out["params"] = _flat_params(model)
        else:
            out["returned_type"] = type(model).__name__
    except BaseException as exc:  # noqa: B036 - SystemExit from the student's code is a result
        kept.append(exc)  # its traceback holds the frames, and so their locals
        out.update(status="raised", failed_at=time.monotonic(), **_describe_error(exc))
    finally:
        sys.setprofile(None)
    out["saves"] = len(saves)
    import torch.distributed as dist

    out["left_initialized"] = dist.is_available() and dist.is_initialized()
    with contextlib.suppress(OSError):
        confine._write_all(report_fd, b"\n" + json.dumps(out).encode() + b"\n")
    os._exit(0)  # leave without the kernel's atexit handlers (and without gloo's teardown)


def _last_report(data: bytes):
    """The last whole JSON line a rank wrote on its report pipe (None without one)."""
    for line in reversed(data.split(b"\n")):
        if line.strip():
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def _run_ranks(fn, setting, timeout: float, result_fd: int) -> dict:
    """In the sandbox's worker (pid 1 of its namespace, never running student code itself):
    fork the ranks, serve each its data, wait for them, and gather what each one reported."""
    import socket

    folder = os.getcwd()  # the sandbox's folder, removed by the caller
    size, epochs, _, seed = setting
    port = free_port()
    sent_before = loopback_bytes()
    links, reports, children = {}, {}, {}
    for rank in range(WORLD_SIZE):
        ours, theirs = socket.socketpair()
        report_r, report_w = os.pipe()
        lock_fd = os.memfd_create(f"rank{rank}-lock")
        pid = os.fork()
        if pid == 0:
            try:
                for fd in [result_fd, ours.fileno(), report_r, *links.values(),
                           *reports.values()]:
                    with contextlib.suppress(OSError):
                        os.close(fd)  # only the worker answers the caller and serves data
                dataset = ServedDataset(size, theirs.detach(), lock_fd)
                _rank_main(fn, rank, port, setting, folder, dataset, report_w)
            finally:
                os._exit(1)
        children[pid] = rank
        theirs.close()
        os.close(report_w)
        os.close(lock_fd)
        os.set_blocking(report_r, False)
        links[rank] = ours.detach()
        reports[rank] = report_r
    # Drawn now, after the fork: no rank's memory holds the key or the data.
    key = int.from_bytes(os.urandom(8), "little") >> 1
    data = secret_dataset(size, key).tensors
    decoys = secret_dataset(size, key ^ 0x5DEECE66D).tensors
    decoys = (decoys[0], torch.randint(0, 4, (size,), generator=torch.Generator().manual_seed(
        key ^ 0xB)))
    servers = {rank: _Server(links[rank], data, rank_share(size, epochs, seed, rank), decoys)
               for rank in range(WORLD_SIZE)}
    written = {rank: bytearray() for rank in range(WORLD_SIZE)}
    deadline, failed_at = time.monotonic() + timeout, None
    ended, ended_at = {}, {}

    def drain(rank) -> None:
        fd = reports[rank]
        while fd >= 0:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                return
            if not chunk or len(written[rank]) > MAX_DOCUMENT:
                os.close(fd)
                reports[rank] = fd = -1
                return
            written[rank] += chunk

    while len(ended) < WORLD_SIZE and time.monotonic() < deadline:
        watch = [s.sock for s in servers.values() if s.open] + [f for f in reports.values()
                                                               if f >= 0]
        ready = select.select(watch, [], [], 0.02)[0] if watch else time.sleep(0.02) or []
        for rank, server in servers.items():
            if server.open and server.sock in ready:
                server.serve()
            if reports[rank] in ready:
                drain(rank)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            rank = children.get(pid)
            if rank is None:
                continue  # something the student forked, reparented to us (pid 1)
            drain(rank)
            ended[rank], ended_at[rank] = os.waitstatus_to_exitcode(status), time.monotonic()
            result = _last_report(bytes(written[rank]))
            if ended[rank] != 0 or type(result) is not dict or result.get(
                    "status") != "returned":
                failed_at = failed_at or time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
            break
    for pid, rank in children.items():
        if rank not in ended:
            os.kill(pid, signal.SIGKILL)
    summary = {}
    for rank in range(WORLD_SIZE):
        drain(rank)
        servers[rank].close()
        result = _last_report(bytes(written[rank]))
        if rank not in ended:
            result = {"rank": rank, "status": "hung", "after_failure": failed_at is not None,
                      "timeout": timeout, "where": _stuck_at(folder, rank)}
        elif type(result) is not dict:
            code = ended[rank]
            how = (f"was killed by signal {signal.Signals(-code).name}" if code < 0 else
                   f"exited with status {code}")
            result = {"rank": rank, "status": "died", "detail": how,
                      "failed_at": ended_at[rank]}
        else:
            if result.get("status") != "returned":
                result.setdefault("failed_at", ended_at[rank])
            result["batches"] = servers[rank].batches  # what it fetched, recorded here
        summary[str(rank)] = result
    for fd in reports.values():
        if fd >= 0:
            os.close(fd)
    return {"ranks": summary, "key": key, "loopback_bytes": loopback_bytes() - sent_before}


def _stuck_at(folder, rank) -> str:
    """Where a rank that did not finish was, from its stack dump ("" without one): the innermost
    frame of the thread that runs the student's code, and the call it was in, e.g. "line 57 of
    train_ddp, in destroy_process_group". faulthandler lists each thread's frames innermost
    first, as '  File "PATH", line N in NAME'."""
    try:
        with open(os.path.join(folder, f"rank{rank}.stacks")) as f:
            text = f.read(200_000)
    except OSError:
        return ""
    for block in text.split("\n\n"):
        frames = []  # (path, line number, function), innermost first
        for line in block.splitlines():
            path, _, place = line.removeprefix('  File "').rpartition('", line ')
            number, _, name = place.partition(" in ")
            if line.startswith('  File "') and path and number.isdigit() and name:
                frames.append((path, number, name[:100]))  # the file is the rank's to write
        for i, (path, number, name) in enumerate(frames):
            if not str(Path(path).resolve()).startswith(_LIBRARY_DIRS):
                return f"line {number} of {name}" + (f", in {frames[0][2]}" if i else "")
    return ""


def _launcher(fn, setting, timeout, result_fd) -> None:
    """The sandbox's worker: the ranks, then one JSON document on ``result_fd``."""
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - the sandbox's output pipe
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    try:
        torch.set_num_threads(1)
        # Before any rank's init_process_group: DDP's constructor imports torch._dynamo, and
        # imported after init it pins the default group (known PyTorch bug, see DESIGN.md).
        # Loaded by this module's import already; a fresh import would cost every run.
        importlib.import_module("torch._dynamo")
        document = {"ok": True, **_run_ranks(fn, setting, timeout, result_fd)}
    except BaseException as exc:  # noqa: B036
        document = {"ok": False, **_describe_error(exc)}
    confine._write_all(result_fd, json.dumps(document).encode())
    os.close(result_fd)


def reference_run(setting, key: int) -> dict:
    """train_dp's parameters and batches for ``setting`` on the run's secret data (``key``),
    computed in the caller after the sandbox has ended (so no rank's memory ever holds them;
    not cached, for the same reason), with the caller's random state restored after."""
    size, epochs, global_batch, seed = setting
    data = RecordingDataset(secret_dataset(size, key))
    with torch.random.fork_rng(devices=[]), tempfile.TemporaryDirectory() as folder:
        model = train_dp(data, epochs, global_batch, seed, os.path.join(folder, "reference.pt"))
    return {"params": _flat_params(model), "batches": data.batches}


# The ranks' limits: 2 ranks and DataLoader workers, each with torch's and gloo's threads.
LIMITS = confine.Limits(address_space_extra_bytes=3 * 2**30,
                        processes=256 + 4 * (os.cpu_count() or 1), cpu_s=120,
                        file_bytes=64 * 2**20)
MAX_DOCUMENT = 4 * 2**20  # bytes of the worker's answer; more is not read
SETUP_S = 10.0  # beyond the timeout: the sandbox's start and the worker's answer


def run(fn, setting=SETTINGS[CHECK_SETTING], timeout: float = DEFAULT_TIMEOUT) -> dict:
    """Run ``fn`` on 2 gloo ranks in a confined sandbox (:mod:`dpcost.grading.confine`);
    what happened, as plain (JSON) data.

    Returns {"ok": True, "reference": {...}, "ranks": {"0": {...}, "1": {...}},
    "protections": {...}} or {"ok": False, "detail": ...} when the sandbox gave no answer in
    time. The reference is computed here, afterwards; the ranks never see it. An interrupt
    (SIGINT) ends the sandbox and everything in it, then raises KeyboardInterrupt.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    _TIMEOUT[0] = timeout
    read_fd, write_fd = os.pipe()
    sandbox = confine.Confined(functools.partial(_launcher, fn, setting, timeout, write_fd),
                               LIMITS, keep_fds=[write_fd])
    chunks, size = [], 0
    try:
        try:
            sandbox.start()
        finally:
            os.close(write_fd)
        deadline = time.monotonic() + timeout + GRACE_S + SETUP_S
        watch = [read_fd, sandbox.output_fd, sandbox.status_fd]
        while size <= MAX_DOCUMENT:  # stops at the deadline, whoever holds the pipe
            if sandbox.status_fd in watch and sandbox.poll() is not None:
                watch.remove(sandbox.status_fd)  # the worker ended: its answer is in the pipe
                deadline = min(deadline, time.monotonic() + 1.0)
            remaining = deadline - time.monotonic()
            ready = select.select(watch, [], [], max(0.0, remaining))[0] if remaining > 0 else []
            if not ready:
                break
            if sandbox.output_fd in ready:  # what the ranks print: read, so they never block
                with contextlib.suppress(BlockingIOError):
                    if not os.read(sandbox.output_fd, 2**16):
                        watch.remove(sandbox.output_fd)
            if read_fd in ready:
                chunk = os.read(read_fd, 2**16)
                if not chunk:
                    break  # the worker answered (and every rank is gone with it)
                chunks.append(chunk)
                size += len(chunk)
    finally:
        sandbox.stop()  # the worker, its ranks and anything they started; the folder
        os.close(read_fd)
    try:
        data = json.loads(b"".join(chunks).decode())
        if type(data) is not dict or type(data.get("ranks", {})) is not dict:
            raise ValueError("not a JSON object")
    except ValueError:
        data = {"ok": False, "error_type": "", "error_message": "",
                "detail": "the checker's sandbox gave no answer (killed or stuck)"}
    if data.get("ok") and (type(data.get("key")) is not int or type(
            data.get("loopback_bytes")) is not int):
        data = {"ok": False, "error_type": "", "error_message": "",
                "detail": "the checker's sandbox gave a malformed answer"}
    if not data.get("ok") and sandbox.stopped_for:  # e.g. over the memory bound: say so
        data["detail"] = sandbox.stopped_for
    if data.get("ok"):
        data["reference"] = reference_run(setting, data["key"])
    data["protections"] = sandbox.protections
    return data


# ----------------------------------------------------------------------------------------------
# Judging it.

ASPECTS = [
    ("runs", "both ranks return a model"),
    ("split", "each rank trains on its own share of the samples"),
    ("reshuffle", "a new order every epoch"),
    ("batch", "each rank's batch is global_batch / world_size"),
    ("sync", "the ranks end with the same parameters"),
    ("params", "the parameters of the one-process run"),
    ("checkpoint", "one rank writes the checkpoint"),
    ("cleanup", "the process group is destroyed"),
]


def _epochs(batches, epochs):
    flat = [i for batch in batches for i in batch]
    if not flat or len(flat) % epochs:
        return None
    per = len(flat) // epochs
    return [flat[e * per:(e + 1) * per] for e in range(epochs)]


def _is_list_of(value, kind, limit=100_000) -> bool:
    return type(value) is list and len(value) <= limit and all(type(v) is kind for v in value)


def checked_rank(result, rank: int) -> dict:
    """A rank's report (written by the rank, where the student's code runs) if it has the
    shape the worker and ``_rank_main`` give it; else a "died" report that says so."""
    bad = {"rank": rank, "status": "died", "detail": "wrote a malformed report"}
    if type(result) is not dict or result.get("rank") != rank:
        return bad
    status = result.get("status")
    if type(result.get("failed_at", 0.0)) not in (int, float):
        return bad
    if status == "hung":
        ok = type(result.get("timeout")) in (int, float) and type(
            result.get("after_failure")) is bool and type(result.get("where", "")) is str
    elif status == "died":
        ok = type(result.get("detail")) is str
    elif status in ("returned", "raised"):
        batches = result.get("batches")
        ok = (type(batches) is list and len(batches) <= 100_000
              and all(_is_list_of(b, int) for b in batches)
              and type(result.get("saves")) is int and type(result.get("left_initialized")) is bool
              and ("params" not in result or _is_list_of(result["params"], float, 10**7)))
        if status == "raised":
            ok = ok and all(type(result.get(k)) is str
                            for k in ("error_type", "error_message", "where"))
        elif "params" not in result:
            ok = ok and type(result.get("returned_type")) is str
    else:
        ok = False
    return result if ok else bad


def judge(data: dict, setting) -> dict[str, str]:
    """{aspect: "" if right, else why not, in words} for one run's ``data`` (from :func:`run`)."""
    size, epochs, global_batch, _ = setting
    n = WORLD_SIZE
    if not data.get("ok"):
        why = data.get("detail") or (f"the checker failed: {data.get('error_type')}: "
                                     f"{data.get('error_message')}")
        return dict.fromkeys((a for a, _ in ASPECTS), why)
    ranks = [checked_rank(data["ranks"].get(str(r)), r) for r in range(n)]
    verdict = dict.fromkeys((a for a, _ in ASPECTS), "")
    problems = []  # (when it happened: the first error in time is the root cause, words)
    for r in ranks:
        when = r.get("failed_at", math.inf)
        if r["status"] == "raised" and r["error_type"] == "NotImplementedError":
            problems.append((-math.inf, "not written yet (it still raises NotImplementedError)"))
        elif r["status"] == "raised":
            where = f" at {r['where']}" if r.get("where") else ""
            problems.append((when, f"rank {r['rank']} raised {r['error_type']}: "
                                   f"{r['error_message']}{where}"))
        elif r["status"] == "died":
            problems.append((when, f"rank {r['rank']} {r['detail']} before returning"))
        elif r["status"] == "hung":
            where = f" (it was at {r['where']})" if r.get("where") else ""
            problems.append((math.inf,
                f"rank {r['rank']} did not finish within {r['timeout']:g} s{where}" +
                (" after the other rank failed: it was waiting for it" if r["after_failure"]
                 else ": it hangs - waiting in a collective another rank never reached "
                      "(or looping)?")))
        elif "params" not in r:
            problems.append((math.inf, f"rank {r['rank']} returned a {r.get('returned_type')}: "
                                       "return the trained model (an nn.Module; ddp.module is "
                                       "the one to return)"))
    if problems:
        problems = [words for _, words in sorted(problems, key=lambda p: p[0])]
        first = problems[0] if problems[0].startswith("not written") else (
            problems[0] + "".join(f"; then {words}" for words in problems[1:]))
        verdict["runs"] = first
        for aspect, _ in ASPECTS[1:]:
            verdict[aspect] = "not checked: the run did not finish"
        return verdict
    reference = data["reference"]
    ref_epochs = _epochs(reference["batches"], epochs)
    seen = [_epochs(r["batches"], epochs) for r in ranks]
    if any(s is None for s in seen):
        counts = [sum(map(len, r["batches"])) for r in ranks]
        verdict["split"] = (f"the ranks read {counts} samples in {epochs} epochs, not the same "
                            "number each epoch: iterate over the DataLoader once per epoch")
    else:
        first = [set(s[0]) for s in seen]
        if same_samples([s[0] for s in seen]):
            verdict["split"] = SAME_SAMPLES
        elif first[0] & first[1] or first[0] | first[1] != set(ref_epochs[0]):
            verdict["split"] = (f"the ranks' samples overlap or miss some (rank 0: "
                                f"{len(first[0])}, rank 1: {len(first[1])}, of {size}): give "
                                "each rank its share with a DistributedSampler")
        if epochs > 1 and same_order_every_epoch(seen[0]):
            verdict["reshuffle"] = SAME_ORDER
    sizes = sorted({len(b) for r in ranks for b in r["batches"]})
    if sizes != [global_batch // n]:
        verdict["batch"] = (f"each rank's batches held {sizes} samples; a global batch of "
                            f"{global_batch} on {n} ranks is {global_batch // n} per rank: "
                            "batch_size=global_batch // world_size")
    needed = min_exchange_bytes(setting)
    if ranks[0]["params"] != ranks[1]["params"]:
        verdict["sync"] = ("rank 0 and rank 1 ended with different parameters: the gradients "
                           "were not averaged - wrap the model in DistributedDataParallel and "
                           "call the wrapped model in the forward pass")
    elif data["loopback_bytes"] < needed:  # counted by the kernel, outside every rank
        verdict["sync"] = (f"the ranks sent {data['loopback_bytes']} bytes to each other in "
                           f"all, less than averaging the gradients needs ({needed}: a ring "
                           "all-reduce of 2 ranks sends twice the gradients' bytes per step): "
                           "wrap the model in DistributedDataParallel")
    diff = max(abs(a - b) for a, b in zip(ranks[0]["params"], reference["params"], strict=True))
    if not diff <= ATOL:
        verdict["params"] = (f"rank 0's parameters differ from the one-process run by up to "
                             f"{diff:.3g}" + ("" if any(verdict.values()) else
                                              ": the data is right, so look at the loss (the "
                                              "mean, as in train_dp) and the optimizer"))
    writers = [r["rank"] for r in ranks if r["saves"]]
    if len(writers) != 1:
        verdict["checkpoint"] = ("no rank saved the checkpoint" if not writers else
                                 f"the checkpoint was written by ranks {writers}: save on rank "
                                 "0 only (if dist.get_rank() == 0), then dist.barrier()")
    elif verdict["sync"]:  # who saved is the ranks' own word: it counts once they agree
        verdict["checkpoint"] = ("not credited while the ranks end with different models: "
                                 "one rank's checkpoint then holds only its own (see sync)")
    left = [r["rank"] for r in ranks if r["left_initialized"]]
    if left:
        verdict["cleanup"] = (f"rank(s) {left} left the process group initialized: call "
                              "dist.destroy_process_group() (in a finally, so errors leave too)")
    return verdict


def min_exchange_bytes(setting) -> int:
    """The fewest bytes 2 ranks that average their gradients every step send each other in
    all: a ring all-reduce sends 2 (n - 1) / n P per rank, so 2 P for n = 2, per step."""
    size, epochs, global_batch, _ = setting
    steps = epochs * math.ceil(size / global_batch)
    return steps * 2 * sum(4 * p.numel() for p in make_model().parameters())


def _name(fn) -> str:
    return student_function_name(fn, ("train_ddp",), "check(train_ddp)")


def check(fn, *, timeout: float = DEFAULT_TIMEOUT) -> Report:
    """Run your ``train_ddp`` once on 2 gloo ranks; one row per thing a migration needs."""
    name = _name(fn)
    setting = SETTINGS[CHECK_SETTING]
    data = run(fn, setting, timeout)
    verdict = judge(data, setting)
    report = Report(f"check({name}): 2 gloo ranks, {CHECK_SETTING}", "check")
    report.protections = data["protections"]  # what confined the ranks (not in the table)
    for aspect, expected in ASPECTS:
        reason = verdict[aspect]
        report.results.append(TestResult(name, aspect, aspect, expected,
                                         "yes" if not reason else "no", not reason, reason))
    return report


def submit(fn=None, *, timeout: float = DEFAULT_TIMEOUT) -> Report:
    """Run ``train_ddp`` (or the one defined where you call this) in both settings; a score."""
    if fn is None:
        fn = sys._getframe(1).f_globals.get("train_ddp")
        if not callable(fn):
            raise ValueError("define train_ddp first, then run submit(train_ddp)")
    _name(fn)
    return settings_report(fn, timeout)


def settings_report(fn, timeout: float = DEFAULT_TIMEOUT) -> Report:
    """Run ``fn`` as ``train_ddp`` in both settings; a :class:`Report`. ``submit`` calls this
    for the notebook's function, ``dpcost.grading.grade`` for the one the notebook's file
    defines (run from its cells in each rank)."""
    name = "train_ddp"
    report = Report(f"submit: {name} on 2 gloo ranks, {len(SETTINGS)} settings", "submit")
    for label, setting in SETTINGS.items():
        data = run(fn, setting, timeout)
        report.protections = data["protections"]  # what confined the ranks (not in the table)
        verdict = judge(data, setting)
        for aspect, expected in ASPECTS:
            reason = verdict[aspect]
            report.results.append(TestResult(name, f"{label}: {aspect}", label, expected,
                                             "yes" if not reason else "no", not reason, reason))
    return report


# ----------------------------------------------------------------------------------------------
# Hints, one at a time: this exercise's entry of dpcost.exercises.hints.HINTS, the one source.

HINTS = _hints.HINTS["train_ddp"]


def hint(k: int) -> None:
    """Print hint ``k`` (1-based) of this exercise."""
    _hints.hint("train_ddp", k)


def hint_button():
    """An ipywidgets box: a button that reveals the next hint at each click (and the static
    hints beside it, see ``dpcost.exercises.hints.hint_button``)."""
    return _hints.hint_button("train_ddp")
