"""dpcost.strategies: each strategy's bytes, messages and model-state memory, by hand."""

import math

import pytest

from dpcost import strategies as st

MB = 10**6


def test_precisions_give_the_zero_papers_bytes_per_parameter():
    assert st.bytes_per_parameter("fp32", "adam") == (4, 4, 8)  # 16 B
    assert st.bytes_per_parameter("mixed", "adam") == (2, 2, 12)  # 16 B, ZeRO paper 3.1
    assert st.bytes_per_parameter("bf16", "adam") == (2, 2, 4)  # 8 B
    assert st.bytes_per_parameter("fp32", "sgd") == (4, 4, 0)
    assert st.bytes_per_parameter("mixed", "sgd_momentum") == (2, 2, 8)


def test_model_state_memory_follows_the_zero_paper():
    # ZeRO paper, figure 1: Psi = 7.5B, n = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.88 GB
    psi, n = 7.5e9, 64
    mixed = st.bytes_per_parameter("mixed", "adam")  # 2 + 2 + 12, the paper's
    assert st.model_state_bytes(psi, n, 0, *mixed) == pytest.approx(120e9)
    assert st.model_state_bytes(psi, n, 1, *mixed) == pytest.approx(4 * psi + 12 * psi / 64)
    assert st.model_state_bytes(psi, n, 1, *mixed) / 1e9 == pytest.approx(31.4, abs=0.05)
    assert st.model_state_bytes(psi, n, 2, *mixed) / 1e9 == pytest.approx(16.6, abs=0.05)
    assert st.model_state_bytes(psi, n, 3, *mixed) / 1e9 == pytest.approx(1.875)
    # the course's default precision is mixed: the paper's 2 + 2 + 12
    assert st.model_state_bytes(psi, n, 1) == st.model_state_bytes(psi, n, 1, *mixed)


def test_collectives_per_rank():
    assert st.ring_allreduce_bytes(8 * MB, 4) == 12 * MB  # 2 * 3/4 * 8
    assert st.allgather_bytes(8 * MB, 4) == 6 * MB
    assert st.reduce_scatter_bytes(8 * MB, 4, "nccl") == 6 * MB
    assert st.reduce_scatter_bytes(8 * MB, 4, "gloo") == 12 * MB  # gloo: a full all-reduce


def test_gloo_broadcast_is_a_binomial_tree():
    # n = 8, root 0: vrank 0 sends in rounds 0, 1, 2; 1 sends in rounds 1, 2; 2 and 3 in
    # round 2; 4..7 are leaves. Every non-root receives once.
    sends = [st.broadcast_bytes(1, 8, 0, r, "gloo")[0] for r in range(8)]
    assert sends == [3, 2, 1, 1, 0, 0, 0, 0]
    received = [st.broadcast_bytes(1, 8, 0, r, "gloo")[1] for r in range(8)]
    assert received == [0] + [1] * 7
    # n = 5, root 2: vranks (rank - 2) mod 5; vrank 0 sends to 1, 2, 4; vrank 1 to 3
    assert [st.broadcast_bytes(1, 5, 2, r)[0] for r in range(5)] == [0, 0, 3, 1, 0]
    # nccl: a chain root -> root+1 -> ...; the last one only receives
    assert [st.broadcast_bytes(1, 4, 1, r, "nccl") for r in range(4)] == [
        (0, 1), (1, 0), (1, 1), (1, 1)]


def test_allreduce_latency():
    assert st.allreduce_latency_s(5, 4, 1e-5) == pytest.approx(5 * 6 * 1e-5)


def test_ddp_and_accumulation():
    cost = st.ddp(8 * MB, 4, num_buckets=3, num_params=2 * MB)
    assert (cost.sent_bytes, cost.received_bytes, cost.messages) == (12 * MB, 12 * MB, 3)
    assert cost.state_after_step_bytes == cost.peak_state_bytes == 16 * 2 * MB  # fp32 Adam
    acc = st.accumulation(8 * MB, 4, 4, samples_per_micro_step=16)
    assert acc.sent_bytes == 12 * MB  # per optimizer step: unchanged
    assert acc.extra["bytes_per_micro_step"] == 3 * MB
    assert acc.extra["bytes_per_sample"] == 12 * MB / 64


