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


CALIBRATION_MIN_BYTES = 4096  # the smallest all-reduce timed: nearly all latency, it pins a
CALIBRATION_CAP_BYTES = 32 << 20  # at 32 MiB the slope dwarfs any jitter


def calibration_sizes(nbytes: int) -> list[int]:
    """Bytes of the all-reduces ``calibrate_allreduce`` times for a model of ``nbytes`` bytes.

    4 KiB, and top / 8, top / 4, top / 2, top, with top = 4·nbytes (at least 64 KiB; above
    8 MiB of model, max(nbytes, 32 MiB), which bounds the time and the buffer at a large
    model), rounded up to a multiple of 32 bytes so that every size is whole float32 elements.

    Why not a ladder all the way down: on 2 loaded cores an all-reduce comes out up to ~4 ms
    late (a scheduler tick), more than a 256 KiB all-reduce lasts; pairs of small sizes give
    slopes of pure noise, and Theil–Sen (``timeline.fit_alpha_beta``) counts pairs. Here the two
    closest sizes, 4 KiB and top / 8, are half the model apart (top = 4·nbytes), the rest further.
    """
    top = max(4 * nbytes, 64 << 10)
    if top > CALIBRATION_CAP_BYTES:
        top = max(nbytes, CALIBRATION_CAP_BYTES)
    top = -(-int(top) // 32) * 32
    return [CALIBRATION_MIN_BYTES, top // 8, top // 4, top // 2, top]


def calibrate_allreduce(nbytes: int, device="cpu", repeats: int = 7) -> dict:
    """Lone all-reduces of float32 tensors timed at ``calibration_sizes(nbytes)``, ``repeats``
    times each, for ``timeline.fit_alpha_beta`` to fit t = a + b·S for the overlap model.

    Returns ``sizes_bytes`` (bytes, ascending), ``seconds`` (the median seconds of each size's
    repeats, one per size: what ``fit_alpha_beta`` takes), ``repeat_seconds`` (every repeat,
    seconds, one list per size) and ``repeats``. Each timing starts after a barrier, on this
    rank's ``time.perf_counter_ns``. The sizes are interleaved, one round of all sizes per
    repeat, so that a burst of load on the machine hits one repeat of several sizes rather
    than every repeat of one size (which would move its median). Run it with nothing else going
    on; every rank must call it (it is a collective). One buffer of the largest size is reused.
    """
    import statistics

    import torch

    sizes = calibration_sizes(nbytes)
    buffer = torch.zeros(sizes[-1] // 4, device=device)
    on_gpu = torch.device(device).type == "cuda"
    repeat_seconds = [[] for _ in sizes]
    for _ in range(repeats):
        for size, times in zip(sizes, repeat_seconds, strict=True):
            tensor = buffer[: size // 4]
            dist.barrier()
            start = now()
            dist.all_reduce(tensor)
            if on_gpu:  # NCCL returns once the all-reduce is queued, not done
                torch.cuda.synchronize(device)
            times.append((now() - start) / 1e9)
    return {"sizes_bytes": sizes, "seconds": [statistics.median(t) for t in repeat_seconds],
            "repeat_seconds": repeat_seconds, "repeats": repeats}


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
