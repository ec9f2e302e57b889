"""Bytes per rank for a module of your own: DDP and both DataParallel patterns, over gloo.

``python -m dpcost.measure --model SPEC`` runs this. ``measure(spec, ...)`` forks
``world_size`` ranks from the launcher's warm process (``launch.warm_context``); each rank
builds the module from ``spec`` on the CPU (seed 0; "package.module:callable" or a preset of
``dpcost.torch_models.PRESET_BUILDERS``) and measures three patterns on it, one after the
other, in one process group:

- ``ddp``: ``DistributedDataParallel`` with the counting hook (``counters.
  counting_allreduce_hook``: one all-reduce per bucket, its bytes recorded), two warm-up
  iterations (the buckets are rebuilt at the second forward), then ``steps`` measured ones;
- ``dp`` (DataParallel's copy path, a star): rank 0 sends the flat parameters (and, as a
  second message, the flat buffers) to every other rank, every rank runs forward and backward,
  and rank 0 receives and sums every other rank's flat gradients;
- ``dp-nccl`` (its NCCL path, a chain): the same tensors, broadcast and reduced along the
  pipelined chain of ``chain.py``.

Bytes are the rank's TCP payload (``counters.tcp_bytes``, TCP_INFO, the store's socket left
out) between two readings around the measured steps, per step; each reading is a barrier, the
counters, and a second barrier (so no rank sends the next bytes before every rank has read).
gloo's framing comes on top (``report.predicted_framing_bytes`` predicts it from the message
count, the one closing barrier per window included).
"""

from __future__ import annotations

from dpcost.measure.bucket_order import BucketOrderError
from dpcost.measure.rank_answers import gather

PATTERNS = ("ddp", "dp", "dp-nccl")
WARMUP = 2


def measure(spec: str, input_shape, vocab: int = 0, world_size: int = 2, steps: int = 3,
            timeout_s: float = 180.0) -> list[dict]:
    """One dict per rank: {"rank", "param_bytes", "buffer_bytes", "grad_bytes", and per
    pattern {"sent_bytes", "received_bytes" (per step), "bucket_sizes" (ddp: each bucket's
    bytes in one step, in the order all-reduced)}}. ``input_shape``: each rank's batch, float
    (``vocab`` 0) or integer tokens below ``vocab``. Raises BucketOrderError naming the rank
    when one fails; no rank outlives the call."""
    return gather(_run_rank, (spec, tuple(input_shape), vocab, world_size, steps), world_size,
                  timeout_s, error=BucketOrderError)


def build(spec: str):
    """The module ``spec`` names, built on the CPU."""
    import importlib

    from dpcost.torch_models import PRESET_BUILDERS

    if spec in PRESET_BUILDERS:
        return PRESET_BUILDERS[spec].build()
    module_name, _, attr = spec.partition(":")
    target = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    return target()


def model_bytes(spec: str) -> float | None:
    """Bytes of the parameters and buffers of the module ``spec`` names, built here on the meta
    device (shapes, no memory; Llama-2 70B in under a second): the preflight's input, before
    any rank starts. ValueError naming ``--model`` when ``spec`` names nothing that builds a
    module (no such module or attribute, ``sys.exit`` while building, not an nn.Module); None
    when it builds only on real tensors (the ranks then build it and report what fails)."""
    import torch

    module_name = spec.partition(":")[0]
    try:
        with torch.device("meta"):
            module = build(spec)
    except ImportError as error:
        raise ValueError(f"--model: cannot import {module_name!r}: {error}") from None
    except AttributeError as error:
        raise ValueError(f"--model: {spec!r} names no callable (package.module:callable or "
                         f"a preset): {error}") from None
    except SystemExit as exiting:
        raise ValueError(f"--model: building {spec!r} called sys.exit({exiting.code!r})"
                         ) from None
    except Exception:  # noqa: BLE001 - e.g. .item() on a meta tensor: real tensors only
        return None
    if not isinstance(module, torch.nn.Module):
        raise ValueError(f"--model: {spec!r} built a {type(module).__name__}, not a "
                         "torch.nn.Module")
    return float(sum(t.numel() * t.element_size()
                     for t in (*module.parameters(), *module.buffers())))


