"""Beyond plain DDP: what each strategy moves and holds per rank per optimizer step.

Every function returns a ``StrategyCost``: bytes a rank sends and receives per optimizer step,
the collective calls (messages) it takes part in, and its model-state memory (parameters,
gradients, optimizer state; activations come on top). Symbols: n ranks, P bytes of the
gradients as DDP holds them (= parameter bytes), S the bytes of one collective's tensor,
Psi the number of parameters. Pure Python, no torch.

Per rank per optimizer step (ring all-reduce: 2 (n-1)/n S each way; all-gather and a true
reduce-scatter: (n-1)/n S each way):

=============================  ==========================  =================================
strategy                       bytes sent (= received)     where in PyTorch
=============================  ==========================  =================================
DDP                            2 (n-1)/n P                 ``reducer.cpp``, one per bucket
+ accumulation over k          2 (n-1)/n P (per sample /k) ``DistributedDataParallel.no_sync``
+ fp16 / bf16 hook             2 (n-1)/n P / 2             ``default_hooks.py: _compress_hook``
PowerSGD, rank r               2 (n-1)/n (U + r(m+k)) w    ``powerSGD_hook.py: powerSGD_hook``
ZeRO-1                         2 (n-1)/n P + broadcasts    ``zero_redundancy_optimizer.py``
FSDP, full sharding            3 (n-1)/n P (NCCL)          ``fully_shard``: AG, AG, RS
                               4 (n-1)/n P (gloo)          gloo's RS is an all-reduce
FSDP, no reshard after fwd     2 (n-1)/n P (NCCL)          ``reshard_after_forward=False``
                               3 (n-1)/n P (gloo)
=============================  ==========================  =================================

Gloo has no native reduce-scatter: ``ProcessGroupGloo::_reduce_scatter_base`` calls
``reduce_scatter_tensor_coalesced``, which clones the input, runs a full ``allreduce`` on it and
copies out this rank's chunk (``torch/csrc/distributed/c10d/ProcessGroupGloo.cpp``). So every
reduce-scatter costs 2 (n-1)/n S on gloo against (n-1)/n S on NCCL.

Model-state memory per rank follows the ZeRO paper (Rajbhandari et al. 2020, sections 3.1 and
5): (p + g + K) Psi bytes with DDP, p + g + K/n with ZeRO-1 (optimizer states sharded), p +
(g + K)/n with ZeRO-2 (gradients too), (p + g + K)/n with ZeRO-3 / FSDP full sharding, where p,
g and K are bytes per parameter of the parameters, gradients and optimizer state: 2, 2 and 12
for mixed-precision Adam (fp32 master weights and moments), 4, 4 and 8 for fp32 Adam.

Model state has two definitions here, and every figure says which it is:

- **after the step** (``state_after_step_bytes``): the parameters, gradients and optimizer
  state the rank holds once ``optimizer.step()`` has returned, the tensors a census reads
  (``dpcost.measure.strategy_scenarios.state_census``). PowerSGD's equals DDP's: its
  error-feedback buffer is hook state, none of the three. FSDP's is the rank's shards, with
  or without resharding after forward (backward reshards in both).
- **peak** (``peak_state_bytes``): the most the rank holds during the step, that plus the
  state a strategy keeps beside the three: PowerSGD's error feedback, g Psi
  (``powerSGD_hook.py``: ``PowerSGDState.error_dict``, one bucket-sized tensor, kept from
  step to step), and FSDP without resharding, every unit's unsharded parameters from its
  forward to its backward, p Psi. Elsewhere the peak equals the state after the step.

Neither counts activations or communication buffers: DDP's buckets (a second copy of the
gradients with the default ``gradient_as_bucket_view=False``), DataParallel's ``reduce_add``
result on GPU0, the one unit FSDP full sharding gathers while it computes, PowerSGD's P and
Q factors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dpcost import defaults, registry
from dpcost.core import (
    check_choice,
    check_int,
    check_ranks,
    check_real,
    ddp_communication_volume,
)
from dpcost.dataparallel_traffic import chain_broadcast_bytes, chain_step_bytes
from dpcost.memory import (
    DEFAULT_PRECISION,
    STRATEGIES,
    model_state_bytes_per_parameter,
    shard_model_states,
)
from dpcost.presets import DTYPE_BYTES, GPUS
from dpcost.step_time import ring_allreduce_terms

__all__ = [
    "StrategyCost", "BACKENDS", "COMPRESS_DTYPES",
    "bytes_per_parameter", "model_state_bytes", "ring_allreduce_bytes", "allgather_bytes",
    "reduce_scatter_bytes", "broadcast_bytes",
    "allreduce_latency_s", "dp_copy_path", "dp_nccl_path", "ddp", "accumulation",
    "compress_hook", "powersgd", "powersgd_elements", "zero1", "zero1_partition", "fsdp", "hsdp",
    "fsdp_shard_rows", "fsdp_padded_param_bytes", "fsdp_local_numel",
    "ladder", "LADDER", "ladder_model_states", "STATE_DEFINITIONS", "H100_SXM_MEMORY_BYTES",
]

# Bytes per element of the dtypes a hook or a precision uses.
COMPRESS_DTYPES = ("fp16", "bf16")
BACKENDS = ("gloo", "nccl")
# Precisions, optimizers and their bytes per parameter: dpcost.memory's tables, one for the
# course (model_state_bytes_per_parameter checks both names). ZeRO stage i is memory's
# STRATEGIES[i]: 0 DDP, 1 zero1, 2 zero2, 3 zero3.
ZERO_STAGES = (0, 1, 2, 3)
STATE_DEFINITIONS = ("after step", "peak")  # the module docstring defines both


@dataclass(frozen=True)
class StrategyCost:
    """Per rank per optimizer step: bytes, collective calls and model-state memory.

    ``sent_bytes`` / ``received_bytes``: payload bytes; ``messages``: collective calls the
    rank takes part in (each all-reduce, all-gather, reduce-scatter or broadcast is one);
    ``state_after_step_bytes``: parameters + gradients + optimizer state once the optimizer
    has stepped; ``peak_state_bytes``: the most the rank holds during the step, that plus the
    strategy's own extra state (both defined in the module docstring; None when not given a
    parameter count); ``formula``: the bytes in symbols; ``source``: the PyTorch code.
    """

    strategy: str
    sent_bytes: float
    received_bytes: float
    messages: int
    state_after_step_bytes: float | None
    peak_state_bytes: float | None
    formula: str
    source: str
    extra: dict = field(default_factory=dict)


# --- model-state memory ---------------------------------------------------------------------

def bytes_per_parameter(precision: str = DEFAULT_PRECISION, optimizer: str = "adam") -> tuple:
    """(p, g, K): bytes per parameter of the parameters, gradients and optimizer state, from
    ``dpcost.memory.model_state_bytes_per_parameter`` (its precisions and optimizers).

    fp32 Adam 4 + 4 + 8 = 16; mixed-precision Adam 2 + 2 + 12 = 16 (fp32 master weights and
    two fp32 moments: ZeRO paper, section 3.1); pure bf16 or fp16 Adam 2 + 2 + 4 = 8
    (``torch.optim.Adam`` makes its moments with ``zeros_like(param)``).
    """
    per = model_state_bytes_per_parameter(precision, optimizer)
    return per["parameters"], per["gradients"], per["optimizer state"]


def model_state_bytes(num_params, num_gpus, stage: int = 0, param_bytes=None,
                      grad_bytes=None, optimizer_bytes=None) -> float:
    """Model-state bytes per rank under ZeRO ``stage`` (0 = DDP), ZeRO paper section 5.

    stage 0: (p + g + K) Psi; 1: (p + g) Psi + K Psi / n; 2: p Psi + (g + K) Psi / n;
    3: (p + g + K) Psi / n (``dpcost.memory.shard_model_states``). p, g, K default to
    ``bytes_per_parameter()``: the course's default precision (mixed) with Adam, 2, 2, 12.
    Stage 3 is FSDP full sharding between steps; during a layer's forward or backward it also
    holds that layer's gathered parameters (and gradients), not counted here.
    """
    psi = check_real(num_params, "num_params", 0.0)
    n = check_ranks(num_gpus)
    check_choice(stage, "stage", ZERO_STAGES)
    default = bytes_per_parameter()
    given = (param_bytes, grad_bytes, optimizer_bytes)
    names = ("param_bytes", "grad_bytes", "optimizer_bytes")
    per = {component: d if v is None else check_real(v, name, 0.0)
           for component, d, v, name in zip(("parameters", "gradients", "optimizer state"),
                                             default, given, names, strict=True)}
    return sum(shard_model_states(per, psi, n, STRATEGIES[stage]).values())


def _states(num_params, n, stage, precision, optimizer):
    if num_params is None:
        return None
    p, g, k = bytes_per_parameter(precision, optimizer)
    return model_state_bytes(num_params, n, stage, p, g, k)


# --- collectives ------------------------------------------------------------------------------

def ring_allreduce_bytes(size_bytes, num_gpus) -> float:
    """Bytes each rank sends (and receives) in a ring all-reduce of S bytes: 2 (n-1)/n S."""
    s, n = check_real(size_bytes, "size_bytes", 0.0), check_ranks(num_gpus)
    return ddp_communication_volume(s, n)


def allgather_bytes(size_bytes, num_gpus) -> float:
    """Bytes each rank sends (and receives) to all-gather a tensor of S bytes in total (each
    rank holds S/n): (n-1)/n S (ring; gloo's ``allgather`` and NCCL's)."""
    s, n = check_real(size_bytes, "size_bytes", 0.0), check_ranks(num_gpus)
    return (n - 1) / n * s


def reduce_scatter_bytes(size_bytes, num_gpus, backend: str = "nccl") -> float:
    """Bytes each rank sends (and receives) to reduce-scatter S bytes (each ends with S/n).

    nccl: (n-1)/n S, a true ring reduce-scatter. gloo: 2 (n-1)/n S, since
    ``ProcessGroupGloo::reduce_scatter_tensor_coalesced`` runs a full all-reduce.
    """
    check_choice(backend, "backend", BACKENDS)
    if backend == "gloo":
        return ring_allreduce_bytes(size_bytes, num_gpus)
    return allgather_bytes(size_bytes, num_gpus)


def broadcast_bytes(size_bytes, num_gpus, root: int, rank: int,
                    backend: str = "gloo") -> tuple:
    """(sent, received) bytes of ``rank`` in a broadcast of S bytes from ``root``.

    gloo (``gloo/broadcast.cc``): a binomial tree on virtual ranks v = (rank - root) mod n; in
    round i, v < 2^i sends to v + 2^i when that exists. Every non-root receives S once; the root
    sends ceil(log2 n) S. nccl: a pipelined chain root -> root+1 -> ...: every rank but the
    last in the chain sends S, every non-root receives S.
    """
    s, n = check_real(size_bytes, "size_bytes", 0.0), check_ranks(num_gpus)
    check_choice(backend, "backend", BACKENDS)
    root, rank = check_int(root, "root", 0), check_int(rank, "rank", 0)
    if root >= n or rank >= n:
        raise ValueError(f"root and rank must be < num_gpus = {n}, got {root} and {rank}")
    v = (rank - root) % n
    if backend == "nccl":  # the chain in virtual ranks, from its owner
        return chain_broadcast_bytes(s, n)[v] if n > 1 else (0.0, 0.0)
    received = 0.0 if v == 0 else s
    sends, i = 0, 0
    while (1 << i) < n:
        if v < (1 << i) and v + (1 << i) < n:
            sends += 1
        i += 1
    return sends * s, received


def allreduce_latency_s(num_buckets, num_gpus, latency_s) -> float:
    """The latency term of a step's all-reduces on a ring: buckets x 2 (n-1) alpha seconds,
    ``step_time.ring_allreduce_terms``' latency once per bucket (one all-reduce each)."""
    b = check_int(num_buckets, "num_buckets", 0)
    n = check_ranks(num_gpus)
    alpha = check_real(latency_s, "latency_s", 0.0)
    per_bucket, _ = ring_allreduce_terms(0, n, 1.0, alpha)  # no bytes: the bandwidth is moot
    try:
        seconds = float(b) * per_bucket
    except OverflowError:  # an int past a float's range
        seconds = math.inf
    if not math.isfinite(seconds):
        raise ValueError(f"num_buckets x 2 (num_gpus - 1) x latency_s must be finite seconds, "
                         f"got num_buckets of {len(str(b))} digits, num_gpus {n}, "
                         f"latency_s {alpha!r}")
    return seconds


