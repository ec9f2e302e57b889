"""Memory model: components recomputed by hand on small models, the n x on the outputs,
the ratio's behaviour on real presets, and errors that name the parameter."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpcost.memory import (
    COMPONENTS,
    OPTIMIZER_STATE_BYTES_PER_PARAM,
    ddp_bucket_buffer_bytes,
    format_memory_table,
    gpu0_memory_ratio,
    memory_per_gpu,
    total_bytes,
)
from dpcost.presets import MODELS, custom_model

KEYS = ["parameters", "gradients", "optimizer state", "activations", "outputs",
        "loss and output grads"]


def test_small_case_by_hand():
    # 1000 parameters, 10 outputs and 400 activation bytes per sample, 4 GPUs, batch 8, Adam.
    model = custom_model(1000, output_elements_per_sample=10, activation_bytes_per_sample=400)
    mem = memory_per_gpu(model, 4, 8, "adam", "fp32")
    assert list(mem) == ["dp_gpu0", "dp_other", "ddp_rank"]
    # fp32 params 4000 B, grads 4000 B, Adam 8000 B, activations 400 * 2 samples = 800 B,
    # outputs of the whole batch 8 * 10 * 4 = 320 B.
    assert list(mem["dp_gpu0"].items()) == list(zip(
        KEYS, [4000.0, 4000.0, 8000.0, 800.0, 320.0, 640.0], strict=True))
    assert list(mem["dp_other"].items()) == list(zip(
        KEYS, [4000.0, 4000.0, 0.0, 800.0, 80.0, 80.0], strict=True))
    assert list(mem["ddp_rank"].items()) == list(zip(
        KEYS, [4000.0, 4000.0, 8000.0, 800.0, 80.0, 160.0], strict=True))
    assert gpu0_memory_ratio(model, 4, 8) == pytest.approx(17760 / 17040)
    assert tuple(KEYS) == COMPONENTS


def test_dtype_and_optimizer_by_hand():
    model = custom_model(1000, output_elements_per_sample=10, activation_bytes_per_sample=400)
    mem = memory_per_gpu(model, 2, 4, "sgd_momentum", "bf16")
    # bf16: 2 bytes per parameter, gradient, output; activations scale 2/4 from fp32;
    # momentum stays fp32 (4 bytes per parameter).
    assert list(mem["dp_gpu0"].values()) == [2000.0, 2000.0, 4000.0, 400.0, 80.0, 160.0]
    assert list(mem["dp_other"].values()) == [2000.0, 2000.0, 0.0, 400.0, 40.0, 40.0]
    assert list(mem["ddp_rank"].values()) == [2000.0, 2000.0, 4000.0, 400.0, 40.0, 80.0]
    assert memory_per_gpu(model, 2, 4, "sgd")["ddp_rank"]["optimizer state"] == 0.0
    assert OPTIMIZER_STATE_BYTES_PER_PARAM == {"sgd": 0, "sgd_momentum": 4, "adam": 8}


def test_one_gpu_dp_equals_ddp_and_has_no_other_gpu():
    mem = memory_per_gpu(MODELS["GPT-2 small"], 1, 4)
    assert mem["dp_gpu0"] == mem["ddp_rank"]
    assert all(v == 0.0 for v in mem["dp_other"].values())
    assert gpu0_memory_ratio(MODELS["GPT-2 small"], 1, 4) == 1.0


@given(n=st.integers(1, 64), batch=st.integers(1, 4096),
       model=st.sampled_from(list(MODELS.values())),
       optimizer=st.sampled_from(["sgd", "sgd_momentum", "adam"]),
       dtype=st.sampled_from(["fp32", "bf16", "fp16"]))
def test_outputs_grow_exactly_n_times_and_only_they_differ(n, batch, model, optimizer, dtype):
    mem = memory_per_gpu(model, n, batch, optimizer, dtype)
    gpu0, ddp = mem["dp_gpu0"], mem["ddp_rank"]
    # The seed's n x lives in the batch-of-outputs terms: GPU0 holds all n replicas' outputs.
    assert gpu0["outputs"] == pytest.approx(n * ddp["outputs"], rel=1e-12)
    assert gpu0["loss and output grads"] == pytest.approx(n * ddp["loss and output grads"],
                                                          rel=1e-12)
    for key in ["parameters", "gradients", "optimizer state", "activations"]:
        assert gpu0[key] == ddp[key]
    assert 1.0 <= gpu0_memory_ratio(model, n, batch, optimizer, dtype) <= n


def test_ddp_ranks_are_all_equal_and_split_the_batch():
    model = MODELS["ResNet-50"]
    for n in (2, 4, 8):
        ddp = memory_per_gpu(model, n, 256)["ddp_rank"]
        # n ranks together hold the whole batch's activations and outputs once.
        assert n * ddp["activations"] == pytest.approx(256 * model.activation_bytes_per_sample)
        assert n * ddp["outputs"] == 256 * 1000 * 4
        # Each rank keeps the full model state: params + grads (4 B each) + Adam (8 B).
        assert ddp["parameters"] + ddp["gradients"] + ddp["optimizer state"] == 16 * 25_557_032


def test_ratio_grows_with_batch_for_large_outputs_and_not_for_resnet():
    gpt2 = MODELS["GPT-2 small"]
    ratios = [gpu0_memory_ratio(gpt2, 8, b) for b in (8, 32, 128, 1024)]
    assert ratios == sorted(ratios) and ratios[-1] > ratios[0] + 0.5
    # Limit as the batch grows: (A/n + 3*O1) / (A/n + 3*O1/n) with per-sample A and O1 bytes.
    act, out = gpt2.activation_bytes_per_sample, 4 * gpt2.output_elements_per_sample
    limit = (act / 8 + 3 * out) / (act / 8 + 3 * out / 8)
    assert ratios[-1] < limit
    assert gpu0_memory_ratio(gpt2, 8, 10**7) == pytest.approx(limit, rel=1e-3)
    # ResNet-50's 1000 logits are tiny next to its state and activations: ratio ~ 1.
    assert gpu0_memory_ratio(MODELS["ResNet-50"], 8, 256) < 1.001


def test_dp_gpu0_against_dp_other():
    mem = memory_per_gpu(MODELS["GPT-2 small"], 4, 16)
    gpu0, other = mem["dp_gpu0"], mem["dp_other"]
    assert other["optimizer state"] == 0.0  # the optimizer lives on GPU0 only
    assert other["parameters"] == gpu0["parameters"]  # replicate copies them every forward
    assert total_bytes(gpu0) - total_bytes(other) == pytest.approx(
        gpu0["optimizer state"] + (3 - 2 / 4) * gpu0["outputs"])


def test_bucket_buffers_are_a_gradient_copy():
    assert ddp_bucket_buffer_bytes(MODELS["GPT-2 small"]) == 4 * 124_439_808
    assert ddp_bucket_buffer_bytes(MODELS["GPT-2 small"], "fp16") == 2 * 124_439_808


@pytest.mark.parametrize("kwargs, error, name", [
    ({"model": "GPT-2 small"}, TypeError, "model"),
    ({"num_gpus": 0}, ValueError, "num_gpus"),
    ({"num_gpus": 2.0}, TypeError, "num_gpus"),
    ({"batch_size": 0}, ValueError, "batch_size"),
    ({"batch_size": 8.0}, TypeError, "batch_size"),
    ({"batch_size": True}, TypeError, "batch_size"),
    ({"optimizer": "adamw"}, ValueError, "optimizer"),
    ({"dtype": "int8"}, ValueError, "dtype"),
])
def test_errors_name_the_parameter(kwargs, error, name):
    args = {"model": MODELS["ResNet-50"], "num_gpus": 2, "batch_size": 8, "optimizer": "adam",
            "dtype": "fp32", **kwargs}
    with pytest.raises(error, match=name):
        memory_per_gpu(**args)
    with pytest.raises(error, match=name):
        gpu0_memory_ratio(**args)


def test_error_lists_valid_choices():
    with pytest.raises(ValueError, match="adam.*sgd.*sgd_momentum"):
        memory_per_gpu(MODELS["ResNet-50"], 2, 8, optimizer="lamb")
    with pytest.raises(ValueError, match="bf16.*fp16.*fp32"):
        memory_per_gpu(MODELS["ResNet-50"], 2, 8, dtype="fp64")
    with pytest.raises(ValueError, match="dtype"):
        ddp_bucket_buffer_bytes(MODELS["ResNet-50"], "fp64")


def test_table_prints_the_small_case():
    model = custom_model(1000, output_elements_per_sample=10, activation_bytes_per_sample=400,
                         name="toy")
    table = format_memory_table(model, [(4, 8)], unit="MB").splitlines()
    assert table[0] == "toy, fp32, adam: MB (decimal) held per GPU during one step"
    assert table[3].split() == ["4", "8", "DP", "GPU0", "0.004", "0.004", "0.008", "0.001",
                                "0.000", "0.001", "0.018", f"{17760 / 17040:.3f}x"]
    assert table[5].split()[:3] == ["4", "8", "DDP"] and len(table) == 6
    with pytest.raises(ValueError, match="unit"):
        format_memory_table(model, [(4, 8)], unit="kB")
