"""Accuracy: measured / predicted bytes per rank at n = 2, 3, 4 for 1, 4 and 16 MB models.

For each (n, model size) one ``measure_traffic`` run of ddp and dp; prints, per scenario, the
lowest and highest measured / predicted ratio over ranks and both directions, and the largest
remainder per iteration in bytes.

    .venv/bin/python benchmarks/measure_accuracy.py [--steps 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json

from dpcost.measure import measure_traffic

SIZES_MB = (1, 4, 16)
WORLD_SIZES = (2, 3, 4)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    rows = []
    print(f"{'n':>2} {'P MB':>6} {'scenario':>8} {'min ratio':>10} {'max ratio':>10} "
          f"{'max extra B':>11}")
    for n in WORLD_SIZES:
        for size in SIZES_MB:
            report = measure_traffic(world_size=n, model_bytes=size * 1e6, steps=args.steps)
            for scenario, ranks in report["scenarios"].items():
                ratios = [r[f"{d}_ratio"] for r in ranks for d in ("sent", "received")]
                extra = max(r[f"{d}_remainder_bytes"] for r in ranks
                            for d in ("sent", "received"))
                row = {"world_size": n, "param_bytes": report["param_bytes"],
                       "scenario": scenario, "min_ratio": min(ratios),
                       "max_ratio": max(ratios), "max_remainder_bytes": extra}
                rows.append(row)
                print(f"{n:>2} {report['param_bytes'] / 1e6:>6.2f} {scenario:>8} "
                      f"{min(ratios):>10.5f} {max(ratios):>10.5f} {extra:>11.0f}")
    worst = max(abs(r[k] - 1) for r in rows for k in ("min_ratio", "max_ratio"))
    print(f"largest |measured / predicted - 1| over all ranks and runs: {worst:.3%}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"date": datetime.date.today().isoformat(), "steps": args.steps,
                       "rows": rows, "worst_deviation": worst}, out, indent=1)


if __name__ == "__main__":
    main()
