"""Ring all-reduce on simulated ranks: real numpy arrays, real sums, every byte counted.

n ranks each hold a 1-D array of S bytes, cut into n chunks with ``np.array_split``. The ring
runs in two phases of n - 1 steps each:

- reduce-scatter, step s: rank r sends chunk (r - s) % n to rank (r + 1) % n, which ADDS it to
  its own copy. Afterwards rank r holds the fully reduced chunk (r + 1) % n.
- all-gather, step s: rank r sends chunk (r + 1 - s) % n to rank (r + 1) % n, which OVERWRITES
  its copy. Afterwards every rank holds every reduced chunk.

Each rank sends one chunk (about S / n bytes) per step, so it sends 2 (n - 1) / n * S bytes in
all, and receives as many. The star pattern of DataParallel is here too
(:func:`simulate_star_allreduce`): every rank sends S to the root, the root sends the sum back.

The sends functions only *say* what moves; the simulator moves the data and counts
``chunk.nbytes`` of what it moved, so a wrong schedule shows in the result and in the bytes.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

Send = tuple[int, int, int]  # (src_rank, dst_rank, chunk_index); all sends of one step at once
SendsFunction = Callable[[int, int], list[Send]]

__all__ = [
    "Send",
    "ring_reduce_scatter_sends",
    "ring_all_gather_sends",
    "TransferRecord",
    "Snapshot",
    "AllReduceTrace",
    "simulate_ring_allreduce",
    "simulate_star_allreduce",
    "step_byte_table",
]


def ring_reduce_scatter_sends(num_ranks: int, step: int) -> list[Send]:
    """Sends of reduce-scatter step ``step`` (0..n-2): rank r -> (r + 1) % n, chunk (r - s) % n.

    The receiver adds the chunk to its own copy.
    """
    n = num_ranks
    return [(r, (r + 1) % n, (r - step) % n) for r in range(n)]


def ring_all_gather_sends(num_ranks: int, step: int) -> list[Send]:
    """Sends of all-gather step ``step`` (0..n-2): rank r -> (r + 1) % n, chunk (r + 1 - s) % n.

    The receiver overwrites its copy. After reduce-scatter, rank r holds the fully reduced chunk
    (r + 1) % n, so at step 0 each rank passes on the chunk it finished.
    """
    n = num_ranks
    return [(r, (r + 1) % n, (r + 1 - step) % n) for r in range(n)]


@dataclass
class TransferRecord:
    """One message: ``nbytes`` of chunk ``chunk`` from rank ``src`` to rank ``dst``.

    phase is "reduce-scatter" or "all-gather" (ring), "reduce" or "broadcast" (star, where
    chunk is -1: the whole array).
    """

    phase: str
    step: int
    src: int
    dst: int
    chunk: int
    nbytes: int


@dataclass
class Snapshot:
    """State after one (phase, step): ``holdings[rank][chunk]`` is the frozenset of ranks
    whose data that rank's copy of that chunk now sums (for drawing the chunks move)."""

    phase: str
    step: int
    holdings: list[list[frozenset]]


@dataclass
class AllReduceTrace:
    """What a simulated all-reduce did: the outputs, whether they are right, and every byte."""

    num_ranks: int
    outputs: list[np.ndarray]  # each rank's array at the end
    expected: np.ndarray  # the elementwise sum of the inputs, added rank 0, 1, ..., n - 1
    correct: bool  # every output equals expected (exact for integers, allclose for floats)
    transfers: list[TransferRecord]
    sent_bytes: list[int]  # per rank, all steps
    received_bytes: list[int]  # per rank, all steps
    snapshots: list = field(default_factory=list)  # Snapshot per (phase, step), after it ran


