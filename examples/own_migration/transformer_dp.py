"""A practitioner's own DataParallel script with dropout: a tiny transformer classifier on
synthetic tokens (two ``TransformerEncoderLayer`` at their default dropout 0.1), trained with
Adam. Compare it with transformer_ddp.py:

    python -m dpcost.migration check examples/own_migration/transformer_dp.py \\
        examples/own_migration/transformer_ddp.py

The check turns dropout off in both runs and says so (one process and n ranks draw different
masks); ``--keep-dropout`` leaves it on, and the check then names dropout as why the parameters
differ. The lines marked CHECK are what the check needs; outside the check they do nothing.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from dpcost.migration import record  # CHECK

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=16, help="samples per step")
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


torch.manual_seed(0)
tokens = torch.randint(0, 32, (128, 8))
labels = tokens[:, 0] % 4  # the class is in the first token
dataset = TensorDataset(tokens, labels, torch.arange(len(tokens)))  # the index names each sample
# Was DataLoader(..., shuffle=True): the order DistributedSampler draws on n ranks together.
sampler = DistributedSampler(dataset, num_replicas=1, rank=0, seed=0)  # CHECK
loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

model = nn.DataParallel(TinyTransformer(dropout=args.dropout))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

for epoch in range(args.epochs):
    sampler.set_epoch(epoch)  # CHECK
    for x, y, index in loader:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        record.samples(index, epoch=epoch)  # CHECK
    print(f"epoch {epoch}: loss {loss.item():.4f}")
record.result(loss=loss, params=model, optimizer=optimizer)  # CHECK
