"""Per-rank readings: TCP bytes on the rank's own sockets, peak RSS, and a DDP hook's bytes.

Wire payload. Linux's ``getsockopt(IPPROTO_TCP, TCP_INFO)`` returns ``struct tcp_info``; since
Linux 4.19 it holds ``tcpi_bytes_received`` (offset 128), ``tcpi_bytes_sent`` (offset 200) and
``tcpi_bytes_retrans`` (offset 208), all u64 byte counts of TCP payload (no IP/TCP headers) and
readable without root. A rank's sent bytes are the sum over its TCP sockets of
``bytes_sent - bytes_retrans``; its received bytes the sum of ``bytes_received``. The sockets
that talk to the rendezvous store (local or peer port = the store port) are left out: they carry
the store's key-value traffic, not the training's.

Peak memory on CPU. Writing "5" to ``/proc/self/clear_refs`` resets the kernel's peak resident
set (``VmHWM`` in ``/proc/self/status``) to the current resident set, so ``VmHWM`` read later is
the true peak over the window: a reading, not an estimate.
"""

from __future__ import annotations

import os
import socket
import struct

TCP_INFO_BYTES_RECEIVED = 128  # offsets in struct tcp_info (include/uapi/linux/tcp.h)
TCP_INFO_BYTES_SENT = 200
TCP_INFO_BYTES_RETRANS = 208
TCP_INFO_LENGTH = 216  # enough to cover the three u64 fields above

WIRE_COUNTER = "tcp_info"  # names of the readings, as the report shows them
LOGICAL_COUNTER = "logical"


def _own_tcp_sockets():
    """(local port, peer port, socket) for each connected TCP socket this process holds.

    Walks /proc/self/fd for socket descriptors; each is duplicated so that closing our Python
    socket object leaves the original (gloo's or the store's) untouched.
    """
    found, seen = [], set()
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
            # Our own dups reuse freed fd numbers still in the listing: one count per inode.
            if not target.startswith("socket:") or target in seen:
                continue
            seen.add(target)
            sock = socket.socket(fileno=os.dup(int(name)))
        except OSError:  # the fd closed meanwhile, or is not a socket we can wrap
            continue
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
            sock.close()
            continue
        try:
            local, peer = sock.getsockname()[1], sock.getpeername()[1]
        except OSError:  # listening or not yet connected: carries no payload
            sock.close()
            continue
        found.append((local, peer, sock))
    return found


def tcp_bytes(exclude_port: int | None) -> dict:
    """Sum of TCP payload bytes over this process's sockets, leaving out ``exclude_port``'s.

    Returns {"sent": int, "received": int, "retransmitted": int, "sockets": int}. Raises
    OSError when TCP_INFO is too short to hold the byte counters (Linux < 4.19) or missing.
    """
    sent = received = retrans = count = 0
    for local, peer, sock in _own_tcp_sockets():
        try:
            if exclude_port is not None and exclude_port in (local, peer):
                continue
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LENGTH)
        finally:
            sock.close()
        if len(info) < TCP_INFO_LENGTH:
            raise OSError(f"TCP_INFO returned {len(info)} bytes; byte counters need "
                          f"{TCP_INFO_LENGTH} (Linux >= 4.19)")
        received += struct.unpack_from("Q", info, TCP_INFO_BYTES_RECEIVED)[0]
        one_sent = struct.unpack_from("Q", info, TCP_INFO_BYTES_SENT)[0]
        one_retrans = struct.unpack_from("Q", info, TCP_INFO_BYTES_RETRANS)[0]
        sent += one_sent - one_retrans  # a retransmitted byte crossed the wire twice, once useful
        retrans += one_retrans
        count += 1
    return {"sent": sent, "received": received, "retransmitted": retrans, "sockets": count}


