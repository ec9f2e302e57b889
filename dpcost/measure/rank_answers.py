"""A few gloo ranks forked from the warm process, each sending back one answer.

The lessons' small oracles (``bucket_order``, ``plan_buckets``, ``model_traffic``) run a function
on every rank of a fresh process group and want its return value: ``gather(run_rank, args)``
forks the ranks from ``launch.warm_context`` (torch already imported), calls
``run_rank(rank, port, *args)`` in each, and returns the answers in rank order. A rank that
raises, exits or stays silent past the deadline ends the call with ``error`` naming it; no rank
outlives the call.
"""

from __future__ import annotations

import os
import time

from dpcost.procs import die_with_parent, free_port


class RankError(RuntimeError):
    """A rank failed or did not answer in time; the message says which."""


def gather(run_rank, args=(), world_size: int = 2, timeout_s: float = 120.0,
           quiet_stderr: bool = False, error=RankError) -> list:
    """``[run_rank(rank, port, *args) for each rank]``, computed on the ranks themselves.

    ``port``: a free TCP port for the ranks' store. ``quiet_stderr``: the ranks' stderr goes to
    /dev/null (errors travel through the pipe; DDP's own warnings would otherwise land in a
    notebook). Raises ``error`` (a ``RankError`` by default) when a rank fails, exits without
    an answer or does not answer within ``timeout_s`` seconds.
    """
    from dpcost.measure.launch import warm_context

    context = warm_context()
    port = free_port()
    pipes = [context.Pipe(duplex=False) for _ in range(world_size)]
    ranks = [context.Process(target=_rank_main,
                             args=(rank, pipes[rank][1], run_rank, (port, *args), quiet_stderr),
                             daemon=True)
             for rank in range(world_size)]
    try:
        for process in ranks:
            process.start()
        for _, writer in pipes:
            writer.close()
        deadline = time.monotonic() + timeout_s
        return [_receive(reader, process, rank, deadline, timeout_s, error)
                for rank, ((reader, _), process) in enumerate(zip(pipes, ranks, strict=True))]
    finally:
        for process in ranks:
            if process.pid is not None:  # started
                # Process.kill, not os.kill: a rank is the forkserver's child, not ours, and the
                # server reaps it as it exits, so a rank that was alive a moment ago may be gone
                # (ESRCH); Process.kill passes over that (multiprocessing/popen_fork.py).
                process.kill()
                process.join()
        for reader, _ in pipes:
            reader.close()


def _receive(reader, process, rank, deadline, timeout_s, error):
    while not reader.poll(0.05):
        if process.exitcode is not None and not reader.poll(0.05):
            raise error(f"rank {rank} exited ({process.exitcode}) without an answer")
        if time.monotonic() > deadline:
            raise error(f"rank {rank} did not answer within {timeout_s:g} s")
    status, value = reader.recv()
    if status != "ok":
        raise error(f"rank {rank} failed: {value}")
    return value


def _rank_main(rank, writer, run_rank, args, quiet_stderr) -> None:
    die_with_parent()
    if quiet_stderr:
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 2)
        os.close(quiet)
    try:
        writer.send(("ok", run_rank(rank, *args)))
    except Exception as exception:  # noqa: BLE001 - the parent names it
        import traceback

        writer.send(("error", f"{exception!r}\n{traceback.format_exc()[-2000:]}"))
    writer.close()
    # Leave without interpreter finalization: a gloo thread alive at Py_FinalizeEx can abort
    # the process (worker.run_rank says why).
    os._exit(0)
