"""The strategies beyond plain DDP, as measured scenarios (gloo on CPU, or NCCL on GPUs).

Every scenario trains the Linear stack of ``scenarios.build_model`` with ``torch.optim.Adam``
(fp32: 4 + 4 + 8 bytes per parameter of model state) on a small regression task: fit
``tanh(x T)`` for a fixed random T (seed 1), mean-squared error, on a fixed training set of
``DATASET_BATCHES`` batches per rank (``scenarios._batch``), cycled, the same on every
scenario. One ``step`` is one optimizer step.

- ``ddp-adam``: plain DDP (the ladder's DDP rung, with Adam's state to compare memory with).
- ``accumulation``: k = ``MICRO_STEPS`` micro-batches per step, the first k - 1 under
  ``DistributedDataParallel.no_sync()`` (no all-reduce), the last one synchronised.
- ``fp16-hook`` / ``bf16-hook``: ``default_hooks.fp16_compress_hook`` / ``bf16_compress_hook``;
  DDP refuses the bf16 hook on a torch built without CUDA and NCCL (``unavailable``), so
  ``bf16-cast`` registers its body, ``default_hooks._compress_hook(torch.bfloat16, ...)``, under
  another name (``bf16_cast_hook``): gloo all-reduces bfloat16 on CPU.
- ``powersgd``: ``powerSGD_hook.powerSGD_hook`` with ``PowerSGDState(matrix_approximation_rank=
  POWERSGD_RANK, start_powerSGD_iter=POWERSGD_START)``; the warm-up iterations run before it
  starts compressing, so the measured window is compressed.
- ``bucket-cap``: DDP with ``bucket_cap_mb=BUCKET_CAP_MB`` and ``default_hooks.allreduce_hook``
  (the same arithmetic as DDP's built-in path, but its all-reduce goes through Python, where it
  is counted).
- ``zero1``: DDP + ``torch.distributed.optim.ZeroRedundancyOptimizer(Adam)``.
- ``fsdp`` / ``fsdp-no-reshard``: FSDP2, ``torch.distributed.fsdp.fully_shard`` on every Linear
  and on the root, with ``reshard_after_forward`` True / False. FSDP2 (not FSDP1): it runs on
  CPU tensors with gloo in torch 2.13 (FSDP1 wants a CUDA device by default), and it is the
  API PyTorch recommends.
- ``hsdp``: FSDP2's hybrid sharding, ``fully_shard(module, mesh=mesh)`` on every Linear and on
  the root with full resharding, where ``mesh = init_device_mesh(device, (world_size // 2, 2),
  mesh_dim_names=("replicate", "shard"))``: shard inside pairs of ranks, replicate across the
  pairs (4 ranks: a 2 x 2 mesh; an odd world size is refused). ``fully_shard``'s docstring:
  "If 2D, then parameters are sharded across the 1st dim and replicated across the 0th dim
  (HSDP) with ``(Replicate(), Shard(0))`` placement". It runs on gloo in torch 2.13. The
  bytes per rank are also split by peer: the shard partner and the replicate partner (see
  ``dpcost.strategies.hsdp`` and ``StrategyScenario._peer_bytes``).

Collective calls are counted by wrapping ``torch.distributed.all_reduce``, ``broadcast``,
``all_gather_single`` and ``reduce_scatter_single`` (the functions the hooks, ZeRO and FSDP2
call by attribute at call time) while a scenario steps; DDP's built-in reducer calls the
process group from C++, which is why ``bucket-cap`` registers ``allreduce_hook``.

Model state is measured under both of ``dpcost.strategies``' definitions. After the step: a
census of the local bytes of parameters, gradients and optimizer state (DTensor shards by
``to_local``) once ``optimizer.step()`` has returned. Peak: that plus what a strategy holds
beside them, read where it is held: PowerSGD's error feedback (``PowerSGDState.error_dict``,
after the step) and, for FSDP, the parameters left unsharded between forward and backward
(read after forward). The worker's peak-RSS reading is reported beside them.
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import socket
import struct

from dpcost import registry
from dpcost import strategies as st
from dpcost.buckets import bucket_assignment, ddp_bucket_caps
from dpcost.measure import counters

# torch is imported inside the functions that need it: the launcher and the report import
# this module for the scenario names and the predictions, without torch.

MICRO_STEPS = 4
POWERSGD_RANK = 1
POWERSGD_START = 2  # the smallest start PowerSGDState allows with error feedback
BUCKET_CAP_MB = 0.5  # MiB: several buckets for a model of a few MB
POWERSGD_BUCKET_CAP_MB = 1024  # MiB: one bucket (see StrategyScenario._wrap)
LEARNING_RATE = 1e-3
TEACHER_SEED = 1
DATASET_BATCHES = 4  # batches per rank in the training set (cycled): the loss can fall
COUNTED = ("all_reduce", "broadcast", "all_gather_single", "reduce_scatter_single")
BUILT_IN_ALLREDUCE = ("ddp-adam", "accumulation", "zero1")  # DDP without a comm hook
NAMES = ("ddp-adam", "accumulation", "fp16-hook", "bf16-hook", "bf16-cast", "powersgd",
         "bucket-cap", "zero1", "fsdp", "fsdp-no-reshard", "hsdp")
FSDP_KINDS = ("fsdp", "fsdp-no-reshard", "hsdp")  # fully_shard: no DDP model, DTensor shards
HSDP_SHARD_SIZE = 2  # ranks in a shard group (the "node"); the replicate groups span the pairs
HSDP_MESH_DIM_NAMES = ("replicate", "shard")


def hsdp_mesh_shape(world_size: int) -> tuple:
    """(replicate, shard) sizes of the hsdp scenario's ``DeviceMesh``: (world_size // 2, 2), a
    2 x 2 mesh on 4 ranks. Rank r sits at (r // 2, r % 2): its shard partner is r ^ 1, its
    replicate partners r % 2, r % 2 + 2, ... ValueError on an odd world size (no such mesh)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2 \
            or world_size % HSDP_SHARD_SIZE:
        raise ValueError(f"scenario hsdp needs an even world_size (a (world_size // 2, 2) "
                         f"DeviceMesh: replicate x shard), got world_size {world_size!r}")
    return world_size // HSDP_SHARD_SIZE, HSDP_SHARD_SIZE


@contextlib.contextmanager
def counting_collectives(counts: collections.Counter):
    """Count calls of the ``COUNTED`` torch.distributed functions (by name) inside the block."""
    import torch.distributed as dist

    originals = {name: getattr(dist, name) for name in COUNTED}

    def wrap(name, function):
        def counted(*args, **kwargs):
            counts[name] += 1
            counts[name + " bytes"] += _collective_size(name, args, kwargs)
            return function(*args, **kwargs)
        return counted

    for name, function in originals.items():
        setattr(dist, name, wrap(name, function))
    try:
        yield counts
    finally:
        for name, function in originals.items():
            setattr(dist, name, function)


def _collective_size(name, args, kwargs) -> int:
    """S, the bytes of the whole tensor a collective works on: the all-reduced or broadcast
    tensor, the all-gather's output, the reduce-scatter's input."""
    if name in ("all_reduce", "broadcast"):
        tensor = args[0] if args else kwargs["tensor"]
    elif name == "all_gather_single":
        tensor = args[0] if args else kwargs["output_tensor"]
    else:
        tensor = args[1] if len(args) > 1 else kwargs["input"]
    return tensor.numel() * tensor.element_size()


def _local_bytes(tensor) -> int:
    if tensor is None:
        return 0
    if not hasattr(tensor, "numel"):
        return 0
    if hasattr(tensor, "to_local"):  # a DTensor: this rank's shard
        tensor = tensor.to_local()
    return tensor.numel() * tensor.element_size()


def state_census(model, optimizer) -> dict:
    """Bytes this rank holds of parameters, gradients and optimizer state (local shards): the
    model state after the step when read after ``optimizer.step()``."""
    import torch

    params = list(model.parameters())
    local = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer wraps its shard's
    state = sum(_local_bytes(value) for per_param in local.state.values()
                for value in per_param.values() if torch.is_tensor(value) and value.dim() > 0)
    return {"parameters": sum(_local_bytes(p) for p in params),
            "gradients": sum(_local_bytes(p.grad) for p in params),
            "optimizer state": state}


def unsharded_parameter_bytes(model) -> int:
    """Bytes of the parameters ``model`` exposes whole (not DTensor shards). Read after an
    FSDP2 forward: without resharding every unit's parameters stay unsharded until its
    backward (p Psi); with resharding none do."""
    return sum(_local_bytes(p) for p in model.parameters() if not hasattr(p, "to_local"))


def _teacher(width: int):
    import torch

    generator = torch.Generator().manual_seed(TEACHER_SEED)
    return torch.randn(width, width, generator=generator) / math.sqrt(width)


class StrategyScenario:
    """One optimizer step per ``step``; counts collective calls, records loss and census."""

    kind = ""

    def __init__(self, kind, width, depth, rank, world_size, device="cpu"):
        from dpcost.measure.scenarios import build_model

        self.kind, self.width, self.rank, self.device = kind, width, rank, device
        self.world_size = world_size
        self.teacher = _teacher(width).to(device)
        self.calls = collections.Counter()
        self.losses = []
        self.logical_sent = self.logical_received = 0  # bytes come from the wire counters
        self.mesh = None  # hsdp: the (replicate, shard) DeviceMesh
        self.peer_roles = None  # hsdp on gloo: {(local port, peer port): "shard" | ...}
        self.peer_reading = None  # hsdp: bytes by peer role at the end of the last step
        self.peer_ranks = {}  # hsdp on gloo: {role: the peers' ranks}
        base = build_model(width, depth).to(device)
        self.model = self._wrap(base)
        self.optimizer = self._optimizer()
        self.census = {}
        self.unsharded_after_forward = 0  # FSDP: parameter bytes left whole after forward

    # -- set-up per kind --------------------------------------------------------------------
    def _wrap(self, base):
        from torch import nn

        ddp = nn.parallel.DistributedDataParallel
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        if self.kind == "hsdp":
            return self._hsdp(base)
        if self.kind in ("fsdp", "fsdp-no-reshard"):
            from torch.distributed.fsdp import fully_shard

            reshard = self.kind == "fsdp"
            for layer in base:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer, reshard_after_forward=reshard)
            return fully_shard(base, reshard_after_forward=reshard)
        if self.kind == "bucket-cap":
            model = ddp(base, bucket_cap_mb=BUCKET_CAP_MB)
            model.register_comm_hook(None, default_hooks.allreduce_hook)
            return model
        # PowerSGD in one bucket: its hook waits for the P and Q all-reduces inside future
        # callbacks, which run on gloo's worker threads; with several buckets the workers all
        # end up waiting (a hang), or, given more workers, the ranks issue their calls in
        # different orders and gloo sums mismatched tensors (dpcost/measure/powersgd_gloo.py).
        model = ddp(base, bucket_cap_mb=POWERSGD_BUCKET_CAP_MB) if self.kind == "powersgd" \
            else ddp(base)
        if self.kind == "fp16-hook":
            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif self.kind == "bf16-hook":
            model.register_comm_hook(None, default_hooks.bf16_compress_hook)
        elif self.kind == "bf16-cast":
            model.register_comm_hook(None, bf16_cast_hook)
        elif self.kind == "powersgd":
            self.powersgd_state = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=POWERSGD_RANK,
                start_powerSGD_iter=POWERSGD_START)
            model.register_comm_hook(self.powersgd_state, powerSGD_hook.powerSGD_hook)
        return model

    def _hsdp(self, base):
        """``fully_shard`` on every Linear and on the root, full resharding, on a 2-D mesh.

        ``init_device_mesh`` makes one process group per row and per column of the mesh
        (``DeviceMesh._init_process_groups``): on 4 ranks the shard groups {0, 1} and {2, 3}
        and the replicate groups {0, 2} and {1, 3}; a dimension that spans every rank reuses
        the default group (at 2 ranks, the shard group). ``fully_shard`` with a 2-D mesh takes
        ``HSDPMeshInfo(mesh, shard_mesh_dim=1, replicate_mesh_dim=0)``
        (``_fsdp_init._get_mesh_info``).
        """
        import torch
        import torch.distributed as dist
        from torch import nn
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        self.mesh = init_device_mesh(torch.device(self.device).type,
                                     hsdp_mesh_shape(self.world_size),
                                     mesh_dim_names=HSDP_MESH_DIM_NAMES)
        if dist.get_backend() == "gloo" and counters.tcp_info_available()[0]:
            self.peer_roles = self._peer_roles()
        for layer in base:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=self.mesh, reshard_after_forward=True)
        return fully_shard(base, mesh=self.mesh, reshard_after_forward=True)

    def _peer_roles(self) -> dict:
        """{(local port, peer port): role} for this rank's TCP sockets to the other ranks; the
        role is "shard" for a peer in this rank's shard group, "replicate" for one in its
        replicate group, "other" otherwise (4 ranks: the diagonal of the mesh).

        A socket names no process group, but the two ends of a TCP connection on one host are
        (a, b) here and (b, a) in the peer: every rank posts its (local, peer) port pairs
        (``all_gather_object``, before any measured step), so each socket gets its peer's
        rank. Each group has its own sockets (gloo connects every pair of a new group), so a
        peer's sockets are the world group's and those of the groups the two share; between
        the window's opening barrier and the end of its last step only the mesh groups carry
        bytes, so the bytes with the shard partner are the shard group's, those with the
        replicate partner the replicate group's.
        """
        import torch.distributed as dist

        mine = sorted(_socket_bytes(_store_port()))
        everyone = [None] * self.world_size
        dist.all_gather_object(everyone, mine)
        owner = {tuple(key): rank for rank, keys in enumerate(everyone) for key in keys
                 if rank != self.rank}
        shard = set(dist.get_process_group_ranks(self.mesh.get_group("shard")))
        replicate = set(dist.get_process_group_ranks(self.mesh.get_group("replicate")))

        def role(rank):
            return "shard" if rank in shard else "replicate" if rank in replicate else "other"

        peers = [r for r in range(self.world_size) if r != self.rank]
        self.peer_ranks = {name: [r for r in peers if role(r) == name] for name in PEER_ROLES}
        return {(local, peer): role(owner[(peer, local)]) for local, peer in mine
                if (peer, local) in owner}

    def _peer_bytes(self) -> dict | None:
        """{role: [sent, received]}: this rank's TCP payload bytes so far with the peers of
        each role (``_peer_roles``); None where they cannot be read (not gloo, no TCP_INFO)."""
        if self.peer_roles is None:
            return None
        totals = {role: [0, 0] for role in PEER_ROLES}
        for key, (sent, received) in _socket_bytes(_store_port()).items():
            role = self.peer_roles.get(key)
            if role is not None:
                totals[role][0] += sent
                totals[role][1] += received
        return totals

    def _optimizer(self):
        import torch

        if self.kind == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            return ZeroRedundancyOptimizer(self.model.parameters(),
                                           optimizer_class=torch.optim.Adam, lr=LEARNING_RATE)
        return torch.optim.Adam(self.model.parameters(), lr=LEARNING_RATE)

    # -- one optimizer step -----------------------------------------------------------------
    def _loss(self, iteration, micro=0):
        import torch

        from dpcost.measure.scenarios import _batch

        # a small fixed data set: each rank cycles through DATASET_BATCHES batches
        x = _batch(self.width, self.rank, 100 * (iteration % DATASET_BATCHES) + micro,
                   self.device)
        return (self.model(x) - torch.tanh(x @ self.teacher)).square().mean()

    def step(self, iteration, progress):
        with counting_collectives(self.calls):
            self.optimizer.zero_grad()
            if self.kind == "accumulation":
                total = 0.0
                for micro in range(MICRO_STEPS):
                    progress(iteration, "forward")
                    last = micro == MICRO_STEPS - 1
                    with contextlib.nullcontext() if last else self.model.no_sync():
                        loss = self._loss(iteration, micro) / MICRO_STEPS
                        progress(iteration, "backward")
                        loss.backward()
                    total += float(loss.detach())
                self.losses.append(total)
            else:
                progress(iteration, "forward")
                loss = self._loss(iteration)
                if self.kind in FSDP_KINDS:
                    self.unsharded_after_forward = unsharded_parameter_bytes(self.model)
                progress(iteration, "backward")
                loss.backward()
                self.losses.append(float(loss.detach()))
            progress(iteration, "optimizer step")
            self.optimizer.step()
        # every collective of the step has returned: the bytes by peer, before any barrier
        self.peer_reading = self._peer_bytes() if self.kind == "hsdp" else None
        self.census = state_census(self.model, self.optimizer)

    # -- what the worker adds to the result ---------------------------------------------------
    def snapshot(self):
        """Read after the barrier that opens the measured window."""
        peers = self._peer_bytes() if self.kind == "hsdp" else None
        return dict(self.calls), len(self.losses), peers

    def window_result(self, before, steps) -> dict:
        calls_before, losses_before, peers_before = before
        def per_step(key):
            return (self.calls[key] - calls_before.get(key, 0)) / steps

        calls = {name: per_step(name) for name in COUNTED if per_step(name)}
        sizes = {name: per_step(name + " bytes") for name in calls}
        result = {"collective_calls": calls, "collective_tensor_bytes": sizes,
                  "messages": sum(calls.values()),
                  "messages_reading": "calls of torch.distributed collectives, counted",
                  "losses": list(self.losses[:]), "window_losses": self.losses[losses_before:],
                  "state_census": dict(self.census),
                  "state_census_bytes": sum(self.census.values())}
        # the peak adds what the strategy holds beside the census (dpcost.strategies)
        beside = 0
        if self.kind == "powersgd":
            beside = sum(_local_bytes(t) for t in self.powersgd_state.error_dict.values())
            result["error_feedback_bytes"] = beside
        if self.kind in FSDP_KINDS:
            beside = self.unsharded_after_forward
            result["unsharded_after_forward_bytes"] = beside
        result["peak_state_bytes"] = result["state_census_bytes"] + beside
        if self.kind == "hsdp":
            result.update(self._hsdp_result(peers_before, steps))
        if self.kind not in FSDP_KINDS:  # a DDP model
            data = self.model._get_ddp_logging_data()
            result["bucket_sizes"] = [int(s) for s in str(data.get(
                "rebuilt_bucket_sizes", data.get("bucket_sizes", ""))).split(", ") if s]
        if self.kind in BUILT_IN_ALLREDUCE:  # DDP's reducer all-reduces from C++: not counted
            result["messages"] += len(result["bucket_sizes"])
            result["messages_reading"] += (" + DDP's rebuilt buckets (_get_ddp_logging_data), "
                                           "one all-reduce each (reducer.cpp)")
        if self.kind == "powersgd":
            result["powersgd_iter"] = self.powersgd_state.iter
        return result

    def _hsdp_result(self, peers_before, steps) -> dict:
        """The mesh, and the bytes per step with each role's peers, from the window's opening
        barrier to the end of its last step (the closing barrier is left out: it goes over the
        world group, and ``sent_bytes`` holds it)."""
        out = {"mesh_shape": list(hsdp_mesh_shape(self.world_size)),
               "mesh_dim_names": list(HSDP_MESH_DIM_NAMES)}
        if peers_before is None or self.peer_reading is None:
            out["peer_bytes_reading"] = ("unavailable: needs gloo and TCP_INFO (each process "
                                         "group's sockets, told apart by peer rank)")
            return out
        out["peer_ranks"] = self.peer_ranks
        out["peer_bytes_reading"] = ("TCP_INFO per socket, each socket's peer rank from the "
                                     "ranks' (local, peer) port pairs; from the window's "
                                     "opening barrier to the end of its last step")
        for role in PEER_ROLES:
            for index, direction in enumerate(("sent", "received")):
                moved = self.peer_reading[role][index] - peers_before[role][index]
                out[f"{role}_peer_{direction}_bytes"] = moved / steps
        return out

    def param_sum(self) -> float:
        return sum(float(_full(p).detach().double().sum()) for p in self.model.parameters())


