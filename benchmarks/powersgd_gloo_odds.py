"""PowerSGD over gloo with DDP's default buckets and no straggler: how often each outcome occurs.

The lesson's probe makes rank 1 a straggler so that its table is the same on every run. This
script runs the same two multi-bucket cases without it (``straggler_s=0``), so that the ranks
interleave by chance, and counts hangs, runs whose calls came out in a different order on
the two ranks, and runs whose replicas differ at the end. docs/measurement.md quotes it.

    .venv/bin/python benchmarks/powersgd_gloo_odds.py [--runs 10]
"""

from __future__ import annotations

import argparse
import collections

from dpcost.measure import powersgd_gloo

CASES = ({"bucket_cap_mb": None, "gloo_threads": 2}, {"bucket_cap_mb": None, "gloo_threads": 8})


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args(argv)
    for case in CASES:
        seen = collections.Counter()
        for run in range(args.runs):
            result = powersgd_gloo.probe(**case, straggler_s=0.0)
            seen[result["outcome"]] += 1
            seen["out of order"] += result["out_of_order"] is not None
            seen["replicas differ"] += bool(result["replica_max_diff"])
            print(f"{case} run {run}: {result['outcome']}, out_of_order="
                  f"{result['out_of_order']}, mismatched={result['mismatched']}, "
                  f"replica_max_diff={result['replica_max_diff']}", flush=True)
        print(f"{case['gloo_threads']} gloo threads, {args.runs} runs: hung {seen['hung']}, "
              f"ran {seen['ran']}, out of order {seen['out of order']}, "
              f"replicas differ {seen['replicas differ']}", flush=True)


if __name__ == "__main__":
    main()
