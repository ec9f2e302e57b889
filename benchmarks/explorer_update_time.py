"""How long one control change of the explorer takes, headless: recompute, redraw, encode PNGs.

Sets each control's ``.value`` many times (a seeded random walk over its values, never the
same value twice in a row) and times the call, which runs the ``observe`` callback
synchronously: the formulas, the artist updates and the PNG rendering of every view that
changed. Reports per control the median and spread (10th-90th percentile, max) of wall-clock
time, and the median CPU time of this process (less sensitive to other processes on a shared
machine). For reference, it also times drawing all three figures from scratch.

    .venv/bin/python benchmarks/explorer_update_time.py            # 60 changes per control
    .venv/bin/python benchmarks/explorer_update_time.py --changes 200 --check 50

``--check MS`` exits with status 1 when the median over all changes exceeds MS milliseconds.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

from dpcost.explorer import (
    CUSTOM,
    GPU_CHOICES,
    GPUS_PER_NODE_CHOICES,
    INTER_NODE_LINKS,
    INTRA_NODE_LINKS,
    OPTIMIZERS,
    PRECISION_CHOICES,
    Explorer,
)
from dpcost.explorer_model import controls
from dpcost.memory import ATTENTIONS
from dpcost.presets import GPUS, MODELS

VALUES = {
    "gpus": GPU_CHOICES,
    "model": [*MODELS, CUSTOM],
    "precision": list(PRECISION_CHOICES),
    "attention": list(ATTENTIONS),
    "gpus_per_node": GPUS_PER_NODE_CHOICES,
    "intra_link": list(INTRA_NODE_LINKS),
    "inter_link": list(INTER_NODE_LINKS),
    "gpu": list(GPUS),
    "bucket_cap_mb": [value for _, value in controls()["options"]["bucket_cap_mb"]],
    "optimizer": [value for _, value in OPTIMIZERS],
    "batch_size": [1, 8, 32, 64, 256, 1024],
    "outputs": [1000, 10_000, 512 * 30_522, 1024 * 50_257],
}


def percentile(values, q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between order statistics."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def time_changes(explorer: Explorer, name: str, values, changes: int, rng: random.Random):
    """Wall and CPU seconds of ``changes`` assignments to ``explorer.controls[name].value``."""
    widget = explorer.controls[name]
    wall, cpu = [], []
    for _ in range(changes):
        value = rng.choice([v for v in values if v != widget.value])
        w0, c0 = time.perf_counter(), time.process_time()
        widget.value = value
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
        if explorer.error:
            raise RuntimeError(f"setting {name} = {value!r} failed: {explorer.error}")
    return wall, cpu


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=60, help="changes per control")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check", type=float, metavar="MS",
                        help="exit 1 if the overall median exceeds MS milliseconds")
    args = parser.parse_args(argv)

    rng = random.Random(args.seed)
    explorer = Explorer()
    for name, values in VALUES.items():  # warm-up: fonts, glyph caches, first renders
        time_changes(explorer, name, values, 3, rng)

    print(f"explorer update time, {args.changes} changes per control, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    print(f"{'control':<13} {'median ms':>9} {'p10':>7} {'p90':>7} {'max':>7} {'cpu ms':>7}")
    all_wall, all_cpu = [], []
    for name, values in VALUES.items():
        wall, cpu = time_changes(explorer, name, values, args.changes, rng)
        all_wall += wall
        all_cpu += cpu
        ms = [1e3 * t for t in wall]
        print(f"{name:<13} {statistics.median(ms):9.1f} {percentile(ms, 10):7.1f} "
              f"{percentile(ms, 90):7.1f} {max(ms):7.1f} {1e3 * statistics.median(cpu):7.1f}")
    overall = 1e3 * statistics.median(all_wall)
    print(f"{'all':<13} {overall:9.1f} {percentile([1e3 * t for t in all_wall], 10):7.1f} "
          f"{percentile([1e3 * t for t in all_wall], 90):7.1f} {1e3 * max(all_wall):7.1f} "
          f"{1e3 * statistics.median(all_cpu):7.1f}")

    full = []
    for _ in range(10):
        start = time.perf_counter()
        for view in explorer.views.values():
            view.render_full()
        full.append(time.perf_counter() - start)
    print(f"reference: drawing all three figures from scratch, median "
          f"{1e3 * statistics.median(full):.1f} ms; load average {os.getloadavg()[0]:.2f} at end")
    if args.check is not None and overall > args.check:
        print(f"FAIL: median {overall:.1f} ms > {args.check:g} ms", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
