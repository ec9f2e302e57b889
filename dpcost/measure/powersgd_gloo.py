"""Why PowerSGD runs in one bucket on gloo: its callbacks wait on gloo's worker threads.

``powerSGD_hook`` (torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py) all-reduces
three tensors per bucket: the uncompressed ones (U, the biases here), then P, then Q. It issues
U from DDP's thread, and P and Q from inside the future callbacks of the one before, each
callback ending in ``dist.all_reduce(...).get_future().wait()``.

On gloo a collective's future is completed by the worker thread that ran it
(``ProcessGroupGloo.cpp``: ``runLoop`` -> ``AsyncWork::execute`` -> ``finishWorkGloo`` ->
``markCompleted``, which runs the callbacks), and a process group has
``ProcessGroupGloo::Options::threads`` workers, 2 by default. Two things follow:

- **Deadlock.** A callback that waits holds its worker. Each bucket in flight can hold one; when
  every worker waits, none is left to run the all-reduces they wait for. One worker hangs with
  one bucket; gloo's two hang with DDP's default buckets (2 for this 4 MB model).
- **Order.** Gloo pairs collectives across ranks by a tag, the count of calls made on the group
  so far (``nextTag``: ``collectiveCounter_++``), and ``ProcessGroupGloo.hpp`` requires every
  rank to call in the same order. With several buckets, P comes from a worker thread while
  DDP's thread issues the next bucket's U, so the order depends on timing. U, P and Q all hold
  ``layers x width`` elements here, so gloo sums mismatched tensors without an error and the
  replicas drift apart.

One bucket avoids both: its three calls are chained, and DDP waits for the bucket before the
next step issues anything. On NCCL the future completes as soon as the kernels are enqueued
(``ProcessGroupNCCL.cpp``: ``collective``), so the callbacks run at once on the calling thread,
in bucket order; that is not measured here (no GPU).

:func:`probe` runs one case on 2 gloo ranks, each its own process in its own session, and kills both
whatever happens. The ranks are forked from the launcher's warm process (``launch.warm_context``),
which imported torch once, so a probe does not pay that per rank. A rank logs every all-reduce it
issues (role, bucket, elements) as it issues it. When the ranks stop issuing calls for ``stall_s``
seconds the case is "hung": each rank dumps its threads' Python stacks (``faulthandler``, SIGUSR1)
before it is killed, and the result names the hook functions its threads wait in. ``straggler_s``
delays rank 1 before each compressed bucket, as a slow rank would, so that the interleaving, and the
outcome, are the same on every run.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from dpcost.measure.launch import warm_context
from dpcost.measure.strategy_scenarios import POWERSGD_BUCKET_CAP_MB
from dpcost.procs import child_env, die_with_parent, free_port, kill_tree

WIDTH, DEPTH = 500, 4  # scenarios.build_model: 4 x Linear(500), P = 4,008,000 B (fp32)
WORLD_SIZE = 2
START_ITER = 2  # PowerSGDState's start_powerSGD_iter: plain all-reduce before it
COMPRESSED_STEPS = 2
STALL_S = 3.0  # no new call for this long once both ranks train: hung (a step: ~0.1 s)
STRAGGLER_S = 0.2
ONE_BUCKET_MB = POWERSGD_BUCKET_CAP_MB  # one bucket, as the strategies ladder's PowerSGD rung
ROLES = {"_allreduce_fut": "plain", "powerSGD_hook": "U",
         "unpack_uncompressed_tensors_and_allreduce_ps": "P", "compute_qs": "Q"}
HOOK_WAITS = ("unpack_uncompressed_tensors_and_allreduce_ps", "compute_qs")
# The cases lesson 08 shows: None means DDP's default caps (1 MiB first bucket, then 25 MiB).
LESSON_CASES = (
    {"bucket_cap_mb": ONE_BUCKET_MB, "gloo_threads": 2, "straggler_s": STRAGGLER_S},
    {"bucket_cap_mb": None, "gloo_threads": 2, "straggler_s": STRAGGLER_S},
    {"bucket_cap_mb": None, "gloo_threads": 8, "straggler_s": STRAGGLER_S},
)
# One worker hangs even one bucket: rank 0's U completes on its only worker, whose callback
# then waits for P there. Rank 1, the straggler, may find its U already complete and run that
# callback on DDP's thread instead (see _waiting_in_hook); either way rank 0's P never runs.
ONE_WORKER_CASE = {"bucket_cap_mb": ONE_BUCKET_MB, "gloo_threads": 1, "straggler_s": STRAGGLER_S}


class ProbeError(RuntimeError):
    """A rank failed for a reason other than the hang the probe looks for."""


def check_case(bucket_cap_mb=None, gloo_threads=2, straggler_s=0.0) -> dict:
    """The case as a plain dict, or ValueError naming the bad parameter."""
    if bucket_cap_mb is not None:
        if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) \
                or not math.isfinite(bucket_cap_mb) or bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb must be None (DDP's default) or a finite number "
                             f"of MiB > 0, got {bucket_cap_mb!r}")
    if isinstance(gloo_threads, bool) or not isinstance(gloo_threads, int) \
            or not 1 <= gloo_threads <= 64:
        raise ValueError(f"gloo_threads must be an int from 1 to 64, got {gloo_threads!r}")
    if isinstance(straggler_s, bool) or not isinstance(straggler_s, (int, float)) \
            or not 0 <= straggler_s <= 5:
        raise ValueError(f"straggler_s must be a number of seconds from 0 to 5, "
                         f"got {straggler_s!r}")
    return {"bucket_cap_mb": bucket_cap_mb, "gloo_threads": gloo_threads,
            "straggler_s": float(straggler_s)}


def predicted_buckets(bucket_cap_mb=None) -> int:
    """Buckets DDP rebuilds for the probe's model (``dpcost.buckets.bucket_assignment``)."""
    from dpcost.buckets import bucket_assignment, ddp_bucket_caps
    from dpcost.measure.strategy_scenarios import ready_order_bytes

    shapes = [(WIDTH, WIDTH), (WIDTH,)] * DEPTH
    return len(bucket_assignment(ready_order_bytes(shapes), ddp_bucket_caps(bucket_cap_mb)))


