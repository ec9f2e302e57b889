"""What is left of the measured remainder after gloo's predicted framing, over repeated runs.

For each run: DDP and the DP star at n = 4 (1.5 MB) and n = 3 (1 MB), 5 steps; prints each rank's
unexplained bytes per iteration (measured remainder minus ``report.predicted_framing_bytes``),
sent and received. docs/measurement.md quotes the range over 8 runs.

    .venv/bin/python benchmarks/framing_residue.py [--runs 8]
"""

from __future__ import annotations

import argparse

from dpcost.measure import measure_traffic

CASES = ((4, 1.5e6), (3, 1e6))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    args = parser.parse_args(argv)
    seen = {"ddp": [], "dp": []}
    for run in range(args.runs):
        for n, model_bytes in CASES:
            report = measure_traffic(world_size=n, model_bytes=model_bytes, steps=5,
                                     scenarios=("ddp", "dp"))
            for scenario in seen:
                values = [row[f"unexplained_{d}_bytes"] for row in report["scenarios"][scenario]
                          for d in ("sent", "received")]
                seen[scenario] += values
                print(f"run {run} n={n} {scenario}: " + ", ".join(f"{v:+.1f}" for v in values),
                      flush=True)
    for scenario, values in seen.items():
        print(f"{scenario}: unexplained per rank and iteration {min(values):+.1f} .. "
              f"{max(values):+.1f} B over {args.runs} runs")


if __name__ == "__main__":
    main()