# --- the strategies ----------------------------------------------------------------------------

def _dp_states(num_params, rank, precision, optimizer):
    """DataParallel's model state on ``rank``: (p + g + K) Psi on GPU0, which holds the only
    optimizer, (p + g) Psi on the others (their replicas and gradients); None without Psi."""
    if num_params is None:
        return None
    p, g, k = bytes_per_parameter(precision, optimizer)
    return (p + g + (k if rank == 0 else 0)) * check_real(num_params, "num_params", 0.0)


def dp_copy_path(param_bytes, num_gpus, rank: int = 0, num_params=None,
                 precision=DEFAULT_PRECISION, optimizer="adam") -> StrategyCost:
    """DataParallel on the copy path (no NCCL): the star through GPU0.

    GPU0 sends (n-1) P (``replicate``) and receives (n-1) P (``ReduceAddCoalesced``); any
    other GPU receives P and sends P. Messages: one per other GPU each way (a broadcast and a
    reduce per 10 MiB chunk in reality, ``buffer_size=10485760``; counted here per peer).
    GPU0 holds the only optimizer: model state (p + g + K) Psi there, p + g elsewhere.
    """
    p, n = check_real(param_bytes, "param_bytes", 0.0), check_ranks(num_gpus)
    rank = check_int(rank, "rank", 0)
    each = (n - 1) * p if rank == 0 else (p if n > 1 else 0.0)
    states = _dp_states(num_params, rank, precision, optimizer)
    return StrategyCost("DP (copy path)", each, each, 2 * (n - 1) if rank == 0 else 2, states,
                        states,
                        "GPU0: (n-1) P out + (n-1) P in; others P each way",
                        "data_parallel.py: replicate -> comm.broadcast_coalesced; "
                        "_functions.py: ReduceAddCoalesced -> comm.reduce_add_coalesced")


