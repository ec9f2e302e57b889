"""The ring exercise: right schedules pass; each kind of wrong schedule fails for its reason."""

import pytest

from dpcost import ring
from dpcost.exercises.ring_step import check, course_schedule, submit


def reduce_scatter_sends(num_ranks, step):
    n = num_ranks
    return [(r, (r + 1) % n, (r - step) % n) for r in range(n)]


def all_gather_sends(num_ranks, step):
    n = num_ranks
    return [(r, (r + 1) % n, (r + 1 - step) % n) for r in range(n)]


def test_course_schedule_by_hand():
    # n = 3, step 1: rank 0 passes on chunk 2 (received from rank 2 at step 0), etc.
    assert course_schedule("reduce_scatter_sends", 3, 1) == [(0, 1, 2), (1, 2, 0), (2, 0, 1)]
    assert course_schedule("all_gather_sends", 3, 0) == [(0, 1, 1), (1, 2, 2), (2, 0, 0)]


def test_right_schedules_pass():
    assert check(reduce_scatter_sends).all_passed and check(all_gather_sends).all_passed
    report = submit(reduce_scatter_sends, all_gather_sends)
    assert report.all_passed, report
    assert report.total == 23  # 7 even settings x 2 + 3 balance + 3 uneven x 2
    assert submit().all_passed  # picks up the two defined in this module
    assert not report.notes


def test_one_phase_alone_uses_the_reference_for_the_other():
    report = submit(reduce_scatter_sends)
    assert report.all_passed
    assert report.notes == ["all_gather_sends: not given, so the package's reference schedule "
                            "runs that phase."]


def test_mirrored_ring_passes_submit_but_not_check():
    # The ring the other way round: rank r sends to r - 1. A valid all-reduce, same bytes.
    def reduce_scatter_sends(num_ranks, step):
        n = num_ranks
        return [(r, (r - 1) % n, (r + step) % n) for r in range(n)]

    def all_gather_sends(num_ranks, step):
        n = num_ranks
        return [(r, (r - 1) % n, (r - 1 + step) % n) for r in range(n)]

    assert submit(reduce_scatter_sends, all_gather_sends).all_passed
    assert not check(reduce_scatter_sends).all_passed


def test_star_all_gather_fails_only_the_one_chunk_per_step_rule():
    def all_gather_sends(num_ranks, step):
        n = num_ranks
        if step:
            return []
        return [((c - 1) % n, d, c) for c in range(n) for d in range(n) if d != (c - 1) % n]

    report = submit(all_gather_sends)
    assert {r.category for r in report.failures} == {"n = 5: one chunk per rank per step",
                                                     "n = 8: one chunk per rank per step"}


def test_a_step_that_sends_nothing_fails_result_and_bytes():
    def reduce_scatter_sends(num_ranks, step):
        n = num_ranks
        return [(r, (r + 1) % n, r) for r in range(n)] if step == 0 else []

    report = submit(reduce_scatter_sends)
    failed = {r.category for r in report.failures}
    assert "n = 3: result" in failed and "n = 3: bytes per rank" in failed
    assert "n = 2: result" not in failed  # n = 2 has a single step
    bytes_failure = next(r for r in report.failures if r.category == "n = 4: bytes per rank")
    # n = 4, S = 840 * 8 = 6720 B, chunks of 1680 B: the ring needs 2 * 3 * 1680 = 10080 B per
    # rank; this one sends 1 chunk in reduce-scatter + 3 in the reference all-gather = 6720 B.
    assert "= 10080 bytes" in bytes_failure.reason and "sent 6720" in bytes_failure.reason


def test_wrong_types_and_bad_sends_are_reported_per_test():
    def reduce_scatter_sends(num_ranks, step):
        return "send everything"

    def all_gather_sends(num_ranks, step):
        return [(r, r, 0) for r in range(num_ranks)]

    report = submit(reduce_scatter_sends)
    assert report.passed == 0 and "TypeError" in report.failures[0].reason
    report = submit(all_gather_sends)
    assert report.passed == 0 and "cannot send to itself" in report.failures[0].reason
    table = check(reduce_scatter_sends)
    assert "list of (src, dst, chunk) tuples" in table.failures[0].reason


def test_stub_and_infinite_loop():
    def reduce_scatter_sends(num_ranks, step):
        raise NotImplementedError("write me")

    def all_gather_sends(num_ranks, step):
        while True:
            pass

    assert all("not written yet" in r.reason for r in submit(reduce_scatter_sends).results)
    report = submit(all_gather_sends, timeout=0.2)
    assert report.passed == 0 and "no result within 0.2 s" in report.failures[0].reason


def test_refuses_package_schedules():
    with pytest.raises(ValueError, match="package's own"):
        check(ring.ring_reduce_scatter_sends)
    with pytest.raises(ValueError, match="define"):
        exec("submit()", {"submit": submit})


def test_a_students_module_named_dpcost_something_is_not_the_package():
    namespace = {"__name__": "dpcost_ring"}
    exec("def reduce_scatter_sends(num_ranks, step):\n"
         "    n = num_ranks\n"
         "    return [(r, (r + 1) % n, (r - step) % n) for r in range(n)]\n", namespace)
    fn = namespace["reduce_scatter_sends"]
    assert fn.__module__ == "dpcost_ring"
    assert check(fn).all_passed and submit(fn).all_passed


def test_submit_without_arguments_refuses_an_imported_package_schedule():
    with pytest.raises(ValueError, match="package's own schedule"):
        exec("submit()", {"submit": submit, "all_gather_sends": ring.ring_all_gather_sends})


class RightSendsOnUnpickling:
    """Not a list; unpickled, it becomes the course's sends (computed by the package)."""

    def __init__(self, num_ranks, step):
        self.args = (num_ranks, step)

    def __reduce__(self):
        return (ring.ring_reduce_scatter_sends, self.args)


def test_reduce_that_unpickles_to_the_right_sends_does_not_pass():
    def reduce_scatter_sends(num_ranks, step):
        return RightSendsOnUnpickling(num_ranks, step)

    report = check(reduce_scatter_sends)
    assert report.passed == 0
    assert "list of (src, dst, chunk) tuples" in report.failures[0].reason


def test_a_trace_too_large_to_send_back_is_a_reported_failure():
    def all_gather_sends(num_ranks, step):
        n = num_ranks  # every chunk to every rank, again and again: a huge trace
        return [(r, d, c) for r in range(n) for d in range(n) if d != r for c in range(n)] * 4

    report = submit(all_gather_sends)
    reasons = {r.reason for r in report.failures}
    assert any("did not come back" in reason and "more than 20000 values" in reason
               for reason in reasons), reasons