def test_compress_hooks_halve_fp32_gradients():
    for dtype in ("fp16", "bf16"):
        assert st.compress_hook(8 * MB, 2, dtype).sent_bytes == 4 * MB  # 2*1/2*8/2
    assert st.compress_hook(8 * MB, 2, "bf16", grad_dtype="bf16").sent_bytes == 8 * MB


def test_powersgd_elements_by_hand():
    # 256 x 256 weight, rank 1: (256 + 256) * 1 * 2 < 65536 -> compressed, P 256 and Q 256.
    # bias (256,) is a 256 x 1 matrix: (257) * 1 * 2 >= 256 -> uncompressed.
    # conv weight (64, 3, 3, 3) -> 64 x 27, rank 4: (91) * 4 * 2 = 728 < 1728 -> compressed.
    # 4 x 4 at rank 2: (8) * 2 * 2 = 32 >= 16 -> uncompressed.
    e = st.powersgd_elements([(256, 256), (256,), (64, 3, 3, 3), (4, 4)], 4)
    assert e == dict(uncompressed=256 + 16, p=256 * 4 + 64 * 4, q=256 * 4 + 27 * 4,
                     compressed_tensors=2, uncompressed_tensors=2)
    one = st.powersgd_elements([(256, 256), (256,)], 1)
    assert (one["p"], one["q"], one["uncompressed"]) == (256, 256, 256)
    # min_compression_rate decides: 512 * 1 * 200 >= 65536 -> not worth it
    assert st.powersgd_elements([(256, 256)], 1, min_compression_rate=200)["p"] == 0


def test_powersgd_bytes_before_and_after_start():
    shapes = [(256, 256), (256,)] * 4
    p = 4 * 4 * (256 * 256 + 256)
    before = st.powersgd(shapes, 2, 1, iteration=1, start_powersgd_iter=2)
    assert before.sent_bytes == p * 2 * 1 / 2 and before.messages == 1
    after = st.powersgd(shapes, 2, 1, iteration=2, start_powersgd_iter=2,
                        buckets=[[0, 1, 2, 3], [4, 5, 6, 7]])
    elements = 4 * (256 + 256 + 256)  # per layer: P 256, Q 256, bias 256 uncompressed
    assert after.sent_bytes == elements * 4  # 2(n-1)/n = 1 at n = 2
    assert after.messages == 6  # three all-reduces per bucket
    # model state: after the step DDP's; at the peak + the error feedback, g Psi
    psi = p / 4
    kept = st.powersgd(shapes, 2, 1, iteration=2, start_powersgd_iter=2, num_params=psi,
                       precision="mixed")
    assert kept.state_after_step_bytes == 16 * psi
    assert kept.peak_state_bytes == 16 * psi + 2 * psi


def test_zero1_partition_and_bytes():
    # greedy, largest first, to the least-loaded (lowest) rank
    assert st.zero1_partition([10, 10, 1, 1], 2) == [0, 1, 0, 1]
    assert st.zero1_partition([5, 3, 3], 2) == [0, 1, 1]
    numels = [100, 100, 10, 10]  # P = 880 B of fp32; shards 440 B each
    cost = st.zero1(numels, 2, rank=0, precision="fp32")
    assert cost.sent_bytes == 880 + 440 and cost.received_bytes == 880 + 440
    assert cost.messages == 1 + 4  # one gradient bucket, one broadcast per parameter
    assert st.zero1(numels, 2, parameters_as_bucket_view=True).messages == 1 + 2
    assert cost.state_after_step_bytes == 8 * 220 + 8 * 110  # fp32 p + g, K=8 on its shard
    assert cost.peak_state_bytes == cost.state_after_step_bytes
    # n = 3 on gloo: shards 100, 100+..., each root sends once to each of 2 others (tree)
    three = st.zero1([30, 30, 30], 3, rank=0)
    assert three.sent_bytes == pytest.approx(2 * 2 / 3 * 360 + 2 * 120)
    assert three.received_bytes == pytest.approx(2 * 2 / 3 * 360 + 2 * 120)


