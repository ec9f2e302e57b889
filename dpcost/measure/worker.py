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
import signal
import statistics
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta

from dpcost.core import ddp_communication_volume
from dpcost.measure import counters, strategy_scenarios

PROGRESS_STARTING, PROGRESS_READY = 0, 1
# What a rank is doing, reported to the launcher so that a hang can be located. Kept here, not
# in scenarios.py, so that the launcher reads positions without importing torch.
PHASES = ["model setup", "iteration start", "parameter exchange", "forward",
          "backward", "gradient exchange", "optimizer step", "snapshot barrier"]
# Test-only faults, injected on one rank in the first scenario:
# raise | hang | kill (SIGKILL itself mid-run) | slow-setup (3 s more to build the model) |
# exit-after-result (post the result, then exit with status 3) |
# abort-after-result (post the result, then die by SIGABRT, as the torchrun crash did).
FAULTS = ("raise", "hang", "kill", "slow-setup", "exit-after-result", "abort-after-result")
SLOW_SETUP_S = 3.0


@dataclass
class RunConfig:
    """Everything a rank needs, picklable so that the launcher can hand it to the helper process."""

    world_size: int
    width: int
    depth: int
    steps: int = 10
    warmup: int = 2
    scenarios: list = field(default_factory=lambda: ["ddp", "dp"])
    backend: str = "gloo"
    process_group_timeout_s: float = 600.0
    # (rank, kind): test-only fault injection; kinds in FAULTS
    fault: tuple | None = None
    # "auto": TCP_INFO on gloo, the profiler's collective records on nccl (not TCP);
    # "profiler" forces the profiler's reading (also on gloo, where the tests compare the two).
    counter: str = "auto"


def encode_progress(scenario_index: int, iteration: int, phase: str) -> int:
    """A rank's position as one increasing integer (scenario, iteration, phase)."""
    return 1_000_000 * (scenario_index + 1) + 10 * (iteration + 2) + PHASES.index(phase)


def in_setup(value: int) -> bool:
    """Whether a rank at position ``value`` is still setting up (joining, priming, building a
    scenario's model) rather than training."""
    return value <= PROGRESS_READY or value % 10 == PHASES.index("model setup")


def describe_progress(value: int, scenarios: list) -> str:
    """Inverse of ``encode_progress`` in words: "ddp iteration 3 (forward)"."""
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
    """One scenario on this rank, in its stages: build it, warm up, read the counters around
    the measured iterations, then put the readings together (``_result``)."""
    import torch.distributed as dist

    def progress(iteration, phase):
        report(encode_progress(index, iteration, phase))

    progress(-1, "model setup")
    if config.fault == (rank, "slow-setup") and index == 0:
        time.sleep(SLOW_SETUP_S)  # a set-up slower than --timeout must not be called a hang
    device = _device(config)
    memory_before = _memory_baseline(device)
    kind = name.split("#")[0]  # "ddp#2": a repeat of "ddp" (the overhead benchmark interleaves)
    scenario = _build_scenario(kind, name, config, rank, device)
    for iteration in range(config.warmup):
        progress(iteration, "iteration start")
        scenario.step(iteration, progress)
    window = _measured_window(kind, index, config, rank, scenario, progress, exclude_port, wire)
    result = _result(kind, config, rank, device, scenario, window, memory_before, wire,
                     progress)
    del scenario
    dist.barrier()  # nobody tears down while a peer still needs its buffers
    return result


def _memory_baseline(device) -> dict:
    """The readings before the model is built: RSS (and the peak reset), or CUDA's allocated."""
    gc.collect()
    before = {"rss": counters.current_rss_bytes(), "peak_ok": counters.reset_peak_rss(),
              "cuda": None}
    if device != "cpu":
        import torch

        torch.cuda.reset_peak_memory_stats(device)
        before["cuda"] = torch.cuda.memory_allocated(device)
    return before


