"""DataParallel's NCCL path on processes: a chunked, pipelined chain broadcast and chain reduce.

On a CUDA build with NCCL, ``torch.nn.DataParallel`` does not copy the parameters from GPU0 to
every GPU one by one: ``replicate`` -> ``comm.broadcast_coalesced`` ->
``torch/csrc/cuda/comm.cpp: broadcast`` -> ``nccl::broadcast``, and ``ReduceAddCoalesced`` ->
``comm.reduce_add`` -> ``torch.cuda.nccl.reduce`` (``torch/nn/parallel/comm.py``). NCCL runs
broadcast and reduce as pipelined rings: the data leaves the root in chunks, and every GPU
forwards chunk i to the next while it receives chunk i + 1. For one broadcast of S bytes

- the root sends S and receives nothing; each GPU in the middle of the chain receives S and
  sends S; the last GPU receives S;

and a reduce onto the root is the same chain run backwards, each GPU adding its own share to
the partial sum before passing it on. So per DP step (parameters out, gradients back, P bytes
each) rank 0 sends P and receives P, a middle rank sends 2P and receives 2P, the last rank P and
P: rank 0's link is no longer n times busier than a DDP rank's, only n/(n - 1) times
(2P in two serial phases against the ring's 2(n - 1)/n P, both ways at once).

Here the chain runs over gloo's point-to-point ``isend``/``recv``, one message per chunk and
hop, ``CHUNK_BYTES`` per chunk: NCCL's pipeline steps are its buffer (``NCCL_BUFFSIZE``,
4 MiB by default) split into ``NCCL_STEPS`` = 8 slices, 512 KiB.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from dpcost.measure.scenarios import DPPatternScenario

CHUNK_BYTES = 512 * 1024  # 4 MiB NCCL buffer / 8 steps


def chain_messages(nbytes: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Messages one hop of the chain carries for ``nbytes``: ceil(nbytes / chunk_bytes)."""
    return max(1, math.ceil(nbytes / chunk_bytes))


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
    """Sum every rank's ``flat`` into rank 0's, along n-1 -> ... -> 1 -> 0, chunk by chunk.

    A rank in the middle receives the partial sum of the ranks after it into ``inbox``, adds its
    own chunk and passes the sum on; rank 0 adds the arriving sums into ``flat``.
    """
    pending = []
    mine = _chunks(flat, chunk_bytes)
    arriving = _chunks(inbox, chunk_bytes) if inbox is not None else [None] * len(mine)
    for tag, (own, partial) in enumerate(zip(mine, arriving, strict=True)):
        if rank == world_size - 1:
            pending.append(dist.isend(own, dst=rank - 1, tag=tag))
            continue
        dist.recv(partial, src=rank + 1, tag=tag)
        if rank == 0:
            own.add_(partial)
        else:
            partial.add_(own)
            pending.append(dist.isend(partial, dst=rank - 1, tag=tag))
    for request in pending:
        request.wait()


class DPChainScenario(DPPatternScenario):
    """DataParallel's NCCL path on processes: chain broadcast out, chain reduce back."""

    chunk_bytes = CHUNK_BYTES

    def _make_inbox(self):  # one buffer for the partial sums arriving from the next rank
        self.inbox = (torch.empty_like(self.flat_grads) if self.rank < self.world_size - 1
                      else None)

    def _per_step(self):
        """Bytes this rank hands to isend and recv per step, broadcast then reduce."""
        nbytes, first, last = self.flat_params.nbytes, self.rank == 0, \
            self.rank == self.world_size - 1
        return nbytes * ((not last) + (not first)), nbytes * ((not first) + (not last))

    def _send_params(self):
        chain_broadcast(self.flat_params, self.rank, self.world_size, self.chunk_bytes)

    def _reduce_grads(self):
        chain_reduce(self.flat_grads, self.inbox, self.rank, self.world_size, self.chunk_bytes)
        sent, received = self._per_step()
        self.logical_sent += sent
        self.logical_received += received