def dp_nccl_path(param_bytes, num_gpus, rank: int = 0, num_params=None,
                 precision=DEFAULT_PRECISION, optimizer="adam") -> StrategyCost:
    """DataParallel on the NCCL path (modelled): ``comm.cpp: broadcast`` -> nccl broadcast and
    ``comm.py: reduce_add`` -> ``nccl.reduce``, pipelined chains. GPU0 sends about P (the
    broadcast) and receives about P (the reduce); it still broadcasts every step. Other ranks:
    ``dataparallel_traffic.chain_step_bytes`` (rank 1 sends 2P and receives P, the last rank P
    and 2P, a rank between them 2P and 2P)."""
    p, n = check_real(param_bytes, "param_bytes", 0.0), check_ranks(num_gpus)
    rank = check_int(rank, "rank", 0)
    if rank >= n:
        raise ValueError(f"rank must be < num_gpus = {n}, got {rank}")
    sent, received = chain_step_bytes(p, n)[rank] if n > 1 else (0.0, 0.0)
    states = _dp_states(num_params, rank, precision, optimizer)
    return StrategyCost("DP (NCCL path)", sent, received, 2 if n > 1 else 0, states, states,
                        "GPU0: about P out (broadcast) + P in (reduce), pipelined",
                        "torch/csrc/cuda/comm.cpp: broadcast -> nccl::broadcast; "
                        "torch/nn/parallel/comm.py: reduce_add -> nccl.reduce")