def _build_scenario(kind, name, config, rank, device):
    from dpcost.measure import scenarios

    if kind in ("ddp", *DDP_VARIANTS):
        # "ddp" times plain DDP, as users run it; its buckets are counted afterwards, on an
        # identical model, by _count_buckets. "ddp-counted" keeps the hook inside the timed
        # window, so that the overhead benchmark can show what the hook costs per step.
        return scenarios.DDPScenario(config.width, config.depth, rank,
                                     count=kind == "ddp-counted", device=device)
    if kind == "dp":
        return scenarios.DPPatternScenario(config.width, config.depth, rank, config.world_size,
                                           device=device)
    if kind == "dp-nccl":
        from dpcost.measure.chain import DPChainScenario

        return DPChainScenario(config.width, config.depth, rank, config.world_size,
                               device=device)
    if kind in TIMED:
        from dpcost.measure import timed

        cls = getattr(timed, TIMED[kind])
        return (cls(config.width, config.depth, rank, device=device) if kind.startswith("ddp")
                else cls(config.width, config.depth, rank, config.world_size, device=device))
    if kind in strategy_scenarios.NAMES:  # beyond DDP: dpcost/measure/strategy_scenarios.py
        return strategy_scenarios.build(kind, config, rank, device)
    raise ValueError(f"unknown scenario {name!r}")


def _measured_window(kind, index, config, rank, scenario, progress, exclude_port, wire) -> dict:
    """The measured iterations between two counter snapshots (each after a barrier), with the
    profiler around them where it counts; the scenario's own counts before, the step times."""
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
    recorder = getattr(scenario, "recorder", None)
    if recorder is not None:
        recorder.on = True  # the measured iterations only (warm-up and set-up left out)
    hook = scenario.hook if kind == "ddp-counted" else None
    window = {"profiler": profiler, "use_profiler": use_profiler, "recorder": recorder,
              "hook": hook, "hook_before": (hook.bytes, hook.buckets) if hook else (0, 0),
              "logical_before": (scenario.logical_sent, scenario.logical_received),
              "window_before": scenario.snapshot() if hasattr(scenario, "snapshot") else None,
              "wire_before": wire_before, "times": []}
    for iteration in range(config.warmup, config.warmup + config.steps):
        progress(iteration, "iteration start")
        if config.fault and config.fault[0] == rank and index == 0:
            _inject(config.fault[1], rank, iteration - config.warmup)
        start = time.perf_counter()
        scenario.step(iteration, progress)
        window["times"].append(time.perf_counter() - start)
    progress(config.warmup + config.steps, "snapshot barrier")
    window["wire_after"], read_after_s = _snapshot(exclude_port, wire["ok"])
    window["read_s"] = read_before_s + read_after_s  # once per window, not per step
    if profiler is not None:
        profiler.__exit__(None, None, None)
    return window


def _memory_growth(device, before: dict) -> tuple:
    """(bytes the scenario added at its peak, how that was read)."""
    peak = counters.peak_rss_bytes() if before["peak_ok"] else None
    if device != "cpu":
        import torch

        return (torch.cuda.max_memory_allocated(device) - before["cuda"],
                "torch.cuda.max_memory_allocated minus memory_allocated before the model")
    if peak is None or before["rss"] is None:
        return None, "unavailable"
    return (peak - before["rss"],
            "peak RSS growth: VmHWM after clear_refs minus VmRSS before the model was built")