def bf16_cast_hook(process_group, bucket):
    """The body of ``bf16_compress_hook`` under another name: ``default_hooks._compress_hook``
    with ``torch.bfloat16`` (cast the bucket to bf16, divide by n, all-reduce, cast back).

    ``DistributedDataParallel._check_comm_hook`` refuses the hooks *named*
    ``bf16_compress_hook`` / ``bf16_compress_wrapper_hook`` on builds without CUDA and NCCL
    2.10+; gloo itself all-reduces bfloat16 on CPU, so this runs the same arithmetic here.
    """
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks._compress_hook(torch.bfloat16, process_group, bucket)


def _full(tensor):
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


PEER_ROLES = ("shard", "replicate", "other")


def _store_port() -> int | None:
    """The rendezvous store's port (MASTER_PORT, under the launcher and torchrun): its
    sockets carry the store's keys, not the training's, and are left out."""
    port = os.environ.get("MASTER_PORT")
    return int(port) if port else None


def _socket_bytes(exclude_port) -> dict:
    """{(local port, peer port): (sent, received)} TCP payload bytes of each of this process's
    connected TCP sockets, those of ``exclude_port`` left out: ``counters.tcp_bytes`` per
    socket (sent less retransmitted, as there)."""
    found = {}
    for local, peer, sock in counters._own_tcp_sockets():
        try:
            if exclude_port is not None and exclude_port in (local, peer):
                continue
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO,
                                   counters.TCP_INFO_LENGTH)
        finally:
            sock.close()
        if len(info) < counters.TCP_INFO_LENGTH:
            raise OSError(f"TCP_INFO returned {len(info)} bytes; byte counters need "
                          f"{counters.TCP_INFO_LENGTH} (Linux >= 4.19)")
        sent = (struct.unpack_from("Q", info, counters.TCP_INFO_BYTES_SENT)[0]
                - struct.unpack_from("Q", info, counters.TCP_INFO_BYTES_RETRANS)[0])
        found[(local, peer)] = (sent, struct.unpack_from("Q", info,
                                                         counters.TCP_INFO_BYTES_RECEIVED)[0])
    return found


