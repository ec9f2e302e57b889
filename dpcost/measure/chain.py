"""DataParallel's NCCL path on processes: a chunked, pipelined chain broadcast and chain reduce.

On a CUDA build with NCCL, ``torch.nn.DataParallel`` does not copy the parameters from GPU0 to
every GPU one by one: ``replicate`` -> ``comm.broadcast_coalesced`` ->
``torch/csrc/cuda/comm.cpp: broadcast`` -> ``nccl::broadcast``, and ``ReduceAddCoalesced`` ->
``comm.reduce_add`` -> ``torch.cuda.nccl.reduce`` (``torch/nn/parallel/comm.py``). NCCL runs
broadcast and reduce as pipelined rings: the data leaves the root in chunks, and every GPU
forwards chunk i to the next while it receives chunk i + 1. For one broadcast of S bytes

- the root sends S and receives nothing; each GPU in the middle of the chain receives S and
  sends S; the last GPU receives S;

and a reduce onto the root runs on the same ring in the same direction (NCCL's
``src/device/reduce.h: runRing``): the GPU after the root sends its share, each next one adds
its own to the partial sum and passes it on, and the root receives the sum. So per DP step
(parameters out, gradients back, P bytes each) rank 0 sends P and receives P, rank 1 sends 2P
and receives P, a rank in the middle 2P and 2P, the last rank P and 2P
(``dpcost.dataparallel_traffic.chain_step_bytes``). Every link is busy 2P: rank 0's is no
longer n times busier than a DDP rank's, only n/(n - 1) times (2P in two serial phases against
the ring's 2(n - 1)/n P, both ways at once).

Here the chain runs over gloo's point-to-point ``isend``/``recv``, one message per chunk and
hop, ``CHUNK_BYTES`` per chunk: NCCL's pipeline slice, its buffer (``NCCL_BUFFSIZE``, 4 MiB by
default) split into ``NCCL_STEPS`` = 8 slices, 512 KiB (``dataparallel_traffic.chain_messages``
counts them).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from dpcost.dataparallel_traffic import NCCL_SLICE_BYTES, chain_step_bytes
from dpcost.measure.scenarios import DPPatternScenario

CHUNK_BYTES = NCCL_SLICE_BYTES


def _chunks(flat: torch.Tensor, chunk_bytes: int):
    step = max(1, chunk_bytes // flat.element_size())
    return [flat[i:i + step] for i in range(0, flat.numel(), step)]


def chain_broadcast(flat: torch.Tensor, rank: int, world_size: int,
                    chunk_bytes: int = CHUNK_BYTES) -> None:
    """Broadcast ``flat`` from rank 0 along 0 -> 1 -> ... -> n-1, chunk by chunk, pipelined."""
    pending = []
    for tag, chunk in enumerate(_chunks(flat, chunk_bytes)):
        if rank > 0:
            dist.recv(chunk, src=rank - 1, tag=tag)
        if rank < world_size - 1:  # pass it on while the next chunk arrives
            pending.append(dist.isend(chunk, dst=rank + 1, tag=tag))
    for request in pending:
        request.wait()


def chain_reduce(flat: torch.Tensor, inbox: torch.Tensor, rank: int, world_size: int,
                 chunk_bytes: int = CHUNK_BYTES) -> None:
    """Sum every rank's ``flat`` into rank 0's, along 1 -> 2 -> ... -> n-1 -> 0, chunk by chunk.

    Rank 1 sends its own chunk; a rank after it receives the partial sum of the ranks before it
    into ``inbox``, adds its own chunk and passes the sum on; rank 0 adds the arriving sums
    into ``flat``.
    """
    pending = []
    mine = _chunks(flat, chunk_bytes)
    arriving = _chunks(inbox, chunk_bytes) if inbox is not None else [None] * len(mine)
    after = (rank + 1) % world_size
    for tag, (own, partial) in enumerate(zip(mine, arriving, strict=True)):
        if rank == 1:
            pending.append(dist.isend(own, dst=after, tag=tag))
            continue
        dist.recv(partial, src=rank - 1 if rank > 0 else world_size - 1, tag=tag)
        if rank == 0:
            own.add_(partial)
        else:
            partial.add_(own)
            pending.append(dist.isend(partial, dst=after, tag=tag))
    for request in pending:
        request.wait()


class DPChainScenario(DPPatternScenario):
    """DataParallel's NCCL path on processes: chain broadcast out, chain reduce back."""

    chunk_bytes = CHUNK_BYTES

    def _make_inbox(self):  # one buffer for the partial sums arriving from the rank before
        self.inbox = torch.empty_like(self.flat_grads) if self.rank != 1 else None

    def _per_step(self):
        """Bytes this rank hands to isend and recv per step, broadcast then reduce."""
        return chain_step_bytes(self.flat_params.nbytes, self.world_size)[self.rank]

    def _send_params(self):
        chain_broadcast(self.flat_params, self.rank, self.world_size, self.chunk_bytes)

    def _reduce_grads(self):
        chain_reduce(self.flat_grads, self.inbox, self.rank, self.world_size, self.chunk_bytes)
        sent, received = self._per_step()
        self.logical_sent += sent
        self.logical_received += received
