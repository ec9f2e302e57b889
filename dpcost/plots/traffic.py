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
    ax.legend(loc="upper left", fontsize=12)
    fig.tight_layout()
    return fig, data
