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


def test_one_phase_alone_runs_with_a_ring_that_fits_it():
    report = submit(reduce_scatter_sends)
    assert report.all_passed
    assert report.notes == ["all_gather_sends: not given, so a ring all-gather that starts from "
                            "the chunk your reduce-scatter leaves summed on each rank runs that "
                            "phase."]
    assert submit(all_gather_sends).all_passed


# The ring the other way round: rank r sends to r - 1. A valid all-reduce, same bytes.
def mirrored_reduce_scatter_sends(num_ranks, step):
    n = num_ranks
    return [(r, (r - 1) % n, (r + step) % n) for r in range(n)]


def mirrored_all_gather_sends(num_ranks, step):
    n = num_ranks
    return [(r, (r - 1) % n, (r - 1 + step) % n) for r in range(n)]


mirrored_reduce_scatter_sends.__name__ = "reduce_scatter_sends"
mirrored_all_gather_sends.__name__ = "all_gather_sends"


def test_mirrored_ring_passes_check_and_submit_alone_and_together():
    """Issue 22: it failed check (1/5) and each phase alone (14/23); graded by its effect now."""
    for schedule in (mirrored_reduce_scatter_sends, mirrored_all_gather_sends):
        table = check(schedule)
        assert table.all_passed, table
        assert "the ring the other way round" in table.results[1].got
        assert submit(schedule).all_passed
    assert submit(mirrored_reduce_scatter_sends, mirrored_all_gather_sends).all_passed


def test_mixed_directions_fail_and_say_where_the_all_gather_should_start():
    report = submit(mirrored_reduce_scatter_sends, all_gather_sends)
    results = [r for r in report.failures if r.category.endswith("result")]
    # every setting's result but n = 2's (the same ring both ways), and nothing else: the bytes
    # and the steps are a ring's
    assert len(results) == len(report.failures) == 9
    # n = 2 is the same ring both ways; n = 3: after the mirrored reduce-scatter rank 0 holds
    # chunk 2 summed, while the course's all-gather has rank 0 send chunk 1 first.
    assert ("rank 0 holds chunk 2 summed, but sends chunk 1 at the all-gather's step 0"
            in results[0].reason), results[0].reason


def test_chunks_numbered_otherwise_pass_submit_alone():
    def reduce_scatter_sends(num_ranks, step):  # each rank starts with chunk r + 1, not r
        n = num_ranks
        return [(r, (r + 1) % n, (r + 1 - step) % n) for r in range(n)]

    assert submit(reduce_scatter_sends).all_passed
    assert not check(reduce_scatter_sends).all_passed  # check knows the course's numbering


def test_lists_are_accepted_where_tuples_are_asked_for():
    def reduce_scatter_sends(num_ranks, step):
        n = num_ranks
        return [[r, (r + 1) % n, (r - step) % n] for r in range(n)]

    assert check(reduce_scatter_sends).all_passed
    assert submit(reduce_scatter_sends).all_passed


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
    assert report.passed == 0
    assert report.failures[0].reason == ("reduce_scatter_sends(2, 0) must return a list of (src, "
                                         "dst, chunk) sends, each a tuple (or list) of 3 ints; "
                                         "got str")
    report = submit(all_gather_sends)
    assert report.passed == 0 and "cannot send to itself" in report.failures[0].reason
    table = check(reduce_scatter_sends)
    assert "list of (src, dst, chunk) sends" in table.failures[0].reason


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
    assert "list of (src, dst, chunk) sends" in report.failures[0].reason


def test_a_trace_too_large_to_send_back_is_a_reported_failure():
    def all_gather_sends(num_ranks, step):
        n = num_ranks  # every chunk to every rank, again and again: a huge trace
        return [(r, d, c) for r in range(n) for d in range(n) if d != r for c in range(n)] * 4

    report = submit(all_gather_sends)
    reasons = {r.reason for r in report.failures}
    assert any("did not come back" in reason and "more than 20000 values" in reason
               for reason in reasons), reasons
