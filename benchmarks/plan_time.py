"""Wall time of ``python -m dpcost.plan --model "Llama-2 70B" --gpus 64 --json`` (target < 30 s).

Each run is a fresh interpreter (import torch, build on meta, one traced forward and backward
at B = 1, T = 4096 in bf16, the plan); prints every wall time, the plan's own ``plan_s`` and the
median.

    .venv/bin/python benchmarks/plan_time.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

COMMAND = [sys.executable, "-m", "dpcost.plan", "--model", "Llama-2 70B", "--gpus", "64",
           "--json"]
TARGET_S = 30.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    walls = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        done = subprocess.run(COMMAND, capture_output=True, text=True, check=True)
        walls.append(time.perf_counter() - start)
        plan_s = json.loads(done.stdout)["plan_s"]
        print(f"wall {walls[-1]:.1f} s (plan itself {plan_s:.1f} s)")
    median = statistics.median(walls)
    print(f"median {median:.1f} s over {len(walls)} runs; target < {TARGET_S:.0f} s")
    return 0 if median < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