# -- the rank ------------------------------------------------------------------------------
def _gloo_group(store, rank, threads):
    """A gloo process group with ``threads`` workers. ``init_process_group`` and ``new_group``
    pass gloo only a timeout (distributed_c10d.py: ``_new_process_group_helper``), so the
    group is built from ``ProcessGroupGloo._Options`` as that helper builds it."""
    import torch
    import torch.distributed as dist

    options = dist.ProcessGroupGloo._Options()
    options._threads = threads
    options._timeout = timedelta(seconds=120)
    options._devices = [dist.ProcessGroupGloo.create_default_device()]
    prefix = dist.PrefixStore(f"powersgd-gloo-{threads}/", store)
    backend = dist.ProcessGroupGloo(prefix, rank, WORLD_SIZE, options)
    group = dist.ProcessGroup(prefix, rank, WORLD_SIZE)
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
    return group


def _calls_logger(dist, log):
    """Wrap ``dist.all_reduce`` (the hook calls it by attribute): log each call as issued."""
    import threading

    real, lock = dist.all_reduce, threading.Lock()

    def all_reduce(tensor, *args, **kwargs):
        frame = sys._getframe(1)
        role = ROLES.get(frame.f_code.co_name, frame.f_code.co_name)
        if role == "plain":
            frame = frame.f_back  # powerSGD_hook, which holds the bucket
        bucket = frame.f_locals.get("bucket_index")
        if bucket is None and "bucket" in frame.f_locals:  # before the hook names it
            bucket = frame.f_locals["bucket"].index()
        with lock:  # the log's order is the order of the calls, hence of gloo's tags
            log.write(json.dumps(["call", role, bucket, tensor.numel()]) + "\n")
            return real(tensor, *args, **kwargs)

    dist.all_reduce = all_reduce


