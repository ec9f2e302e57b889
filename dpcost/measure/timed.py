"""The same training loops, with a timestamp on every phase: what lesson 07's timeline shows.

Each timed scenario records, per iteration, events ``(lane, name, start_ns, end_ns)`` on the
clock ``time.perf_counter_ns`` (CLOCK_MONOTONIC on Linux: one clock for every process of the
machine, so ranks line up):

- ``ddp-timeline``: forward; backward (the ``loss.backward()`` call, which returns only once
  DDP has waited for every bucket: ``reducer.cpp: finalize_backward``); each parameter's
  gradient ready (``Tensor.register_post_accumulate_grad_hook``, start = end); each bucket's
  all-reduce from the moment DDP hands it to the comm hook to its future's completion (the
  ``then`` callback, run by gloo's thread); the optimizer step.
- ``dp-timeline`` (the star) and ``dp-nccl-timeline`` (the chain): the parameter exchange,
  forward, backward, the gradient exchange, rank 0's optimizer step.

The hooks are Python and cost time, so these are separate scenarios: the plain ``ddp`` and
``dp`` windows stay free of them, and the report shows both step times side by side.
"""

from __future__ import annotations

import time

import torch.distributed as dist

from dpcost.measure.chain import DPChainScenario
from dpcost.measure.scenarios import DDPScenario, DPPatternScenario, _batch

now = time.perf_counter_ns


class Recorder:
    """Events of the measured iterations: (iteration, lane, name, start_ns, end_ns)."""

    def __init__(self):
        self.events, self.iteration, self.on = [], 0, False

    def add(self, lane, name, start, end=None):
        if self.on:
            self.events.append((self.iteration, lane, name, start, start if end is None else end))

    def span(self, lane, name):
        return _Span(self, lane, name)


class _Span:
    def __init__(self, recorder, lane, name):
        self.recorder, self.lane, self.name = recorder, lane, name

    def __enter__(self):
        self.start = now()

    def __exit__(self, *exc):
        self.recorder.add(self.lane, self.name, self.start, now())


def timed_allreduce_hook(recorder: Recorder, bucket):
    """A DDP comm hook that all-reduces the bucket as DDP does and times it.

    Divides by the world size first, as ``default_hooks.py: allreduce_hook`` does, so that the
    gradients are DDP's mean; the extra pass is part of the time this scenario pays.
    """
    start, index, nbytes = now(), bucket.index(), bucket.buffer().nbytes
    tensor = bucket.buffer().div_(dist.get_world_size())

    def done(future):
        recorder.add("comm", f"bucket {index} ({nbytes} B)", start, now())
        return future.value()[0]

    return dist.all_reduce(tensor, async_op=True).get_future().then(done)


def calibrate_allreduce(nbytes: int, device="cpu", repeats: int = 5) -> dict:
    """Median seconds of a lone all-reduce of 4 KiB, nbytes / 4 and nbytes float32 bytes.

    Run with nothing else going on, so that ``timeline.fit_alpha_beta`` can fit t = a + b·S
    for the overlap model; every rank must call it (it is a collective).
    """
    import statistics

    import torch

    sizes = sorted({4096, max(4096, nbytes // 4), max(8192, nbytes)})
    seconds = []
    for size in sizes:
        tensor = torch.zeros(size // 4, device=device)
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = now()
            dist.all_reduce(tensor)
            times.append((now() - start) / 1e9)
        seconds.append(statistics.median(times))
    return {"sizes_bytes": sizes, "seconds": seconds}


class TimedDDPScenario(DDPScenario):
    def __init__(self, width, depth, rank, device="cpu"):
        super().__init__(width, depth, rank, count=False, device=device)
        self.recorder = Recorder()
        nbytes = sum(p.nbytes for p in self.model.parameters())
        self.allreduce_calibration = calibrate_allreduce(nbytes, device)
        self.model.register_comm_hook(self.recorder, timed_allreduce_hook)
        for name, parameter in self.model.module.named_parameters():
            parameter.register_post_accumulate_grad_hook(
                lambda p, name=name: self.recorder.add("grad", f"{name} ready", now()))

    def step(self, iteration, progress):
        record = self.recorder
        record.iteration = iteration
        progress(iteration, "forward")
        with record.span("compute", "forward"):
            out = self.model(_batch(self.width, self.rank, iteration, self.device))
            loss = out.square().mean()
        progress(iteration, "backward")
        self.optimizer.zero_grad()
        with record.span("compute", "backward"):
            loss.backward()
        progress(iteration, "optimizer step")
        with record.span("compute", "optimizer step"):
            self.optimizer.step()


class TimedDPPatternScenario(DPPatternScenario):
    def __init__(self, width, depth, rank, world_size, device="cpu"):
        super().__init__(width, depth, rank, world_size, device=device)
        self.recorder = Recorder()


class TimedDPChainScenario(DPChainScenario):
    def __init__(self, width, depth, rank, world_size, device="cpu"):
        super().__init__(width, depth, rank, world_size, device=device)
        self.recorder = Recorder()