def ddp(param_bytes, num_gpus, num_buckets: int = 1, num_params=None, precision=DEFAULT_PRECISION,
        optimizer="adam") -> StrategyCost:
    """Plain DDP: one ring all-reduce per bucket, 2 (n-1)/n P sent and received per rank."""
    v = ring_allreduce_bytes(param_bytes, num_gpus)
    n = check_ranks(num_gpus)
    states = _states(num_params, n, 0, precision, optimizer)
    return StrategyCost("DDP", v, v, check_int(num_buckets, "num_buckets", 1), states, states,
                        "2(n-1)/n P",
                        "reducer.cpp: Reducer::all_reduce_bucket, one all-reduce per bucket")


def accumulation(param_bytes, num_gpus, micro_steps, num_buckets: int = 1,
                 samples_per_micro_step=None, num_params=None, precision=DEFAULT_PRECISION,
                 optimizer="adam") -> StrategyCost:
    """DDP with ``no_sync()`` on the first k - 1 of k micro-steps: one all-reduce per step.

    Bytes per optimizer step stay 2 (n-1)/n P; per micro-step they fall to 2 (n-1)/n P / k, and
    per sample by k as well. ``extra`` holds ``bytes_per_micro_step`` and, given
    ``samples_per_micro_step`` (per rank), ``bytes_per_sample``.
    """
    k = check_int(micro_steps, "micro_steps", 1)
    cost = ddp(param_bytes, num_gpus, num_buckets, num_params, precision, optimizer)
    extra = {"micro_steps": k, "bytes_per_micro_step": cost.sent_bytes / k}
    if samples_per_micro_step is not None:
        b = check_int(samples_per_micro_step, "samples_per_micro_step", 1)
        extra["bytes_per_sample"] = cost.sent_bytes / (k * b)
    return StrategyCost(f"DDP + accumulation (k={k})", cost.sent_bytes, cost.received_bytes,
                        cost.messages, cost.state_after_step_bytes, cost.peak_state_bytes,
                        "2(n-1)/n P per step; / k per "
                        "micro-step", "distributed.py: DistributedDataParallel.no_sync "
                        "(require_backward_grad_sync = False)", extra)


def compress_hook(param_bytes, num_gpus, dtype: str = "bf16", grad_dtype: str = "fp32",
                  num_buckets: int = 1, num_params=None, precision=DEFAULT_PRECISION,
                  optimizer="adam") -> StrategyCost:
    """``fp16_compress_hook`` / ``bf16_compress_hook``: each bucket is cast to 16 bits and
    all-reduced (``default_hooks.py: _compress_hook``): 2 (n-1)/n P x 2 / w bytes, half of
    plain DDP for fp32 gradients (w = ``grad_dtype``'s bytes per element)."""
    check_choice(dtype, "dtype", COMPRESS_DTYPES)
    check_choice(grad_dtype, "grad_dtype", DTYPE_BYTES)
    p = check_real(param_bytes, "param_bytes", 0.0)
    compressed = p * DTYPE_BYTES[dtype] / DTYPE_BYTES[grad_dtype]
    v = ring_allreduce_bytes(compressed, num_gpus)
    n = check_ranks(num_gpus)
    states = _states(num_params, n, 0, precision, optimizer)
    return StrategyCost(f"DDP + {dtype} hook", v, v, check_int(num_buckets, "num_buckets", 1),
                        states, states,
                        f"2(n-1)/n P x {DTYPE_BYTES[dtype]}/{DTYPE_BYTES[grad_dtype]}",
                        f"ddp_comm_hooks/default_hooks.py: {dtype}_compress_hook")


def _matrix(shape, index):
    """The (rows, cols) PowerSGD sees: ``tensor.view(tensor.shape[0], -1)``."""
    dims = [check_int(d, f"shapes[{index}] dimension", 0) for d in shape]
    if not dims:
        raise ValueError(f"shapes[{index}] is a 0-d tensor; PowerSGD views each gradient as "
                         "shape[0] x rest, which needs at least one dimension")
    rows = dims[0]
    cols = math.prod(dims[1:]) if len(dims) > 1 else 1
    return rows, cols


def powersgd_elements(shapes, matrix_approximation_rank: int = 1,
                      min_compression_rate: float = 2) -> dict:
    """Elements PowerSGD all-reduces for one bucket holding tensors of ``shapes``.

    Per tensor, seen as a rows x cols matrix with r' = min(rows, cols, rank): compressed when
    (rows + cols) r' x ``min_compression_rate`` < rows x cols, r' = min(rows, cols,
    ``matrix_approximation_rank``) (``_should_compress``); then it
    contributes rows r' elements to P and cols r' to Q; otherwise (biases: a length-w vector
    is a w x 1 matrix) its rows x cols elements go uncompressed. Returns {"uncompressed",
    "p", "q", "compressed_tensors", "uncompressed_tensors"}.
    """
    r = check_int(matrix_approximation_rank, "matrix_approximation_rank", 1)
    rate = check_real(min_compression_rate, "min_compression_rate", 0.0)
    out = dict(uncompressed=0, p=0, q=0, compressed_tensors=0, uncompressed_tensors=0)
    for index, shape in enumerate(shapes):
        rows, cols = _matrix(shape, index)
        r_eff = min(rows, cols, r)
        if (rows + cols) * r_eff * rate < rows * cols:
            out["p"] += rows * r_eff
            out["q"] += cols * r_eff
            out["compressed_tensors"] += 1
        else:
            out["uncompressed"] += rows * cols
            out["uncompressed_tensors"] += 1
    return out