def rank_main(rank: int, port: int, case: dict, out: Path) -> None:
    """One rank: DDP + powerSGD_hook on a gloo group with the case's worker threads."""
    import faulthandler

    die_with_parent()
    stacks = open(out / f"stacks{rank}.txt", "w")
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    import torch
    import torch._dynamo  # noqa: F401 - before init_process_group (worker.run_rank says why)
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    from dpcost.measure.scenarios import _batch, build_model

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, WORLD_SIZE, rank == 0,
                          timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD_SIZE)
    group = _gloo_group(store, rank, case["gloo_threads"])
    model = build_model(WIDTH, DEPTH)
    caps = {} if case["bucket_cap_mb"] is None else {"bucket_cap_mb": case["bucket_cap_mb"]}
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group, **caps)
    state = powerSGD_hook.PowerSGDState(process_group=group, matrix_approximation_rank=1,
                                        start_powerSGD_iter=START_ITER)

    def straggling_hook(state, bucket):
        if rank == 1 and state.iter >= START_ITER:
            time.sleep(case["straggler_s"])  # a slow rank: the same interleaving every run
        return powerSGD_hook.powerSGD_hook(state, bucket)

    ddp.register_comm_hook(state, straggling_hook)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    log = open(out / f"calls{rank}.jsonl", "w", buffering=1)  # one line per call, at once
    _calls_logger(dist, log)
    for step in range(START_ITER + COMPRESSED_STEPS):
        ddp(_batch(WIDTH, rank, step)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if step == 1:  # DDP rebuilt its buckets in the second forward (reducer.cpp)
            buckets = len(ddp.reducer._get_zeros_like_grad_buckets())
            log.write(json.dumps(["ready", buckets]) + "\n")
        log.write(json.dumps(["step", step]) + "\n")
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(WORLD_SIZE)]
    dist.all_gather(everyone, flat)  # the default group: its order is never in doubt
    log.write(json.dumps(["done", (everyone[0] - everyone[1]).abs().max().item()]) + "\n")
    log.close()
    # Leave without interpreter finalization: the extra group is not c10d's to destroy, and a
    # gloo thread alive at Py_FinalizeEx can abort the process (see worker.run_rank).
    os._exit(0)


# -- the parent ----------------------------------------------------------------------------
def _read_log(path: Path) -> list:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.endswith("]")]  # skip a torn last line


def _waiting_in_hook(stacks: str) -> list:
    """Per gloo worker thread of a faulthandler dump: the hook function its newest frame is in.

    A worker runs the hook's callbacks from C++, so its stack holds no ``rank_main`` frame;
    DDP's own thread does. DDP's thread can wait in the hook too: a callback attached to a
    future that is already complete runs at once on the thread that attaches it
    (``ivalue::Future::addCallback`` in ATen/core/ivalue_inl.h), and that wait holds no worker.
    """
    waiting = []
    blocks = re.split(r"^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$",
                      stacks, flags=re.MULTILINE)[1:]
    for block in blocks:
        frames = [line.strip() for line in block.splitlines() if line.strip()]
        if not frames or any(frame.endswith(" in rank_main") for frame in frames):
            continue
        if "powerSGD_hook.py" in frames[0]:
            name = frames[0].rsplit(" in ", 1)[-1]
            if name in HOOK_WAITS:
                waiting.append(name)
    return waiting


def probe(bucket_cap_mb=None, gloo_threads=2, straggler_s=0.0, stall_s=STALL_S,
          timeout_s=120.0) -> dict:
    """Run one case on 2 gloo ranks; what happened, as plain values.

    Returns {"case", "buckets" (as DDP rebuilt them), "outcome": "ran" or "hung", "calls":
    each rank's all-reduces in the order issued, [role, bucket, elements], "out_of_order": the
    first index where the ranks' calls differ (None if they never do), "mismatched": how many
    of the calls both ranks made differ, "replica_max_diff": max |rank 0 parameter - rank 1
    parameter| after the last step (None if hung), "waiting": per rank, the hook functions
    its threads wait in when hung, "steps": steps each rank finished, "wall_s"}.
    Raises ProbeError if a rank fails otherwise or nothing happens within ``timeout_s``.
    """
    case = check_case(bucket_cap_mb, gloo_threads, straggler_s)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dpcost-powersgd-") as tmp:
        out, port = Path(tmp), free_port()
        ranks = [(rank_main, (rank, port, case, out)) for rank in range(WORLD_SIZE)]
        outcome = run_ranks(ranks, out, stall_s, timeout_s)
        logs = [_read_log(out / f"calls{rank}.jsonl") for rank in range(WORLD_SIZE)]
        waiting = ([_waiting_in_hook((out / f"stacks{r}.txt").read_text())
                    for r in range(WORLD_SIZE)] if outcome == "hung" else [[], []])
    calls = [[entry[1:] for entry in log if entry[0] == "call"] for log in logs]
    pairs = list(zip(*calls, strict=False))  # a hung rank may have made fewer calls
    differ = [i for i, (a, b) in enumerate(pairs) if a != b]
    ready = [entry[1] for entry in logs[0] if entry[0] == "ready"]
    done = [entry[1] for entry in logs[0] if entry[0] == "done"]
    return {"case": case, "buckets": ready[0] if ready else None, "outcome": outcome,
            "calls": calls, "out_of_order": differ[0] if differ else None,
            "mismatched": len(differ), "replica_max_diff": done[0] if done else None,
            "waiting": waiting,
            "steps": [sum(entry[0] == "step" for entry in log) for log in logs],
            "wall_s": time.monotonic() - start}