def _result(kind, config, rank, device, scenario, window, memory_before, wire, progress) -> dict:
    """The rank's report for one scenario: times, memory, then bytes by the best counter."""
    peak_growth, memory_reading = _memory_growth(device, memory_before)
    steps, n = config.steps, config.world_size
    logical_before = window["logical_before"]
    result = {
        "rank": rank,
        "step_time_s": statistics.median(window["times"]),
        "counter_read_s": window["read_s"],
        # Same seed, batches and optimizer: every scenario must end with the same parameters.
        "param_sum": scenario.param_sum() if hasattr(scenario, "param_sum") else sum(
            float(p.detach().double().sum()) for p in scenario.model.parameters()),
        "peak_memory_bytes": peak_growth,
        "memory_reading": memory_reading,
        "logical_sent_bytes": (scenario.logical_sent - logical_before[0]) / steps,
        "logical_received_bytes": (scenario.logical_received - logical_before[1]) / steps,
    }
    if kind in TIMED:
        result["timeline"] = [list(event) for event in window["recorder"].events]
        result["clock"] = "time.perf_counter_ns (CLOCK_MONOTONIC: one clock for the machine)"
        if hasattr(scenario, "allreduce_calibration"):
            result["allreduce_calibration"] = scenario.allreduce_calibration
    if window["window_before"] is not None:  # strategy scenarios: collectives, losses, census
        result.update(scenario.window_result(window["window_before"], steps))
    hook, hook_before = window["hook"], window["hook_before"]
    if hook is not None:
        result["hook_bytes"] = (hook.bytes - hook_before[0]) / steps  # S over buckets: P
        result["hook_buckets"] = (hook.buckets - hook_before[1]) / steps
    if kind == "ddp":
        first = config.warmup + config.steps + 1
        hook_bytes, result["hook_buckets"], result["bucket_sizes"] = _count_buckets(
            config, rank, device, first, progress)
        result["hook_bytes"] = hook_bytes
        result["hook_window"] = (f"{COUNTED_STEPS} iterations of an identical DDP model with the "
                                 "counting hook, after the timed window")
    if "hook_bytes" in result:
        # A ring all-reduce of S sends and receives 2 (n - 1) / n S on every rank.
        result["logical_sent_bytes"] = result["logical_received_bytes"] = (
            ddp_communication_volume(result["hook_bytes"], n))
    result.update(_counted_bytes(result, scenario, window, wire, steps, n))
    return result


def _counted_bytes(result, scenario, window, wire, steps, n) -> dict:
    """Bytes per step by the counter in use: the profiler's collectives, the wire (TCP
    counters), or the scenario's logical count where neither can be read."""
    fields = {}
    if window["profiler"] is not None:
        element_size = next(scenario.model.parameters()).element_size()
        seen = counters.collective_bytes(window["profiler"].events(), n, element_size)
        fields.update(profiler_sent_bytes=seen["sent"] / steps,
                      profiler_received_bytes=seen["received"] / steps,
                      profiler_uncounted=seen["other"])
    before, after = window["wire_before"], window["wire_after"]
    if window["use_profiler"]:
        fields.update(counter=counters.PROFILER_COUNTER,
                      sent_bytes=fields["profiler_sent_bytes"],
                      received_bytes=fields["profiler_received_bytes"])
        if wire["ok"]:  # keep the wire reading beside it, for comparison
            fields.update(wire_sent_bytes=(after["sent"] - before["sent"]) / steps,
                          wire_received_bytes=(after["received"] - before["received"]) / steps)
    elif wire["ok"]:
        fields.update(
            counter=counters.WIRE_COUNTER,
            sent_bytes=(after["sent"] - before["sent"]) / steps,
            received_bytes=(after["received"] - before["received"]) / steps,
            retransmitted_bytes=(after["retransmitted"] - before["retransmitted"]) / steps,
            sockets=after["sockets"])
    else:
        fields.update(counter=f"{counters.LOGICAL_COUNTER} ({wire['why']})",
                      sent_bytes=result["logical_sent_bytes"],
                      received_bytes=result["logical_received_bytes"])
    return fields


# The one list of scenario names; _measure_scenario builds each. The patterns lessons 06 and the
# CLI measure, DDP's variants for the overhead benchmark, the timed scenarios of lesson 07
# (dpcost/measure/timed.py, with their classes) and the strategies beyond DDP
# (strategy_scenarios.NAMES). measure_traffic accepts MEASURABLE; the report predicts
# PREDICTED (dataparallel-cuda runs in one process, beside the ranks).
PATTERNS = ("ddp", "dp", "dp-nccl")
DDP_VARIANTS = ("ddp-plain", "ddp-counted", "ddp-profiler")
TIMED = {"ddp-timeline": "TimedDDPScenario", "dp-timeline": "TimedDPPatternScenario",
         "dp-nccl-timeline": "TimedDPChainScenario"}
