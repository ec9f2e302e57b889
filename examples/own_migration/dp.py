"""A practitioner's own DataParallel script (not the course's): an MLP regressor on synthetic
data, trained with Adam. Run it as is (``python dp.py``), or compare it with ddp.py:

    python -m dpcost.migration check examples/own_migration/dp.py examples/own_migration/ddp.py

The lines marked CHECK are what the check needs; outside the check they do nothing.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from dpcost.migration import record  # CHECK

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=32, help="samples per step")
parser.add_argument("--lr", type=float, default=1e-3)
args = parser.parse_args()

torch.manual_seed(0)
x = torch.randn(256, 16)
y = torch.sin(x[:, :4]).sum(dim=1, keepdim=True) + 0.1 * torch.randn(256, 1)
dataset = TensorDataset(x, y, torch.arange(len(x)))  # the index names each sample
# Was DataLoader(..., shuffle=True). For the check, the one process draws the order that
# DistributedSampler draws on n ranks together (seed + epoch): the same sampler, one replica.
sampler = DistributedSampler(dataset, num_replicas=1, rank=0, seed=0)  # CHECK
loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

model = nn.DataParallel(nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                                      nn.Linear(64, 1)))
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

for epoch in range(args.epochs):
    sampler.set_epoch(epoch)  # CHECK
    for xb, yb, index in loader:
        loss = F.mse_loss(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        record.samples(index, epoch=epoch)  # CHECK
    print(f"epoch {epoch}: loss {loss.item():.4f}")
record.result(loss=loss, params=model, optimizer=optimizer)  # CHECK
