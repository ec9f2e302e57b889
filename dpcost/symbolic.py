"""The course's quantities as SymPy expressions, and the algebra behind lesson 03's proofs.

Symbols: ``n`` ranks/GPUs (positive integer), ``P`` parameter bytes and ``S`` bytes of one
all-reduced tensor (nonnegative reals), ``alpha`` seconds of latency per message and ``beta``
bytes per second of link bandwidth (positive reals).

The five expressions mirror :mod:`dpcost.core`. No piecewise is needed on the symbols' domain
n >= 1: at n = 1 the formulas give 0, 0, 1, 1 and (after simplification) 1, exactly the values
the numeric functions return for n <= 1. Only this module imports SymPy, so ``import dpcost``
stays light.
"""

from __future__ import annotations

import sympy as sp

from dpcost.core import check_choice

__all__ = [
    "n", "P", "S", "alpha", "beta", "k",
    "dp_volume_expr", "ddp_volume_expr", "dp_gpu0_memory_multiplier_expr",
    "ddp_gpu0_memory_multiplier_expr", "reduction_factor_expr",
    "reduction_factor_ratio", "reduction_factor_simplified", "limits",
    "ring_traffic", "star_traffic", "ring_time_expr", "star_time_expr", "busiest_link_times",
    "allreduce_lower_bound", "min_messages_per_element",
    "K", "C", "chain_traffic", "nccl_path_ratio", "bucketed_ring_time_expr",
    "chunked_dp_time_expr",
]

n = sp.Symbol("n", integer=True, positive=True)
P = sp.Symbol("P", real=True, nonnegative=True)
S = sp.Symbol("S", real=True, nonnegative=True)
alpha = sp.Symbol("alpha", positive=True)
beta = sp.Symbol("beta", positive=True)
k = sp.Symbol("k", integer=True, positive=True)  # step counter in sums over steps
K = sp.Symbol("K", integer=True, positive=True)  # DDP's gradient buckets (one all-reduce each)
C = sp.Symbol("C", integer=True, positive=True)  # DataParallel's 10 MiB chunks per direction


# --- the five quantities ------------------------------------------------------------------

def dp_volume_expr() -> sp.Expr:
    """DataParallel, bytes through GPU0's link per step: ``2 (n - 1) P``."""
    return 2 * (n - 1) * P


def ddp_volume_expr() -> sp.Expr:
    """DDP, bytes each rank sends per step (ring all-reduce of P bytes): ``2 (n - 1) / n * P``."""
    return 2 * (n - 1) / n * P


def dp_gpu0_memory_multiplier_expr() -> sp.Expr:
    """DataParallel, GPU0's batch-sized memory over one GPU's share: ``n`` (dimensionless)."""
    return n


def ddp_gpu0_memory_multiplier_expr() -> sp.Expr:
    """DDP, rank 0's memory over any other rank's: ``1`` (dimensionless)."""
    return sp.Integer(1)


def reduction_factor_ratio() -> sp.Expr:
    """DP volume / DDP volume, multiplied out as on paper: ``(2nP - 2P) / (2P - 2P/n)``.

    Both volumes are expanded before dividing; otherwise SymPy cancels the common factors
    the moment the quotient is built and there is nothing left to prove.
    """
    return sp.expand(dp_volume_expr()) / sp.expand(ddp_volume_expr())


def reduction_factor_simplified() -> sp.Expr:
    """``reduction_factor_ratio()`` simplified; the proof is that this is exactly ``n``."""
    return sp.simplify(reduction_factor_ratio())


def reduction_factor_expr() -> sp.Expr:
    """The reduction factor as the numeric function computes it: ``n`` (P has cancelled)."""
    return reduction_factor_simplified()


def limits() -> dict[str, sp.Expr]:
    """Limits as n -> oo of the five quantities, and of star time / ring time in S.

    DP's volume is taken for a positive model size (for P = 0 it is 0 for every n).
    Keys: "ddp_volume" (2P), "dp_volume" (oo), "reduction_factor" (oo),
    "dp_gpu0_memory_multiplier" (oo), "ddp_gpu0_memory_multiplier" (1),
    "time_ratio_large_S" (n: bandwidth-bound), "time_ratio_small_S" (1: latency-bound).
    """
    p_positive = sp.Symbol("P", positive=True)
    time_ratio = star_time_expr() / ring_time_expr()
    return {
        "ddp_volume": sp.limit(ddp_volume_expr(), n, sp.oo),
        "dp_volume": sp.limit(dp_volume_expr().subs(P, p_positive), n, sp.oo),
        "reduction_factor": sp.limit(reduction_factor_expr(), n, sp.oo),
        "dp_gpu0_memory_multiplier": sp.limit(dp_gpu0_memory_multiplier_expr(), n, sp.oo),
        "ddp_gpu0_memory_multiplier": sp.limit(ddp_gpu0_memory_multiplier_expr(), n, sp.oo),
        "time_ratio_large_S": sp.simplify(sp.limit(time_ratio, S, sp.oo)),
        "time_ratio_small_S": sp.simplify(sp.limit(time_ratio, S, 0)),
    }