def tcp_info_available() -> tuple[bool, str]:
    """(True, "") when TCP_INFO byte counters can be read here; else (False, the reason)."""
    if not hasattr(socket, "TCP_INFO") or not os.path.isdir("/proc/self/fd"):
        return False, "TCP_INFO or /proc/self/fd is not available on this system"
    server = socket.create_server(("127.0.0.1", 0))
    try:
        client = socket.create_connection(server.getsockname())
        try:
            info = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LENGTH)
        finally:
            client.close()
    except OSError as exc:
        return False, f"TCP_INFO could not be read: {exc}"
    finally:
        server.close()
    if len(info) < TCP_INFO_LENGTH:
        return False, f"TCP_INFO holds {len(info)} bytes, byte counters need Linux >= 4.19"
    return True, ""


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def current_rss_bytes() -> int | None:
    """This process's resident set now (``VmRSS``), in bytes; None where /proc is missing."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * 1024


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (``VmHWM``) to the current RSS; False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int | None:
    """Peak resident set since the last reset (``VmHWM``), in bytes; None where unreadable."""
    kib = _status_kib("VmHWM")
    return None if kib is None else kib * 1024


class BucketCounter:
    """DDP communication-hook state: counts the bytes of every bucket the hook all-reduces.

    ``bytes`` sums ``bucket.buffer().nbytes`` (S for each bucket); over one iteration it equals
    the gradient bytes G exactly, since every gradient sits in exactly one bucket.
    """

    def __init__(self):
        self.bytes = 0
        self.buckets = 0
        self.sizes = []  # every bucket's bytes, in the order DDP all-reduced them


def counting_allreduce_hook(state: BucketCounter, bucket):
    """A DDP comm hook: count the bucket's bytes, then sum it across ranks with all-reduce.

    It sums and does not divide by the world size: DDP's built-in path fuses that 1/n into
    copying the gradients into the bucket (``reducer.cpp: Reducer::copy_grad_to_bucket``), while
    a hook that divides (``default_hooks.py: allreduce_hook``) pays one more pass over every
    bucket (+10-15 % of a 9 ms step here). The caller scales its loss by 1/n instead, which
    gives the same averaged gradients (see ``scenarios.DDPScenario``).
    """
    import torch.distributed as dist

    tensor = bucket.buffer()
    state.bytes += tensor.numel() * tensor.element_size()
    state.buckets += 1
    state.sizes.append(tensor.numel() * tensor.element_size())
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0])


PROFILER_COUNTER = ("profiler (torch.profiler's collective records: message sizes x the "
                    "algorithm's factor, 2(n-1)/n for a ring all-reduce; send/recv as sized)")


def collective_bytes(events, world_size: int, element_size: int) -> dict:
    """Bytes a rank sent and received, from ``torch.profiler`` events with ``record_shapes``.

    The process group records each collective as "<backend>:<op>" (``gloo:all_reduce``,
    ``nccl:all_reduce``, ``gloo:send``, ...) with the shapes of its tensors, not their dtype,
    so ``element_size`` (bytes per element of the gradients) converts elements to bytes. An
    all-reduce of S bytes sends and receives 2(n-1)/n S per rank on a ring (gloo's algorithm;
    NCCL's ring for large messages); a send or receive moves its tensor once. Other collectives
    (barriers, which carry no tensor) are listed in "other" and not counted.
    """
    sent = received = 0.0
    other = set()
    ring = 2 * (world_size - 1) / world_size
    for event in events:
        backend, _, op = event.name.partition(":")
        if backend not in ("gloo", "nccl", "mpi", "ucc") or not op:
            continue
        elements = 0
        for shape in event.input_shapes or []:
            count = 1
            for size in shape:
                count *= size
            elements += count if shape else 0
        nbytes = elements * element_size
        if op == "all_reduce":
            sent += ring * nbytes
            received += ring * nbytes
        elif op == "send":
            sent += nbytes
        elif op in ("recv", "recv_anysource"):
            received += nbytes
        else:
            other.add(event.name)
    return {"sent": sent, "received": received, "other": sorted(other)}
