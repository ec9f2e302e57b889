"""Finding a test's own processes anywhere: the test puts a mark in their environment."""

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
