"""dpcost.plots.migration: the placement rules, counted independently, and the figure."""

import pytest

from dpcost.plots.migration import SETUPS, gpu_placement, gpu_placement_figure

C, S, K = 5.0, 100.0, 70.0


def totals(gpus):
    return [sum(gpu.values()) for gpu in gpus]


def test_with_set_device_and_map_location_every_gpu_holds_the_same():
    assert totals(gpu_placement(4, SETUPS[0], C, S, K)) == [C + S + K] * 4


def test_without_set_device_gpu0_holds_every_ranks_context():
    gpus = gpu_placement(4, "no set_device", C, S, K)
    assert gpus[0]["CUDA context"] == 4 * C
    assert totals(gpus)[1:] == [C + S + K] * 3


def test_without_map_location_gpu0_holds_every_copy_of_the_checkpoint():
    gpus = gpu_placement(3, "no map_location", C, S, K)
    assert gpus[0]["checkpoint read back"] == 3 * K and gpus[0]["CUDA context"] == 3 * C
    assert totals(gpus)[1:] == [C + S] * 2
    assert sum(totals(gpus)) == (3 + 2) * C + 3 * S + 3 * K  # n own contexts + n-1 on GPU0


@pytest.mark.parametrize("kwargs, words", [
    ({"num_gpus": 0}, "num_gpus must be an int >= 1"),
    ({"setup": "nope"}, "setup must be one of"),
    ({"context_bytes": -1}, "context_bytes must be a number of bytes >= 0"),
])
def test_bad_input_names_the_parameter(kwargs, words):
    args = {"num_gpus": 2, "setup": SETUPS[0], "context_bytes": C, "state_bytes": S,
            "checkpoint_bytes": K, **kwargs}
    with pytest.raises(ValueError, match=words):
        gpu_placement(**args)


def test_figure_draws_what_it_returns():
    fig, data = gpu_placement_figure(4)
    assert set(data) == set(SETUPS) and len(fig.axes) == 3
    bars = fig.axes[1].patches  # "no set_device": GPU0's context bar is the first patch
    assert bars[0].get_height() == pytest.approx(data["no set_device"][0]["CUDA context"] / 1e9)
    assert all(ax.get_title() for ax in fig.axes) and fig.axes[0].get_ylabel()
