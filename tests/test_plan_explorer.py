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