def build(kind, config, rank, device="cpu") -> StrategyScenario:
    """The scenario ``kind`` (one of ``NAMES``) for ``config``'s model on this rank."""
    if kind not in NAMES:
        raise ValueError(f"strategy scenario must be one of {NAMES}, got {kind!r}")
    if kind == "hsdp":
        hsdp_mesh_shape(config.world_size)  # refuses an odd world size, before any collective
    return StrategyScenario(kind, config.width, config.depth, rank, config.world_size, device)


def _torch_has_cuda() -> bool:
    """Whether the installed torch is a CUDA build (``libtorch_cuda`` beside ``libtorch``),
    found without importing torch: ``find_spec`` of a top-level package does not import it."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return False
    return any((Path(spec.origin).parent / "lib").glob("libtorch_cuda*"))


def unavailable(kind: str, backend: str, world_size: int | None = None) -> str | None:
    """Why scenario ``kind`` cannot run with ``backend``, this torch build and ``world_size``
    ranks (None: not checked), or None.

    Checked before any rank starts, so that the report lists the scenario under "skipped"
    with this reason. ``bf16-hook``: ``DistributedDataParallel._check_comm_hook`` refuses
    ``bf16_compress_hook`` unless torch is built with CUDA 11+ and NCCL 2.10+ (or XPU and
    XCCL), whatever the backend; a CPU build cannot register it. ``hsdp``: its mesh is
    (world_size // 2, 2), which an odd world size cannot fill.
    """
    if kind not in NAMES:
        raise ValueError(f"strategy scenario must be one of {NAMES}, got {kind!r}")
    if kind == "hsdp" and world_size is not None:
        try:
            hsdp_mesh_shape(world_size)
        except ValueError as error:
            return str(error)
    if kind == "bf16-hook" and not _torch_has_cuda():
        return ("DistributedDataParallel._check_comm_hook refuses bf16_compress_hook unless "
                "torch is built with CUDA 11+ and NCCL 2.10+ (or XPU and XCCL); this torch is "
                f"a CPU build (backend {backend}); scenario bf16-cast runs the same code "
                "(default_hooks._compress_hook with torch.bfloat16) under another name")
    return None


# --- predictions (torch-free: the report computes them from dpcost.strategies) ---------------

def linear_stack_shapes(param_bytes: int, depth: int):
    """Parameter shapes of ``scenarios.build_model`` (registration order) from its P and depth:
    w^2 + w = P / (4 depth)."""
    width = round((-1 + math.sqrt(1 + param_bytes / depth)) / 2)
    if 4 * depth * (width * width + width) != param_bytes:
        raise ValueError(f"param_bytes {param_bytes} is not a Linear stack of depth {depth}")
    return [(width, width), (width,)] * depth


def ready_order_bytes(shapes) -> list:
    """Gradient bytes in the order they become ready in backward, as DDP rebuilds its buckets:
    last layer first, each layer's bias before its weight (read from the rebuilt bucket sizes
    of ``_get_ddp_logging_data``: 2 layers make the first bucket at the 1 MiB cap, which only
    this order gives for 1 MB layers)."""
    layers = [shapes[i:i + 2] for i in range(0, len(shapes), 2)]
    return [4 * math.prod(shape) for weight, bias in reversed(layers) for shape in (bias, weight)]


def _hsdp_cost(shapes, n, rank, backend, depth, **common):
    """``strategies.hsdp`` for the measured Linear stack on ``rank`` of the hsdp scenario's
    (n // 2, 2) mesh: shards padded over s = 2 ranks, the rank's shard index rank % 2."""
    m, s = hsdp_mesh_shape(n)
    return st.hsdp(st.fsdp_padded_param_bytes(shapes, s), n, s, backend, depth,
                           **common, local_numel=st.fsdp_local_numel(shapes, s, rank % s))


def predictions(name: str, rank: int, param_bytes: int, world_size: int, depth: int,
                backend: str = "gloo", warmup: int = 2) -> dict:
    """What ``dpcost.strategies`` predicts for scenario ``name`` on ``rank``, per step:
    predicted sent/received bytes, messages and model state (fp32 Adam) after the step (what
    the census reads) and at its peak. hsdp adds the bytes with its shard and replicate
    partners (``predicted_shard_peer_bytes``, ``predicted_replicate_peer_bytes``), each way."""

    if name not in NAMES:
        raise ValueError(f"strategy scenario must be one of {NAMES}, got {name!r}")
    n, p = world_size, param_bytes
    shapes = linear_stack_shapes(param_bytes, depth)
    numels = [math.prod(s) for s in shapes]
    psi = sum(numels)
    ready = ready_order_bytes(shapes)
    buckets = len(bucket_assignment(ready, ddp_bucket_caps()))
    common = dict(num_params=psi, precision="fp32", optimizer="adam")
    if name == "ddp-adam":
        cost = st.ddp(p, n, buckets, **common)
    elif name == "accumulation":
        cost = st.accumulation(p, n, MICRO_STEPS, buckets, **common)
    elif name in ("fp16-hook", "bf16-hook", "bf16-cast"):
        cost = st.compress_hook(p, n, name[:4], num_buckets=buckets, **common)
    elif name == "powersgd":
        cost = st.powersgd(shapes, n, POWERSGD_RANK, iteration=warmup,
                           start_powersgd_iter=POWERSGD_START, **common)
    elif name == "bucket-cap":
        capped = len(bucket_assignment(ready, ddp_bucket_caps(BUCKET_CAP_MB)))
        cost = st.ddp(p, n, capped, **common)
    elif name == "zero1":
        cost = st.zero1(numels, n, rank, 4, backend, num_buckets=buckets,
                        precision=common["precision"], optimizer=common["optimizer"])
    elif name == "hsdp":
        cost = _hsdp_cost(shapes, n, rank, backend, depth, **common)
    else:  # shards padded to ceil(rows / n) rows (FSDP2), so P grows unless n divides w
        cost = st.fsdp(st.fsdp_padded_param_bytes(shapes, n), n, name == "fsdp", backend,
                       depth, **common, local_numel=st.fsdp_local_numel(shapes, n, rank))
    out = {"predicted_sent_bytes": cost.sent_bytes,
           "predicted_received_bytes": cost.received_bytes,
           "predicted_messages": cost.messages,
           "predicted_state_census_bytes": cost.state_after_step_bytes,
           "predicted_peak_state_bytes": cost.peak_state_bytes,
           "formula": cost.formula, "source": cost.source}
    if name == "hsdp":
        out.update(predicted_shard_peer_bytes=cost.extra["shard_group_bytes"],
                   predicted_replicate_peer_bytes=cost.extra["replicate_group_bytes"],
                   predicted_other_peer_bytes=0.0)
    return out


# The lesson's ladder and the scenario that measures each rung here, from the strategy
# registry; None: not measurable on this CPU (the NCCL path needs GPUs and NCCL).
LADDER_SCENARIOS = {entry.ladder: entry.scenario for entry in registry.ladder()}


def ladder_rows(report: dict, rank: int = 0, hsdp_report: dict | None = None) -> list:
    """One dict per rung for ``rank``: modelled bytes sent per optimizer step, messages and
    model-state bytes (``dpcost.strategies.ladder`` for the measured model, fp32 Adam, on the
    report's backend) beside the measured ones, None where the rung did not run.
    ``hsdp_report``: a run of the hsdp scenario on more ranks (its (n/2, 2) mesh needs 4 to
    replicate at all): the HSDP row is modelled and measured there. Each row says its
    ``world_size``.

    Model state under ``dpcost.strategies``' two definitions: ``*_state_after_step_bytes``,
    once the optimizer has stepped (measured: the census); ``*_peak_state_bytes``, that plus
    PowerSGD's error feedback (g Psi) or FSDP-without-resharding's unsharded parameters
    (p Psi) (measured: the census plus those tensors, read where they are held).
    """
    rows = _rows(report, rank)
    if hsdp_report is not None:
        hsdp = registry.BY_KEY["hsdp"].ladder
        rows = [next(r for r in _rows(hsdp_report, rank) if r["rung"] == hsdp)
                if row["rung"] == hsdp else row for row in rows]
    return rows


def _rows(report: dict, rank: int) -> list:
    from dpcost.measure.shape import DEPTH

    n, p = report["world_size"], report["param_bytes"]
    shapes = linear_stack_shapes(p, DEPTH)
    buckets = len(bucket_assignment(ready_order_bytes(shapes), ddp_bucket_caps()))
    modelled = st.ladder(shapes, n, rank, report["backend"], MICRO_STEPS, POWERSGD_RANK,
                         buckets, DEPTH, precision="fp32", optimizer="adam")  # as measured
    rows = []
    for rung, cost in zip(st.LADDER, modelled, strict=True):
        scenario = LADDER_SCENARIOS[rung]
        measured = None
        if scenario in report["scenarios"]:
            measured = next(r for r in report["scenarios"][scenario] if r["rank"] == rank)
        rows.append({
            "rung": rung, "scenario": scenario, "world_size": n,
            "modelled_sent_bytes": cost.sent_bytes, "modelled_received_bytes":
                cost.received_bytes, "modelled_messages": cost.messages,
            "modelled_state_after_step_bytes": cost.state_after_step_bytes,
            "modelled_peak_state_bytes": cost.peak_state_bytes,
            "measured_sent_bytes": measured["sent_bytes"] if measured else None,
            "measured_received_bytes": measured["received_bytes"] if measured else None,
            "measured_messages": measured.get("messages") if measured else None,
            "measured_state_after_step_bytes": measured.get("state_census_bytes")
                if measured else None,
            "measured_peak_state_bytes": measured.get("peak_state_bytes") if measured else None,
            "peak_rss_growth_bytes": measured["peak_memory_bytes"] if measured else None,
            "why_not_measured": None if measured else (
                "needs GPUs and NCCL" if scenario is None else report["skipped"].get(
                    scenario, f"scenario {scenario} was not run")),
        })
    return rows


def bytes_excess(report: dict, hsdp_report: dict | None = None) -> dict:
    """Per rung measured: the largest |measured / modelled - 1| of the bytes over every rank
    and both directions (sent, received). Gloo's framing is the only difference, so it grows
    with the messages per byte (``docs/measurement.md``). ``hsdp_report``: as in
    ``ladder_rows``."""
    excess = {}
    for rank in range(max(report["world_size"], (hsdp_report or report)["world_size"])):
        rows = [r for r in (_rows(report, rank) if rank < report["world_size"] else [])
                if hsdp_report is None or r["scenario"] != "hsdp"]
        if hsdp_report is not None:
            rows += [r for r in _rows(hsdp_report, rank) if r["scenario"] == "hsdp"]
        for row in rows:
            if row["measured_sent_bytes"] is None:
                continue
            for direction in ("sent", "received"):
                ratio = row[f"measured_{direction}_bytes"] / row[f"modelled_{direction}_bytes"]
                excess[row["rung"]] = max(excess.get(row["rung"], 0.0), abs(ratio - 1))
    return excess


def format_ladder_table(rows: list) -> str:
    """``ladder_rows`` as a text table: MB (10^6 B) per rank per optimizer step, messages and
    model state after the step and at its peak, modelled beside measured ("-" where the rung
    did not run here)."""
    def mb(value):
        return "-" if value is None else f"{value / 1e6:.4f}"

    def count(value):
        return "-" if value is None else f"{value:g}"

    lines = [f"{'':<20} {'sent MB':^19} {'messages':^17} {'state after step MB':^19} "
             f"{'peak state MB':^19}".rstrip(),
             f"{'rung':<20} {'model':>9} {'measured':>9} {'model':>8} {'measured':>8} "
             f"{'model':>9} {'measured':>9} {'model':>9} {'measured':>9}"]
    first = rows[0].get("world_size") if rows else None
    for row in rows:
        rung = row["rung"] if row.get("world_size", first) == first else \
            f"{row['rung']} (n = {row['world_size']})"
        lines.append(f"{rung:<20} {mb(row['modelled_sent_bytes']):>9} "
                     f"{mb(row['measured_sent_bytes']):>9} {count(row['modelled_messages']):>8} "
                     f"{count(row['measured_messages']):>8} "
                     f"{mb(row['modelled_state_after_step_bytes']):>9} "
                     f"{mb(row['measured_state_after_step_bytes']):>9} "
                     f"{mb(row['modelled_peak_state_bytes']):>9} "
                     f"{mb(row['measured_peak_state_bytes']):>9}")
    return "\n".join(lines)
