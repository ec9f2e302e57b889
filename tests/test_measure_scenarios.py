"""dpcost.measure.scenarios: the model's bytes, one-buffer views, the CUDA scenario's guard."""

import pytest
import torch

from dpcost.measure.scenarios import _flatten_into_views, build_model, dataparallel_cuda
from dpcost.measure.shape import param_bytes_of


def test_the_model_holds_exactly_param_bytes_of_float32():
    model = build_model(30, 3)
    assert sum(p.numel() * p.element_size() for p in model.parameters()) == param_bytes_of(30, 3)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_flattening_keeps_values_and_makes_views():
    model = build_model(5, 2)
    values = [p.detach().clone() for p in model.parameters()]
    flat = _flatten_into_views(list(model.parameters()))
    assert flat.numel() == sum(v.numel() for v in values)
    for p, v in zip(model.parameters(), values, strict=True):
        assert torch.equal(p.detach(), v)
    flat.zero_()  # one write to the buffer reaches every parameter
    assert all(float(p.detach().abs().sum()) == 0.0 for p in model.parameters())


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="checks the guard on < 2 GPUs")
def test_dataparallel_cuda_needs_two_gpus():
    with pytest.raises(RuntimeError, match="needs >= 2 CUDA GPUs"):
        dataparallel_cuda(8, 1)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="the CUDA scenario needs >= 2 GPUs")
def test_dataparallel_cuda_counts_gpu0_star():
    p = param_bytes_of(256, 4)
    rows = dataparallel_cuda(256, 4, steps=3)
    n = len(rows)
    # parameters out and gradients in, plus the batch scattered and the outputs gathered
    assert rows[0]["sent_bytes"] >= (n - 1) * p and rows[0]["received_bytes"] >= (n - 1) * p