def powersgd(shapes, num_gpus, matrix_approximation_rank: int = 1, iteration: int = 1_000,
             start_powersgd_iter: int = 1_000, min_compression_rate: float = 2,
             element_bytes: int = 4, buckets=None, num_params=None, precision=DEFAULT_PRECISION,
             optimizer="adam") -> StrategyCost:
    """``powerSGD_hook`` at DDP iteration ``iteration`` (0-based), per rank.

    Before ``start_powerSGD_iter`` the hook runs a plain all-reduce of each bucket
    (``default._allreduce_fut``): 2 (n-1)/n P, one message per bucket. From then on, per
    bucket, three all-reduces one after the other: the uncompressed tensors concatenated
    (biases and any matrix not worth compressing, see ``powersgd_elements``), then P (rows x r'
    per compressed matrix), then Q (cols x r'); each is called even when empty. Bytes per rank:
    2 (n-1)/n (U + sum r'(rows + cols)) x ``element_bytes``. ``buckets``: lists of indices into
    ``shapes`` (default: one bucket).

    Model state: after the step, DDP's (p + g + K) Psi; at its peak, plus the error feedback,
    one bucket-sized tensor of the gradients' dtype per bucket, g Psi in all
    (``PowerSGDState.error_dict``: created at the start, kept from step to step). The P and Q
    factors the hook all-reduces (r' (rows + cols) per matrix) are not counted.
    """
    shapes = list(shapes)
    n = check_ranks(num_gpus)
    r = check_int(matrix_approximation_rank, "matrix_approximation_rank", 1)
    it = check_int(iteration, "iteration", 0)
    start = check_int(start_powersgd_iter, "start_powersgd_iter", 0)
    w = check_int(element_bytes, "element_bytes", 1)
    powersgd_elements(shapes, r, min_compression_rate)  # checks every shape and the rate
    buckets = [list(range(len(shapes)))] if buckets is None else [list(b) for b in buckets]
    states = _states(num_params, n, 0, precision, optimizer)
    total = sum(math.prod(_matrix(s, i)) for i, s in enumerate(shapes))
    if it < start:
        v = ring_allreduce_bytes(total * w, n)
        return StrategyCost(f"PowerSGD r={r} (before start)", v, v, len(buckets), states,
                            states,
                            "2(n-1)/n P (vanilla all-reduce before start_powerSGD_iter)",
                            "powerSGD_hook.py: powerSGD_hook -> default._allreduce_fut")
    elements = dict(uncompressed=0, p=0, q=0)
    for bucket in buckets:
        one = powersgd_elements([shapes[i] for i in bucket], r, min_compression_rate)
        for key in elements:
            elements[key] += one[key]
    sent = sum(ring_allreduce_bytes(e * w, n) for e in elements.values())
    peak = None
    if states is not None:  # + the error feedback, g bytes per parameter
        peak = states + bytes_per_parameter(precision, optimizer)[1] * check_real(
            num_params, "num_params", 0.0)
    return StrategyCost(f"PowerSGD r={r}", sent, sent, 3 * len(buckets), states, peak,
                        "2(n-1)/n (U + r(m+k)) w", "powerSGD_hook.py: powerSGD_hook "
                        "(all-reduces of the uncompressed tensors, then Ps, then Qs)",
                        {**elements, "uncompressed_total_elements": total})


def zero1_partition(numels, num_gpus) -> list:
    """Which rank's shard holds each parameter: ``ZeroRedundancyOptimizer._partition_parameters``
    sorts the parameters by size, largest first (a stable sort), and gives each to the rank
    with the fewest elements so far (the lowest such rank). Returns one rank per parameter."""
    n = check_ranks(num_gpus)
    sizes = [check_int(e, f"numels[{i}]", 0) for i, e in enumerate(numels)]
    owner, load = [0] * len(sizes), [0] * n
    for index in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        rank = min(range(n), key=load.__getitem__)
        owner[index] = rank
        load[rank] += sizes[index]
    return owner


def zero1(numels, num_gpus, rank: int = 0, element_bytes: int = 4, backend: str = "gloo",
          parameters_as_bucket_view: bool = False, num_buckets: int = 1,
          precision=DEFAULT_PRECISION, optimizer="adam") -> StrategyCost:
    """ZeRO-1: DDP + ``ZeroRedundancyOptimizer`` (``zero_redundancy_optimizer.py``).

    Gradients: DDP's all-reduce, 2 (n-1)/n P. After the local step on its shard, ``step``
    calls ``_sync_params``: for every rank, a broadcast of that rank's updated shard from it,
    parameter by parameter (one message per parameter) or, with
    ``parameters_as_bucket_view``, as one flat bucket per rank. Bytes of the broadcasts per
    ``broadcast_bytes`` (gloo: binomial tree; nccl: chain). A true all-gather would move
    (n-1)/n P. Optimizer state per rank: its shard's K bytes per parameter.
    """
    numels = list(numels)
    n = check_ranks(num_gpus)
    rank = check_int(rank, "rank", 0)
    w = check_int(element_bytes, "element_bytes", 1)
    check_choice(backend, "backend", BACKENDS)
    owner = zero1_partition(numels, n)
    p = sum(numels) * w
    grad = ring_allreduce_bytes(p, n)
    sent = received = grad
    for root in range(n):
        shard = sum(e for e, o in zip(numels, owner, strict=True) if o == root) * w
        s, r = broadcast_bytes(shard, n, root, rank, backend)
        sent, received = sent + s, received + r
    broadcasts = n if parameters_as_bucket_view else len(numels)
    pb, gb, k = bytes_per_parameter(precision, optimizer)
    own = sum(e for e, o in zip(numels, owner, strict=True) if o == rank)
    states = (pb + gb) * sum(numels) + k * own
    return StrategyCost("ZeRO-1", sent, received,
                        check_int(num_buckets, "num_buckets", 1) + broadcasts, states, states,
                        "2(n-1)/n P + broadcast of every rank's shard",
                        "zero_redundancy_optimizer.py: ZeroRedundancyOptimizer.step -> "
                        "_sync_params -> _broadcast_params_from_rank",
                        {"shard_bytes": own * w, "owner": owner})


