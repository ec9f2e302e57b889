"""The explorer's "your module", fed by dpcost.plan on the meta device (pure lane)."""

from dpcost.explorer import YOUR_MODULE, Explorer
from dpcost.plan import plan


def test_your_module_takes_its_counts_from_the_plan():
    explorer = Explorer(model=YOUR_MODULE, spec="dpcost.torch_models:small_cnn",
                        module_input="3,32,32", precision="fp32", gpus=8, batch_size=256)
    planned = plan("dpcost.torch_models:small_cnn", gpus=1, precision="fp32",
                   input_shape="1,3,32,32")
    assert explorer.error is None
    assert explorer.last["model_size_bytes"] == 4 * planned["trainable_parameters"] == 4 * 620_586
    # activations: the traced bytes of one sample, times the 32 samples of each of 8 GPUs
    assert explorer.last["memory"]["ddp"]["activations"] == planned["activation_bytes"] * 32
    assert "your module dpcost.torch_models:small_cnn" in explorer.source.value
    assert not explorer.controls["spec"].disabled and explorer.controls["outputs"].disabled


def test_a_bad_spec_is_named_and_the_presets_still_work():
    explorer = Explorer(model=YOUR_MODULE, spec="no_such_package:build")
    assert explorer.error.startswith("--model: cannot import 'no_such_package'")
    assert "Cannot update" in explorer.readout.value
    explorer.controls["model"].value = "GPT-2 small"
    assert explorer.error is None and explorer.controls["spec"].disabled


def test_token_input():
    explorer = Explorer(model=YOUR_MODULE, spec="dpcost.torch_models:tied_lm",
                        module_input="tokens 16")
    assert explorer.error is None
    assert explorer.last["model_size_bytes"] > 0


def test_your_module_has_ddps_real_buckets_and_its_counted_flops():
    """The explorer's DDP buckets are the plan's (DDP's rebuilt assignment over the module's
    own gradients in ready order), and its compute is the plan's counted FLOPs, not a custom
    model's 6 N per sample. Checked against the plan for two modules, one with tied weights."""
    from dpcost.evaluate import ddp_buckets
    from dpcost.explorer import planned_model
    from dpcost.setting import Setting

    for spec, per_sample, plan_input in (
            ("dpcost.torch_models:small_cnn", "3,32,32", {"input_shape": "1,3,32,32"}),
            ("dpcost.torch_models:tied_lm", "tokens 16", {"batch": 1, "seq": 16})):
        planned = plan(spec, gpus=1, precision="fp32", **plan_input)
        facts = planned_model(spec, per_sample)
        buckets = ddp_buckets(Setting(facts))
        assert buckets["rebuilt_bytes"] == planned["buckets"]["rebuilt_bytes"], spec
        assert facts.parameters == sum(facts.tensor_elements) \
            == planned["trainable_parameters"], spec
        flops = planned["flops"]["forward"] + planned["flops"]["backward"]
        assert facts.per(facts.forward_flops + facts.backward_flops, 32) == 32 * flops, spec
        assert flops != 6 * planned["trainable_parameters"], spec  # not the custom rule
