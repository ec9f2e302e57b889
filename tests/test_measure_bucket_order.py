"""dpcost.measure.bucket_order refuses a bad timeout by name, before any rank starts.

Its measurements run in the lessons, under nbval, and are checked there: lesson 07 (``measure``:
both bucket orders, the ready order, each bucket's parameters and bytes against
``dpcost.buckets``' prediction and DDP's own log, the table of the exposed bucket) and lesson 09
(``measure_find_unused``: one bucket then the rebuild by default, capped buckets never rebuilt
with ``find_unused_parameters=True``). This file re-ran both, 2 gloo ranks each, for the same
assertions.
"""

import pytest

from dpcost.measure import bucket_order as bo


@pytest.mark.parametrize("measure", [bo.measure, bo.measure_find_unused])
@pytest.mark.parametrize("timeout_s", [0, -1.0, float("inf"), True, "60"])
def test_bad_timeout_names_the_parameter(measure, timeout_s):
    with pytest.raises(ValueError, match="timeout_s"):
        measure(timeout_s=timeout_s)
