"""Run the tests that start ranks, torchrun or servers K times each; count the failures.

A multi-process test that fails 1 time in 10 fails CI within a few submissions, so each one is
run in a fresh pytest process K times in a row, and the failures are reported out of K. Also
runs the torchrun command that used to abort at exit (issue 9) as a plain command.

    .venv/bin/python benchmarks/repeat.py                 # K = 20, every test below
    .venv/bin/python benchmarks/repeat.py -k 5 tests/test_measure_torchrun.py
    .venv/bin/python benchmarks/repeat.py -k 10 notebooks/06_measure_it.ipynb   # under nbval
    .venv/bin/python benchmarks/repeat.py --json out.json
    make stress                                           # the same, K = 20

Not part of ``make test``: 20 rounds of everything take over an hour on 2 cores.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def _serial_tests() -> list[str]:
    """The test files of conftest.py's two one-at-a-time lanes: they start ranks, torchrun or
    timed processes."""
    spec = importlib.util.spec_from_file_location("dpcost_root_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [name for name in module.SERIAL if name.startswith("tests/")]


# These start kernels, servers, a browser or a fresh venv too, but run beside the pure tests.
PARALLEL_PROCESS_TESTS = [
    "tests/test_make_lab.py",
    "tests/test_package.py",
    "tests/test_site.py",
    "tests/test_slides.py",
    "tests/test_gpu_memory_check.py",
    "tests/test_jupyterlab_browser.py",
]
# Every test file whose tests start processes: ranks, torchrun agents, kernels or servers.
MULTIPROCESS_TESTS = _serial_tests() + PARALLEL_PROCESS_TESTS
assert len(set(MULTIPROCESS_TESTS)) == len(MULTIPROCESS_TESTS)

# A notebook given on the command line runs under strict nbval, as `make test` runs it.
NBVAL = ["--nbval", "--nbval-current-env", "--nbval-cell-timeout=300",
         "--nbval-sanitize-with", str(ROOT / "tests" / "nbval_sanitize.cfg")]

COMMANDS = {  # the reproduction: failed 6 times in 20 before the fix
    "torchrun -m dpcost.measure (2 ranks)": [
        TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "dpcost.measure", "--backend",
        "gloo", "--scenario", "ddp", "--model-mb", "1", "--steps", "5", "--json"],
}


def run_once(command: list[str], timeout: float) -> tuple[bool, float, str]:
    """(passed, seconds, the end of its output: 8,000 characters) for one run of ``command``."""
    start = time.monotonic()
    try:
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                                timeout=timeout)
        passed, output = result.returncode == 0, result.stdout + result.stderr
    except subprocess.TimeoutExpired as expired:
        passed, output = False, f"timed out after {timeout:.0f} s\n{expired.stdout or ''}"
    return passed, time.monotonic() - start, output.strip()[-8000:]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", "--repeats", type=int, default=20, help="runs of each (default 20)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run")
    parser.add_argument("--json", metavar="FILE", help="also write the counts to FILE")
    parser.add_argument("--no-commands", action="store_true",
                        help="only the tests, not the plain torchrun command")
    parser.add_argument("tests", nargs="*", help="test files or node ids (default: all above)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    tests = args.tests or [t for t in MULTIPROCESS_TESTS if (ROOT / t).exists()]
    jobs = {t: [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", t,
                *(NBVAL if t.split("::")[0].endswith(".ipynb") else [])] for t in tests}
    if not args.no_commands and not args.tests:
        jobs.update(COMMANDS)
    counts = {}
    for name, command in jobs.items():
        failures, times = [], []
        for attempt in range(1, args.repeats + 1):
            passed, seconds, tail = run_once(command, args.timeout)
            times.append(seconds)
            if not passed:  # the JSON keeps the whole tail: a test's diagnostics, its stacks
                failures.append({"attempt": attempt, "tail": tail})
                last = "\n".join(tail.splitlines()[-5:])
                print(f"  {name}: run {attempt} FAILED\n    " + last.replace("\n", "\n    "),
                      flush=True)
        counts[name] = {"failed": len(failures), "runs": args.repeats,
                        "median_s": sorted(times)[len(times) // 2], "failures": failures}
        print(f"{name}: {len(failures)} failed of {args.repeats} "
              f"(median {counts[name]['median_s']:.1f} s a run)", flush=True)
    total_failed = sum(c["failed"] for c in counts.values())
    print(f"{total_failed} failed of {args.repeats * len(counts)} runs "
          f"({len(counts)} tests or commands x {args.repeats})")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "date": datetime.date.today().isoformat(), "repeats": args.repeats,
            "counts": counts}, indent=2))
    return 1 if total_failed else 0


if __name__ == "__main__":
    sys.exit(main())
