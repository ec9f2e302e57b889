"""The training loops that are measured: DDP, the DataParallel pattern on processes, real DP.

Every scenario trains the same model, a stack of ``depth`` square ``nn.Linear`` layers in float32
with ReLU between them, so its gradient bytes are P = 4 * depth * (width^2 + width).

- ``ddp``: ``torch.nn.parallel.DistributedDataParallel`` as users run it; with ``count=True``
  a comm hook counts every bucket it all-reduces (``counters.counting_allreduce_hook``).
- ``dp``: DataParallel's star on processes. Rank 0 plays GPU0: each iteration it sends the
  parameters to every other rank (DP's ``replicate``), every rank runs forward and backward on
  its share of the batch, every other rank sends its gradients back and rank 0 sums them (DP's
  ``ReduceAddCoalesced``) and steps the optimizer. Point-to-point ``send``/``recv`` on purpose:
  gloo's own broadcast (a binomial tree) and reduce (ring-based) are not a star.
- ``dataparallel-cuda``: the real ``torch.nn.DataParallel`` in one process on >= 2 GPUs,
  counting the bytes given to the ``torch.nn.parallel.comm`` functions it calls.
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist
from torch import nn

from dpcost.measure import counters

SAMPLES_PER_RANK = 16  # each rank's share of the batch
LEARNING_RATE = 1e-3



def build_model(width: int, depth: int, seed: int = 0) -> nn.Sequential:
    """The measured model: ``depth`` Linear(width, width) layers, ReLU between, float32."""
    torch.manual_seed(seed)
    layers = []
    for i in range(depth):
        layers.append(nn.Linear(width, width))
        if i < depth - 1:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _batch(width: int, rank: int, iteration: int, device="cpu") -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * iteration + rank)
    return torch.randn(SAMPLES_PER_RANK, width, generator=generator).to(device)


def _flatten_into_views(tensors) -> torch.Tensor:
    """One contiguous buffer holding ``tensors``' values; each tensor becomes a view into it.

    So the whole model is sent or received as one message, without a copy per iteration.
    """
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    offset = 0
    for t in tensors:
        t.data = flat[offset:offset + t.numel()].view_as(t)
        offset += t.numel()
    return flat


class DDPScenario:
    """One DDP training iteration per ``step``; ``hook`` counts the buckets when ``count``."""

    def __init__(self, width, depth, rank, count=True, device="cpu"):
        self.width, self.rank, self.device = width, rank, device
        self.model = nn.parallel.DistributedDataParallel(build_model(width, depth).to(device))
        self.hook = counters.BucketCounter()
        if count:
            self.model.register_comm_hook(self.hook, counters.counting_allreduce_hook)
        # The counting hook sums the gradients; the 1/n that makes them a mean moves into the loss.
        self.loss_scale = 1.0 / dist.get_world_size() if count else 1.0
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LEARNING_RATE)
        self.logical_sent = self.logical_received = 0  # DDP's are derived from the hook

    def step(self, iteration, progress):
        progress(iteration, "forward")
        out = self.model(_batch(self.width, self.rank, iteration, self.device))
        loss = out.square().mean() * self.loss_scale
        progress(iteration, "backward")  # the buckets are all-reduced during backward
        self.optimizer.zero_grad()
        loss.backward()
        progress(iteration, "optimizer step")
        self.optimizer.step()


class NullRecorder:
    """Records nothing: the plain scenarios' stand-in for ``timed.Recorder``."""

    iteration = 0

    def add(self, lane, name, start, end=None):
        pass

    def span(self, lane, name):
        return contextlib.nullcontext()


class DPPatternScenario:
    """DataParallel's star on processes: rank 0 sends parameters out and sums gradients in."""

    def __init__(self, width, depth, rank, world_size, device="cpu"):
        self.width, self.rank, self.world_size, self.device = width, rank, world_size, device
        self.model = build_model(width, depth).to(device)
        params = list(self.model.parameters())
        self.flat_params = _flatten_into_views(params)
        for p in params:
            p.grad = torch.zeros_like(p)
        self.flat_grads = _flatten_into_views([p.grad for p in params])
        self._make_inbox()
        self.optimizer = torch.optim.SGD(params, lr=LEARNING_RATE) if rank == 0 else None
        self.logical_sent = self.logical_received = 0  # bytes handed to send / recv
        self.recorder = NullRecorder()  # timed.py's scenarios put a real one here

    def _make_inbox(self):
        # Rank 0 keeps one landing buffer per other rank, as GPU0 holds their gradient copies.
        self.inbox = ([torch.empty_like(self.flat_grads) for _ in range(self.world_size - 1)]
                      if self.rank == 0 else [])

    def _send_params(self):
        """replicate: GPU0 sends the parameters to every other GPU."""
        nbytes, others = self.flat_params.nbytes, range(1, self.world_size)
        if self.rank == 0:
            for request in [dist.isend(self.flat_params, dst) for dst in others]:
                request.wait()
            self.logical_sent += nbytes * (self.world_size - 1)
        else:
            dist.recv(self.flat_params, src=0)
            self.logical_received += nbytes

    def _reduce_grads(self):
        """reduce-add: every other GPU's gradients come back to GPU0, which sums them."""
        nbytes, others = self.flat_grads.nbytes, range(1, self.world_size)
        if self.rank == 0:
            requests = [dist.irecv(box, src) for src, box in zip(others, self.inbox, strict=True)]
            for request in requests:
                request.wait()
            for box in self.inbox:
                self.flat_grads.add_(box)
            self.logical_received += nbytes * (self.world_size - 1)
        else:
            dist.send(self.flat_grads, dst=0)
            self.logical_sent += nbytes

    def step(self, iteration, progress):
        record = self.recorder
        record.iteration = iteration
        progress(iteration, "parameter exchange")
        with record.span("comm", "parameters out"):
            self._send_params()
        progress(iteration, "forward")
        with record.span("compute", "forward"):
            loss = self.model(_batch(self.width, self.rank, iteration, self.device))
            loss = loss.square().mean()
        progress(iteration, "backward")
        self.flat_grads.zero_()
        with record.span("compute", "backward"):
            loss.backward()
        progress(iteration, "gradient exchange")
        with record.span("comm", "gradients in"):
            self._reduce_grads()
        if self.rank == 0:
            self.flat_grads.div_(self.world_size)  # the mean over the whole batch, as DDP's
            progress(iteration, "optimizer step")
            with record.span("compute", "optimizer step"):
                self.optimizer.step()