def test_fsdp_full_sharding_and_no_reshard_on_both_backends():
    p, n = 8 * MB, 4
    unit = (n - 1) / n * p
    assert st.fsdp(p, n, True, "nccl").sent_bytes == pytest.approx(3 * unit)
    assert st.fsdp(p, n, True, "gloo").sent_bytes == pytest.approx(4 * unit)
    assert st.fsdp(p, n, False, "nccl").sent_bytes == pytest.approx(2 * unit)
    assert st.fsdp(p, n, False, "gloo").sent_bytes == pytest.approx(3 * unit)
    assert st.fsdp(p, n, True, num_units=4).messages == 12
    assert st.fsdp(p, n, False, num_units=4).messages == 8
    # after the step both hold their shards; the peak without resharding adds p Psi
    full = st.fsdp(p, n, True, num_params=2 * MB, precision="mixed")
    assert full.state_after_step_bytes == full.peak_state_bytes == 16 * 2 * MB / 4
    kept = st.fsdp(p, n, False, num_params=2 * MB, precision="mixed")
    assert kept.state_after_step_bytes == 16 * 2 * MB / 4
    assert kept.peak_state_bytes == 2 * 2 * MB + 16 * 2 * MB / 4
    # a rank's own shards, when given: 3 of 10 rows
    assert st.fsdp(p, n, True, num_params=10, local_numel=3).state_after_step_bytes == 16 * 3


def test_dp_paths():
    copy0 = st.dp_copy_path(8 * MB, 4, rank=0)
    assert copy0.sent_bytes == copy0.received_bytes == 24 * MB
    assert st.dp_copy_path(8 * MB, 4, rank=2).sent_bytes == 8 * MB
    assert st.dp_nccl_path(8 * MB, 4, rank=0).sent_bytes == 8 * MB


def test_the_ladder_has_every_rung_in_order():
    shapes = [(256, 256), (256,)] * 4
    rows = st.ladder(shapes, 2, precision="fp32")
    assert len(rows) == len(st.LADDER) == 10
    p = 4 * 4 * (256 * 256 + 256)
    by = dict(zip(st.LADDER, rows, strict=True))
    assert by["DDP"].sent_bytes == p
    assert by["+ bf16 hook"].sent_bytes == p / 2
    assert by["FSDP full sharding"].sent_bytes == 2 * p  # 4(n-1)/n on gloo
    assert by["FSDP no reshard"].sent_bytes == 1.5 * p
    assert by["ZeRO-1"].sent_bytes == 1.5 * p
    psi = p / 4
    after = {rung: cost.state_after_step_bytes for rung, cost in by.items()}
    peak = {rung: cost.peak_state_bytes for rung, cost in by.items()}
    assert after["DDP"] == after["PowerSGD"] == 16 * psi
    assert after["ZeRO-1"] == 8 * psi + 8 * psi / 2
    assert after["FSDP full sharding"] == after["FSDP no reshard"] == 16 * psi / 2
    assert peak["PowerSGD"] == 16 * psi + 4 * psi  # + error feedback, fp32
    assert peak["FSDP no reshard"] == 16 * psi / 2 + 4 * psi  # + unsharded parameters
    assert {r for r in st.LADDER if peak[r] != after[r]} == {"PowerSGD", "FSDP no reshard"}
    # FSDP2's shards are torch.chunk's: 3 ranks of 256 rows hold 86, 86 and 84
    three = dict(zip(st.LADDER, st.ladder(shapes, 3, rank=2), strict=True))
    assert three["FSDP full sharding"].state_after_step_bytes == 16 * 4 * (84 * 256 + 84)
    assert math.isclose(by["PowerSGD"].sent_bytes, 4 * 768 * 4)


