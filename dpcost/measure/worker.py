"""What each rank runs: join the process group, run the scenarios, count bytes per window.

For each scenario: build it, run ``warmup`` iterations, barrier, snapshot the counters, run
``steps`` iterations, barrier, snapshot again. Bytes per iteration = (after - before) / steps.
The window therefore holds the second barrier's few hundred bytes, part of the remainder that
the report shows. Start-up (process creation, ``import torch``, rendezvous) is paid once for
all the scenarios.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta

from dpcost.measure import counters

PROGRESS_STARTING, PROGRESS_READY = 0, 1


@dataclass
class RunConfig:
    """Everything a rank needs, picklable so that ``spawn`` can hand it to a new process."""

    world_size: int
    width: int
    depth: int
    steps: int = 10
    warmup: int = 2
    scenarios: list = field(default_factory=lambda: ["ddp", "dp"])
    backend: str = "gloo"
    process_group_timeout_s: float = 600.0
    fault: tuple | None = None  # (rank, "raise" | "hang"): test-only fault injection
    # "auto": TCP_INFO on gloo, the profiler's collective records on nccl (not TCP);
    # "profiler" forces the profiler's reading (also on gloo, where the tests compare the two).
    counter: str = "auto"


def encode_progress(scenario_index: int, iteration: int, phase: str) -> int:
    """A rank's position as one increasing integer (scenario, iteration, phase)."""
    from dpcost.measure.scenarios import PHASES

    return 1_000_000 * (scenario_index + 1) + 10 * (iteration + 2) + PHASES.index(phase)


def describe_progress(value: int, scenarios: list) -> str:
    """Inverse of ``encode_progress`` in words: "ddp iteration 3 (forward)"."""
    from dpcost.measure.scenarios import PHASES

    if value == PROGRESS_STARTING:
        return "starting (import torch, joining the process group)"
    if value == PROGRESS_READY:
        return "process group ready"
    scenario, rest = divmod(value, 1_000_000)
    iteration, phase = divmod(rest, 10)
    name = scenarios[scenario - 1] if 0 < scenario <= len(scenarios) else f"#{scenario}"
    if iteration < 2:
        return f"{name} ({PHASES[phase]})"
    return f"{name} iteration {iteration - 2} ({PHASES[phase]})"


def _snapshot(exclude_port, wire_ok):
    """Barrier, then the TCP counters; returns (counters, seconds the reading took)."""
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    wire = counters.tcp_bytes(exclude_port) if wire_ok else None
    return wire, time.perf_counter() - start