def fsdp(param_bytes, num_gpus, reshard_after_forward: bool = True, backend: str = "nccl",
         num_units: int = 1, num_params=None, precision=DEFAULT_PRECISION,
         optimizer="adam", local_numel=None) -> StrategyCost:
    """FSDP (``fully_shard``, ZeRO-3) per rank per step, for ``num_units`` sharded modules.

    Forward all-gathers every unit's parameters ((n-1)/n P); with ``reshard_after_forward``
    (full sharding) backward all-gathers them again; backward reduce-scatters the gradients
    (``reduce_scatter_bytes``: (n-1)/n P on NCCL, 2 (n-1)/n P on gloo). Full sharding: 3 (n-1)/n
    P on NCCL, 4 (n-1)/n P on gloo; without resharding 2 and 3. Messages: 2 or 1 all-gathers
    and one reduce-scatter per unit.

    Model state after the step: the rank's shards, (p + g + K) x ``local_numel`` (its
    parameter elements, ``fsdp_local_numel``; default Psi / n, ZeRO stage 3), with or without
    resharding. Peak: the same with resharding (the one unit gathered while it computes is a
    communication buffer, not counted); without resharding every unit's unsharded parameters
    stay from its forward to its backward, so p Psi more.
    """
    p, n = check_real(param_bytes, "param_bytes", 0.0), check_ranks(num_gpus)
    check_choice(backend, "backend", BACKENDS)
    if not isinstance(reshard_after_forward, bool):
        raise TypeError(f"reshard_after_forward must be a bool, got {reshard_after_forward!r}")
    units = check_int(num_units, "num_units", 1)
    gathers = 2 if reshard_after_forward else 1
    v = gathers * allgather_bytes(p, n) + reduce_scatter_bytes(p, n, backend)
    factor = {True: {"nccl": 3, "gloo": 4}, False: {"nccl": 2, "gloo": 3}}[
        reshard_after_forward][backend]
    name = "FSDP full sharding" if reshard_after_forward else "FSDP no reshard"
    states = peak = None
    if num_params is not None:
        local = None if local_numel is None else check_real(local_numel, "local_numel", 0.0)
        states, peak = fsdp_model_states(check_real(num_params, "num_params", 0.0), n,
                                         reshard_after_forward,
                                         *bytes_per_parameter(precision, optimizer), local)
    return StrategyCost(name, v, v, (gathers + 1) * units, states, peak,
                        f"{factor}(n-1)/n P on {backend}",
                        "torch.distributed.fsdp.fully_shard: all-gather in forward"
                        + (" and backward" if reshard_after_forward else "")
                        + ", reduce-scatter in backward"
                        + (" (an all-reduce on gloo: ProcessGroupGloo.cpp)"
                           if backend == "gloo" else ""))