@pytest.mark.parametrize("call, name", [
    (lambda: st.powersgd([(4, 4)], 2, 0), "matrix_approximation_rank"),
    (lambda: st.powersgd_elements([(4, 4)], -1), "matrix_approximation_rank"),
    (lambda: st.accumulation(1e6, 2, 0), "micro_steps"),
    (lambda: st.bytes_per_parameter("fp8"), "precision"),
    (lambda: st.bytes_per_parameter("mixed", "lion"), "optimizer"),
    (lambda: st.compress_hook(1e6, 2, "fp8"), "dtype"),
    (lambda: st.fsdp(1e6, 2, backend="mpi"), "backend"),
    (lambda: st.model_state_bytes(1e6, 2, stage=4), "stage"),
    (lambda: st.ddp(-1, 2), "size_bytes"),
    (lambda: st.ddp(1e6, 0), "num_gpus"),
    (lambda: st.powersgd([()], 2), "shapes[0]"),
    (lambda: st.broadcast_bytes(1, 2, 2, 0), "root"),
])
def test_bad_input_names_the_parameter(call, name):
    with pytest.raises(ValueError, match=name.replace("[", r"\[")):
        call()


def test_wrong_types_are_type_errors():
    with pytest.raises(TypeError, match="micro_steps"):
        st.accumulation(1e6, 2, 2.5)
    with pytest.raises(TypeError, match="reshard_after_forward"):
        st.fsdp(1e6, 2, "yes")


def test_ladder_model_states_for_llama_on_80_gb():
    psi = 6_738_415_616  # Llama-2 7B (dpcost.presets)
    states = st.ladder_model_states(psi, 8, "mixed")  # mixed-precision Adam: 2 + 2 + 12
    assert states["DDP"] == 16 * psi
    assert states["PowerSGD"] == 18 * psi  # + the error-feedback copy of the gradients
    assert states["ZeRO-1"] == 4 * psi + 12 * psi / 8
    assert states["FSDP no reshard"] == 2 * psi + 16 * psi / 8
    assert states["FSDP full sharding"] == states["HSDP"] == 2 * psi  # one node: HSDP = FSDP
    fits = [rung for rung, b in states.items() if b <= st.H100_SXM_MEMORY_BYTES]
    assert fits == ["ZeRO-1", "FSDP no reshard", "FSDP full sharding", "HSDP"]
    assert list(states) == list(st.LADDER)
    # Llama-2 70B on 8 nodes of 8: FSDP shards over 64, HSDP only over a node's 8
    seventy = st.ladder_model_states(68_976_648_192, 64, "mixed")
    assert seventy["HSDP"] == 16 * 68_976_648_192 / 8 > st.H100_SXM_MEMORY_BYTES
    assert seventy["FSDP full sharding"] == 16 * 68_976_648_192 / 64
    after = st.ladder_model_states(psi, 8, "mixed", definition="after step")
    assert after["PowerSGD"] == after["DDP"] == 16 * psi  # the census has no error feedback
    assert after["FSDP no reshard"] == after["FSDP full sharding"] == 2 * psi
    assert {r for r in st.LADDER if after[r] != states[r]} == {"PowerSGD", "FSDP no reshard"}
    with pytest.raises(ValueError, match="definition"):
        st.ladder_model_states(psi, 8, definition="between steps")


def test_fsdp2_pads_shards_to_the_first_chunk():
    # torch.chunk(500 rows, 3) -> 167, 167, 166; every shard is padded to 167 rows
    assert [st.fsdp_shard_rows(500, 3, r) for r in range(3)] == [167, 167, 166]
    assert [st.fsdp_shard_rows(4, 3, r) for r in range(3)] == [2, 2, 0]
    shapes = [(500, 500), (500,)]
    assert st.fsdp_padded_param_bytes(shapes, 3) == 4 * (501 * 500 + 501)
    assert st.fsdp_padded_param_bytes(shapes, 2) == 4 * (500 * 500 + 500)  # n divides: P
    assert st.fsdp_local_numel(shapes, 3, 2) == 166 * 500 + 166


@pytest.mark.parametrize("precision", ["fp32", "mixed", "bf16", "fp16"])
@pytest.mark.parametrize("optimizer", ["adam", "sgd_momentum", "sgd"])
def test_model_states_agree_with_the_memory_model(precision, optimizer):
    from dpcost.memory import model_state_bytes_per_rank

    p, g, k = st.bytes_per_parameter(precision, optimizer)
    for stage, strategy in enumerate(("ddp", "zero1", "zero2", "zero3")):
        memory = sum(model_state_bytes_per_rank(7_000_000, 8, strategy, precision,
                                                optimizer).values())
        assert st.model_state_bytes(7_000_000, 8, stage, p, g, k) == memory  # one rule
