"""The ring and star simulators: exact sums, bytes per rank, and wrong schedules caught."""

import numpy as np
import pytest

from dpcost.ring import (
    AllReduceTrace,
    TransferRecord,
    ring_all_gather_sends,
    ring_reduce_scatter_sends,
    simulate_ring_allreduce,
    simulate_star_allreduce,
    step_byte_table,
)


def rank_arrays(n, length, dtype=np.int64, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(-1000, 1000, size=length).astype(dtype) for _ in range(n)]


def chunk_lengths(length, n):
    # np.array_split: the first length % n chunks get one extra element.
    return [length // n + (1 if i < length % n else 0) for i in range(n)]


@pytest.mark.parametrize("n", range(1, 9))
@pytest.mark.parametrize("length", [0, 1, 5, 12, 17, 64, 101])
def test_ring_sum_is_exact(n, length):
    arrays = rank_arrays(n, length, seed=n * 1000 + length)
    trace = simulate_ring_allreduce(arrays)
    total = np.zeros(length, dtype=np.int64)
    for a in arrays:
        total = total + a
    assert trace.correct
    assert trace.num_ranks == n
    np.testing.assert_array_equal(trace.expected, total)
    for out in trace.outputs:
        np.testing.assert_array_equal(out, total)


def test_inputs_are_not_modified():
    arrays = rank_arrays(4, 10)
    copies = [a.copy() for a in arrays]
    simulate_ring_allreduce(arrays)
    simulate_star_allreduce(arrays)
    for a, c in zip(arrays, copies, strict=True):
        np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("n", range(2, 9))
def test_ring_bytes_exact_when_divisible(n):
    length = 24 * n  # int64: S = 8 * length bytes
    trace = simulate_ring_allreduce(rank_arrays(n, length))
    size = 8 * length
    assert trace.sent_bytes == [2 * (n - 1) * size // n] * n
    assert trace.received_bytes == [2 * (n - 1) * size // n] * n
    # 2 (n - 1) steps, one message per rank per step.
    assert len(trace.transfers) == 2 * (n - 1) * n
    assert sum(trace.sent_bytes) == 2 * (n - 1) * size


@pytest.mark.parametrize("n", range(2, 9))
@pytest.mark.parametrize("length", [1, 7, 13, 50, 101])
def test_ring_bytes_within_split_rounding(n, length):
    trace = simulate_ring_allreduce(rank_arrays(n, length, dtype=np.int32))
    size = 4 * length
    ideal = 2 * (n - 1) / n * size
    biggest, smallest = max(chunk_lengths(length, n)), min(chunk_lengths(length, n))
    for rank in range(n):
        # each rank sends 2 (n - 1) chunks, each within one element of S / n
        assert 2 * (n - 1) * 4 * smallest <= trace.sent_bytes[rank] <= 2 * (n - 1) * 4 * biggest
        assert abs(trace.sent_bytes[rank] - ideal) <= 2 * (n - 1) * 4
        assert abs(trace.received_bytes[rank] - ideal) <= 2 * (n - 1) * 4
    # every link carries what its sender sent: totals agree
    assert sum(trace.sent_bytes) == sum(trace.received_bytes) == 2 * (n - 1) * size


def test_ring_transfers_follow_the_schedule_n4():
    n = 4
    trace = simulate_ring_allreduce(rank_arrays(n, 8))  # 2 int64 per chunk = 16 bytes
    first = [(t.phase, t.step, t.src, t.dst, t.chunk, t.nbytes) for t in trace.transfers[:4]]
    assert first == [("reduce-scatter", 0, r, (r + 1) % 4, r, 16) for r in range(4)]
    gather0 = [t for t in trace.transfers if t.phase == "all-gather" and t.step == 0]
    assert [(t.src, t.chunk) for t in gather0] == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert all(isinstance(t, TransferRecord) for t in trace.transfers)


def test_schedules_by_hand():
    assert ring_reduce_scatter_sends(3, 0) == [(0, 1, 0), (1, 2, 1), (2, 0, 2)]
    assert ring_reduce_scatter_sends(3, 1) == [(0, 1, 2), (1, 2, 0), (2, 0, 1)]
    assert ring_all_gather_sends(3, 0) == [(0, 1, 1), (1, 2, 2), (2, 0, 0)]
    assert ring_all_gather_sends(3, 1) == [(0, 1, 0), (1, 2, 1), (2, 0, 2)]


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_snapshots_track_contributors(n):
    trace = simulate_ring_allreduce(rank_arrays(n, 3 * n))
    everyone = frozenset(range(n))
    assert [(s.phase, s.step) for s in trace.snapshots] == (
        [("reduce-scatter", s) for s in range(n - 1)] + [("all-gather", s) for s in range(n - 1)]
    )
    # after reduce-scatter step s, rank r's chunk (r - s - 1) % n sums s + 2 ranks
    for s in range(n - 1):
        holdings = trace.snapshots[s].holdings
        for r in range(n):
            assert len(holdings[r][(r - s - 1) % n]) == s + 2
    # after reduce-scatter, rank r holds the reduced chunk (r + 1) % n
    last_rs = trace.snapshots[n - 2].holdings
    for r in range(n):
        assert last_rs[r][(r + 1) % n] == everyone
    # at the end everything is fully reduced
    assert all(h == everyone for row in trace.snapshots[-1].holdings for h in row)


def test_one_rank_moves_nothing():
    trace = simulate_ring_allreduce([np.arange(5)])
    assert trace.correct and trace.transfers == [] and trace.snapshots == []
    assert trace.sent_bytes == [0] and trace.received_bytes == [0]
    star = simulate_star_allreduce([np.arange(5)])
    assert star.correct and star.transfers == [] and star.sent_bytes == [0]


@pytest.mark.parametrize("n", range(2, 9))
@pytest.mark.parametrize("root", [0, 1])
def test_star_bytes_and_sum(n, root):
    length = 11
    trace = simulate_star_allreduce(rank_arrays(n, length), root=root)
    size = 8 * length
    assert isinstance(trace, AllReduceTrace)
    assert trace.correct
    for rank in range(n):
        expected = (n - 1) * size if rank == root else size
        assert trace.sent_bytes[rank] == expected
        assert trace.received_bytes[rank] == expected
    assert sum(trace.sent_bytes) == 2 * (n - 1) * size
    assert {t.phase for t in trace.transfers} == {"reduce", "broadcast"}
    assert all(t.chunk == -1 and t.nbytes == size for t in trace.transfers)
    assert all(h == frozenset(range(n)) for row in trace.snapshots[-1].holdings for h in row)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_same_total_but_star_root_carries_n_times_more(n):
    arrays = rank_arrays(n, 40 * n)
    ring, star = simulate_ring_allreduce(arrays), simulate_star_allreduce(arrays)
    assert sum(ring.sent_bytes) == sum(star.sent_bytes) == 2 * (n - 1) * arrays[0].nbytes
    # the root's sends and receives happen in different phases (forward, backward), serially;
    # a ring rank sends and receives at the same time, so its link is busy for its sends alone
    root_busy = star.sent_bytes[0] + star.received_bytes[0]
    assert root_busy == n * max(ring.sent_bytes) == n * max(ring.received_bytes)


def test_float_arrays_use_allclose():
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(37) for _ in range(5)]
    trace = simulate_ring_allreduce(arrays)
    assert trace.correct
    np.testing.assert_allclose(trace.outputs[2], sum(arrays))


def test_small_integer_dtype_adds_in_its_own_dtype():
    arrays = [np.full(6, 100, dtype=np.int8) for _ in range(3)]  # 300 wraps to 44 in int8
    trace = simulate_ring_allreduce(arrays)
    assert trace.correct
    assert trace.expected.dtype == np.int8
    np.testing.assert_array_equal(trace.outputs[0], np.full(6, 44, dtype=np.int8))


# --- wrong schedules ------------------------------------------------------------------------


def off_by_one_reduce_scatter(num_ranks, step):
    # sends the chunk one position too far ahead: partial sums land on the wrong chunks
    return [(r, (r + 1) % num_ranks, (r - step + 1) % num_ranks) for r in range(num_ranks)]


def doubled_all_gather(num_ranks, step):
    return ring_all_gather_sends(num_ranks, step) * 2


def lazy_all_gather(num_ranks, step):
    return []


@pytest.mark.parametrize("n", [3, 4, 5])
def test_wrong_chunk_gives_wrong_result(n):
    trace = simulate_ring_allreduce(
        rank_arrays(n, 4 * n), reduce_scatter_sends=off_by_one_reduce_scatter)
    assert not trace.correct


def test_wrong_schedules_change_bytes():
    n, length = 4, 16
    good = simulate_ring_allreduce(rank_arrays(n, length))
    doubled = simulate_ring_allreduce(rank_arrays(n, length), all_gather_sends=doubled_all_gather)
    lazy = simulate_ring_allreduce(rank_arrays(n, length), all_gather_sends=lazy_all_gather)
    assert doubled.correct  # the same data twice still overwrites correctly ...
    assert doubled.sent_bytes == [s + s // 2 for s in good.sent_bytes]  # ... at 1.5x the bytes
    assert not lazy.correct
    assert lazy.sent_bytes == [s // 2 for s in good.sent_bytes]


def test_odd_sizes_wrong_chunk_moves_different_bytes():
    # length 5 over 4 ranks: chunk 0 has 2 elements, the others 1; sending chunk 0 every time
    def always_chunk_zero(num_ranks, step):
        return [(r, (r + 1) % num_ranks, 0) for r in range(num_ranks)]

    trace = simulate_ring_allreduce(rank_arrays(4, 5), reduce_scatter_sends=always_chunk_zero)
    assert not trace.correct
    chunk_bytes = [16, 8, 8, 8]  # int64
    # reduce-scatter: 3 steps of chunk 0; all-gather (right schedule): chunks (r + 1 - s) % 4
    expected = [3 * 16 + sum(chunk_bytes[(r + 1 - s) % 4] for s in range(3)) for r in range(4)]
    assert expected == [80, 80, 72, 80]
    assert trace.sent_bytes == expected
    good = simulate_ring_allreduce(rank_arrays(4, 5))
    assert trace.sent_bytes != good.sent_bytes


def test_numpy_int_sends_are_accepted():
    def numpy_sends(num_ranks, step):
        return [tuple(np.int64(v) for v in s) for s in ring_reduce_scatter_sends(num_ranks, step)]

    assert simulate_ring_allreduce(rank_arrays(3, 6), reduce_scatter_sends=numpy_sends).correct


def test_step_byte_table():
    n, length = 3, 9  # int64, 3 elements per chunk = 24 bytes
    rows = step_byte_table(simulate_ring_allreduce(rank_arrays(n, length)))
    assert len(rows) == 2 * (n - 1) * n
    assert all(row["sent"] == row["received"] == 24 for row in rows)
    assert [(r["phase"], r["step"], r["rank"]) for r in rows[:3]] == [
        ("reduce-scatter", 0, 0), ("reduce-scatter", 0, 1), ("reduce-scatter", 0, 2)]
    star_rows = step_byte_table(simulate_star_allreduce(rank_arrays(n, length)))
    root_reduce = [r for r in star_rows if r["phase"] == "reduce" and r["rank"] == 0][0]
    assert root_reduce == {"phase": "reduce", "step": 0, "rank": 0, "sent": 0,
                           "received": 2 * 72}


def student_sends(returned):
    """A sends function, as a student writes one, that returns ``returned`` at every step."""
    def student_sends(num_ranks, step):
        return returned
    return student_sends


def ring_with(returned):
    return lambda: simulate_ring_allreduce(rank_arrays(4, 8),
                                           reduce_scatter_sends=student_sends(returned))


@pytest.mark.parametrize("call, error, parameter", [
    (lambda: simulate_ring_allreduce([]), ValueError, "arrays"),
    (lambda: simulate_ring_allreduce(np.zeros((2, 3))), TypeError, "arrays"),
    (lambda: simulate_ring_allreduce([[1, 2, 3]]), TypeError, "arrays[0]"),
    (lambda: simulate_ring_allreduce([np.zeros((2, 2))]), ValueError, "arrays[0]"),
    (lambda: simulate_ring_allreduce([np.zeros(3), np.zeros(4)]), ValueError, "arrays"),
    (lambda: simulate_ring_allreduce([np.zeros(3), np.zeros(3, dtype=np.int64)]), ValueError,
     "arrays"),
    (lambda: simulate_ring_allreduce([np.zeros(3, dtype=bool)]), TypeError, "arrays[0]"),
    (lambda: simulate_star_allreduce([np.array(["a", "b"])]), TypeError, "arrays[0]"),
    (lambda: simulate_star_allreduce(rank_arrays(3, 4), root=3), ValueError, "root"),
    (lambda: simulate_star_allreduce(rank_arrays(3, 4), root=1.0), TypeError, "root"),
    # a wrong schedule: the message names the sends function
    (ring_with([(0, 4, 0)]), ValueError, "student_sends"),
    (ring_with([(-1, 1, 0)]), ValueError, "student_sends"),
    (ring_with([(0, 1, 4)]), ValueError, "student_sends"),
    (ring_with([(2, 2, 0)]), ValueError, "student_sends"),
    (ring_with(None), TypeError, "student_sends"),
    (ring_with([(0, 1)]), TypeError, "student_sends"),
    (ring_with([(0, True, 1)]), TypeError, "student_sends"),
])
def test_bad_input_names_the_parameter(call, error, parameter):
    with pytest.raises(error) as info:
        call()
    assert parameter in str(info.value)
