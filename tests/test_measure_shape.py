"""dpcost.measure.shape: the Linear stack closest to a requested size, and its bytes."""

import pytest

from dpcost.measure.shape import model_shape, param_bytes_of


def test_param_bytes_counts_weights_and_biases_in_float32():
    assert param_bytes_of(2, 3) == 3 * (4 + 2) * 4


@pytest.mark.parametrize("size", [2.5e5, 1e6, 4e6, 16e6])
def test_shape_is_within_one_percent_of_the_request(size):
    width, depth = model_shape(size)
    assert abs(param_bytes_of(width, depth) / size - 1) < 0.01
