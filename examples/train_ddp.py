"""Train a small classifier with DistributedDataParallel: one process per GPU (or CPU rank).

    torchrun --standalone --nproc-per-node 2 examples/train_ddp.py --epochs 3 --global-batch 16

The same training as train_dp.py; every change carries a comment (the lesson prints the diff).
gloo on CPUs, NCCL on GPUs. Rank 0 prints one JSON line: final loss, parameter checksum,
samples seen per rank.
The --bug-* flags each inject one common migration mistake (lesson 09, tests/test_examples.py).
"""

import argparse
import contextlib
import json
import math
import os
import sys
from contextlib import nullcontext

import torch
import torch._dynamo  # noqa: F401 - BEFORE init_process_group: DDP imports it; see setup()
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Sampler, TensorDataset
from torch.utils.data.distributed import DistributedSampler

MAX_DATASET_SIZE = 10_000_000  # samples: 480 MB generated
BYTES_PER_SAMPLE = 48  # 8 float32 features, an int64 label, an int64 index
MAX_EPOCHS = 100_000


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):  # one line, from one rank: torchrun gives every rank the same flags
        rank_0 = os.environ.get("RANK", "0") == "0"
        self.exit(2, f"{self.prog}: error: {message}\n" if rank_0 else None)


def parse_args(argv=None):
    parser = OneLineParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--dataset-size", type=int, default=96, help="samples in the dataset")
    parser.add_argument("--global-batch", type=int, default=16,
                        help="samples per optimizer step, all ranks together")
    parser.add_argument("--accum", type=int, default=1,
                        help="micro-batches accumulated per optimizer step")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-batchnorm", action="store_true", help="a model without BatchNorm")
    parser.add_argument("--drop-last", action="store_true", help="drop the last partial batch")
    parser.add_argument("--checkpoint", default="", help="save model+optimizer here each epoch")
    parser.add_argument("--resume", action="store_true", help="start from --checkpoint")
    parser.add_argument("--result", default="", help="also write parameters etc. to this JSON")
    # The common migration mistakes (--bug-*), to see what each one does:
    parser.add_argument("--bug-no-sampler", action="store_true", help="all data on every rank")
    parser.add_argument("--bug-no-set-epoch", action="store_true", help="one order, all epochs")
    parser.add_argument("--bug-summed-loss", action="store_true", help="sum, not mean, the loss")
    parser.add_argument("--bug-save-every-rank", action="store_true", help="all ranks write")
    parser.add_argument("--bug-no-final-sync", action="store_true", help="no_sync() always")
    args = parser.parse_args(argv)
    # Refuse what cannot train before training: one line each, not a traceback an epoch in.
    world_size = int(os.environ.get("WORLD_SIZE", 1))  # new: torchrun sets it
    for name in ("epochs", "dataset_size", "global_batch", "accum"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.dataset_size > MAX_DATASET_SIZE:  # generated in memory at once
        parser.error(f"--dataset-size must be <= {MAX_DATASET_SIZE} (the dataset is generated "
                     f"in memory, {BYTES_PER_SAMPLE} bytes a sample), got {args.dataset_size}")
    if args.epochs > MAX_EPOCHS:
        parser.error(f"--epochs must be <= {MAX_EPOCHS}, got {args.epochs}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        parser.error(f"--lr must be a finite number > 0, got {args.lr}")
    if not 0 <= args.seed < 2**63:  # torch's generators take 64 bits; seed + epoch must fit
        parser.error(f"--seed must be in 0 to 2**63 - 1, got {args.seed}")
    if args.global_batch % (world_size * args.accum):  # each rank takes an equal share
        parser.error(f"--global-batch ({args.global_batch}) must divide by world size x "
                     f"--accum ({world_size} x {args.accum})")
    micro = args.global_batch // (world_size * args.accum)
    per_rank = (args.dataset_size if args.drop_last else args.dataset_size + world_size - 1
                ) // world_size  # DistributedSampler pads to equal shares, or cuts
    batches = [micro] * (per_rank // micro) + [per_rank % micro] * (not args.drop_last)
    batches = [size for size in batches if size]
    if not batches:
        parser.error(f"--dataset-size ({args.dataset_size}) is less than one batch per rank")
    if min(batches) == 1 and not args.no_batchnorm:
        parser.error(f"--dataset-size ({args.dataset_size}) leaves a batch of 1 sample, on "
                     f"which BatchNorm cannot train: use --drop-last or --no-batchnorm")
    if args.resume and not os.path.isfile(args.checkpoint):
        parser.error(f"--resume needs --checkpoint FILE that exists, got {args.checkpoint!r}")
    if args.resume:
        try:
            done = torch.load(args.checkpoint, map_location="cpu", weights_only=True)["epoch"] + 1
        except Exception as error:  # not a checkpoint of this script
            parser.error(f"--resume: cannot read {args.checkpoint}: {error!r}".splitlines()[0])
        if done >= args.epochs:
            parser.error(f"--epochs ({args.epochs}): the checkpoint has {done} done already")
    for flag, path in (("--checkpoint", args.checkpoint), ("--result", args.result)):
        if path and not can_write(path):
            parser.error(f"{flag}: cannot write a file at {path}")
    if sys.stdout is None:  # started with stdout closed: say so before training, not after
        parser.error("stdout is closed, so the summary could not be printed")
    return args


def can_write(path):
    """Whether a file can be written at ``path``: opened for appending (root may write where
    os.access says yes and the file system says no, as in /proc), and removed again if new."""
    if os.path.isdir(path):
        return False
    existed = os.path.exists(path)
    try:
        with open(path, "ab"):
            pass
    except OSError:
        return False
    if not existed:
        with contextlib.suppress(FileNotFoundError):  # another rank may have removed it
            os.remove(path)
    return True


def make_dataset(size):
    """A generated, seeded 4-class problem: 8 features, labels from a fixed random teacher."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(size, 8, generator=g)
    y = (x @ torch.randn(8, 4, generator=g)).argmax(dim=1)
    return TensorDataset(x, y, torch.arange(size))  # the index lets us count samples seen


def make_model(batchnorm=True):
    norm = nn.BatchNorm1d(32) if batchnorm else nn.Identity()
    return nn.Sequential(nn.Linear(8, 32), norm, nn.ReLU(), nn.Linear(32, 4))


class ShuffleEachEpoch(Sampler):
    """A new order each epoch, drawn from seed + epoch (the order DistributedSampler uses)."""

    def __init__(self, dataset, seed=0):
        self.size, self.seed, self.epoch = len(dataset), seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.size, generator=g).tolist())

    def __len__(self):
        return self.size


def batchnorm_modules(model):
    """The names of the model's BatchNorm layers: on CPU ranks they normalise over B/n samples."""
    return [name for name, module in model.named_modules()
            if isinstance(module, nn.modules.batchnorm._BatchNorm)]


def checksum(model):
    """Sum of |parameter| over the whole model, in float64: one number to compare runs."""
    return sum(p.detach().double().abs().sum().item() for p in model.parameters())


def setup():
    """Join the process group that torchrun describes in the environment; pick this rank's device.

    torch._dynamo is imported at the top, before init_process_group: DDP's constructor imports it,
    and imported after init it makes torch/distributed/nn/functional.py's `group=group.WORLD`
    defaults hold the default group forever, so destroy_process_group cannot free it and gloo's
    threads can abort the process at exit ("terminate called without an active exception").
    """
    local_rank = int(os.environ["LOCAL_RANK"])  # set by torchrun, like RANK and WORLD_SIZE
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)  # else every rank opens a CUDA context on GPU0
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend)  # reads MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    return device


def train(args, device):
    rank, world_size = dist.get_rank(), dist.get_world_size()  # new: who am I, how many of us
    torch.manual_seed(args.seed)  # same init everywhere (DDP also broadcasts rank 0's weights)
    model = make_model(not args.no_batchnorm)
    if device.type == "cuda":  # SyncBatchNorm raises on CPU tensors (torch/nn/modules/batchnorm.py)
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # BN statistics over all ranks
    model = model.to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)  # was DP
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    start_epoch = 0
    if args.resume:  # map_location: onto this rank's device, not the GPU that saved it
        state = torch.load(args.checkpoint, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])  # the plain model, was model.module
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1

    dataset = make_dataset(args.dataset_size)
    # This rank's 1/world_size of the data (padded or cut to divide evenly), was ShuffleEachEpoch.
    sampler = DistributedSampler(dataset, seed=args.seed, drop_last=args.drop_last)
    if args.bug_no_sampler:  # BUG: the one-process sampler gives all the data to every rank
        sampler = ShuffleEachEpoch(dataset, seed=args.seed)  # BUG
    micro_batch = args.global_batch // (world_size * args.accum)  # per rank: global / n
    loader = DataLoader(dataset, batch_size=micro_batch, sampler=sampler,
                        drop_last=args.drop_last)

    seen, steps, writes, step_loss = [], 0, 0, torch.zeros((), device=device)
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        if args.bug_no_set_epoch:  # BUG: as if set_epoch were never called
            sampler.set_epoch(0)  # BUG
        seen.append([])
        for i, (x, y, index) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            last_micro = (i + 1) % args.accum == 0 or i + 1 == len(loader)
            # Accumulate without communicating; all-reduce on the window's last backward.
            sync = ddp.no_sync() if not last_micro else nullcontext()
            if args.bug_no_final_sync:  # BUG: the last micro-batch under no_sync() too
                sync = ddp.no_sync()  # BUG
            with sync:
                output = ddp(x)  # was model(x)
                loss = F.cross_entropy(output, y) / args.accum
                if args.bug_summed_loss:  # BUG: summed over the batch instead of averaged
                    loss = F.cross_entropy(output, y, reduction="sum") / args.accum  # BUG
                loss.backward()  # DDP averages the gradients over the ranks here
            step_loss += loss.detach()
            seen[-1] += index.tolist()
            if last_micro:
                optimizer.step()
                optimizer.zero_grad()
                steps += 1
                dist.all_reduce(step_loss)  # the loss of the global batch: mean over ranks
                final_loss, step_loss = step_loss.item() / world_size, torch.zeros_like(step_loss)
        if args.checkpoint:
            writer = rank == 0  # one writer
            if args.bug_save_every_rank:  # BUG: every rank writes the same file
                writer = True  # BUG
            if writer:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "epoch": epoch}, args.checkpoint)  # model, not ddp: no "module."
                writes += 1
            dist.barrier()  # nobody reads or overwrites the file before it is complete

    checkpoint_ok = None
    if args.checkpoint:  # read it back on every rank, each onto its own device
        state = torch.load(args.checkpoint, map_location=device, weights_only=True)
        checkpoint_ok = all(torch.equal(state["model"][k], v)
                            for k, v in model.state_dict().items())  # was model.module
    params = torch.cat([p.detach().flatten() for p in model.parameters()])  # was model.module
    gathered = [None] * world_size  # new: collect every rank's view on rank 0
    dist.all_gather_object(gathered, {"checksum": checksum(model), "seen": seen,
                                      "writes": writes, "checkpoint_ok": checkpoint_ok})
    return {"script": "train_ddp", "world_size": world_size, "final_loss": final_loss,
            "param_checksum": checksum(model),
            "samples_per_rank": [sum(map(len, g["seen"])) for g in gathered], "steps": steps,
            "checkpoint_writes": sum(g["writes"] for g in gathered),
            "checkpoint_ok": None if checkpoint_ok is None else all(
                g["checkpoint_ok"] for g in gathered),
            "rank_checksums": [g["checksum"] for g in gathered],
            "sample_ids": [g["seen"] for g in gathered], "params": params.cpu().tolist(),
            "batchnorm_modules": batchnorm_modules(model)}


