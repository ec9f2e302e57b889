"""Start the ranks on this machine, watch them, and end the run cleanly whatever happens.

``launch(config)`` starts one helper process with multiprocessing's ``spawn`` (a fresh
interpreter, so it works from a notebook and repeatedly in one session). The helper imports
torch and ``torch._dynamo`` (which DDP's constructor imports) once, then forks the
``config.world_size`` ranks: on 2 cores that saves several seconds per rank against importing
torch in every rank. Ranks die with the helper (``PR_SET_PDEATHSIG``), and the helper kills them
when it is told to stop, so no process outlives ``launch``.

Each rank posts its position (scenario, iteration, phase) to a shared array. ``launch`` raises
``MeasureError`` naming the rank and the cause when

- a rank raises (the earliest failure is named; peers that fail because it left are not),
- a rank dies without a word (its exit status or signal is named),
- once all ranks have joined, no rank moves for ``timeout_s`` seconds (the rank furthest behind
  is named as hung; the others are waiting for it in a collective),
- the ranks have not all joined the process group within ``startup_timeout_s``.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import queue
import signal
import socket
import sys
import time

from dpcost.measure import worker

GRACE_S = 1.0  # time to let the peers of a failed rank report, so that the first cause wins
PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


class MeasureError(RuntimeError):
    """A measurement run failed; the message names the rank and the cause."""

    def __init__(self, message, rank=None, details=""):
        super().__init__(message)
        self.rank, self.details = rank, details


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1 (the kernel picks it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _die_with_parent():
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def fork_ranks(config, port, progress, messages):
    """The helper process: import torch once, fork the ranks, report how each one ended."""
    _die_with_parent()
    import torch  # noqa: F401 - imported here so that every forked rank has it already
    import torch._dynamo  # noqa: F401 - DDP's constructor imports it: pay once, not per rank

    ranks = {}
    for rank in range(config.world_size):
        pid = os.fork()
        if pid == 0:  # the rank
            _die_with_parent()
            status = worker.local_rank_main(rank, config, port, progress, messages)
            messages.close()
            messages.join_thread()  # flush the result before leaving
            os._exit(status)
        ranks[pid] = rank

    def stop(signum, frame):
        for pid in list(ranks):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # reaped a moment ago
                pass
        os._exit(1)

    signal.signal(signal.SIGTERM, stop)
    while ranks:
        pid, status = os.wait()
        rank, code = ranks.pop(pid), os.waitstatus_to_exitcode(status)
        if code != 0:
            messages.put(("exit", rank, code))


def _exit_cause(code) -> str:
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"exited with status {code} without reporting"


def _first_failure(errors, dead):
    if errors:
        _, rank, _, cause, details = min(errors, key=lambda error: error[2])
        others = sorted({e[1] for e in errors} - {rank})
        after = f" (then rank(s) {', '.join(map(str, others))} failed as a consequence)" \
            if others else ""
        return MeasureError(f"rank {rank} failed: {cause}{after}", rank, details)
    rank, code = dead[0]
    return MeasureError(f"rank {rank} died: {_exit_cause(code)}", rank)


def _hang(positions, config, still_s):
    lowest = min(positions)
    behind = [r for r, p in enumerate(positions) if p == lowest]
    where = worker.describe_progress(lowest, config.scenarios)
    if len(behind) == len(positions):
        return MeasureError(f"ranks {', '.join(map(str, behind))} hung: none moved for "
                            f"{still_s:.0f} s, all at {where}")
    waiting = [f"rank {r} at {worker.describe_progress(p, config.scenarios)}"
               for r, p in enumerate(positions) if p != lowest]
    names = ", ".join(map(str, behind))
    return MeasureError(f"rank {names} hung: no progress for {still_s:.0f} s at {where}; "
                        f"waiting for it: {'; '.join(waiting)}", behind[0])


def launch(config: worker.RunConfig, timeout_s: float = 60.0,
           startup_timeout_s: float = 180.0) -> dict:
    """Run ``config`` on ``config.world_size`` local ranks.

    Returns {"ranks": each rank's results, by rank; "startup_s": seconds until every rank had
    joined the process group; "wall_s": seconds until the last result came}. Raises
    MeasureError (see the module docstring); leaves no process behind either way.
    """
    context = multiprocessing.get_context("spawn")
    progress = context.Array("q", config.world_size, lock=False)
    messages = context.Queue()
    port = free_port()
    # Large tensors get their own mmap, so freeing one returns it to the kernel and the
    # peak-RSS reading follows the live tensors (glibc reads this when the helper starts).
    saved = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    helper = context.Process(target=fork_ranks, name="dpcost-measure-ranks", daemon=True,
                             args=(config, port, progress, messages))
    try:
        helper.start()
    finally:
        if saved is None:
            del os.environ["MALLOC_MMAP_THRESHOLD_"]
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = saved
    try:
        run = _watch(helper, progress, messages, config, timeout_s, startup_timeout_s)
        helper.join(10)  # every rank has reported and is leaving: let the helper reap them
        return run
    finally:
        if helper.is_alive():
            helper.terminate()  # its SIGTERM handler kills the ranks
        helper.join(5)
        if helper.is_alive():
            helper.kill()  # the ranks follow it (PR_SET_PDEATHSIG)
            helper.join()
        messages.close()
        messages.cancel_join_thread()


def _watch(helper, progress, messages, config, timeout_s, startup_timeout_s):
    n = config.world_size
    results, errors, dead = {}, [], []
    started = moved = time.monotonic()
    positions = list(progress)
    failed_at = ready_at = None
    while len(results) < n:
        try:
            message = messages.get(timeout=0.1)
        except queue.Empty:
            message = None
        if message and message[0] == "result":
            results[message[1]] = message[2]
        elif message and message[0] == "error":
            errors.append(message)
        elif message:  # ("exit", rank, status): a rank ended badly
            dead.append(message[1:])
        now = time.monotonic()
        if helper.exitcode is not None and len(results) < n and not (errors or dead):
            dead.append((None, helper.exitcode))  # the helper itself is gone
        reported = {e[1] for e in errors}
        dead = [(rank, code) for rank, code in dead if rank not in reported]
        if (errors or dead) and failed_at is None:
            failed_at = now
        if failed_at is not None and (now - failed_at > GRACE_S or len(errors) == n):
            if dead and dead[0][0] is None and not errors:
                raise MeasureError(f"the process that starts the ranks ended: "
                                   f"{_exit_cause(dead[0][1])}")
            raise _first_failure(errors, dead)
        if list(progress) != positions:
            positions, moved = list(progress), now
        all_ready = min(positions) >= worker.PROGRESS_READY
        if all_ready and ready_at is None:
            ready_at = now
        if not all_ready and now - started > startup_timeout_s:
            late = [r for r, p in enumerate(positions) if p < worker.PROGRESS_READY]
            raise MeasureError(f"rank {', '.join(map(str, late))} did not join the process group "
                               f"within {startup_timeout_s:.0f} s", late[0])
        if all_ready and failed_at is None and now - moved > timeout_s:
            raise _hang(positions, config, now - moved)
    end = time.monotonic()
    return {"ranks": [results[rank] for rank in range(n)],
            "startup_s": (ready_at or end) - started, "wall_s": end - started}