def dataparallel_cuda(width: int, depth: int, steps: int = 10, warmup: int = 2) -> list:
    """Run the real ``torch.nn.DataParallel`` on every visible GPU and count what it moves.

    Bytes: the ``torch.nn.parallel.comm`` functions DataParallel calls (``broadcast_coalesced``
    from ``replicate.py``; ``reduce_add_coalesced``, ``scatter`` and ``gather`` from
    ``_functions.py``, all looked up as ``comm.<name>`` at call time) are wrapped during the
    measured steps, and every tensor that lands on another device than it came from is counted
    as sent by its source and received by its destination. Memory: per device,
    ``torch.cuda.max_memory_allocated`` over the measured steps. Returns one dict per GPU in the
    shape of a rank's result. Raises RuntimeError when fewer than 2 CUDA GPUs are visible.
    """
    from torch._utils import _get_device_index
    from torch.nn.parallel import comm

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < 2:
        raise RuntimeError(f"dataparallel-cuda needs >= 2 CUDA GPUs, this machine has {n}")
    model = nn.DataParallel(build_model(width, depth).cuda(0))
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    sent, received = [0] * n, [0] * n

    def move(source, destination, size):
        if source != destination and source >= 0 and destination >= 0:
            sent[source] += size
            received[destination] += size

    def nbytes(tensor):
        return tensor.numel() * tensor.element_size()

    def broadcast_coalesced(tensors, devices, *args, **kwargs):
        devices = [_get_device_index(d) for d in devices]
        for tensor in tensors:
            for device in devices[1:]:
                move(tensor.get_device(), device, nbytes(tensor))
        return original["broadcast_coalesced"](tensors, devices, *args, **kwargs)

    def reduce_add_coalesced(inputs, destination=None, *args, **kwargs):
        outputs = original["reduce_add_coalesced"](inputs, destination, *args, **kwargs)
        for group in inputs:
            for tensor in group:
                move(tensor.get_device(), outputs[0].get_device(), nbytes(tensor))
        return outputs

    def scatter(tensor, *args, **kwargs):
        outputs = original["scatter"](tensor, *args, **kwargs)
        for chunk in outputs:
            move(tensor.get_device(), chunk.get_device(), nbytes(chunk))
        return outputs

    def gather(tensors, *args, **kwargs):
        output = original["gather"](tensors, *args, **kwargs)
        for tensor in tensors:
            move(tensor.get_device(), output.get_device(), nbytes(tensor))
        return output

    wrappers = {"broadcast_coalesced": broadcast_coalesced,
                "reduce_add_coalesced": reduce_add_coalesced, "scatter": scatter, "gather": gather}
    original = {name: getattr(comm, name) for name in wrappers}
    times = []
    try:
        for iteration in range(warmup + steps):
            if iteration == warmup:
                torch.cuda.synchronize()
                for device in range(n):
                    torch.cuda.reset_peak_memory_stats(device)
                for name, wrapper in wrappers.items():
                    setattr(comm, name, wrapper)
            start = time.perf_counter()
            batch = torch.cat([_batch(width, r, iteration) for r in range(n)]).cuda(0)
            loss = model(batch).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    finally:
        for name, function in original.items():
            setattr(comm, name, function)
    step_time = sorted(times[warmup:])[steps // 2]
    return [{"rank": device, "sent_bytes": sent[device] / steps,
             "received_bytes": received[device] / steps,
             "counter": "torch.nn.parallel.comm calls (tensor bytes between devices)",
             "peak_memory_bytes": torch.cuda.max_memory_allocated(device),
             "memory_reading": "torch.cuda.max_memory_allocated per device",
             "step_time_s": step_time} for device in range(n)]
