"""Where `make test`'s CPU goes: a pytest plugin that records each test's process-tree CPU time.

Before and after each test it sums utime + stime + cutime + cstime (``/proc/<pid>/stat``) over
the pytest process and every live descendant, so ranks, kernels, torchrun and browsers that a
test starts are counted when they are reaped inside the tree. One JSON line per test, its CPU and
wall seconds, goes to ``$TREECPU_OUT`` (default /tmp/treecpu.jsonl). Linux only. Used for issue
19's profile:

    PYTHONPATH=benchmarks make test TEST_ARGS="-p tree_cpu"
    python3 -c "import json, collections; c = collections.Counter(); \\
      [c.update({(r := json.loads(l))['id'].split('::')[0]: r['cpu']}) \\
       for l in open('/tmp/treecpu.jsonl')]; print(c.most_common(20))"
"""

import json
import os
import time

import pytest

TICKS = os.sysconf("SC_CLK_TCK")
OUT = os.environ.get("TREECPU_OUT", "/tmp/treecpu.jsonl")


def _stat(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), sum(map(int, fields[11:15]))  # ppid; utime stime cutime cstime


def tree_cpu_s(root: int) -> float:
    """CPU seconds of ``root`` and its live descendants, their reaped children included."""
    children, ticks = {}, {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                parent, used = _stat(int(name))
            except OSError:
                continue  # gone meanwhile
            children.setdefault(parent, []).append(int(name))
            ticks[int(name)] = used
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += ticks.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total / TICKS


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before, started = tree_cpu_s(os.getpid()), time.monotonic()
    yield
    used = tree_cpu_s(os.getpid()) - before
    with open(OUT, "a") as f:
        f.write(json.dumps({"id": item.nodeid, "cpu": round(used, 2),
                            "wall": round(time.monotonic() - started, 2)}) + "\n")
