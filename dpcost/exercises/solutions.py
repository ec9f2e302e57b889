"""The worked solutions of the exercises, for a student who has tried: shown after the last hint.

``SOLUTIONS[name]`` is the code of the instructor master's solution cell for exercise ``name``
(nbgrader's ``### BEGIN/END SOLUTION`` markers left out); ``tests/test_exercises_hints.py`` fails
when a master changes and this copy does not. The hint button reveals it after its last hint, and
``solution(name)`` prints it. A student without the masters (a pip install, nbgrader's release)
finds it here, as they find the package's own reference code (``dpcost.core``, ``dpcost.ring``,
``examples/``): a graded course cannot hide either.
"""

from __future__ import annotations

SOLUTIONS: dict[str, str] = {
    "dp_communication_volume": '''\
def dp_communication_volume(model_size_bytes, num_gpus):
    """Bytes through GPU0's link per step under DataParallel: 2 (n - 1) P."""
    size = check_model_size_bytes(model_size_bytes)
    n = check_num_gpus(num_gpus)
    if n <= 1:
        return 0.0
    return float(2 * (n - 1) * size)''',
    "ddp_communication_volume": '''\
def ddp_communication_volume(model_size_bytes, num_gpus):
    """Bytes each rank sends per step under DDP: 2 (n - 1) / n * P."""
    size = check_model_size_bytes(model_size_bytes)
    n = check_num_gpus(num_gpus)
    if n <= 1:
        return 0.0
    return float(2 * (n - 1) / n * size)''',
    "dp_gpu0_memory_multiplier": '''\
def dp_gpu0_memory_multiplier(num_gpus):
    """GPU0's memory relative to one GPU's share under DataParallel: n."""
    return float(check_num_gpus(num_gpus))''',
    "ddp_gpu0_memory_multiplier": '''\
def ddp_gpu0_memory_multiplier(num_gpus):
    """Rank 0's memory relative to any other rank under DDP: 1."""
    check_num_gpus(num_gpus)
    return 1.0''',
    "communication_reduction_factor": '''\
def communication_reduction_factor(model_size_bytes, num_gpus):
    """DP volume / DDP volume = n for every model size (1.0 for n <= 1)."""
    check_model_size_bytes(model_size_bytes)
    n = check_num_gpus(num_gpus)
    if n <= 1:
        return 1.0
    return float(n)''',
    "reduce_scatter_sends": '''\
def reduce_scatter_sends(num_ranks, step):
    """Sends of reduce-scatter step `step`: a list of (src, dst, chunk); the receiver adds."""
    n = num_ranks
    return [(r, (r + 1) % n, (r - step) % n) for r in range(n)]''',
    "all_gather_sends": '''\
def all_gather_sends(num_ranks, step):
    """Sends of all-gather step `step`: a list of (src, dst, chunk); the receiver overwrites."""
    n = num_ranks
    return [(r, (r + 1) % n, (r + 1 - step) % n) for r in range(n)]''',
    "train_ddp": '''\
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def train_ddp(dataset, epochs=2, global_batch=8, seed=0, checkpoint="checkpoint.pt"):
    """train_dp, migrated to DDP: run on every rank, as a torchrun worker."""
    dist.init_process_group("gloo")
    try:
        torch.manual_seed(seed)
        model = make_model()
        ddp = DDP(model)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        sampler = DistributedSampler(dataset, seed=seed)
        loader = DataLoader(dataset, batch_size=global_batch // dist.get_world_size(),
                            sampler=sampler)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for x, y in loader:
                loss = F.cross_entropy(ddp(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        if dist.get_rank() == 0:
            torch.save(model.state_dict(), checkpoint)
        dist.barrier()
        return model
    finally:
        dist.destroy_process_group()''',
}


def solution_text(name: str) -> str:
    """The worked solution of exercise ``name``, as code."""
    if name not in SOLUTIONS:
        raise ValueError(f"name must be one of {', '.join(SOLUTIONS)}; got {name!r}")
    return SOLUTIONS[name]


def solution(name: str) -> None:
    """Print the worked solution of exercise ``name`` (after trying, and the hints)."""
    print(f"The worked solution of {name}:\n\n{solution_text(name)}")
