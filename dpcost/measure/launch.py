"""Start the ranks on this machine, watch them, and end the run cleanly whatever happens.

``launch(config)`` starts one helper process, which forks the ``config.world_size`` ranks. The
helper comes from multiprocessing's ``forkserver``: a warm process, started once per calling
process, that imported torch and ``torch._dynamo`` (which DDP's constructor imports) before forking
anything (``warm.py``). Importing them is slow, so a session (a notebook, a test run) pays it
once instead of once per run; the ranks, forked from the helper, never pay it. The warm
process ignores SIGINT and SIGTERM and leaves when its caller exits (at exit, the caller waits for
it). Ranks die with the helper (``PR_SET_PDEATHSIG``), the helper dies with the warm process, and
the helper kills the ranks when it is told to stop, so no rank or helper outlives ``launch``.

Each rank posts its position (scenario, iteration, phase) to a shared array. ``launch`` raises
``MeasureError`` naming the rank and the cause when

- a rank raises (the earliest failure is named; peers that fail because it left are not),
- a rank dies without a word (its exit status or signal is named; its peers' errors, such as
  "Connection reset by peer", are consequences and are not taken for the cause),
- a rank posts its result but then exits non-zero or dies by a signal,
- once all ranks have joined, no rank moves for ``timeout_s`` seconds while they train (the
  rank furthest behind is named as hung; the others are waiting for it in a collective);
  building a scenario's model is set-up, bounded by ``startup_timeout_s`` instead,
- the ranks have not all joined the process group within ``startup_timeout_s``.

SIGINT (Ctrl-C; the helper and the ranks ignore it) and SIGTERM (where the caller's handler
raises ``Terminated``, as the CLI's does) end every rank and raise ``Interrupted``.
"""

from __future__ import annotations

import atexit
import ctypes
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time

from dpcost.measure import worker
from dpcost.procs import die_with_parent, exit_cause, free_port, kill_tree

# Imported once in the warm process (forkserver); every helper and rank is forked from it.
WARM_MODULE = "dpcost.measure.warm"
GRACE_S = 2.0  # time to let the peers of a failed rank report, so that the first cause wins
EXIT_TIMEOUT_S = 30.0  # a rank that posted its result must have exited within this time
M_MMAP_THRESHOLD = -3  # from <malloc.h>


class MeasureError(RuntimeError):
    """A measurement run failed; the message names the rank and the cause."""

    def __init__(self, message, rank=None, details=""):
        super().__init__(message)
        self.rank, self.details = rank, details


class Terminated(BaseException):
    """Raised in the main thread by a SIGTERM handler (the CLI installs one), like Ctrl-C's
    KeyboardInterrupt, so that ``launch`` ends the ranks and says what it was doing."""

    def __init__(self, signum=signal.SIGTERM):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Interrupted(MeasureError):
    """The run was interrupted (SIGINT or SIGTERM); every rank has been ended.

    ``exit_status`` is the shell's convention, 128 + the signal's number: 130 and 143.
    """

    def __init__(self, signum, message):
        super().__init__(message)
        self.signum, self.exit_status = signum, 128 + signum


def warm_context():
    """multiprocessing's forkserver context, its server started with torch imported.

    The server is started here with SIGINT and SIGTERM ignored (a signal to the whole process
    group, Ctrl-C in a terminal, must not end it under a run; it leaves when this process
    exits or closes its end of the server's pipe). Its children get SIGINT ignored too.
    A server that someone started earlier without these modules still works: each helper
    then imports torch itself.
    """
    from multiprocessing import forkserver

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([WARM_MODULE])
    main_thread = threading.current_thread() is threading.main_thread()
    saved = ({sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
             if main_thread else {})
    try:
        forkserver.ensure_running()
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    global _owner_pid
    if _owner_pid is None:  # gone before we are, not a moment after: callers count processes
        _owner_pid = os.getpid()
        atexit.register(stop_warm_process)
    return context


_owner_pid = None  # the process that started the warm process


def stop_warm_process():
    """End the warm process that this process started, and wait for it (run at exit)."""
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)  # CPython's own; its tests use it
    if stop is not None and os.getpid() == _owner_pid:  # not in a forked child
        stop()


