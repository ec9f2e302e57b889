"""CPU seconds of the whole machine while each test file runs alone, and how fast the host is.

    .venv/bin/python benchmarks/file_cpu.py tests/test_measure_cli.py tests/test_examples.py

Each file runs in its own pytest (nbval for notebooks), one after the other; the figure is the
machine's busy time from /proc/stat over the run, so it counts every process the file starts,
also those nobody waits for (Chromium's renderers, forked ranks): `time` and `tree_cpu.py` miss
them (Pyodide's page cost 17-20 s here, 6 s by the rusage of pytest's children). Run it on an
otherwise idle machine. Each figure includes the file's pytest start-up and collection (about 3 s);
inside `make test` a lane pays that once.

The host's speed is printed before and after (seconds for a fixed pure-Python loop): on this
project's shared 2-core machine it varied from 3.3 to 4.8 s within minutes, so compare figures
taken at the same speed, or repeat them.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBVAL = ["--nbval", "--nbval-current-env", "--nbval-cell-timeout=300",
         "--nbval-sanitize-with", "tests/nbval_sanitize.cfg"]


def busy_seconds() -> float:
    """All CPUs' non-idle time since boot (user, nice, system, irq, softirq), in seconds."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = map(int, fields[:7])
    return (user + nice + system + irq + softirq) / 100  # USER_HZ: 100 on Linux


# The loop runs as module-level code (its names are globals, as in a script): the speeds in
# docs/ci.md were taken that way. Inside a function the same loop takes about half as long.
SPEED_LOOP = compile("total = 0\nfor i in range(30_000_000):\n    total += i * i % 7\n",
                     "<host speed>", "exec")


def host_speed() -> float:
    """Seconds of CPU for a fixed loop (3.3 s on a fast moment of this project's machine)."""
    start = time.process_time()
    exec(SPEED_LOOP, {})
    return time.process_time() - start


def main(argv: list[str]) -> int:
    if not argv or any(not (ROOT / path).exists() for path in argv):
        print("usage: file_cpu.py TEST_FILE_OR_NOTEBOOK... (paths from the repository root)",
              file=sys.stderr)
        return 2
    print(f"host speed: {host_speed():.2f} s", flush=True)
    failed = 0
    for path in argv:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path,
                   *(NBVAL if path.endswith(".ipynb") else [])]
        before, started = busy_seconds(), time.monotonic()
        status = subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL).returncode
        cpu, wall = busy_seconds() - before, time.monotonic() - started
        failed += status != 0
        print(f"{cpu:7.1f} s CPU {wall:7.1f} s wall  {'ok' if status == 0 else 'FAILED'}  {path}",
              flush=True)
    print(f"host speed: {host_speed():.2f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