# --- two ways to all-reduce S bytes ------------------------------------------------------

def ring_traffic() -> dict[str, sp.Expr]:
    """Bytes moved by a ring all-reduce of S bytes over n ranks, built from its steps.

    The tensor is cut into n chunks of S/n. Reduce-scatter: n - 1 steps, in each every rank
    sends one chunk to its right neighbour and receives one from its left. All-gather: n - 1
    more steps of the same shape. Keys "reduce_scatter" and "all_gather" hold the unevaluated
    sums over steps (bytes one rank sends in that phase); "sent_per_rank" and
    "received_per_rank" = 2 (n - 1) / n * S; "total" (over all links) = 2 (n - 1) S.
    """
    reduce_scatter = sp.Sum(S / n, (k, 1, n - 1))
    all_gather = sp.Sum(S / n, (k, 1, n - 1))
    per_rank = sp.factor(reduce_scatter.doit() + all_gather.doit())
    return {
        "reduce_scatter": reduce_scatter,
        "all_gather": all_gather,
        "sent_per_rank": per_rank,
        "received_per_rank": per_rank,  # each step's chunk in equals its chunk out
        "total": sp.factor(n * per_rank),
    }


def star_traffic() -> dict[str, sp.Expr]:
    """Bytes moved by an all-reduce of S bytes through a root (DP's pattern, GPU0 the root).

    Reduce: each of the n - 1 leaves sends its S bytes to the root. Broadcast: the root sends
    the S-byte result to each of the n - 1 leaves. Keys "root_received" and "root_sent" are
    the unevaluated sums over leaves; "root_sent_and_received" = 2 (n - 1) S is what DP's
    2 (n - 1) P counts; "leaf_sent" = "leaf_received" = S; "total" = 2 (n - 1) S.
    """
    root_received = sp.Sum(S, (k, 1, n - 1))
    root_sent = sp.Sum(S, (k, 1, n - 1))
    leaves_sent = (n - 1) * S
    return {
        "root_received": root_received,
        "root_sent": root_sent,
        "root_sent_and_received": sp.factor(root_received.doit() + root_sent.doit()),
        "leaf_sent": S,
        "leaf_received": S,
        "total": sp.factor(root_sent.doit() + leaves_sent),
    }


def ring_time_expr() -> sp.Expr:
    """Ring all-reduce time, alpha-beta model: ``2 (n - 1) alpha + 2 (n - 1) / n * S / beta``.

    2 (n - 1) steps, each one message latency alpha plus a chunk of S/n at beta bytes/s; a rank
    sends and receives at once (full-duplex link). Units: seconds.
    """
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * S / beta


def star_time_expr() -> sp.Expr:
    """Star (through GPU0) all-reduce time, alpha-beta model: ``2 (n - 1) (alpha + S / beta)``.

    The root's link carries 2 (n - 1) whole copies one after the other: n - 1 in, then n - 1
    out (in DP the two phases are in backward and forward, so they never overlap). Seconds.
    """
    return 2 * (n - 1) * (alpha + S / beta)


def busiest_link_times() -> dict[str, sp.Expr]:
    """Bandwidth terms (seconds) on the busiest link: ring, star and their ratio star / ring.

    The ring's busiest link is any rank's, busy 2 (n - 1) / n * S / beta; the star's is the
    root's, busy 2 (n - 1) S / beta. The ratio simplifies to n.
    """
    ring = (ring_time_expr() - ring_time_expr().subs(S, 0)).expand()
    star = (star_time_expr() - star_time_expr().subs(S, 0)).expand()
    return {"ring": sp.factor(ring), "star": sp.factor(star), "ratio": sp.simplify(star / ring)}


# --- DataParallel's NCCL path, and messages counted per bucket and per chunk ---------------

def chain_traffic() -> dict[str, sp.Expr]:
    """DataParallel's NCCL path: a pipelined chain broadcast of S from GPU0 in forward and a
    chain reduce of S onto GPU0 in backward (``nccl::broadcast``, ``nccl.reduce``).

    Per GPU: the root sends S and later receives S; an intermediate GPU receives and forwards S
    in each (at once, pipelined); the two ends send or receive S once. Keys: "root_sent",
    "root_received", "root_busy" (2 S: the two phases are serial), "total" (2 (n - 1) S: n - 1
    links carry S in each phase, the same total as the ring and the star).
    """
    return {"root_sent": S, "root_received": S, "root_busy": 2 * S,
            "total": sp.factor(2 * (n - 1) * S)}