def fork_ranks(config, port, progress, messages, environ):
    """The helper process: fork the ranks, report how each one ended.

    Forked from the warm process, it starts with that process's environment: ``environ`` is
    the caller's, as a spawned helper would have had it."""
    die_with_parent()
    # Ctrl-C reaches the whole process group; the launcher alone handles it and ends us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the warm process ignores it; we must not
    os.environ.clear()
    os.environ.update(environ)
    # Large tensors get their own mmap, so freeing one returns it to the kernel and the
    # peak-RSS reading follows the live tensors. mallopt, not MALLOC_MMAP_THRESHOLD_: glibc
    # read the environment when the warm process started.
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, 65536)
    import torch  # noqa: F401 - already imported by the warm process; a no-op there
    import torch._dynamo  # noqa: F401 - DDP's constructor imports it: before any process group

    ranks = {}
    for rank in range(config.world_size):
        pid = os.fork()
        if pid == 0:  # the rank
            die_with_parent()
            status = worker.local_rank_main(rank, config, port, progress, messages)
            messages.close()
            messages.join_thread()  # flush the result before leaving
            worker.exit_fault(config, rank)
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
        messages.put(("exit", rank, code))  # every rank's status, 0 included


def _consequences(ranks) -> str:
    return (f" (then rank(s) {', '.join(map(str, sorted(ranks)))} failed as a consequence)"
            if ranks else "")


def _first_failure(errors, silent, after_result):
    """The cause, named. A rank that died without a word (a signal, os._exit) comes first:
    its peers' errors ("Connection reset by peer") follow from it. Then the earliest error
    reported; then a rank that posted its result but exited badly."""
    if silent:
        rank, code = silent[0]
        others = {e[1] for e in errors} | {r for r, _ in silent[1:]}
        return MeasureError(f"rank {rank} died: {exit_cause(code)} without reporting"
                            f"{_consequences(others - {rank})}", rank)
    if errors:
        _, rank, _, cause, details = min(errors, key=lambda error: error[2])
        others = {e[1] for e in errors} - {rank}
        return MeasureError(f"rank {rank} failed: {cause}{_consequences(others)}", rank, details)
    rank, code = after_result[0]
    how = f"died, {exit_cause(code)}" if code < 0 else exit_cause(code)
    return MeasureError(f"rank {rank} posted its result, then {how}", rank)


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


def _interrupted(signum, positions, config):
    where = "; ".join(f"rank {r} at {worker.describe_progress(p, config.scenarios)}"
                      for r, p in enumerate(positions))
    return Interrupted(signum, f"interrupted by {signal.Signals(signum).name} while measuring "
                               f"{', '.join(config.scenarios)} on {config.world_size} ranks "
                               f"({where}); every rank was ended")


def launch(config: worker.RunConfig, timeout_s: float = 60.0,
           startup_timeout_s: float = 180.0) -> dict:
    """Run ``config`` on ``config.world_size`` local ranks.

    ``timeout_s`` bounds how long the ranks may all stand still once they train;
    ``startup_timeout_s`` bounds start-up (import, joining the process group) and each
    scenario's model set-up. Returns {"ranks": each rank's results, by rank; "startup_s":
    seconds until every rank had joined the process group; "wall_s": seconds until the last
    result came}. Raises MeasureError (see the module docstring), Interrupted on SIGINT (and on
    SIGTERM where a handler raises ``Terminated``); leaves no process behind either way.
    """
    context = warm_context()
    progress = context.Array("q", config.world_size, lock=False)
    messages = context.Queue()
    port = free_port()
    # The helper and its ranks ignore SIGINT (the warm process's children start so, and
    # fork_ranks keeps it): Ctrl-C then prints no traceback from them; the launcher ends them.
    helper = context.Process(target=fork_ranks, name="dpcost-measure-ranks", daemon=True,
                             args=(config, port, progress, messages, dict(os.environ)))
    helper.start()
    try:
        run = _watch(helper, progress, messages, config, timeout_s, startup_timeout_s)
        helper.join(10)  # every rank has exited: the helper is leaving
        return run
    finally:
        # SIGTERM first: the helper's handler kills its ranks; then SIGKILL to the helper and
        # every rank still under it (they would also follow it: PR_SET_PDEATHSIG).
        kill_tree(helper, grace_s=5)
        messages.close()
        messages.cancel_join_thread()


