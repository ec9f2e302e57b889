"""A measured timeline's events, as the timed scenarios record them and the figures read them.

Each event is ``[iteration, lane, name, start_ns, end_ns]``; ``lane`` is one of ``LANES``:
"compute" (forward, backward, optimizer step), "comm" (each bucket all-reduce; DataParallel's
parameters out and gradients in) or "grad" (a parameter's gradient ready: start = end).
Standard library only, so ``dpcost.plots`` can read a timeline without ``dpcost.measure``
(which needs torch).
"""

from __future__ import annotations

__all__ = ["LANES", "by_iteration"]

LANES = ("compute", "comm", "grad")


def by_iteration(events: list) -> dict:
    """{iteration: [(lane, name, start_ns, end_ns), ...]} in time order."""
    iterations = {}
    for iteration, lane, name, start, end in events:
        iterations.setdefault(iteration, []).append((lane, name, start, end))
    return {i: sorted(evs, key=lambda e: e[2]) for i, evs in sorted(iterations.items())}
