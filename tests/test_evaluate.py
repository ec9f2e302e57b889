"""One evaluator behind every view: the explorer and the plan show the same numbers for the same
setting, and HSDP's figures hold against a hand derivation and against the strategies it joins.
"""

import itertools

import pytest

from dpcost import explorer_model as X
from dpcost import registry
from dpcost.evaluate import evaluate, memory
from dpcost.plan import plan
from dpcost.presets import GPUS, INTERCONNECTS, MODELS
from dpcost.setting import Setting, preset_facts

# 36 settings across every control (model, precision, attention, n, GPUs per node, GPU,
# optimizer, DDP's bucket cap, batch) and so every strategy the two views show.
MODEL_NAMES = ("ResNet-50", "GPT-2 small", "GPT-2 XL", "Llama-2 7B")
CASES = [
    (model, precision, attention, n, per_node, gpu, optimizer, cap, per_gpu)
    for (model, precision, attention, optimizer), (n, per_node, gpu, cap, per_gpu) in zip(
        itertools.product(MODEL_NAMES, ("fp32", "mixed", "bf16"), ("sdpa", "eager"),
                          ("adam", "sgd", "sgd_momentum")),
        itertools.cycle([(1, 8, "H100 SXM 80GB", None, 4), (2, 8, "A100 SXM 80GB", 1, 1),
                         (8, 8, "H100 SXM 80GB", 250, 2), (16, 8, "A100 SXM 80GB", None, 1),
                         (64, 4, "H100 SXM 80GB", 5, 8), (4, 4, "A100 SXM 80GB", 100, 3)]))
][::2]
assert len(CASES) == 36