def model_input(spec: str, input_shape=None, batch=None, seq=None) -> tuple[tuple, int]:
    """(each rank's input shape, vocabulary or 0 for a float input) from the options; a
    preset knows its own input (``batch`` samples, default 1). ValueError names the option."""
    from dpcost.torch_models import PRESET_BUILDERS

    if input_shape is not None:
        try:
            shape = tuple(int(part) for part in input_shape.split(","))
        except ValueError:
            raise ValueError(f"--input-shape: {input_shape!r} must be comma-separated "
                             "integers such as 2,16,256") from None
        if not shape or min(shape) < 1:
            raise ValueError(f"--input-shape: every size must be >= 1, got {input_shape!r}")
        return shape, 0
    preset = PRESET_BUILDERS.get(spec)
    if seq is not None:
        vocab = preset.vocab if preset is not None and preset.tokens else 0
        if not vocab:
            vocab = _first_embedding_rows(spec)
        return (batch or 1, seq), vocab
    if preset is not None:
        return (batch or 1, *preset.sample_shape), preset.vocab if preset.tokens else 0
    raise ValueError("--input-shape: a module of your own needs its input: --input-shape "
                     "B,... or --batch B --seq S")


def _first_embedding_rows(spec) -> int:
    import torch

    with torch.device("meta"):
        module = build(spec)
    for sub in module.modules():
        if isinstance(sub, torch.nn.Embedding):
            return sub.num_embeddings
    raise ValueError("--seq: token input needs an nn.Embedding in the module")


def _flat(tensors):
    """One tensor holding ``tensors``' bytes (one dtype: their values; mixed: their bytes)."""
    import torch

    if not tensors:
        return None
    if len({t.dtype for t in tensors}) == 1:
        return torch.cat([t.detach().reshape(-1) for t in tensors])
    return torch.cat([t.detach().reshape(-1).view(torch.uint8) for t in tensors])


