"""dpcost.plan's DDP buckets against a real DDP on 2 gloo ranks (UNTIMED lane: starts ranks).

One 2-rank run (``dpcost.measure.plan_buckets.measure``, module-scoped) builds all four modules
(ResNet-50, nn.TransformerEncoder, a module with a frozen parameter, one with tied weights);
each test compares one of DDP's own accounts with what ``plan`` predicts on the meta device.
"""

import pytest

from dpcost.measure.plan_buckets import CASES, measure
from dpcost.plan import plan


@pytest.fixture(scope="module")
def real():
    return measure()


@pytest.fixture(scope="module")
def planned():
    out = {}
    for name, spec, shape, vocab in CASES:
        kwargs = ({"batch": shape[0], "seq": shape[1]} if vocab
                  else {"input_shape": ",".join(map(str, shape))})
        out[name] = plan(spec, gpus=2, precision="fp32", **kwargs)
    return out


NAMES = [case[0] for case in CASES]


@pytest.mark.parametrize("name", NAMES)
def test_construction_buckets_are_ddps(real, planned, name):
    assert planned[name]["buckets"]["construction_bytes"] == real[name]["bucket_sizes"]


@pytest.mark.parametrize("name", NAMES)
def test_rebuilt_buckets_are_ddps(real, planned, name):
    assert planned[name]["buckets"]["rebuilt_bytes"] == real[name]["rebuilt_bucket_sizes"]
    assert planned[name]["buckets"]["rebuilt"] == real[name]["rebuilt_indices"]


@pytest.mark.parametrize("name", NAMES)
def test_gradient_ready_order_is_ddps(real, planned, name):
    assert planned[name]["ready_order"] == real[name]["ready_order"]


def test_the_cases_show_what_they_are_for(real, planned):
    # ResNet-50's rebuilt order is not the reversed parameter order (a block's shortcut and a
    # batch norm's bias come first), and the tied embedding (parameter 0) is ready last.
    order = real["ResNet-50"]["ready_order"]
    assert order != sorted(order, reverse=True)
    assert len(real["ResNet-50"]["rebuilt_bucket_sizes"]) > 1
    assert real["tied weights"]["ready_order"][-1] == 0
    # the frozen Linear's weight and bias are in no bucket: 4 of the 6 parameters are
    assert sorted(real["frozen parameter"]["ready_order"]) == [0, 1, 2, 3]
    assert planned["frozen parameter"]["frozen_parameters"] == 512 * 512 + 512