class _WarmProcess:
    """A process forked from the warm process, with the parts of Popen that run_ranks uses."""

    def __init__(self, process):
        self.process, self.pid = process, process.pid

    def poll(self):
        return self.process.exitcode

    @property
    def returncode(self):
        return self.process.exitcode

    def wait(self):
        self.process.join()


def _start_warm_rank(target, args, output: Path, env: dict) -> _WarmProcess:
    process = warm_context().Process(target=_warm_rank_main, daemon=True,
                                     args=(target, args, str(output), env))
    process.start()
    return _WarmProcess(process)


def _warm_rank_main(target, args, output: str, env: dict):
    """In the warm process's child: the session, output and environment that Popen gave."""
    os.setsid()
    die_with_parent()
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    target(*args)


def run_ranks(ranks, out: Path, stall_s=STALL_S, timeout_s=120.0) -> str:
    """Start one process per rank (rank r writes ``out``/calls{r}.jsonl); "ran" or "hung".

    A rank is ``(function, args)``, forked from the warm process, or a command (a list of
    str), run as a subprocess. Each process runs in a session of its own and is killed with its
    group at the end, whatever happens. Raises ProbeError, with the tail of every rank's output,
    when a rank exits non-zero or the ranks have not finished within ``timeout_s``.
    """
    env = child_env()
    started = []
    try:
        for rank, spec in enumerate(ranks):
            path = out / f"output{rank}.txt"
            if isinstance(spec, tuple):
                started.append(_start_warm_rank(*spec, path, env))
                continue
            with open(path, "w") as output:
                started.append(subprocess.Popen(spec, stdout=output, stderr=subprocess.STDOUT,
                                                start_new_session=True, env=env,
                                                preexec_fn=die_with_parent))
        outcome = _watch(started, out, stall_s, timeout_s)
    finally:
        for process in started:  # its session, group and anything under it
            kill_tree(process.process if isinstance(process, _WarmProcess) else process)
    if outcome == "exited" and any(p.returncode != 0 for p in started):
        outputs = [out / f"output{r}.txt" for r in range(len(started))]
        tails = "\n".join(f"--- rank {r}, exit {p.returncode}:\n"
                          + (path.read_text()[-2000:] if path.exists() else "(no output)")
                          for r, (p, path) in enumerate(zip(started, outputs, strict=True)))
        raise ProbeError(f"a rank failed (exit statuses {[p.returncode for p in started]}):\n"
                         + tails)
    return "ran" if outcome == "exited" else outcome


def _watch(ranks, out, stall_s, timeout_s) -> str:
    """Wait until every rank exits, or one fails ("exited"), or, once all train, they stop
    issuing calls for ``stall_s`` ("hung": each rank dumps its threads' stacks first)."""
    sizes, start = None, time.monotonic()
    moved = start
    logs = [out / f"calls{rank}.jsonl" for rank in range(len(ranks))]
    while True:
        now = time.monotonic()
        codes = [p.poll() for p in ranks]
        if None not in codes or any(code not in (None, 0) for code in codes):
            return "exited"
        current = [path.stat().st_size if path.exists() else 0 for path in logs]
        trained = all(any(e[0] == "ready" for e in _read_log(path)) for path in logs)
        if current != sizes:
            sizes, moved = current, now
        elif trained and now - moved > stall_s:
            for process in ranks:
                try:
                    os.kill(process.pid, signal.SIGUSR1)  # faulthandler: dump every thread
                except ProcessLookupError:  # it left a moment ago (the forkserver reaped it)
                    pass
            _wait_for_dumps([out / f"stacks{rank}.txt" for rank in range(len(ranks))])
            return "hung"
        if now - start > timeout_s:
            raise ProbeError(f"the ranks did not finish within {timeout_s:g} s (and did not "
                             f"stall once training)")
        time.sleep(0.05)


