"""What crosses GPU0's link in one DataParallel iteration, term by term, beside DDP."""

from __future__ import annotations

from matplotlib.figure import Figure

from dpcost.dataparallel_traffic import ddp_step_transfers, dp_step_transfers
from dpcost.plots import style

# (label, colour) of each DataParallel row with bytes, in dp_step_transfers' order
_TERMS = [
    ("inputs scattered, (n-1)/n I", "#f5b041"),
    ("parameters replicated, (n-1) P", style.DP_COLOR),
    ("buffers replicated, (n-1) B", "#7d3c98"),
    ("outputs gathered, (n-1)/n O", "#27ae60"),
    ("output grads scattered, (n-1)/n O", "#82e0aa"),
    ("gradients reduced, (n-1) G", "#e6b0aa"),
]


def dp_volume_breakdown(cases: dict[str, dict], num_gpus: int):
    """Stacked bars, one pair per model: DP's bytes through GPU0 by term, and DDP's bytes
    sent by rank 0 (gradient all-reduce plus buffer broadcast), in GB (decimal).

    Both bars are the bytes that set the link's busy time: DP's terms run one after another
    (forward, then backward), while a DDP rank receives as much as it sends at the same time,
    so its sent bytes alone measure its busy time.

    ``cases`` maps a label to keyword arguments of ``dp_step_transfers`` (param_bytes,
    buffer_bytes, grad_bytes, input_bytes, output_bytes). Returns (figure, data) with
    data[label] = {"dp_terms": [bytes per term], "dp_total", "ddp_total"}.
    """
    style.apply()
    fig = Figure()  # not pyplot-managed: shown once, where displayed
    ax = fig.subplots()
    data = {}
    for i, (label, kwargs) in enumerate(cases.items()):
        # every forward/backward row but parallel_apply's, which moves nothing
        terms = [r.gpu0_sent_bytes + r.gpu0_received_bytes
                 for r in dp_step_transfers(num_gpus=num_gpus, **kwargs)
                 if r.phase in ("forward", "backward")
                 and "parallel_apply" not in r.pytorch_function]
        bottom = 0.0
        for (name, color), value in zip(_TERMS, terms, strict=True):
            ax.bar(2 * i, value / 1e9, 0.8, bottom=bottom / 1e9, color=color,
                   label=name if i == 0 else None)
            bottom += value
        ddp = sum(r.gpu0_sent_bytes for r in ddp_step_transfers(num_gpus=num_gpus, **kwargs))
        ax.bar(2 * i + 0.9, ddp / 1e9, 0.8, color=style.DDP_COLOR,
               label="DDP, rank 0: sent (= received, at the same time)" if i == 0 else None)
        data[label] = {"dp_terms": terms, "dp_total": bottom, "ddp_total": ddp}
    ax.set_xticks([2 * i + 0.45 for i in range(len(cases))],
                  [f"{label}\nDP | DDP" for label in cases])
    ax.set_ylabel("GB on GPU0's link (time = GB / bandwidth)")
    ax.set_xlabel("model (batch as stated)")
    ax.set_title(f"One training iteration on n = {num_gpus} GPUs: what crosses GPU0's link")
    ax.legend(loc="upper left", fontsize=13)
    fig.tight_layout()
    return fig, data


def two_paths_per_gpu(param_bytes: float, num_gpus: int, buffer_bytes: float = 0.0):
    """Bars per GPU: bytes sent and received in DataParallel's broadcast of P + B and reduce
    of G = P, on the copy path (a star through GPU0) and on the NCCL path (a pipelined chain),
    beside a DDP rank's ring all-reduce. GB (decimal).

    Returns (figure, data): data[path] = {"sent": [...], "received": [...], "busy": [...]}
    per GPU for "copy" and "nccl" (busy = sum over phases of max(sent, received), the bytes
    that set each link's busy time), and data["ddp"] = {"sent", "received", "busy"} per rank.
    """
    from dpcost.core import ddp_communication_volume
    from dpcost.dataparallel_traffic import dp_path_traffic, gpu_busy_bytes

    style.apply()
    n = num_gpus
    data = {}
    for path in ("copy", "nccl"):
        rows = dp_path_traffic(param_bytes, buffer_bytes, param_bytes, 0, 0, n, path=path)
        data[path] = {"sent": [sum(r.sent[g] for r in rows) for g in range(n)],
                      "received": [sum(r.received[g] for r in rows) for g in range(n)],
                      "busy": [gpu_busy_bytes(rows, g) for g in range(n)]}
    ring = ddp_communication_volume(param_bytes, n)
    data["ddp"] = {"sent": [ring] * n, "received": [ring] * n, "busy": [ring] * n}
    fig = Figure(figsize=(12.0, 5.6))
    ax = fig.subplots()
    width = 0.27
    series = [("copy", "DP, copy path (no NCCL): star", style.DP_COLOR),
              ("nccl", "DP, NCCL path: pipelined chain", style.DP_NCCL_COLOR),
              ("ddp", "DDP rank: ring all-reduce", style.DDP_COLOR)]
    for i, (key, label, color) in enumerate(series):
        xs = [g + (i - 1) * width for g in range(n)]
        ax.bar(xs, [b / 1e9 for b in data[key]["busy"]], width, color=color, label=label)
    ax.set_xticks(range(n), [f"GPU {g}" for g in range(n)])
    ax.set_xlabel("GPU (GPU0 = device_ids[0], DataParallel's root)")
    ax.set_ylabel("busy bytes on the GPU's link (GB)")
    ax.set_title(f"Parameters out + gradients in, P = {param_bytes / 1e9:g} GB, n = {n}: "
                 "busy bytes per GPU's link")
    ax.legend(loc="upper right")
    fig.tight_layout()
    return fig, data