def _measure_scenario(name, index, config, rank, report, exclude_port, wire):
    import torch.distributed as dist

    from dpcost.measure import scenarios

    def progress(iteration, phase):
        report(encode_progress(index, iteration, phase))

    progress(-1, "model setup")
    gc.collect()
    rss_before = counters.current_rss_bytes()
    peak_ok = counters.reset_peak_rss()
    device = _device(config)
    if device != "cpu":
        import torch

        torch.cuda.reset_peak_memory_stats(device)
        cuda_before = torch.cuda.memory_allocated(device)
    kind = name.split("#")[0]  # "ddp#2": a repeat of "ddp" (the overhead benchmark interleaves)
    if kind in ("ddp", "ddp-plain", "ddp-counted", "ddp-profiler"):
        # "ddp" times plain DDP, as users run it; its buckets are counted afterwards, on an
        # identical model, by _count_buckets. "ddp-counted" keeps the hook inside the timed
        # window, so that the overhead benchmark can show what the hook costs per step.
        scenario = scenarios.DDPScenario(config.width, config.depth, rank,
                                         count=kind == "ddp-counted", device=device)
    elif kind == "dp":
        scenario = scenarios.DPPatternScenario(config.width, config.depth, rank,
                                               config.world_size, device=device)
    else:
        raise ValueError(f"unknown scenario {name!r}")
    for iteration in range(config.warmup):
        progress(iteration, "iteration start")
        scenario.step(iteration, progress)

    profiler = None
    use_profiler = config.counter == "profiler" or (config.counter == "auto"
                                                    and config.backend != "gloo")
    if kind == "ddp-profiler" or use_profiler:  # collectives as the profiler records them
        import torch.profiler

        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                          record_shapes=True)
        profiler.__enter__()
    progress(config.warmup, "snapshot barrier")
    wire_before, read_before_s = _snapshot(exclude_port, wire["ok"])
    hook = scenario.hook if kind == "ddp-counted" else None
    hook_before = (hook.bytes, hook.buckets) if hook else (0, 0)
    logical_before = (scenario.logical_sent, scenario.logical_received)
    times = []
    for iteration in range(config.warmup, config.warmup + config.steps):
        progress(iteration, "iteration start")
        if config.fault and config.fault[0] == rank and index == 0:
            _inject(config.fault[1], rank)
        start = time.perf_counter()
        scenario.step(iteration, progress)
        times.append(time.perf_counter() - start)
    progress(config.warmup + config.steps, "snapshot barrier")
    wire_after, read_after_s = _snapshot(exclude_port, wire["ok"])
    if profiler is not None:
        profiler.__exit__(None, None, None)
    peak = counters.peak_rss_bytes() if peak_ok else None
    memory_reading = ("peak RSS growth: VmHWM after clear_refs minus VmRSS before the model "
                      "was built" if peak is not None and rss_before is not None else "unavailable")
    peak_growth = peak - rss_before if memory_reading != "unavailable" else None
    if device != "cpu":
        import torch

        peak_growth = torch.cuda.max_memory_allocated(device) - cuda_before
        memory_reading = "torch.cuda.max_memory_allocated minus memory_allocated before the model"

    steps, n = config.steps, config.world_size
    result = {
        "rank": rank,
        "step_time_s": statistics.median(times),
        "counter_read_s": read_before_s + read_after_s,  # once per window, not per step
        # Same seed, batches and optimizer: every scenario must end with the same parameters.
        "param_sum": sum(float(p.detach().double().sum()) for p in scenario.model.parameters()),
        "peak_memory_bytes": peak_growth,
        "memory_reading": memory_reading,
        "logical_sent_bytes": (scenario.logical_sent - logical_before[0]) / steps,
        "logical_received_bytes": (scenario.logical_received - logical_before[1]) / steps,
    }
    if hook is not None:
        hook_bytes = (hook.bytes - hook_before[0]) / steps
        result["hook_bytes"] = hook_bytes  # S summed over buckets: must equal P exactly
        result["hook_buckets"] = (hook.buckets - hook_before[1]) / steps
    if kind == "ddp":
        first = config.warmup + config.steps + 1
        hook_bytes, result["hook_buckets"] = _count_buckets(config, rank, device, first,
                                                            progress)
        result["hook_bytes"] = hook_bytes
        result["hook_window"] = (f"{COUNTED_STEPS} iterations of an identical DDP model with the "
                                 "counting hook, after the timed window")
    if "hook_bytes" in result:
        # A ring all-reduce of S sends and receives 2 (n - 1) / n S on every rank.
        result["logical_sent_bytes"] = result["logical_received_bytes"] = 2 * (n - 1) / n * (
            result["hook_bytes"])
    if profiler is not None:
        element_size = next(scenario.model.parameters()).element_size()
        seen = counters.collective_bytes(profiler.events(), n, element_size)
        result.update(profiler_sent_bytes=seen["sent"] / steps,
                      profiler_received_bytes=seen["received"] / steps,
                      profiler_uncounted=seen["other"])
    if use_profiler:
        result.update(counter=counters.PROFILER_COUNTER,
                      sent_bytes=result["profiler_sent_bytes"],
                      received_bytes=result["profiler_received_bytes"])
        if wire["ok"]:  # keep the wire reading beside it, for comparison
            result.update(wire_sent_bytes=(wire_after["sent"] - wire_before["sent"]) / steps,
                          wire_received_bytes=(wire_after["received"] - wire_before["received"])
                          / steps)
    elif wire["ok"]:
        result.update(
            counter=counters.WIRE_COUNTER,
            sent_bytes=(wire_after["sent"] - wire_before["sent"]) / steps,
            received_bytes=(wire_after["received"] - wire_before["received"]) / steps,
            retransmitted_bytes=(wire_after["retransmitted"] - wire_before["retransmitted"])
            / steps,
            sockets=wire_after["sockets"])
    else:
        result.update(counter=f"{counters.LOGICAL_COUNTER} ({wire['why']})",
                      sent_bytes=result["logical_sent_bytes"],
                      received_bytes=result["logical_received_bytes"])
    del scenario
    dist.barrier()  # nobody tears down while a peer still needs its buffers
    return result


