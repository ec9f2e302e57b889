"""transformer_dp.py moved to DistributedDataParallel: one process per GPU (or CPU rank).

    torchrun --standalone --nproc-per-node 2 examples/own_migration/transformer_ddp.py

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
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=16, help="samples per step, all ranks")
parser.add_argument("--dropout", type=float, default=0.1)
args = parser.parse_args()


class TinyTransformer(nn.Module):
    def __init__(self, vocab=32, width=16, classes=4, dropout=0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, nhead=2, dim_feedforward=32, dropout=dropout,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


local_rank = int(os.environ["LOCAL_RANK"])
if torch.cuda.is_available():
    torch.cuda.set_device(local_rank)
device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
try:
    torch.manual_seed(0)
    tokens = torch.randint(0, 32, (128, 8))
    labels = tokens[:, 0] % 4
    dataset = TensorDataset(tokens, labels, torch.arange(len(tokens)))
    sampler = DistributedSampler(dataset, seed=0)  # this rank's share; shuffle=True removed
    loader = DataLoader(dataset, batch_size=args.batch_size // world_size, sampler=sampler)

    model = TinyTransformer(dropout=args.dropout).to(device)
    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y, index in loader:
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            record.samples(index, epoch=epoch)  # CHECK
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f} (rank 0's batch)")
    record.result(loss=loss, params=model, optimizer=optimizer)  # CHECK
finally:
    dist.destroy_process_group()
