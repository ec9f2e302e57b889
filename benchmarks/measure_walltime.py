"""Wall time of ``python -m dpcost.measure --world-size 4`` (defaults: 4 MB, 10 steps).

Runs the command REPEATS times in a fresh interpreter each and prints every time and the median.
The target on a 2-core laptop CPU is 15 s or less; start-up (import torch once, rendezvous of 4
ranks) dominates.

    .venv/bin/python benchmarks/measure_walltime.py [--repeats 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

COMMAND = [sys.executable, "-m", "dpcost.measure", "--world-size", "4"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        subprocess.run(COMMAND, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(f"python -m dpcost.measure --world-size 4 on {os.cpu_count()} CPUs: "
          f"{', '.join(f'{t:.1f}' for t in times)} s; median {median:.1f} s (target <= 15 s)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"date": datetime.date.today().isoformat(), "cpus": os.cpu_count(),
                       "seconds": times, "median_s": median,
                       "load_average": os.getloadavg()}, out, indent=1)


if __name__ == "__main__":
    main()