def _check_arrays(arrays) -> list[np.ndarray]:
    """Copies of ``arrays``: n >= 1 numpy 1-D arrays of one shape and one numeric dtype."""
    if isinstance(arrays, np.ndarray) or not isinstance(arrays, (list, tuple)):
        raise TypeError(
            f"arrays must be a list of 1-D numpy arrays (one per rank), got {type(arrays).__name__}"
        )
    if len(arrays) == 0:
        raise ValueError("arrays must hold at least one array (one per rank), got an empty list")
    for rank, array in enumerate(arrays):
        if not isinstance(array, np.ndarray):
            raise TypeError(
                f"arrays[{rank}] must be a numpy array, got {type(array).__name__}"
            )
        if array.ndim != 1:
            raise ValueError(f"arrays[{rank}] must be 1-D, got shape {array.shape}")
        if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.number):
            raise TypeError(f"arrays[{rank}] must have a numeric dtype, got {array.dtype}")
        if array.shape != arrays[0].shape or array.dtype != arrays[0].dtype:
            raise ValueError(
                f"arrays must all have one shape and dtype: arrays[0] is {arrays[0].shape} "
                f"{arrays[0].dtype}, arrays[{rank}] is {array.shape} {array.dtype}"
            )
    return [array.copy() for array in arrays]


def _exact_sum(arrays: list[np.ndarray]) -> np.ndarray:
    # Add in the arrays' own dtype (np.sum would widen small integers), rank 0 first.
    total = arrays[0].copy()
    for array in arrays[1:]:
        total += array
    return total


def _all_equal(outputs: list[np.ndarray], expected: np.ndarray) -> bool:
    # Integers must match exactly; floats are summed in a different order per chunk.
    if np.issubdtype(expected.dtype, np.integer):
        return all(np.array_equal(out, expected) for out in outputs)
    return all(out.shape == expected.shape and np.allclose(out, expected) for out in outputs)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _checked_sends(sends_function: SendsFunction, n: int, step: int) -> list[Send]:
    """Call ``sends_function(n, step)`` and check every send it returns."""
    name = getattr(sends_function, "__name__", repr(sends_function))
    sends = sends_function(n, step)
    if not isinstance(sends, list):
        raise TypeError(
            f"{name}({n}, {step}) must return a list of (src, dst, chunk) tuples, "
            f"got {type(sends).__name__}"
        )
    checked = []
    for send in sends:
        if not (isinstance(send, tuple) and len(send) == 3 and all(_is_int(v) for v in send)):
            raise TypeError(
                f"{name}({n}, {step}) returned {send!r}: each send must be a tuple of 3 ints "
                "(src_rank, dst_rank, chunk_index)"
            )
        src, dst, chunk = (int(v) for v in send)
        if not (0 <= src < n and 0 <= dst < n):
            raise ValueError(
                f"{name}({n}, {step}) returned send {send!r}: ranks must be in 0..{n - 1}"
            )
        if not 0 <= chunk < n:
            raise ValueError(
                f"{name}({n}, {step}) returned send {send!r}: chunk must be in 0..{n - 1}"
            )
        if src == dst:
            raise ValueError(
                f"{name}({n}, {step}) returned send {send!r}: a rank cannot send to itself"
            )
        checked.append((src, dst, chunk))
    return checked


def simulate_ring_allreduce(
    arrays,
    reduce_scatter_sends: SendsFunction = ring_reduce_scatter_sends,
    all_gather_sends: SendsFunction = ring_all_gather_sends,
) -> AllReduceTrace:
    """All-reduce ``arrays`` (one per rank) with a ring: reduce-scatter, then all-gather.

    Each phase runs n - 1 steps; at each step the sends function says which chunks move, all
    sends of the step happen at once (payloads are read before any is applied), and the
    simulator adds (reduce-scatter) or copies (all-gather) each payload and counts its bytes.
    With the default schedules every rank sends and receives 2 (n - 1) / n * S bytes (exactly
    when the length divides by n; chunks of ``np.array_split`` differ by one element otherwise).
    """
    inputs = _check_arrays(arrays)
    n = len(inputs)
    expected = _exact_sum(inputs)
    # Each rank's array as n chunks; array_split returns views, so += and [:] = edit in place.
    buffers = [array.copy() for array in inputs]
    chunks = [np.array_split(buffer, n) for buffer in buffers]
    holdings = [[frozenset([rank]) for _ in range(n)] for rank in range(n)]
    transfers: list[TransferRecord] = []
    sent, received = [0] * n, [0] * n
    snapshots: list[Snapshot] = []

    for phase, sends_function in (
        ("reduce-scatter", reduce_scatter_sends),
        ("all-gather", all_gather_sends),
    ):
        for step in range(n - 1):
            sends = _checked_sends(sends_function, n, step)
            # Read every payload first: the sends of one step are simultaneous.
            payloads = [
                (src, dst, c, chunks[src][c].copy(), holdings[src][c]) for src, dst, c in sends
            ]
            for src, dst, c, data, held in payloads:
                if phase == "reduce-scatter":
                    chunks[dst][c] += data
                    holdings[dst][c] = holdings[dst][c] | held
                else:
                    chunks[dst][c][:] = data
                    holdings[dst][c] = held
                transfers.append(TransferRecord(phase, step, src, dst, c, int(data.nbytes)))
                sent[src] += int(data.nbytes)
                received[dst] += int(data.nbytes)
            snapshots.append(Snapshot(phase, step, [list(row) for row in holdings]))

    return AllReduceTrace(
        num_ranks=n,
        outputs=buffers,
        expected=expected,
        correct=_all_equal(buffers, expected),
        transfers=transfers,
        sent_bytes=sent,
        received_bytes=received,
        snapshots=snapshots,
    )


