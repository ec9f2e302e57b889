"""A clean DDP training script to copy: the six steps of lesson 09, nothing else.

    torchrun --standalone --nproc-per-node N examples/ddp_template.py

Replace the dataset and the model with yours. gloo on CPUs, NCCL on GPUs."""

import os

import torch
import torch._dynamo  # noqa: F401 - before init_process_group: DDP imports it (lesson 09)
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

EPOCHS, GLOBAL_BATCH, LR = 3, 32, 1e-2

# 1. Launch: torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
if "LOCAL_RANK" not in os.environ:
    raise SystemExit(f"{__file__}: error: run it with torchrun --standalone --nproc-per-node N")
local_rank = int(os.environ["LOCAL_RANK"])
if torch.cuda.is_available():
    torch.cuda.set_device(local_rank)  # else every rank opens a context on GPU0
device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
try:
    # 2. Data: each rank its share; no shuffle=True in the DataLoader (the sampler shuffles).
    torch.manual_seed(0)
    x = torch.randn(256, 16)
    dataset = TensorDataset(x, x[:, :4].sum(dim=1, keepdim=True))  # yours here
    sampler = DistributedSampler(dataset, seed=0)
    loader = DataLoader(dataset, batch_size=GLOBAL_BATCH // world_size, sampler=sampler)
    # 3. Model: on this rank's device, wrapped in DDP (SyncBatchNorm first, on GPUs).
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))  # yours here
    if device.type == "cuda":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device)
    ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=LR)
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)  # a new order each epoch, the same on every rank
        total = torch.zeros((), device=device)
        for x, y in loader:
            # 4. Step: DDP averages the gradients over the ranks during backward().
            loss = F.mse_loss(ddp(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.detach()
        dist.all_reduce(total)  # the epoch's mean loss over all ranks, not rank 0's alone
        # 5. Checkpoint and log on rank 0 only; the barrier holds the others until it is saved.
        if rank == 0:
            torch.save(model.state_dict(), "checkpoint.pt")  # model, not ddp: no "module."
            print(f"epoch {epoch}: loss {total.item() / (world_size * len(loader)):.4f}")
        dist.barrier()
finally:
    dist.destroy_process_group()  # 6. Exit: on every way out, errors included