def nccl_path_ratio() -> sp.Expr:
    """GPU0's busy bytes on the NCCL path over a ring rank's: ``2 S / (2 (n - 1)/n S)``, which
    simplifies to ``n / (n - 1)`` (for n >= 2): the copy path's factor n nearly closes."""
    return sp.simplify(chain_traffic()["root_busy"] / ring_traffic()["sent_per_rank"])


def bucketed_ring_time_expr() -> sp.Expr:
    """DDP's all-reduce of S in K buckets, one ring each: ``2 (n - 1) K alpha + 2 (n-1)/n S/beta``
    (the bytes are the same; the latency is paid per bucket). Seconds."""
    return 2 * (n - 1) * K * alpha + 2 * (n - 1) / n * S / beta


def chunked_dp_time_expr(path: str = "copy") -> sp.Expr:
    """DataParallel's broadcast and reduce of S in C chunks each way, on GPU0's link: latency
    ``2 C (n - 1) alpha``; bytes ``2 (n - 1) S / beta`` on the copy path (star), ``2 S / beta``
    on the NCCL path (chain). Seconds."""
    check_choice(path, "path", ("copy", "nccl"))
    volume = 2 * (n - 1) * S if path == "copy" else 2 * S
    return 2 * C * (n - 1) * alpha + volume / beta


# --- the bandwidth lower bound -----------------------------------------------------------

def allreduce_lower_bound() -> dict[str, sp.Expr]:
    """Lower bounds on the bytes any all-reduce of S bytes over n >= 1 ranks must move.

    Counting lemma (see ``min_messages_per_element`` and lesson 03): each element needs at
    least n - 1 messages to reduce it (every rank but the first to hold the full sum must send
    its contribution) and n - 1 more to distribute it (every other rank must then receive), so
    2 (n - 1) element-sized messages. Over the whole tensor that is 2 (n - 1) S bytes on the
    links; since every byte has one sender and one receiver, the ranks send 2 (n - 1) S bytes
    in total, and so the busiest rank sends at least the average 2 (n - 1) / n * S bytes
    (same for receiving). Keys: "messages_per_element", "reduction_total",
    "distribution_total", "total", "reduction_share" ((n - 1) / n * S, one rank's average
    share of the reduction), "result_share" ((n - 1) / n * S, of the distribution),
    "busiest_rank_sent", "busiest_rank_received" (both 2 (n - 1) / n * S).
    """
    reduction_total = (n - 1) * S
    distribution_total = (n - 1) * S
    total = sp.factor(reduction_total + distribution_total)
    reduction_share = reduction_total / n
    result_share = distribution_total / n
    per_rank = sp.factor(reduction_share + result_share)
    return {
        "messages_per_element": 2 * (n - 1),
        "reduction_total": reduction_total,
        "distribution_total": distribution_total,
        "total": total,
        "reduction_share": reduction_share,
        "result_share": result_share,
        "busiest_rank_sent": per_rank,
        "busiest_rank_received": per_rank,
    }


def min_messages_per_element(num_ranks: int) -> int:
    """Fewest point-to-point messages after which every rank can know the sum of all inputs.

    Exhaustive breadth-first search in a model at least as strong as any all-reduce without
    compression: a message gives its receiver everything its sender knows (a sender holding
    partial sums can send at most that). The answer is 2 (num_ranks - 1); the search checks it
    for small num_ranks (state space up to 2**(num_ranks**2); 5 takes seconds).
    """
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, int):
        raise TypeError(f"num_ranks must be an int, got {type(num_ranks).__name__}")
    if not 1 <= num_ranks <= 5:
        raise ValueError(f"num_ranks must be between 1 and 5 (exhaustive search), got {num_ranks}")
    everything = (1 << num_ranks) - 1
    start = tuple(1 << r for r in range(num_ranks))  # rank r knows only its own input
    if all(known == everything for known in start):
        return 0
    seen, frontier, messages = {start}, [start], 0
    while frontier:
        messages += 1
        next_frontier = []
        for state in frontier:
            for sender in range(num_ranks):
                for receiver in range(num_ranks):
                    merged = state[receiver] | state[sender]
                    if merged == state[receiver]:
                        continue  # includes sender == receiver: nothing new learnt
                    new = state[:receiver] + (merged,) + state[receiver + 1:]
                    if all(known == everything for known in new):
                        return messages
                    if new not in seen:
                        seen.add(new)
                        next_frontier.append(new)
        frontier = next_frontier
    raise AssertionError("unreachable: sending everything to everyone always finishes")