COUNTED_STEPS = 2  # the hook's count is the same every steady-state iteration: P


def _count_buckets(config, rank, device, first_iteration, progress):
    """Bytes and buckets per iteration that a counting comm hook sees on a fresh DDP model.

    Kept out of the timed window: a Python comm hook costs several percent of a step here
    (benchmarks/measure_overhead.py), and the wire counters need no hook at all. One warm-up
    iteration first, since DDP rebuilds its buckets after the first (``reducer.cpp``).
    """
    from dpcost.measure import scenarios

    counted = scenarios.DDPScenario(config.width, config.depth, rank, count=True, device=device)
    counted.step(first_iteration, progress)
    before = (counted.hook.bytes, counted.hook.buckets)
    for iteration in range(first_iteration + 1, first_iteration + 1 + COUNTED_STEPS):
        progress(iteration, "iteration start")
        counted.step(iteration, progress)
    return ((counted.hook.bytes - before[0]) / COUNTED_STEPS,
            (counted.hook.buckets - before[1]) / COUNTED_STEPS)


def _prime(config, rank):
    """One tiny iteration of DDP and of the DP pattern, before any window opens.

    The first DDP and autograd use load code and start threads (tens of MiB of RSS); paying
    that here keeps it out of the first scenario's peak-memory reading.
    """
    import torch.distributed as dist

    from dpcost.measure import scenarios

    device = _device(config)
    for scenario in (scenarios.DDPScenario(8, 1, rank, count=True, device=device),
                     scenarios.DPPatternScenario(8, 1, rank, config.world_size, device=device)):
        scenario.step(0, lambda iteration, phase: None)
    dist.barrier()


def _device(config):
    """Gloo trains on the CPU; NCCL on this rank's GPU (LOCAL_RANK, set by torchrun)."""
    if config.backend == "nccl":
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return "cpu"


def _inject(kind, rank):
    if kind == "raise":
        raise RuntimeError(f"injected fault on rank {rank} (test)")
    while True:  # "hang": never return; the launcher must notice and end the run
        time.sleep(1)


def run_rank(rank, config, report=lambda value: None, store_port=None, gather=False):
    """Run every scenario of ``config`` on this rank; return {scenario: result dict}.

    Expects MASTER_ADDR / MASTER_PORT (and, under torchrun, RANK / WORLD_SIZE) in the
    environment; ``store_port`` is the rendezvous store's port, whose sockets are not counted.
    With ``gather`` (torchrun: no launcher to collect results) every rank returns the list of
    all ranks' results, gathered after the last window closed.
    """
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # ranks share the cores; one compute thread each
    report(PROGRESS_STARTING)
    if config.backend == "nccl":
        torch.cuda.set_device(_device(config))
    dist.init_process_group(config.backend, rank=rank, world_size=config.world_size,
                            timeout=timedelta(seconds=config.process_group_timeout_s))
    try:
        report(PROGRESS_READY)
        exclude = store_port if store_port is not None else int(os.environ["MASTER_PORT"])
        ok, why = counters.tcp_info_available()
        if config.backend != "gloo":
            ok, why = False, f"backend {config.backend} does not move bytes over TCP sockets"
            if config.counter == "tcp_info":
                raise ValueError(f"counter 'tcp_info' needs the gloo backend, not "
                                 f"{config.backend}: use counter 'profiler' or 'auto'")
        wire = {"ok": ok, "why": why}
        _prime(config, rank)
        results = {name: _measure_scenario(name, i, config, rank, report, exclude, wire)
                   for i, name in enumerate(config.scenarios)}
        if not gather:
            return results
        everyone = [None] * config.world_size
        dist.all_gather_object(everyone, results)
        return everyone
    except BaseException as exc:
        # Stamp the failure before the process group closes its sockets: the peers fail a
        # moment later ("Connection reset by peer") and must not be taken for the cause.
        exc.dpcost_failed_at = time.time()
        raise
    finally:
        dist.destroy_process_group()


def local_rank_main(rank, config, port, progress, messages) -> int:
    """One rank started by ``launch.launch``: run, post the outcome, return the exit status."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))

    def report(value):
        progress[rank] = value

    try:
        messages.put(("result", rank, run_rank(rank, config, report, store_port=port)))
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the launcher
        cause = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        failed_at = getattr(exc, "dpcost_failed_at", time.time())
        messages.put(("error", rank, failed_at, cause, traceback.format_exc()))
        return 1