MEASURABLE = PATTERNS + DDP_VARIANTS + tuple(TIMED) + strategy_scenarios.NAMES
PREDICTED = PATTERNS + ("dataparallel-cuda",) + tuple(TIMED) + strategy_scenarios.NAMES
COUNTED_STEPS = 2  # the hook's count is the same every steady-state iteration: P


def _count_buckets(config, rank, device, first_iteration, progress):
    """Bytes and buckets per iteration that a counting comm hook sees on a fresh DDP model.

    Kept out of the timed window: a Python comm hook costs several percent of a step here
    (benchmarks/measure_overhead.py), and the wire counters need no hook at all. One warm-up
    iteration first, since DDP rebuilds its buckets after the first (``reducer.cpp``).
    """
    from dpcost.measure import scenarios

    progress(first_iteration, "model setup")
    counted = scenarios.DDPScenario(config.width, config.depth, rank, count=True, device=device)
    counted.step(first_iteration, progress)
    before = (counted.hook.bytes, counted.hook.buckets)
    for iteration in range(first_iteration + 1, first_iteration + 1 + COUNTED_STEPS):
        progress(iteration, "iteration start")
        counted.step(iteration, progress)
    per_step = (counted.hook.buckets - before[1]) // COUNTED_STEPS
    return ((counted.hook.bytes - before[0]) / COUNTED_STEPS,
            (counted.hook.buckets - before[1]) / COUNTED_STEPS,
            counted.hook.sizes[-per_step:] if per_step else [])


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


def gloo_threads() -> int:
    """How many of this process's threads are gloo's (``pt_gloo_runloop``, ``gloo_tcp_loop``).

    Read from ``/proc/self/task/*/comm`` (Linux). After ``destroy_process_group()`` it must be
    0: a gloo thread still alive at interpreter exit is what aborts the process (see run_rank).
    """
    count = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                count += "gloo" in comm.read()
        except FileNotFoundError:  # the thread ended while we looked
            pass
    return count


def _device(config):
    """Gloo trains on the CPU; NCCL on this rank's GPU (LOCAL_RANK, set by torchrun)."""
    if config.backend == "nccl":
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return "cpu"


def _inject(kind, rank, measured_iteration):
    if kind == "raise":
        raise RuntimeError(f"injected fault on rank {rank} (test)")
    if kind == "kill" and measured_iteration == 1:  # mid-run: the peers are in a collective
        os.kill(os.getpid(), signal.SIGKILL)
    while kind == "hang":  # never return; the launcher must notice and end the run
        time.sleep(1)


def exit_fault(config, rank) -> None:
    """After the result is posted: the injected exit-time faults (tests only)."""
    if config.fault == (rank, "exit-after-result"):
        os._exit(3)
    if config.fault == (rank, "abort-after-result"):
        os.kill(os.getpid(), signal.SIGABRT)


def run_rank(rank, config, report=lambda value: None, store_port=None, gather=False):
    """Run every scenario of ``config`` on this rank; return {scenario: result dict}.

    Expects MASTER_ADDR / MASTER_PORT (and, under torchrun, RANK / WORLD_SIZE) in the
    environment; ``store_port`` is the rendezvous store's port, whose sockets are not counted.
    With ``gather`` (torchrun: no launcher to collect results) every rank returns the list of
    all ranks' results, gathered after the last window closed.
    """
    import torch

    # Import torch._dynamo BEFORE init_process_group (PyTorch bug). DDP's constructor imports
    # it, and through torch.distributed.fsdp -> _shard -> torch.distributed.nn it imports
    # torch/distributed/nn/functional.py, whose defaults `group=group.WORLD` are evaluated at
    # import time. Imported after init_process_group, those defaults hold the default group
    # forever: destroy_process_group() cannot free it, gloo's threads (pt_gloo_runloop) outlive
    # it, and at interpreter exit one of them can free a work object that needs the GIL while
    # Py_FinalizeEx runs -> std::terminate, SIGABRT ("terminate called without an active
    # exception"). Under torchrun that failed about 1 run in 4. Imported first: no default
    # group exists yet, destroy frees it, and the gloo threads are gone (test_measure_torchrun).
    import torch._dynamo  # noqa: F401
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