def hsdp(param_bytes, num_gpus, shard_size, backend: str = "nccl",
         num_units: int = 1, num_params=None, precision=DEFAULT_PRECISION,
         optimizer="adam", local_numel=None,
         reshard_after_forward: bool = True) -> StrategyCost:
    """HSDP (``fully_shard`` on a 2-D ``DeviceMesh`` (replicate, shard)) per rank per step, for
    ``num_units`` sharded modules: shard groups of s = ``shard_size`` ranks, replicate groups
    of m = n / s.

    Derivation, per unit, from FSDP2's code in torch 2.13:

    - forward: ``FSDPParamGroup.pre_forward`` -> ``foreach_all_gather`` over
      ``_all_gather_process_group``, the shard group (``mesh_info.shard_process_group``):
      every rank gathers the unit's P_u from s shards, (s-1)/s P_u sent and received;
    - backward, with full resharding: the same all-gather again, (s-1)/s P_u;
    - ``FSDPParamGroup.post_backward`` -> ``_fsdp_collectives.foreach_reduce``: a
      reduce-scatter of the unit's whole gradient G_u = P_u in ``reduce_scatter_group``, the
      shard group (``reduce_scatter_bytes``: on gloo ``ProcessGroupGloo::_reduce_scatter_base``
      -> ``reduce_scatter_tensor_coalesced`` clones the input and all-reduces it, 2 (s-1)/s
      P_u; on NCCL a true reduce-scatter, (s-1)/s P_u); then, since ``all_reduce_group`` is
      not None (``HSDPMeshInfo`` is a ``DDPMeshInfo``: ``_all_reduce_process_group``, the
      replicate group), ``dist.all_reduce(reduce_output, group=all_reduce_group)`` of this
      rank's shard, P_u / s bytes, a ring: 2 (m-1)/m P_u / s.

    Summed over the units (P = sum of P_u, padded to s chunks: ``fsdp_padded_param_bytes``
    with s): sent = received = 2 (s-1)/s P + 2 (s-1)/s P + 2 (m-1)/m P / s on gloo (4 ranks,
    s = m = 2: P/2 + P/2 + P + P/2 = 2.5 P; flat FSDP on the same 4 ranks, 3 P), and
    (s-1)/s P (x 2) + (s-1)/s P + 2 (m-1)/m P / s on NCCL (2 P). The first three terms cross
    the shard group, the last the replicate group (``extra``: ``shard_group_bytes``,
    ``replicate_group_bytes``). Without resharding, one all-gather less.

    Messages: per unit 2 all-gathers (1 without resharding), 1 reduce-scatter and 1
    all-reduce; FSDP2 calls the all-reduce even when m = 1 (a group of one rank, no bytes).

    Model state: the rank's shards over the shard group, (p + g + K) x ``local_numel``
    (``fsdp_local_numel`` with s; default Psi / s), as ``fsdp_model_states`` with n = s; the
    peak adds p Psi without resharding.
    """
    p, n = check_real(param_bytes, "param_bytes", 0.0), check_ranks(num_gpus)
    s = check_int(shard_size, "shard_size", 1)
    check_choice(backend, "backend", BACKENDS)
    if not isinstance(reshard_after_forward, bool):
        raise TypeError(f"reshard_after_forward must be a bool, got {reshard_after_forward!r}")
    if n % s:
        raise ValueError(f"shard_size must divide num_gpus (a (num_gpus / shard_size, "
                         f"shard_size) mesh), got shard_size {s} and num_gpus {n}")
    m = n // s
    units = check_int(num_units, "num_units", 1)
    gathers = 2 if reshard_after_forward else 1
    shard_bytes = gathers * allgather_bytes(p, s) + reduce_scatter_bytes(p, s, backend)
    replicate_bytes = ring_allreduce_bytes(p / s, m)
    v = shard_bytes + replicate_bytes
    states = peak = None
    if num_params is not None:
        local = None if local_numel is None else check_real(local_numel, "local_numel", 0.0)
        states, peak = fsdp_model_states(check_real(num_params, "num_params", 0.0), s,
                                         reshard_after_forward,
                                         *bytes_per_parameter(precision, optimizer), local)
    rs = "2(s-1)/s P" if backend == "gloo" else "(s-1)/s P"
    ag = "2 x (s-1)/s P" if reshard_after_forward else "(s-1)/s P"
    return StrategyCost(
        "HSDP" if reshard_after_forward else "HSDP no reshard", v, v, (gathers + 2) * units,
        states, peak, f"{ag} (all-gather) + {rs} (reduce-scatter) + 2(m-1)/m P/s "
        f"(all-reduce) on {backend}, s = {s}, m = {m}",
        "torch.distributed.fsdp.fully_shard on a 2-D DeviceMesh (replicate, shard): "
        "all-gathers in the shard group, _fsdp_collectives.py: foreach_reduce reduce-scatters "
        "in the shard group (an all-reduce on gloo: ProcessGroupGloo.cpp), then all-reduces "
        "the shard in the replicate group",
        {"shard_size": s, "replicate_size": m, "shard_group_bytes": shard_bytes,
         "replicate_group_bytes": replicate_bytes})


def fsdp_model_states(psi, n, reshard_after_forward: bool, p, g, k, local_numel=None) -> tuple:
    """FSDP's model state per rank, (after the step, peak) in bytes: the rank's shards,
    (p + g + K) x ``local_numel`` (default Psi / n, ZeRO stage 3: ``model_state_bytes``); at
    the peak without resharding, plus every unit's unsharded parameters, p Psi, kept from
    forward to backward."""
    after = (model_state_bytes(psi, n, 3, p, g, k) if local_numel is None
             else (p + g + k) * local_numel)
    return after, after if reshard_after_forward else after + p * psi