def _run_rank(rank, port, spec, shape, vocab, world_size, steps):
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from dpcost.measure import counters

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world_size, rank == 0,
                          timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    generator = torch.Generator().manual_seed(rank)

    def batch():
        return (torch.randint(vocab, shape, generator=generator) if vocab
                else torch.randn(shape, generator=generator))

    def reading():
        # Barrier, read, barrier: without the second one a rank that has read its counters
        # can send the next step's bytes before a slower peer reads, and the peer counts them
        # in this window (seen here: +1,152 B in one window, -1,200 B in the next).
        dist.barrier()
        counted = counters.tcp_bytes(port)
        dist.barrier()
        return counted

    def window(run_one):
        for _ in range(WARMUP):
            run_one()
        before = reading()
        for _ in range(steps):
            run_one()
        after = reading()
        return {"sent_bytes": (after["sent"] - before["sent"]) / steps,
                "received_bytes": (after["received"] - before["received"]) / steps}

    torch.manual_seed(0)
    module = build(spec)
    params = [p for p in module.parameters() if p.requires_grad]
    result = {"rank": rank,
              "param_bytes": sum(p.numel() * p.element_size() for p in module.parameters()),
              "buffer_bytes": sum(b.numel() * b.element_size() for b in module.buffers()),
              "buffer_dtypes": len({b.dtype for b in module.buffers()}),
              "grad_bytes": sum(p.numel() * p.element_size() for p in params)}

    # DDP, with the counting hook (it sums; the loss carries the 1/n).
    ddp = torch.nn.parallel.DistributedDataParallel(module)
    hook = counters.BucketCounter()
    ddp.register_comm_hook(hook, counters.counting_allreduce_hook)

    def ddp_step():
        hook.sizes.clear()
        (ddp(batch()).float().sum() / world_size).backward()

    result["ddp"] = window(ddp_step)
    result["ddp"]["bucket_sizes"] = list(hook.sizes)

    # DataParallel's two paths on processes: parameters (+ buffers) out, gradients back, on a
    # fresh copy of the module (DDP's reducer hooks stay on the first one's parameters).
    from dpcost.measure.chain import chain_broadcast, chain_reduce

    torch.manual_seed(0)
    module = build(spec)
    params = [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    outgoing = [t for t in (_flat(list(module.parameters())), _flat(list(module.buffers())))
                if t is not None]
    grads = _flat([p.grad for p in params])
    others = range(1, world_size)

    def compute():
        for p in params:
            p.grad = None
        module(batch()).float().sum().backward()
        grads.copy_(_flat([p.grad for p in params]))

    def star():
        for flat in outgoing:  # replicate: broadcast_coalesced, parameters then buffers
            if rank == 0:
                for request in [dist.isend(flat, dst) for dst in others]:
                    request.wait()
            else:
                dist.recv(flat, src=0)
        compute()
        if rank == 0:  # reduce_add: every other replica's gradients onto rank 0, summed
            inbox = [torch.empty_like(grads) for _ in others]
            for request in [dist.irecv(box, src) for src, box in zip(others, inbox,
                                                                     strict=True)]:
                request.wait()
            for box in inbox:
                grads.add_(box)
        else:
            dist.send(grads, dst=0)

    inbox = torch.empty_like(grads) if rank != 1 else None

    def chain():
        for flat in outgoing:
            chain_broadcast(flat, rank, world_size)
        compute()
        chain_reduce(grads, inbox, rank, world_size)

    result["dp"] = window(star)
    result["dp-nccl"] = window(chain)
    dist.destroy_process_group()
    return result


def predicted_framing(results: list, steps: int) -> dict:
    """{pattern: [(sent, received) framing bytes per step, by rank]} from the message counts
    (``report.predicted_framing_bytes``; the DDP buckets as the hook counted them)."""
    from dpcost.measure.report import predicted_framing_bytes
    from dpcost.step_time import GLOO_FRAMING_BYTES_PER_MESSAGE, gloo_barrier_messages

    n = len(results)
    # The window holds two barriers (the opening reading's second, the closing reading's
    # first); predicted_framing_bytes counts one.
    second = gloo_barrier_messages(n) * GLOO_FRAMING_BYTES_PER_MESSAGE / steps
    out = {}
    for pattern in PATTERNS:
        out[pattern] = [tuple(x + second + y for x, y in zip(predicted_framing_bytes(
            pattern, r["rank"], r["param_bytes"], n, steps,
            bucket_sizes=r["ddp"]["bucket_sizes"] if pattern == "ddp" else None),
            _buffer_framing(pattern, r["rank"], n, r["buffer_bytes"], r["buffer_dtypes"]),
            strict=True)) for r in results]
    return out


def _buffer_framing(pattern, rank, n, buffer_bytes, buffer_dtypes) -> tuple:
    """Framing of the buffers' messages per step (report.predicted_framing_bytes counts the
    parameters' and gradients' only): DDP broadcasts them from rank 0 each forward, one
    broadcast per dtype (``_broadcast_coalesced`` flattens each dtype apart), over gloo's
    binomial tree; the DP star sends them as one more message per peer; the chain in slices.
    """
    from dpcost.dataparallel_traffic import chain_broadcast_bytes, chain_messages
    from dpcost.step_time import gloo_framing_bytes

    if not buffer_bytes:
        return (0.0, 0.0)
    if pattern == "ddp":
        children = sum(1 for k in range(n.bit_length())
                       if 2**k > rank and rank + 2**k < n) if rank else (n - 1).bit_length()
        sent, received = children * buffer_dtypes, (buffer_dtypes if rank else 0)
    elif pattern == "dp":
        sent, received = (n - 1, 0) if rank == 0 else (0, 1)
    else:
        hops_out, hops_in = chain_broadcast_bytes(1, n)[rank]
        chunks = chain_messages(buffer_bytes)
        sent, received = int(hops_out) * chunks, int(hops_in) * chunks
    return gloo_framing_bytes(sent, received)


def format_table(results: list, steps: int) -> str:
    """Measured bytes per step and rank, and the framing gloo adds by the message count."""
    framing = predicted_framing(results, steps)
    lines = [f"{'pattern':<9}{'rank':>5}{'sent':>14}{'received':>14}{'framing (pred.)':>17}"]
    for pattern in PATTERNS:
        for r in results:
            f = framing[pattern][r["rank"]]
            lines.append(f"{pattern:<9}{r['rank']:>5}{r[pattern]['sent_bytes']:>14,.0f}"
                         f"{r[pattern]['received_bytes']:>14,.0f}"
                         f"{'n/a' if f is None else f'{f[0]:,.0f} / {f[1]:,.0f}':>17}")
    buckets = results[0]["ddp"]["bucket_sizes"]
    lines.append(f"DDP buckets per step: {len(buckets)} ({', '.join(f'{b:,}' for b in buckets)} B)")
    return "\n".join(lines)