def _wait_for_dumps(paths, timeout_s=10.0, settle_s=0.3):
    """Until every dump has begun and no file has grown for ``settle_s`` (a rank that the
    scheduler stops mid-dump finishes it later), or ``timeout_s``."""
    deadline, sizes, still_since = time.monotonic() + timeout_s, None, time.monotonic()
    while time.monotonic() < deadline:
        current = [path.stat().st_size if path.exists() else 0 for path in paths]
        if current != sizes:
            sizes, still_since = current, time.monotonic()
        elif all(current) and time.monotonic() - still_since >= settle_s:
            return
        time.sleep(0.05)


def describe(result: dict) -> dict:
    """One table row in words, for the lesson and ``python -m dpcost.measure.powersgd_gloo``."""
    case = result["case"]
    cap = "default" if case["bucket_cap_mb"] is None else f"{case['bucket_cap_mb']:g} MiB"
    if result["out_of_order"] is None:
        order = "same on both ranks"
    else:
        i = result["out_of_order"]
        a, b = (result["calls"][r][i] for r in range(WORLD_SIZE))
        order = f"differs from call {i + 1}: {a[0]}{a[1]} vs {b[0]}{b[1]}"
    if result["outcome"] == "hung":
        full = [r for r, w in enumerate(result["waiting"]) if len(w) == case["gloo_threads"]]
        threads = case["gloo_threads"]
        outcome = (f"hung: all {threads} of rank {full[0]}'s workers wait in the hook" if full
                   else f"hung: workers waiting in the hook per rank: "
                        f"{[len(w) for w in result['waiting']]}")
    else:
        diff = result["replica_max_diff"]
        outcome = "ran, replicas identical" if diff == 0 else "ran, replicas differ"
    return {"bucket_cap_mb": cap, "buckets": result["buckets"],
            "gloo_threads": case["gloo_threads"], "order": order, "outcome": outcome}


def format_table(results) -> str:
    rows = [describe(r) for r in results]
    lines = [f"{'bucket_cap_mb':<14}{'buckets':>8}{'gloo threads':>13}  {'call order':<32}outcome"]
    lines += [f"{r['bucket_cap_mb']:<14}{r['buckets']:>8}{r['gloo_threads']:>13}  "
              f"{r['order']:<32}{r['outcome']}" for r in rows]
    return "\n".join(lines)


def default_gloo_threads(timeout_s: float = 60.0) -> tuple[int, int]:
    """(gloo's ``Options._threads`` for a default process group, the ``pt_gloo_runloop``
    threads it started), read in a fresh process forked from the warm process: one rank, a
    default group, destroyed again."""
    context = warm_context()
    reader, writer = context.Pipe(duplex=False)
    process = context.Process(target=_default_gloo_threads_main, args=(writer, free_port()),
                              daemon=True)
    process.start()
    writer.close()
    try:
        if not reader.poll(timeout_s):
            raise ProbeError(f"no answer within {timeout_s:g} s (exit {process.exitcode})")
        return reader.recv()
    finally:
        reader.close()
        kill_tree(process)


def _default_gloo_threads_main(writer, port):
    import torch
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, 1, True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    for _ in range(100):  # a new thread names itself a moment after it starts
        workers = sum(Path(f"/proc/self/task/{t}/comm").read_text().strip() == "pt_gloo_runloop"
                      for t in os.listdir("/proc/self/task"))
        if workers >= 2:
            break
        time.sleep(0.02)
    writer.send((dist.group.WORLD._get_backend(torch.device("cpu")).options._threads, workers))
    dist.destroy_process_group()


def main(argv) -> int:
    cases = list(LESSON_CASES) + [ONE_WORKER_CASE]
    if argv[:1] == ["--json"]:
        results = [probe(**case) for case in cases]
        print(json.dumps(results))
        return 0
    if argv:
        print("usage: python -m dpcost.measure.powersgd_gloo [--json]", file=sys.stderr)
        return 2
    print(format_table([probe(**case) for case in cases]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
