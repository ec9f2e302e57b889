"""dpcost.migration's recorder (what a checked script writes, nothing when unset), the tolerance
scaled to the optimizer, the findings a recorded optimizer adds, and the check's help: no ranks
here (tests/test_migration_check.py runs the check)."""

import json

import pytest
import torch
import torch.nn as nn

from dpcost import migration as m


def test_the_recorder_does_nothing_when_the_check_is_not_running(tmp_path, monkeypatch):
    monkeypatch.delenv(m.RECORD_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    record = m.Recorder()
    record.samples("anything", epoch="not checked")  # returns at once: no check, no cost
    record.saved()
    record.result(loss=None, params=None)
    assert list(tmp_path.iterdir()) == []


def test_the_recorder_writes_what_the_script_saw(tmp_path, monkeypatch):
    """No optimizer here: building one imports torch._dynamo (seconds); the check's own test
    (tests/test_migration_check.py) records a real Adam's name, lr and steps."""
    monkeypatch.setenv(m.RECORD_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    record = m.Recorder()
    for epoch, batches in enumerate([[[3, 1], [0, 2]], [[2, 0], [1, 3]]]):
        for index in batches:
            record.samples(torch.tensor(index), epoch=epoch)
    record.samples(7, epoch=2)
    record.saved()
    record.result(loss=torch.tensor(0.25), params=nn.DataParallel(model))
    line = json.loads((tmp_path / "rank1.json").read_text())
    assert line["sample_ids"] == [[3, 1, 0, 2], [2, 0, 1, 3], [7]]
    assert line["params"] == [p.item() for p in torch.cat([model.weight.flatten(), model.bias])]
    assert line["checksum"] == pytest.approx(sum(abs(p) for p in line["params"]))
    assert line["checkpoint_writes"] == 1 and line["final_loss"] == 0.25
    assert line["optimizer"] is None
    assert [p.name for p in tmp_path.iterdir()] == ["rank1.json"]  # no .part left


def test_the_recorder_refuses_bad_input_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv(m.RECORD_ENV, str(tmp_path))
    record = m.Recorder()
    with pytest.raises(ValueError, match="epoch must be an int >= 0, got -1"):
        record.samples([0], epoch=-1)
    with pytest.raises(ValueError, match="index must hold sample ids"):
        record.samples(torch.tensor([0.5]), epoch=0)
    with pytest.raises(ValueError, match="params must be an nn.Module, a tensor or tensors"):
        record.result(loss=0.0, params=[1.0])


def result(params, sample_ids, optimizer=None):
    return {"params": params, "sample_ids": sample_ids, "rank_checksums": [1.0] * len(sample_ids),
            "checkpoint_writes": 0, "optimizer": optimizer}


ADAM = {"name": "Adam", "lr": 1e-3, "steps": 24.0}
REF = result([0.0, 1.0], [[[0, 1, 2, 3], [2, 0, 3, 1]]], ADAM)


def test_the_tolerance_scales_with_an_adaptive_optimizer():
    """1 % of lr x steps, the farthest Adam moves a parameter; atol for SGD or none recorded."""
    assert m.parameter_tolerance(REF) == (pytest.approx(2.4e-4),
                                          "0.00024 = 0.01 x lr 0.001 x 24 steps, Adam")
    assert m.parameter_tolerance(result([], [], {"name": "SGD", "lr": 0.1, "steps": None})) == \
        (1e-5, "1e-05")
    assert m.parameter_tolerance(result([], [], None)) == (1e-5, "1e-05")
    tiny = {"name": "AdamW", "lr": 1e-6, "steps": 10.0}  # 1e-7 < atol: atol stays
    assert m.parameter_tolerance(result([], [], tiny))[0] == 1e-5


def test_a_correct_adam_migration_3_47e_5_apart_passes_once_adam_is_recorded():
    """The issue's case: 3.47e-5 apart with Adam. Flagged at the fixed 1e-5, the finding then
    names rounding amplified by an adaptive optimizer; accepted once the optimizer is known."""
    ddp = result([3.47e-5, 1.0], [[[0, 2], [2, 3]], [[1, 3], [0, 1]]], ADAM)
    assert m.diagnose(REF, ddp) == []
    unknown = dict(REF, optimizer=None)
    (finding,) = m.diagnose(unknown, dict(ddp, optimizer=None))
    assert "up to 3.47e-05 (tolerance 1e-05)" in finding
    assert "an adaptive optimizer (Adam) also grows float rounding" in finding


def test_a_recorded_optimizer_adds_its_own_findings():
    wrong_lr = result([0.0, 1.0], [[[0, 2], [2, 3]], [[1, 3], [0, 1]]],
                      {"name": "Adam", "lr": 2e-3, "steps": 24.0})
    assert m.diagnose(REF, wrong_lr) == [
        "the optimizer differs: Adam with lr 0.002 under DDP, Adam with lr 0.001 in one process "
        "(a global batch split over the ranks keeps the one-process lr)"]
    half_steps = result([0.0, 1.1], [[[0, 2], [2, 3]], [[1, 3], [0, 1]]],
                        {"name": "Adam", "lr": 1e-3, "steps": 12.0})
    steps, params = m.diagnose(REF, half_steps)
    assert steps.startswith("the DDP run took 12 optimizer steps, one process 24")
    assert "up to 0.1" in params and "a summed loss does not show here" not in params


def test_records_are_read_by_rank_and_refused_when_missing(tmp_path):
    line = {"sample_ids": [[0, 1]], "params": [0.5], "checksum": 0.5, "final_loss": 1.0,
            "checkpoint_writes": 1, "optimizer": None}
    (tmp_path / "rank0.json").write_text(json.dumps(line))
    (tmp_path / "rank1.json").write_text(json.dumps(dict(line, sample_ids=[[2, 3]])))
    merged = m._as_result(m._read_records(tmp_path, "ddp_script", tmp_path / "d.py", 2))
    assert merged["sample_ids"] == [[[0, 1]], [[2, 3]]] and merged["checkpoint_writes"] == 2
    assert merged["samples_per_rank"] == [2, 2] and merged["world_size"] == 2
    with pytest.raises(m.CheckInputError, match=r"ddp_script: d.py ran, but rank 2 never called"):
        m._read_records(tmp_path, "ddp_script", tmp_path / "d.py", 3)
    (tmp_path / "rank0.json").write_text(json.dumps(dict(line, sample_ids=[])))
    with pytest.raises(m.CheckInputError, match=r"d.py never called record.samples\(\)"):
        m._read_records(tmp_path, "ddp_script", tmp_path / "d.py", 1)


def test_a_failed_rank_is_reported_by_its_own_last_stderr_line(tmp_path):
    for rank, text in ((0, "Traceback ...\nKeyError: 'label'\n"), (1, "")):
        folder = tmp_path / "run_abc" / "attempt_0" / str(rank)
        folder.mkdir(parents=True)
        (folder / "stderr.log").write_text(text)
    assert m._last_line(m._rank_stderr(tmp_path)) == "KeyError: 'label'"
    assert m._last_line("") == "(no output on stderr)"


def test_help_describes_the_check(capsys):
    with pytest.raises(SystemExit) as exiting:
        m.main(["--help"])
    assert exiting.value.code == 0
    text = capsys.readouterr().out
    for words in ("python -m dpcost.migration check my_dp.py my_ddp.py", "record.samples(",
                  "record.result(", "exit status 0 when the migration is right, 1 when not, 2",
                  "DistributedSampler(dataset, num_replicas=1, rank=0)", "examples/own_migration"):
        assert words in text, words
    with pytest.raises(SystemExit) as exiting:
        m.main(["check", "--help"])
    assert "--optimizer-tolerance" in capsys.readouterr().out


def test_the_rank_that_names_the_failure_is_reported_not_a_peer_cut_mid_traceback(tmp_path):
    cut = ('Traceback (most recent call last):\n  File "ddp.py", line 58\n'
           '    "final_loss": float(loss),\n')
    named = "Traceback (most recent call last):\n  File \"ddp.py\"\nValueError: bad batch\n"
    for rank, text in ((0, cut), (1, named)):
        folder = tmp_path / "run_abc" / "attempt_0" / str(rank)
        folder.mkdir(parents=True)
        (folder / "stderr.log").write_text(text)
    assert m._last_line(m._rank_stderr(tmp_path)) == "ValueError: bad batch"
    (tmp_path / "run_abc" / "attempt_0" / "1" / "stderr.log").write_text("")
    assert m._last_line(m._rank_stderr(tmp_path)) == '"final_loss": float(loss),'  # all there is


class RandInForward(nn.Module):
    """Noise drawn from torch's global generator in the forward: per-step randomness that no
    dropout module shows."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, x):
        return self.linear(x + 0.1 * torch.rand_like(x))


def _train_recorded(model, tmp_path, monkeypatch, augment=None):
    """Two epochs of two batches with the recorder on; the line it wrote."""
    import random

    monkeypatch.setenv(m.RECORD_ENV, str(tmp_path))
    monkeypatch.delenv("RANK", raising=False)
    record = m.Recorder()
    x = torch.ones(4, 2)
    for epoch in range(2):
        for index in ([0, 1], [2, 3]):
            if augment == "python":
                random.random()  # a random augmentation written with Python's random
            model(x[index]).sum().backward()
            record.samples(index, epoch=epoch)
    record.result(loss=0.0, params=model)
    return json.loads((tmp_path / "rank0.json").read_text())


def test_the_recorder_notes_which_generator_a_step_drew_from(tmp_path, monkeypatch):
    """Batches are compared within an epoch (2 epochs x 2 batches: 2 intervals); a generator
    that moved between two of them drew in a step. torch.rand in the forward moves torch's;
    an augmentation with Python's random moves that one; a plain model moves none."""
    plain = _train_recorded(nn.Linear(2, 1), tmp_path, monkeypatch)
    assert plain["random_draws"] == {"batches": 2}
    noisy = _train_recorded(RandInForward(), tmp_path, monkeypatch)
    assert noisy["random_draws"] == {"batches": 2, "torch": 2}
    augmented = _train_recorded(nn.Linear(2, 1), tmp_path, monkeypatch, augment="python")
    assert augmented["random_draws"] == {"batches": 2, "random": 2}
    model = nn.Sequential(nn.Linear(2, 4), nn.BatchNorm1d(4), nn.Dropout(0.25),
                          nn.Dropout(0.0), nn.Linear(4, 1))
    named = _train_recorded(model, tmp_path, monkeypatch)
    assert named["dropout_modules"] == ["2 (p=0.25)"]  # p = 0 draws nothing
    assert named["batchnorm_modules"] == ["1"]
    assert named["random_draws"]["torch"] == 2  # nn.Dropout(0.25) drew a mask in each step


def _draw(draws, **facts):
    return {"params": [0.0, 1.0], "sample_ids": [[[0, 1], [1, 0]]], "rank_checksums": [1.0],
            "checkpoint_writes": 0, "optimizer": None, "random_draws": draws, **facts}


def test_a_parameter_difference_is_blamed_on_randomness_and_on_batchnorm_only_if_present():
    """The issue's case: a correct migration of a model with dropout, left on, ended 0.0226
    apart and was blamed on BatchNorm it did not have. Randomness a run drew is named first,
    dropout by its modules; BatchNorm only when the model has it."""
    ref = _draw({"batches": 4}, dropout_modules=[], batchnorm_modules=[])
    ddp = dict(_draw({"batches": 4}, dropout_modules=[], batchnorm_modules=[]),
               params=[0.0226, 1.0], sample_ids=[[[0], [1]], [[1], [0]]],
               rank_checksums=[1.0, 1.0])
    (finding,) = m.diagnose(ref, ddp)
    assert "BatchNorm" not in finding and "mean, not sum" in finding
    (finding,) = m.diagnose(dict(ref, batchnorm_modules=["net.1"]), ddp)
    assert "BatchNorm (net.1)" in finding
    dropout = {"batches": 4, "torch": 4}
    (finding,) = m.diagnose(dict(ref, random_draws=dropout, dropout_modules=["enc.drop (p=0.1)"],
                                 batchnorm_modules=["net.1"]), dict(ddp, random_draws=dropout))
    assert "enc.drop (p=0.1)" in finding and "dropout" in finding and "BatchNorm" not in finding
    assert "torch's default generator after 4 of 4 batches" in finding
    # dropout turned off by the check, and still a draw: something else, named as such
    (finding,) = m.diagnose(dict(ref, random_draws=dropout, dropout_modules=["enc.drop (p=0.1)"],
                                 dropout_off={"F.dropout": 0.1}), ddp)
    assert "turned dropout off (F.dropout)" in finding and "torch.rand in the forward" in finding


def test_elements_moved_by_rounding_alone_are_left_out_of_the_comparison():
    """Two elements differ by 0.01; the second's gradient scale is 1e-11 against 1e-2, zero
    up to rounding: left out, and the runs agree. Without the scale, nothing is left out."""
    ref = dict(result([0.5, 0.0, 1.0], [[[0, 1]]], ADAM), gradient_scale=[1e-2, 1e-11, 3e-4],
               param_names=[["w", 1], ["key_bias", 2]])
    ddp = dict(ref, params=[0.5, 0.01, 1.0], sample_ids=[[[0]], [[1]]],
               rank_checksums=[1.0, 1.0])
    assert m.rounding_driven(ref, ddp) == ({1}, ["key_bias"])
    assert m.max_param_diff(ref, ddp, {1}) == 0.0 and m.max_param_diff(ref, ddp) == 0.01
    assert m.diagnose(ref, ddp) == []
    (finding,) = m.diagnose(dict(ref, gradient_scale=None), dict(ddp, gradient_scale=None))
    assert "up to 0.01" in finding


def test_turning_dropout_off_makes_every_dropout_the_identity(monkeypatch):
    """What the check does in a checked script (its import, with the recorder on): nn.Dropout,
    a TransformerEncoderLayer's dropouts and attention dropout give what p = 0 gives (torch's
    own layer built with dropout 0), draw nothing, and are named."""
    import torch.nn.functional as F

    for name in (*m.DROPOUT_FUNCTIONS, "scaled_dot_product_attention"):
        monkeypatch.setattr(F, name, getattr(F, name))  # put back after the test
    record = m.Recorder()
    m.turn_dropout_off(record)
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, nhead=2, dim_feedforward=16, dropout=0.5,
                                       batch_first=True).train()
    torch.manual_seed(0)
    without = nn.TransformerEncoderLayer(8, nhead=2, dim_feedforward=16, dropout=0.0,
                                         batch_first=True).train()
    x = torch.randn(3, 5, 8)
    state = torch.get_rng_state()
    assert torch.equal(layer(x), without(x))
    assert torch.equal(nn.Dropout(0.5).train()(x), x)
    assert torch.equal(torch.get_rng_state(), state)  # no mask drawn
    assert record._dropout_off == {"F.dropout": 0.5, "F.scaled_dot_product_attention": 0.5}
    assert torch.equal(nn.Dropout(0.5).eval()(x), x) and F.dropout(x, 0.5, training=False) is x
