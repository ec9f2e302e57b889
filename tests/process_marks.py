"""Finding a test's own processes: anywhere, by a mark in their environment; or below this
process, for runs whose ranks fork from its warm process."""

import psutil


def marked_processes(mark: str) -> list[int]:
    """Pids of live processes whose environment has DPCOST_TEST_MARK == ``mark`` (other lanes of
    make test run the same commands meanwhile; only the marked ones are this test's)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("DPCOST_TEST_MARK") == mark:
                found.append(process.pid)
        except (psutil.Error, OSError):
            continue
    return found


def our_descendants() -> set[int]:
    """Pids of this process's descendants. multiprocessing's resource tracker and the launcher's
    warm process (the forkserver) live as long as this process, one each, not one per run: they
    are started first, so that they are in every "before"."""
    from multiprocessing import resource_tracker

    from dpcost.measure.launch import warm_context

    resource_tracker.ensure_running()
    warm_context()
    return {p.pid for p in psutil.Process().children(recursive=True)}
