"""dpcost.torch_models: ResNet-50 and GPT-2 from torch.nn, at the presets' exact counts."""

import math

import pytest
import torch

from dpcost.presets import MODELS
from dpcost.torch_models import (
    GPT2,
    GPT2_CONFIGS,
    GPT2Block,
    GPT2Config,
    count_parameters,
    resnet50,
)


def gpt2_count_by_hand(c: GPT2Config) -> int:
    """Token and position embeddings; per layer two LNs (2 x 2h), c_attn (3h^2 + 3h), c_proj
    (h^2 + h), c_fc (4h^2 + 4h), mlp proj (4h^2 + h); the final LN (2h); the head is tied."""
    h = c.hidden
    per_layer = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (4 * h * h + 4 * h) + (4 * h * h + h)
    return c.vocab * h + c.positions * h + c.layers * per_layer + 2 * h


@pytest.mark.parametrize("name", ["GPT-2 small", "GPT-2 XL"])
def test_gpt2_full_size_count_is_the_presets_on_meta(name):
    with torch.device("meta"):
        model = GPT2(GPT2_CONFIGS[name])
    assert next(model.parameters()).is_meta
    assert count_parameters(model) == MODELS[name].parameters
    assert count_parameters(model) == gpt2_count_by_hand(GPT2_CONFIGS[name])


def test_gpt2_small_count_is_the_model_card_figure():
    with torch.device("meta"):
        assert count_parameters(GPT2(GPT2_CONFIGS["GPT-2 small"])) == 124_439_808


def test_published_configs():
    small, xl = GPT2_CONFIGS["GPT-2 small"], GPT2_CONFIGS["GPT-2 XL"]
    assert (small.vocab, small.positions, small.hidden, small.layers, small.heads) == (
        50257, 1024, 768, 12, 12)
    assert (xl.vocab, xl.positions, xl.hidden, xl.layers, xl.heads) == (50257, 1024, 1600, 48, 25)
    assert small.dropout == xl.dropout == 0.1


def test_resnet50_count_and_layout_match_torchvisions():
    # torchvision's resnet50(): 161 parameter tensors, 320 state_dict entries (53 BatchNorms
    # with 3 buffers each), conv1 7x7x3 -> 64, fc 2048 -> 1000.
    with torch.device("meta"):
        model = resnet50()
    params = dict(model.named_parameters())
    assert count_parameters(model) == MODELS["ResNet-50"].parameters == 25_557_032
    assert len(params) == 161 and len(model.state_dict()) == 320
    assert tuple(params["0.weight"].shape) == (64, 3, 7, 7)
    assert tuple(params["22.weight"].shape) == (1000, 2048)


def test_resnet50_runs_on_a_small_image():
    torch.manual_seed(0)
    model = resnet50(num_classes=10).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, 32, 32))
    assert out.shape == (1, 10) and torch.isfinite(out).all()


TINY = GPT2Config(vocab=97, positions=16, hidden=32, layers=2, heads=4)


def test_eager_and_sdpa_compute_the_same_causal_attention():
    torch.manual_seed(0)
    eager = GPT2(TINY, "eager").eval()
    sdpa = GPT2(TINY, "sdpa").eval()
    sdpa.load_state_dict(eager.state_dict())
    idx = torch.randint(TINY.vocab, (2, 12))
    with torch.no_grad():
        a, b = eager(idx), sdpa(idx)
    assert a.shape == (2, 12, TINY.vocab)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_a_later_token_does_not_change_earlier_logits(attention):
    torch.manual_seed(0)
    model = GPT2(TINY, attention).eval()
    idx = torch.randint(TINY.vocab, (1, 10))
    changed = idx.clone()
    changed[0, 7] = (idx[0, 7] + 1) % TINY.vocab
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7], b[:, 7])


def test_lm_head_is_tied_to_the_token_embedding():
    torch.manual_seed(0)
    model = GPT2(TINY, "eager").eval()  # eager: the mask of future positions is used too
    idx = torch.randint(TINY.vocab, (1, 5))
    with torch.no_grad():
        logits = model(idx)
        hidden = model.drop(model.wte(idx) + model.wpe(torch.arange(5)))
        for block in model.h:
            hidden = block(hidden, torch.ones(5, 5, dtype=torch.bool).triu(1))
        expected = model.ln_f(hidden) @ model.wte.weight.T
    torch.testing.assert_close(logits, expected)


def test_gpt2_initialisation_is_hfs():
    torch.manual_seed(0)
    config = GPT2Config(vocab=1000, positions=256, hidden=256, layers=8, heads=4)
    model = GPT2(config)
    assert model.wte.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert model.h[0].c_fc.weight.std().item() == pytest.approx(0.02, rel=0.02)
    scaled = 0.02 / math.sqrt(2 * config.layers)
    assert model.h[0].mlp_proj.weight.std().item() == pytest.approx(scaled, rel=0.02)
    assert model.h[0].c_proj.weight.std().item() == pytest.approx(scaled, rel=0.05)
    assert torch.count_nonzero(model.h[0].c_attn.bias) == 0
    assert torch.equal(model.ln_f.weight, torch.ones(256))


def test_a_training_step_is_finite():
    torch.manual_seed(0)
    model = GPT2(TINY).train()
    idx = torch.randint(TINY.vocab, (2, 9))
    logits = model(idx[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, TINY.vocab), idx[:, 1:].reshape(-1))
    loss.backward()
    assert loss.item() == pytest.approx(math.log(TINY.vocab), rel=0.1)  # small init: near uniform
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("kwargs,name", [
    ({"hidden": 10, "heads": 3}, "hidden"),
    ({"layers": 0}, "layers"),
    ({"vocab": 2.5}, "vocab"),
    ({"dropout": 1.0}, "dropout"),
])
def test_bad_config_names_the_field(kwargs, name):
    with pytest.raises(ValueError, match=name):
        GPT2Config(**kwargs)


def test_bad_attention_sequence_and_classes_are_refused():
    with pytest.raises(ValueError, match="attention"):
        GPT2Block(TINY, "flash")
    with pytest.raises(ValueError, match="positions"):
        GPT2(TINY)(torch.zeros(1, TINY.positions + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="num_classes"):
        resnet50(num_classes=0)