SUMMARY = ("script", "world_size", "final_loss", "param_checksum", "samples_per_rank", "steps",
           "checkpoint_writes", "checkpoint_ok")


def report(args, result):
    """Print the JSON line, then write --result: a failed write loses nothing printed."""
    if not math.isfinite(result["final_loss"]):  # NaN is not JSON, and not a result
        sys.exit(f"{sys.argv[0]}: error: the loss diverged to {result['final_loss']}; "
                 f"try a smaller --lr")
    try:
        if sys.stdout is None:  # started with stdout closed: print() would write nothing
            raise OSError("stdout is closed")
        print(json.dumps({k: result[k] for k in SUMMARY}), flush=True)
    except (OSError, ValueError) as error:
        with contextlib.suppress(OSError, ValueError, AttributeError):  # quiet at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        sys.exit(f"{sys.argv[0]}: error: could not print the summary: "
                 f"{getattr(error, 'strerror', None) or error}")
    if args.result:
        try:
            with open(args.result, "w") as f:
                json.dump(result, f)
        except OSError as error:
            sys.exit(f"{sys.argv[0]}: error: --result: could not write {args.result}: "
                     f"{error.strerror}")


def main(argv=None):
    args = parse_args(argv)
    if "LOCAL_RANK" not in os.environ:  # new: torchrun starts the ranks, not python
        sys.exit(f"{sys.argv[0]}: error: start it with torchrun, for example torchrun "
                 f"--standalone --nproc-per-node 2 {sys.argv[0]} (LOCAL_RANK is not set)")
    device = setup()
    try:  # destroy_process_group on every way out, errors included
        result = train(args, device)
        if dist.get_rank() == 0:  # new: one rank reports
            report(args, result)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
