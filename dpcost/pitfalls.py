"""DDP's behaviours that migrations trip on, each run on a few gloo ranks within a time limit.

Lesson 09 states them, lesson 09b shows them; each demo here is a function that every rank runs
(``rank_fn(rank, world_size) -> dict``, JSON-able) and :func:`run_on_ranks` starts, watches and
ends:

- ``no_sync_placement``: which of forward and backward must sit inside ``no_sync()``. The forward
  decides: ``DistributedDataParallel._pre_forward``/``_post_forward`` call the reducer's
  ``prepare_for_backward`` only when ``require_backward_grad_sync`` is on at the forward
  (torch/nn/parallel/distributed.py; ``no_sync``'s docstring warns of it).
- ``batchnorm_buffers``: a BatchNorm's running statistics on every rank, at each forward's start
  and end, with the default ``forward_sync_buffers`` (rank 0's buffers broadcast at the start of
  every training forward: ``_pre_forward`` -> ``_sync_buffers``) and without it.
- ``eval_on_rank0``: ``ddp(x)`` on rank 0 alone waits in that broadcast for peers that never come
  (a gloo timeout, short here); ``ddp.module(x)`` does not.
- ``distributed_validation``: ``DistributedSampler`` pads, so a metric over its shards counts
  samples twice; all-reduced sums over unpadded shards give the true metric.
- ``module_forward_in_training``: ``ddp.module(x)`` skips ``_pre_forward``, so the reducer never
  expects the backward's gradients, nothing is all-reduced and the ranks drift.
- ``unequal_loss_elements``: ranks with different numbers of loss elements; the mean of per-rank
  means is not the global mean, a sum over the global count (all-reduced) is.

:func:`dp_checkpoint_into_plain_model` (one process, no ranks) loads a DataParallel checkpoint,
whose keys start with ``module.``, into the bare model.

The ranks come from the warm process of ``dpcost.measure.launch`` (torch imported once). Each
rank dies with that process (``PR_SET_PDEATHSIG``), which leaves when the caller does, and
:func:`run_on_ranks` kills every rank still alive when it returns or raises: no run can hang a
kernel or a test.
"""

from __future__ import annotations

import os
import queue
import re
import time
from datetime import timedelta

from dpcost.procs import die_with_parent, exit_cause, free_port

SHORT_TIMEOUT_S = 3.0  # the process group that a pitfall is expected to time out in


class PitfallRunError(RuntimeError):
    """A demo failed on a rank, or did not finish in time; the message names the rank."""


# ---------------------------------------------------------------------------------------------
# What each rank runs. Small models with exact inputs (small integers, powers of two), so the
# numbers a lesson prints are the same on every CPU.


def _linear(features=3):
    """A bias-free linear layer whose weights start at 0: every step below is exact."""
    import torch

    layer = torch.nn.Linear(features, 1, bias=False)
    torch.nn.init.zeros_(layer.weight)
    return layer


def no_sync_placement(rank, world_size):
    """Rank r's input is all (r + 1), so its local gradient of ``out.sum()`` is batch·(r + 1)
    per weight; averaged over the ranks it is batch·(n + 1)/2. Four placements of forward and
    backward relative to ``no_sync()``: the gradient each rank ends with."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(_linear())
    x = torch.full((2, 3), float(rank + 1))
    cases = {}
    for name, forward_inside, backward_inside in [
            ("forward and backward inside", True, True),
            ("forward inside, backward outside", True, False),
            ("forward outside, backward inside", False, True),
            ("forward and backward outside", False, False)]:
        ddp.zero_grad(set_to_none=True)
        if forward_inside:
            with ddp.no_sync():
                loss = ddp(x).sum()
        else:
            loss = ddp(x).sum()
        if backward_inside:
            with ddp.no_sync():
                loss.backward()
        else:
            loss.backward()
        cases[name] = ddp.module.weight.grad[0, 0].item()
    return {"grad": cases, "local_grad": float(2 * (rank + 1))}


def _bn_model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.BatchNorm1d(1), torch.nn.Linear(1, 1))


def _bn_input(rank, step):
    """A batch whose mean is 8·(rank + 1) + step and whose values are exact in float32."""
    import torch

    mean = 8.0 * (rank + 1) + step
    return torch.tensor([[mean - 1.0], [mean + 1.0]])


def batchnorm_buffers(rank, world_size, steps=3):
    """The BatchNorm's ``running_mean`` on this rank at the start of each training forward (after
    DDP's buffer broadcast) and at its end (after this rank's own update), with
    ``forward_sync_buffers`` on (the default) and off."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    runs = {}
    for sync in (True, False):
        ddp = DDP(_bn_model(), forward_sync_buffers=sync)
        bn = ddp.module[0]
        seen = {"start": [], "end": []}
        bn.register_forward_pre_hook(
            lambda m, a, seen=seen: seen["start"].append(m.running_mean.item()))
        bn.register_forward_hook(
            lambda m, a, o, seen=seen: seen["end"].append(m.running_mean.item()))
        for step in range(steps):
            ddp(_bn_input(rank, step)).sum().backward()
        seen["final"] = bn.running_mean.item()
        runs["on" if sync else "off"] = seen
    return runs


