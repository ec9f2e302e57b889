"""``python -m dpcost.measure --model SPEC`` measures a user's module over gloo, and the bytes
per rank ``dpcost.plan`` predicts for DDP and both DataParallel patterns agree with it within
gloo's framing (UNTIMED lane: starts ranks). One 2-rank run, shared by the tests."""

import contextlib
import io
import json

import pytest

from dpcost.measure.__main__ import main
from dpcost.plan import plan

SPEC, SHAPE, STEPS = "dpcost.torch_models:small_cnn", "8,3,32,32", 3  # BatchNorm: buffers too
# plan's traffic key for each measured pattern
PLANNED = {"ddp": "ddp", "dp": "dp_copy", "dp-nccl": "dp_nccl"}


@pytest.fixture(scope="module")
def measured():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(["--model", SPEC, "--input-shape", SHAPE, "--world-size", "2",
                       "--steps", str(STEPS), "--json"])
    assert status == 0
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def planned():
    return plan(SPEC, gpus=2, precision="fp32", input_shape=SHAPE)


@pytest.mark.parametrize("pattern", list(PLANNED))
def test_plans_bytes_per_rank_agree_with_the_measured_run_within_the_framing(measured,
                                                                             planned, pattern):
    # The test_measure_traffic bound: what is left after the payload and the framing predicted
    # from the message count is at most one 144-byte message or a tenth of that framing.
    per_gpu = planned["traffic"][PLANNED[pattern]]["model_bytes_per_gpu"]
    for rank in measured["ranks"]:
        framing = measured["predicted_framing"][pattern][rank["rank"]]
        for i, direction in enumerate(("sent", "received")):
            payload = per_gpu[rank["rank"]][i]
            left = rank[pattern][f"{direction}_bytes"] - payload - framing[i]
            assert payload > 0 and framing[i] > 0
            assert abs(left) <= max(144.0, 0.1 * framing[i]), (pattern, rank["rank"], direction,
                                                               left)


def test_the_ddp_buckets_measured_are_the_rebuilt_ones_plan_predicts(measured, planned):
    assert measured["ranks"][0]["ddp"]["bucket_sizes"] == planned["buckets"]["rebuilt_bytes"]


def test_measure_refuses_a_module_without_its_input(capsys):
    assert main(["--model", SPEC]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--input-shape" in err