def simulate_star_allreduce(arrays, root: int = 0) -> AllReduceTrace:
    """All-reduce through one root, DataParallel's pattern: a reduce, then a broadcast.

    reduce (step 0): every other rank sends its whole array (S bytes) to ``root``, which adds
    them. broadcast (step 0): ``root`` sends the sum (S bytes) to every other rank. So the root
    sends (n - 1) S and receives (n - 1) S; every other rank sends S and receives S. Total over
    all links: 2 (n - 1) S, the same as the ring, but all of it through the root's link.
    Chunk index -1 in the records means "the whole array"; snapshots hold one chunk per rank.
    """
    inputs = _check_arrays(arrays)
    n = len(inputs)
    if not _is_int(root):
        raise TypeError(f"root must be an int rank, got {type(root).__name__} {root!r}")
    if not 0 <= root < n:
        raise ValueError(f"root must be a rank in 0..{n - 1}, got {root}")
    expected = _exact_sum(inputs)
    buffers = [array.copy() for array in inputs]
    holdings = [[frozenset([rank])] for rank in range(n)]
    others = [rank for rank in range(n) if rank != root]
    transfers: list[TransferRecord] = []
    sent, received = [0] * n, [0] * n
    snapshots: list[Snapshot] = []

    def move(phase, src, dst, data):
        transfers.append(TransferRecord(phase, 0, src, dst, -1, int(data.nbytes)))
        sent[src] += int(data.nbytes)
        received[dst] += int(data.nbytes)

    if others:
        for src in others:  # reduce: the root adds every other rank's array
            data = buffers[src].copy()
            buffers[root] += data
            holdings[root][0] = holdings[root][0] | holdings[src][0]
            move("reduce", src, root, data)
        snapshots.append(Snapshot("reduce", 0, [list(row) for row in holdings]))
        for dst in others:  # broadcast: the root sends the sum back
            data = buffers[root].copy()
            buffers[dst][:] = data
            holdings[dst][0] = holdings[root][0]
            move("broadcast", root, dst, data)
        snapshots.append(Snapshot("broadcast", 0, [list(row) for row in holdings]))

    return AllReduceTrace(
        num_ranks=n,
        outputs=buffers,
        expected=expected,
        correct=_all_equal(buffers, expected),
        transfers=transfers,
        sent_bytes=sent,
        received_bytes=received,
        snapshots=snapshots,
    )


def step_byte_table(trace: AllReduceTrace) -> list[dict]:
    """Bytes each rank sent and received at each (phase, step) of ``trace``, as rows.

    Each row: {"phase", "step", "rank", "sent", "received"}, in the order the steps ran.
    """
    rows: dict[tuple[str, int, int], dict] = {}
    steps = [(s.phase, s.step) for s in trace.snapshots]
    for phase, step in steps:
        for rank in range(trace.num_ranks):
            rows[(phase, step, rank)] = {
                "phase": phase, "step": step, "rank": rank, "sent": 0, "received": 0}
    for t in trace.transfers:
        rows[(t.phase, t.step, t.src)]["sent"] += t.nbytes
        rows[(t.phase, t.step, t.dst)]["received"] += t.nbytes
    return list(rows.values())