def eval_on_rank0(rank, world_size, timeout_s=SHORT_TIMEOUT_S):
    """Train one step on every rank, then evaluate: ``ddp.module(x)`` on rank 0 alone, ``ddp(x)``
    on every rank, and last ``ddp(x)`` on rank 0 alone, in a process group whose timeout is
    ``timeout_s``. Rank 1 waits meanwhile in a barrier of the default group (its own timeout)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    short = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    ddp = DDP(_bn_model(), process_group=short)
    ddp(_bn_input(rank, 0)).sum().backward()  # a training step: the next forward syncs buffers
    ddp.eval()
    x = _bn_input(0, 0)
    result = {"timeout_s": timeout_s}
    with torch.no_grad():
        if rank == 0:
            started = time.monotonic()
            ddp.module(x)
            result["module_on_rank0_s"] = time.monotonic() - started
        dist.barrier()
        ddp(x)  # every rank: the broadcast has its peers
        result["ddp_on_every_rank"] = "returned"
    ddp.train()  # a no_grad forward turned the buffer sync off: a training step turns it on
    ddp(_bn_input(rank, 0)).sum().backward()
    ddp.eval()
    if rank == 0:
        started = time.monotonic()
        try:
            with torch.no_grad():
                ddp(x)
            result["ddp_on_rank0_only"] = "returned"
        except RuntimeError as error:  # gloo words it two ways, both say it timed out
            result["ddp_on_rank0_only"] = ("RuntimeError, timed out" if re.search(
                r"timed out|timeout", str(error), re.IGNORECASE) else "RuntimeError")
            result["gloo_message"] = _first_line(error)
        result["ddp_on_rank0_only_s"] = time.monotonic() - started
    dist.barrier()  # the default group: rank 1 waits here, not in the short group
    return result


def _first_line(error):
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return text.split("] ", 1)[-1]  # drop gloo's "[file.cc:81] " prefix


def distributed_validation(rank, world_size, dataset_size=11):
    """Accuracy of a fixed rule on ``dataset_size`` samples, three ways: this rank's shard of a
    ``DistributedSampler``; the sampler's shards all-reduced (padded: some samples twice); the
    unpadded shards ``range(rank, N, n)`` all-reduced (every sample once)."""
    import torch
    import torch.distributed as dist
    from torch.utils.data import DistributedSampler

    labels = torch.tensor([int(i % 3 != 0) for i in range(dataset_size)])  # ids 0, 3, 6, 9: 0
    predict = lambda ids: torch.ones_like(ids)  # noqa: E731 - a "model" that always says 1

    def totals(ids):
        ids = torch.tensor(ids, dtype=torch.long)
        return torch.tensor([float((predict(ids) == labels[ids]).sum()), float(len(ids))])

    sampler = DistributedSampler(range(dataset_size), num_replicas=world_size, rank=rank,
                                 shuffle=False)
    padded_ids = list(sampler)
    own = totals(padded_ids)
    padded = own.clone()
    dist.all_reduce(padded)
    exact = totals(list(range(rank, dataset_size, world_size)))
    dist.all_reduce(exact)
    return {"padded_ids": padded_ids, "own": own.tolist(), "padded": padded.tolist(),
            "exact": exact.tolist(), "reference": [float((labels == 1).sum()), dataset_size]}


def module_forward_in_training(rank, world_size, steps=3):
    """Train ``steps`` SGD steps on rank-specific data, the forward once through ``ddp(x)`` and
    once through ``ddp.module(x)``; this rank's final weight sum for each."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    sums = {}
    for way in ("ddp(x)", "ddp.module(x)"):
        ddp = DDP(_linear())
        opt = torch.optim.SGD(ddp.parameters(), lr=0.125)
        forward = ddp if way == "ddp(x)" else ddp.module
        for _ in range(steps):
            opt.zero_grad()
            forward(torch.full((2, 3), float(rank + 1))).sum().backward()
            opt.step()
        sums[way] = ddp.module.weight.sum().item()
    return sums