def _link(gpu):
    return INTERCONNECTS["NVLink 4 (H100)" if gpu.startswith("H100") else "NVLink 3 (A100)"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_the_explorer_and_the_plan_show_the_same_numbers(case):
    model, precision, attention, n, per_node, gpu, optimizer, cap, per_gpu = case
    s = X.scenario(MODELS[model], precision, n, per_node, _link(gpu),
                   INTERCONNECTS["InfiniBand NDR"], GPUS[gpu], cap, optimizer,
                   per_gpu * n, attention)
    p = plan(preset_facts(model, precision, attention), gpus=n, gpus_per_node=per_node,
             gpu=gpu, precision=precision, batch=per_gpu, bucket_cap_mb=cap,
             optimizer={"sgd_momentum": "momentum"}.get(optimizer, optimizer))
    assert s["dp_available"] == p["dp_available"]
    if s["dp_available"] and n > 1:
        for path in ("copy", "nccl"):
            assert s["dp_bytes"][path] == p["traffic"][f"dp_{path}"]["busy_bytes"]
    if s["dp_available"]:
        assert s["steps"][X.DP_COPY].total_s == p["steps"]["dp_copy"]["total_s"]
        assert s["steps"][X.DP_NCCL].total_s == p["steps"]["dp_nccl"]["total_s"]
    assert s["ddp_bytes"] == p["traffic"]["ddp"]["busy_bytes"]
    ddp = s["steps"][s["ddp_name"]]
    assert (ddp.total_s, ddp.exposed_communication_s) == (
        p["steps"]["ddp"]["total_s"], p["steps"]["ddp"]["exposed_communication_s"])
    assert s["hsdp_bytes"]["inter"] == p["traffic"]["hsdp"]["inter_node_bytes"]
    assert s["steps"][X.HSDP].total_s == p["steps"]["hsdp"]["total_s"]
    for key, parts in s["memory"].items():
        assert parts == p["memory"][key], key
        assert s["fits"][key] == p["fits"][key], key


def test_no_view_assembles_costs_of_its_own():
    """The explorer and the plan import the evaluator, and neither calls the floors' step or
    traffic assemblers directly."""
    import inspect

    from dpcost.plan import costs

    for module in (X, costs):
        source = inspect.getsource(module)
        assert "evaluate" in source
        for assembler in ("ddp_step_time(", "dp_step_time(", "dp_path_traffic(",
                          "memory_per_gpu(", "rank_memory("):
            assert assembler not in source, (module.__name__, assembler)


# --- HSDP ----------------------------------------------------------------------------------


def _setting(n, per_node, precision="mixed"):
    return Setting(preset_facts("GPT-2 XL", precision), gpus=n, gpus_per_node=per_node,
                   batch=n)


def test_hsdp_bytes_per_rank_inside_and_across_nodes_by_hand():
    """Per rank per step, s GPUs per node and m nodes: all-gather in forward and again in
    backward, (s-1)/s P each, a reduce-scatter of (s-1)/s G inside the node; the 1/s shard of
    the gradients all-reduced across nodes, 2 (m-1)/m G/s (``foreach_reduce``)."""
    r = evaluate(_setting(32, 8), keys=("hsdp",))
    P = G = MODELS["GPT-2 XL"].parameters * 2  # mixed: 16-bit parameters and gradients
    s, m = 8, 4
    assert r["hsdp"].busiest_bytes == pytest.approx(7 / 8 * (2 * P + G), rel=1e-12)
    assert r["hsdp"].inter_node_bytes == pytest.approx(2 * (m - 1) / m * G / s, rel=1e-12)


def test_hsdp_on_one_node_is_fsdp_and_with_one_gpu_per_node_holds_ddps_states():
    one_node = evaluate(_setting(8, 8))
    assert one_node["hsdp"].memory == one_node["fsdp"].memory == one_node["zero3"].memory
    assert one_node["hsdp"].busiest_bytes == one_node["fsdp"].busiest_bytes
    assert one_node["hsdp"].inter_node_bytes == 0
    spread = evaluate(_setting(8, 1))  # every GPU its own node: nothing to shard inside one
    states = ("parameters", "gradients", "optimizer state")
    assert [spread["hsdp"].memory[c] for c in states] == [spread["ddp"].memory[c] for c in states]
    assert spread["hsdp"].inter_node_bytes == pytest.approx(2 * 7 / 8 * spread.gradient_bytes)


def test_hsdp_states_are_zero3s_over_a_node():
    """Model states per rank: the ZeRO paper's stage 3 over the s GPUs of one node
    (``strategies.fsdp_model_states`` with n = s), whatever the number of nodes."""
    from dpcost.strategies import bytes_per_parameter, fsdp_model_states

    for n in (8, 16, 64):
        held = memory(_setting(n, 8), "hsdp")
        states = held["parameters"] + held["gradients"] + held["optimizer state"]
        expected = fsdp_model_states(MODELS["GPT-2 XL"].parameters, 8, True,
                                     *bytes_per_parameter("mixed", "adam"))[0]
        assert states == pytest.approx(expected, rel=1e-12)


def test_every_view_reads_the_registry():
    from dpcost.memory import SHARDED_COMPONENTS
    from dpcost.plan.costs import STRATEGY_NAMES
    from dpcost.plots.style import DDP_COLOR
    from dpcost.strategies import LADDER

    assert LADDER == tuple(s.ladder for s in registry.STRATEGIES if s.ladder)
    assert all(SHARDED_COMPONENTS[k] == registry.BY_KEY[k].sharded for k in SHARDED_COMPONENTS)
    assert X.STRATEGY_NAMES["hsdp"] == STRATEGY_NAMES["hsdp"] == registry.BY_KEY["hsdp"].label
    assert DDP_COLOR == registry.BY_KEY["ddp"].color
    assert len({s.color for s in registry.STRATEGIES}) == len(registry.STRATEGIES)


def test_ddp_across_nodes_sends_each_gpus_shard_and_fsdp_without_resharding_peaks_higher():
    """Two-level all-reduce (``step_time.hierarchical_allreduce_time``): each GPU all-reduces
    its 1/g of G over the N nodes, 2 (N-1)/N G/g; its total per rank is still 2 (n-1)/n G.
    FSDP without resharding keeps every unit's gathered parameters, p Psi, at its peak
    (``strategies.fsdp_model_states``)."""
    from dpcost.strategies import bytes_per_parameter, fsdp_model_states

    r = evaluate(_setting(32, 8))
    G = r.gradient_bytes
    assert r["ddp"].inter_node_bytes == pytest.approx(2 * 3 / 4 * G / 8, rel=1e-12)
    assert r["ddp"].busiest_bytes == pytest.approx(2 * 31 / 32 * G, rel=1e-12)
    held = r["fsdp_no_reshard"].memory
    peak = fsdp_model_states(MODELS["GPT-2 XL"].parameters, 32, False,
                             *bytes_per_parameter("mixed", "adam"))[1]
    assert held["parameters"] + held["gradients"] + held["optimizer state"] == pytest.approx(
        peak, rel=1e-12)


def test_fsdp_shards_frozen_parameters_as_torch_does():
    """fully_shard shards every parameter of a module, frozen ones too (torch 2.13, a fake
    process group of 4 ranks in this process); the evaluator's FSDP and ZeRO-3 hold 1/n of
    them, DDP all of them."""
    pytest.importorskip("torch")
    import torch
    import torch._dynamo  # noqa: F401 - before any process group (DESIGN.md: torch's bug)
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
        model[0].requires_grad_(False)
        fully_shard(model)
        frozen = list(model[0].parameters())
        assert sum(p.to_local().numel() for p in frozen) * 4 == sum(p.numel() for p in frozen)
    finally:
        dist.destroy_process_group()
    from dataclasses import replace

    facts = replace(preset_facts("GPT-2 small"), frozen_elements=10**8, frozen_bytes=2e8)
    setting = Setting(facts, gpus=4, gpus_per_node=4, batch=4)
    bare = Setting(preset_facts("GPT-2 small"), gpus=4, gpus_per_node=4, batch=4)
    for key, share in (("fsdp", 1 / 4), ("zero3", 1 / 4), ("ddp", 1.0)):
        extra = memory(setting, key)["parameters"] - memory(bare, key)["parameters"]
        assert extra == pytest.approx(2e8 * share), key
