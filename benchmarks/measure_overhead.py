"""Counting overhead: DDP step time with dpcost's counters against plain DDP and torch.profiler.

Runs, in one gloo process group, ROUNDS interleaved windows of four variants of the same DDP
loop: plain DDP with no counter ("ddp-plain"); what ``dpcost.measure`` times ("ddp": plain DDP,
the TCP counters read only at the window's edges, the hook's count taken after the window on an
identical model); DDP with the counting hook inside the window ("ddp-counted", to show what the
hook would cost per step); and plain DDP inside ``torch.profiler.profile(record_shapes=True)``.
Each window's step time is the median over its steps, averaged over ranks; the figure is the
median over rounds. The counters' overhead adds the TCP reads, spread over the window's steps.

    .venv/bin/python benchmarks/measure_overhead.py [--world-size 2] [--model-mb 4]
        [--steps 20] [--rounds 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics

from dpcost.measure.launch import launch
from dpcost.measure.shape import model_shape, param_bytes_of
from dpcost.measure.worker import RunConfig

VARIANTS = ("ddp-plain", "ddp", "ddp-counted", "ddp-profiler")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--model-mb", type=float, default=4.0)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()

    width, depth = model_shape(args.model_mb * 1e6)
    order = [f"{v}#{r}" for r in range(args.rounds) for v in VARIANTS]  # interleaved
    config = RunConfig(world_size=args.world_size, width=width, depth=depth, steps=args.steps,
                       scenarios=order)
    ranks = launch(config, timeout_s=120)["ranks"]
    step = {v: [statistics.mean(rank[f"{v}#{r}"]["step_time_s"] for rank in ranks)
                for r in range(args.rounds)] for v in VARIANTS}
    median = {v: statistics.median(times) for v, times in step.items()}
    read_s = statistics.median(rank[f"ddp#{r}"]["counter_read_s"]
                               for rank in ranks for r in range(args.rounds))
    result = {
        "date": datetime.date.today().isoformat(),
        "cpus": os.cpu_count(),
        "world_size": args.world_size,
        "param_bytes": param_bytes_of(width, depth),
        "steps": args.steps,
        "rounds": args.rounds,
        "median_step_s": median,
        "step_s_per_round": step,
        # per step: the timed window's step time, plus the two TCP reads spread over its steps
        "counters_overhead": (median["ddp"] + read_s / args.steps) / median["ddp-plain"] - 1,
        "hook_overhead": median["ddp-counted"] / median["ddp-plain"] - 1,
        "profiler_overhead": median["ddp-profiler"] / median["ddp-plain"] - 1,
        "counter_read_s_per_window": read_s,
    }
    print(f"n = {args.world_size}, P = {result['param_bytes'] / 1e6:.2f} MB, {args.steps} steps x "
          f"{args.rounds} interleaved rounds, median step time:")
    for v in VARIANTS:
        extra = "" if v == "ddp-plain" else f"  ({median[v] / median['ddp-plain'] - 1:+.1%})"
        print(f"  {v:<13} {median[v] * 1e3:8.2f} ms{extra}")
    print(f"  TCP_INFO reads per window (twice, not per step): {read_s * 1e3:.2f} ms")
    print(f"counters' overhead per step (ddp, reads included): {result['counters_overhead']:+.1%}; "
          f"hook inside the window: {result['hook_overhead']:+.1%}; "
          f"profiler: {result['profiler_overhead']:+.1%}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