def _watch(helper, progress, messages, config, timeout_s, startup_timeout_s):
    positions = list(progress)
    try:
        return _watch_until_done(helper, progress, messages, config, timeout_s,
                                 startup_timeout_s, positions)
    except KeyboardInterrupt:
        raise _interrupted(signal.SIGINT, list(progress), config) from None
    except Terminated as stop:
        raise _interrupted(stop.signum, list(progress), config) from None


def _watch_until_done(helper, progress, messages, config, timeout_s, startup_timeout_s,
                      positions):
    """Read the ranks' messages until every rank has posted its result AND exited 0."""
    n = config.world_size
    results, errors, exits = {}, [], {}
    started = moved = time.monotonic()
    failed_at = ready_at = results_at = None
    while True:
        try:
            message = messages.get(timeout=0.1)
        except queue.Empty:
            message = None
        if message and message[0] == "result":
            results[message[1]] = message[2]
        elif message and message[0] == "error":
            errors.append(message)
        elif message:  # ("exit", rank, status): how a rank ended, in the order they ended
            exits[message[1]] = message[2]
        now = time.monotonic()
        if len(results) == n and results_at is None:
            results_at = now
        reported = {e[1] for e in errors}
        silent = [(r, c) for r, c in exits.items()
                  if c != 0 and r not in results and r not in reported]
        after_result = [(r, c) for r, c in exits.items() if c != 0 and r in results]
        helper_gone = helper.exitcode is not None and len(exits) < n
        if (errors or silent or after_result or helper_gone) and failed_at is None:
            failed_at = now
        everyone_ended = len(exits) == n or len(errors) == n
        if failed_at is not None and (now - failed_at > GRACE_S or everyone_ended):
            if errors or silent or after_result:
                raise _first_failure(errors, silent, after_result)
            if len(exits) < n:
                raise MeasureError(f"the process that starts the ranks ended: "
                                   f"{exit_cause(helper.exitcode)}")
            # The helper left after writing every rank's exit, which we had not all read yet
            # when we saw it gone: nothing failed.
            failed_at = None
        if len(results) == n and len(exits) == n:  # all reported and all exited 0
            break
        if len(exits) == n:  # every rank exited 0, and one never posted its result
            missing = sorted(set(range(n)) - set(results))
            raise MeasureError(f"rank {', '.join(map(str, missing))} exited 0 without posting "
                               f"its result", missing[0])
        if results_at is not None and now - results_at > EXIT_TIMEOUT_S:
            late = sorted(set(range(n)) - set(exits))
            raise MeasureError(f"rank {', '.join(map(str, late))} posted its result but did not "
                               f"exit within {EXIT_TIMEOUT_S:.0f} s", late[0])
        if list(progress) != positions:
            positions[:], moved = list(progress), now
        all_ready = min(positions) >= worker.PROGRESS_READY
        if all_ready and ready_at is None:
            ready_at = now
        if not all_ready and now - started > startup_timeout_s:
            late = [r for r, p in enumerate(positions) if p < worker.PROGRESS_READY]
            raise MeasureError(f"rank {', '.join(map(str, late))} did not join the process group "
                               f"within {startup_timeout_s:.0f} s", late[0])
        # The rank furthest behind decides which limit applies: building a model (or priming
        # DDP before the first scenario) is set-up, bounded by startup_timeout_s; after that
        # timeout_s bounds how long the training may stand still.
        limit = startup_timeout_s if worker.in_setup(min(positions)) else timeout_s
        if all_ready and failed_at is None and results_at is None and now - moved > limit:
            raise _hang(positions, config, now - moved)
    end = results_at or time.monotonic()
    return {"ranks": [results[rank] for rank in range(n)],
            "startup_s": (ready_at or end) - started, "wall_s": end - started}
