"""dpcost.measure.bucket_order: DDP's rebuilt buckets on 2 gloo ranks, both settings.

Starts ranks: listed in conftest.py's SERIAL.
"""

import pytest

from dpcost.measure import bucket_order as bo

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def measured():
    return bo.measure()


def test_default_reduces_the_small_bucket_first_and_the_large_one_last(measured):
    default = measured[0]
    assert default["small_last_bucket"] is False
    assert [b["bytes"] for b in default["buckets"]] == [4_004_000, 12_012_000]
    assert [b["index"] for b in default["buckets"]] == [0, 1]  # handed over in index order
    assert sorted(default["buckets"][0]["params"]) == ["6.bias", "6.weight"]  # the last layer
    assert default["rebuilt_bucket_sizes"] == [4_004_000, 12_012_000]  # DDP's own account


def test_set_last_bucket_cap_moves_the_small_cap_to_the_last_bucket(measured):
    small_last = measured[1]
    assert small_last["small_last_bucket"] is True
    assert [b["bytes"] for b in small_last["buckets"]] == [12_016_000, 4_000_000]
    assert small_last["buckets"][-1]["params"] == ["0.weight"]  # the first layer's weight
    assert small_last["rebuilt_bucket_sizes"] == [12_016_000, 4_000_000]


def test_strategies_predicts_both_from_the_measured_ready_order(measured):
    for result in measured:
        # gradients ready from the last layer to the first, each bias before its weight
        assert result["ready"] == [f"{layer}.{kind}" for layer in (6, 4, 2, 0)
                                   for kind in ("bias", "weight")]
        assert [sorted(names) for names in bo.predicted(result)] == \
            [sorted(b["params"]) for b in result["buckets"]]
        assert sum(b["bytes"] for b in result["buckets"]) == 16_016_000


def test_the_table_marks_the_exposed_bucket(measured):
    table = bo.format_table(measured)
    assert table.count("(last: exposed)") == 2
    assert "12,012,000  layer 2 (b, w) + layer 1 (b, w) + layer 0 (b, w) (last: exposed)" in table
    assert "4,000,000  layer 0 (w) (last: exposed)" in table


def test_bad_timeout_names_the_parameter():
    with pytest.raises(ValueError, match="timeout_s"):
        bo.measure(timeout_s=0)


def test_find_unused_parameters_keeps_its_first_buckets_and_never_rebuilds():
    """Lesson 09: with find_unused_parameters=True the caps apply from the first iteration, over
    the parameters in registration order, reversed (the 1 MiB cap on layer 0's weight, reduced
    last), and are never rebuilt; by default the first iteration has one bucket and the rebuild
    splits it in ready order."""
    measured = bo.measure_find_unused()
    default, unused = measured["default"], measured["find unused"]
    assert default["first"] == [16_016_000] and default["last"] == [4_004_000, 12_012_000]
    assert default["rebuilt_bucket_sizes"] == [4_004_000, 12_012_000]
    assert unused["first"] == unused["last"] == [12_016_000, 4_000_000]
    assert unused["rebuilt_bucket_sizes"] == []  # DDP logged no rebuild