def unequal_loss_elements(rank, world_size):
    """Rank 0 holds 2 loss elements (tokens) of value x = 1 per feature, rank 1 holds 6 of
    x = 3. The gradient per weight after DDP's average, with each rank's loss the mean over its
    own elements, and with each rank's loss the sum over its elements times n / (global count,
    all-reduced): that one is the gradient of the mean over all elements."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    count = 2 if rank == 0 else 6
    x = torch.full((count, 3), 1.0 if rank == 0 else 3.0)
    ddp = DDP(_linear())
    ddp(x).mean().backward()
    per_rank_mean = ddp.module.weight.grad[0, 0].item()
    total = torch.tensor([float(count)])
    dist.all_reduce(total)  # the global number of loss elements
    ddp.zero_grad(set_to_none=True)
    (ddp(x).sum() * world_size / total).backward()  # DDP divides by n: put it back
    return {"count": count, "per_rank_mean": per_rank_mean,
            "global_mean": ddp.module.weight.grad[0, 0].item(), "total": total.item()}


DEMOS = {fn.__name__: fn for fn in (no_sync_placement, batchnorm_buffers, eval_on_rank0,
                                    distributed_validation, module_forward_in_training,
                                    unequal_loss_elements)}


# ---------------------------------------------------------------------------------------------
# Starting and ending the ranks.


def _rank_main(name, rank, world_size, port, group_timeout_s, results):
    die_with_parent()  # the warm process gone -> this rank goes too
    import torch
    import torch._dynamo  # noqa: F401 - DDP imports it: before the process group (DESIGN.md)
    import torch.distributed as dist

    torch.set_num_threads(1)
    status = 1
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size,
                                timeout=timedelta(seconds=group_timeout_s))
        results.put(("result", rank, DEMOS[name](rank, world_size)))
        status = 0
    except Exception as error:  # noqa: BLE001 - reported to the caller, named
        results.put(("error", rank, f"{type(error).__name__}: {error}"))
    finally:
        results.close()
        results.join_thread()  # the message is out before the process leaves
        # No destroy_process_group: a group that timed out can abort gloo's teardown, and
        # leaving at once ends every socket just as well.
        os._exit(status)


def run_on_ranks(name: str, world_size: int = 2, timeout_s: float = 60.0,
                 group_timeout_s: float = 30.0) -> list[dict]:
    """Run the demo ``name`` (a key of :data:`DEMOS`) on ``world_size`` gloo ranks; each rank's
    result, by rank.

    ``timeout_s`` bounds the whole run (start-up included); ``group_timeout_s`` is the default
    process group's timeout (each collective's, and joining it). Raises ValueError for a bad
    argument, PitfallRunError when a rank fails or the time is up; every rank is dead on return.
    """
    if name not in DEMOS:
        raise ValueError(f"name must be one of {', '.join(DEMOS)}; got {name!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise ValueError(f"world_size must be an int >= 2, got {world_size!r}")
    for label, value in (("timeout_s", timeout_s), ("group_timeout_s", group_timeout_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{label} must be a number > 0, got {value!r}")
    from dpcost.measure.launch import warm_context

    context = warm_context()
    results = context.Queue()
    port = free_port()
    ranks = [context.Process(target=_rank_main, name=f"dpcost-pitfall-{name}-{rank}",
                             args=(name, rank, world_size, port, group_timeout_s, results),
                             daemon=True) for rank in range(world_size)]
    deadline = time.monotonic() + timeout_s
    try:
        for process in ranks:
            process.start()
        return _collect(name, ranks, results, deadline, timeout_s)
    finally:
        for process in ranks:
            if process.pid is not None and process.is_alive():
                process.kill()
            if process.pid is not None:
                process.join(5)
        results.close()
        results.cancel_join_thread()


def _collect(name, ranks, results, deadline, timeout_s):
    done, errors = {}, {}
    while len(done) + len(errors) < len(ranks):
        try:
            kind, rank, payload = results.get(timeout=0.2)
        except queue.Empty:
            silent = [r for r, p in enumerate(ranks)
                      if r not in done and r not in errors and p.exitcode not in (None, 0)]
            if silent:
                time.sleep(0.5)  # a message posted just before the exit may still be on its way
                if results.empty():
                    raise PitfallRunError(f"{name}: rank {silent[0]} "
                                          f"{exit_cause(ranks[silent[0]].exitcode)} "
                                          "without reporting") from None
            if time.monotonic() > deadline:
                late = sorted(set(range(len(ranks))) - set(done) - set(errors))
                raise PitfallRunError(f"{name}: rank {', '.join(map(str, late))} did not finish "
                                      f"within {timeout_s:g} s") from None
            continue
        (done if kind == "result" else errors)[rank] = payload
    if errors:
        rank = min(errors)
        raise PitfallRunError(f"{name}: rank {rank} failed: {errors[rank]}")
    return [done[rank] for rank in range(len(ranks))]


def dp_checkpoint_into_plain_model() -> dict:
    """Save a ``nn.DataParallel`` model's ``state_dict`` (keys ``module.*``), load it into the
    bare model as is (fails), then after ``consume_prefix_in_state_dict_if_present(state,
    "module.")`` (torch/nn/modules/utils.py), which strips the prefix in place."""
    import io

    import torch
    from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

    buffer = io.BytesIO()
    torch.save(torch.nn.DataParallel(_bn_model()).state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, map_location="cpu")
    keys = sorted(state)
    plain = _bn_model()
    try:
        plain.load_state_dict(state)
        as_is = "loaded"
    except RuntimeError as error:
        as_is = str(error).splitlines()[0]
    consume_prefix_in_state_dict_if_present(state, "module.")
    result = plain.load_state_dict(state)
    return {"saved_keys": keys, "as_is": as_is, "stripped_keys": sorted(state),
            "after_strip": "loaded" if not (result.missing_keys or result.unexpected_keys)
            else str(result)}
