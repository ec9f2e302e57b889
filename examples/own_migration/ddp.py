"""dp.py moved to DistributedDataParallel: one process per GPU (or CPU rank) under torchrun.

    torchrun --standalone --nproc-per-node 2 examples/own_migration/ddp.py

The lines marked CHECK are what ``python -m dpcost.migration check`` needs; outside the check
they do nothing.
"""

import argparse
import os

import torch
import torch._dynamo  # noqa: F401 - before init_process_group (lesson 09: one import first)
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from dpcost.migration import record  # CHECK

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=32, help="samples per step, all ranks")
parser.add_argument("--lr", type=float, default=1e-3)
args = parser.parse_args()

local_rank = int(os.environ["LOCAL_RANK"])
if torch.cuda.is_available():
    torch.cuda.set_device(local_rank)
device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
try:
    torch.manual_seed(0)
    x = torch.randn(256, 16)
    y = torch.sin(x[:, :4]).sum(dim=1, keepdim=True) + 0.1 * torch.randn(256, 1)
    dataset = TensorDataset(x, y, torch.arange(len(x)))
    sampler = DistributedSampler(dataset, seed=0)  # this rank's share; shuffle=True removed
    loader = DataLoader(dataset, batch_size=args.batch_size // world_size, sampler=sampler)

    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                          nn.Linear(64, 1)).to(device)
    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for xb, yb, index in loader:
            loss = F.mse_loss(model(xb.to(device)), yb.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            record.samples(index, epoch=epoch)  # CHECK
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f} (rank 0's batch)")
    record.result(loss=loss, params=model, optimizer=optimizer)  # CHECK
finally:
    dist.destroy_process_group()