def fsdp_shard_rows(rows: int, num_gpus, rank: int) -> int:
    """Rows of a dim-0 length ``rows`` that ``rank`` holds under FSDP2: ``torch.chunk`` into n
    chunks of ceil(rows / n), the last ones shorter or empty
    (``_fsdp_common._chunk_with_empty``)."""
    n = check_ranks(num_gpus)
    rows, rank = check_int(rows, "rows", 0), check_int(rank, "rank", 0)
    chunk = -(-rows // n)
    return max(0, min(chunk, rows - rank * chunk))


def fsdp_padded_param_bytes(shapes, num_gpus, element_bytes: int = 4) -> int:
    """The P that FSDP2's collectives move: every shard is padded to the first chunk's size
    (``FSDPParam._init_sharded_param``: ``padded_sharded_param_size = chunks[0].size()``), so
    each parameter all-gathers n ceil(rows / n) x rest elements. Equals P when n divides every
    parameter's first dimension."""
    n = check_ranks(num_gpus)
    w = check_int(element_bytes, "element_bytes", 1)
    total = 0
    for index, shape in enumerate(shapes):
        rows, cols = _matrix(shape, index)
        total += n * -(-rows // n) * cols
    return total * w


def fsdp_local_numel(shapes, num_gpus, rank: int) -> int:
    """Parameter elements ``rank`` holds (its unpadded shards) under FSDP2."""
    total = 0
    for index, shape in enumerate(shapes):
        rows, cols = _matrix(shape, index)
        total += fsdp_shard_rows(rows, num_gpus, rank) * cols
    return total


# --- the ladder -------------------------------------------------------------------------------

LADDER = tuple(entry.ladder for entry in registry.ladder())


def ladder(shapes, num_gpus, rank: int = 0, backend: str = "gloo", micro_steps: int = 4,
           powersgd_rank: int = 1, num_buckets: int = 1, num_units=None,
           element_bytes: int = 4, precision=DEFAULT_PRECISION, optimizer="adam") -> list:
    """The lesson's ladder for one model given by its parameters' ``shapes``: a list of
    ``StrategyCost`` for ``rank``, one per rung in ``LADDER`` (PowerSGD after its start).
    Model state is this rank's: ZeRO-1's optimizer shard and FSDP's parameter shards as
    PyTorch partitions them (``zero1_partition``, ``fsdp_local_numel``)."""
    shapes = [tuple(s) for s in shapes]
    numels = [math.prod(s) for s in shapes]
    psi = sum(numels)
    p = psi * element_bytes
    units = num_units if num_units is not None else max(1, len(shapes) // 2)
    padded = fsdp_padded_param_bytes(shapes, num_gpus, element_bytes)
    local = fsdp_local_numel(shapes, num_gpus, rank)
    shard = 2 if num_gpus % 2 == 0 else 1  # HSDP's (n / 2, 2) mesh: a "node" of 2 ranks
    common = dict(num_params=psi, precision=precision, optimizer=optimizer)
    rows = [dp_copy_path(p, num_gpus, rank, **common), dp_nccl_path(p, num_gpus, rank, **common),
            ddp(p, num_gpus, num_buckets, **common),
            accumulation(p, num_gpus, micro_steps, num_buckets, **common),
            compress_hook(p, num_gpus, "bf16", num_buckets=num_buckets, **common),
            powersgd(shapes, num_gpus, powersgd_rank, element_bytes=element_bytes, **common),
            zero1(numels, num_gpus, rank, element_bytes, backend, num_buckets=num_buckets,
                  precision=precision, optimizer=optimizer),
            fsdp(padded, num_gpus, False, backend, units, **common, local_numel=local),
            fsdp(padded, num_gpus, True, backend, units, **common, local_numel=local),
            hsdp(fsdp_padded_param_bytes(shapes, shard, element_bytes), num_gpus, shard, backend,
                 units, **common, local_numel=fsdp_local_numel(shapes, shard, rank % shard))]
    return rows


# An 80 GB GPU, decimal bytes as its datasheet states it (the source is in dpcost.presets.GPUS)
H100_SXM_MEMORY_BYTES = GPUS["H100 SXM 80GB"].memory_bytes


def ladder_model_states(num_params, num_gpus, precision: str = DEFAULT_PRECISION,
                        optimizer: str = "adam", definition: str = "peak",
                        gpus_per_node: int = defaults.GPUS_PER_NODE) -> dict:
    """Model-state bytes per GPU on each rung of ``LADDER`` for a model of ``num_params``
    (the busiest GPU: GPU0 under DP), by ``definition``, one of ``STATE_DEFINITIONS`` (the
    module docstring defines both; shards are Psi / n). Activations come on top.

    After the step: DP (both paths), DDP, accumulation, the bf16 hook and PowerSGD hold
    (p + g + K) Psi (GPU0 under DP holds the only optimizer); ZeRO-1 stage 1; FSDP, with or
    without resharding, stage 3, (p + g + K) Psi / n. Peak: the same, except PowerSGD, plus its
    error feedback g Psi (``PowerSGDState.error_dict``), and FSDP without resharding, plus the
    unsharded parameters it keeps from forward to backward, p Psi. HSDP shards over the GPUs
    of one node only, (p + g + K) Psi / min(n, ``gpus_per_node``), whatever the number of
    nodes. Neither counts DP's ``reduce_add`` buffer or DDP's buckets.
    """
    psi = check_real(num_params, "num_params", 0.0)
    n = check_ranks(num_gpus)
    check_choice(definition, "definition", STATE_DEFINITIONS)
    p, g, k = bytes_per_parameter(precision, optimizer)
    ddp_state = model_state_bytes(psi, n, 0, p, g, k)
    peak = definition == "peak"  # indexes fsdp_model_states: (after the step, peak)
    return {
        "DP (copy path)": ddp_state, "DP (NCCL path)": ddp_state, "DDP": ddp_state,
        "+ accumulation": ddp_state, "+ bf16 hook": ddp_state,
        "PowerSGD": ddp_state + g * psi if peak else ddp_state,
        "ZeRO-1": model_state_bytes(psi, n, 1, p, g, k),
        "FSDP no reshard": fsdp_model_states(psi, n, False, p, g, k)[peak],
        "FSDP full sharding": fsdp_model_states(psi, n, True, p, g, k)[peak],
        "HSDP": fsdp_model_states(psi, min(n, check_ranks(gpus_per_node)), True, p, g, k)[peak],
    }
