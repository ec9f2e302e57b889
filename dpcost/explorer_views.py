"""The explorer's three figures, drawn once and then updated in place.

Each view owns one matplotlib ``Figure`` (no pyplot: nothing is registered or shown twice) and
keeps handles to its artists, so a control change only moves data (``set_data``,
``set_height``, ``set_ylim``) and renders one PNG. A view renders again only when what it draws
changed: a utilisation change redraws the step view alone, an optimizer change the memory view
alone. Units: bytes and seconds in, human units on the axes (decimal kB/MB/GB).
"""

from __future__ import annotations

import math
import struct
import zlib

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import (
    FixedLocator,
    FuncFormatter,
    LogLocator,
    MaxNLocator,
    NullFormatter,
    NullLocator,
)

from dpcost.plots import style
from dpcost.units import format_bytes, format_seconds

FIGSIZE = (6.4, 4.3)  # two side by side fill a 1280-pixel-wide screen at 100 dpi

COMPONENT_COLORS = style.COMPONENT_COLORS  # memory components, bottom to top


def _bytes_tick(value, _pos) -> str:
    return format_bytes(value, digits=3)


class _View:
    """One figure on an Agg canvas, rendered in two layers to keep updates fast.

    The background (axes, ticks, labels, legend) depends only on ``background_key`` (the axis
    limits): it is drawn in full the first time a key is seen and its pixels are cached, up to
    ``MAX_BACKGROUNDS`` keys. Every change restores those pixels and draws only the ``dynamic``
    artists over them (matplotlib's blitting, here into a PNG).
    """

    MAX_BACKGROUNDS = 16  # about 1.1 MB of pixels each

    def __init__(self):
        style.apply()
        self.figure = Figure(figsize=FIGSIZE)
        self.canvas = FigureCanvasAgg(self.figure)
        self.dynamic = []  # artists that move with the controls, drawn last, in this order
        self._backgrounds = {}
        self._key = None
        self._png = b""

    def png(self, background_key, key) -> bytes:
        """The figure as PNG bytes, rendered again only when ``key`` (what is drawn) changed."""
        if (background_key, key) == self._key:
            return self._png
        background = self._backgrounds.get(background_key)
        if background is None:
            visible = [artist.get_visible() for artist in self.dynamic]
            for artist in self.dynamic:
                artist.set_visible(False)
            self.canvas.draw()
            for artist, shown in zip(self.dynamic, visible, strict=True):
                artist.set_visible(shown)
            if len(self._backgrounds) >= self.MAX_BACKGROUNDS:
                self._backgrounds.clear()
            self._backgrounds[background_key] = self.canvas.copy_from_bbox(self.figure.bbox)
        else:
            self.canvas.restore_region(background)
        renderer = self.canvas.get_renderer()
        for artist in self.dynamic:
            artist.draw(renderer)
        self._png = encode_png(self.canvas)
        self._key = (background_key, key)
        return self._png

    def render_full(self) -> bytes:
        """The whole figure drawn from scratch as PNG (to check the layered render against)."""
        self.canvas.draw()
        return encode_png(self.canvas)


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def encode_png(canvas) -> bytes:
    """The canvas's pixels as an 8-bit RGB PNG, written directly (PNG spec, ISO/IEC 15948).

    Rows unfiltered (filter byte 0) and zlib level 1: about twice as fast as Pillow's encoder
    here, at a similar size (~45 kB), because a PNG is made on every control change.
    """
    width, height = canvas.get_width_height()
    rgb = np.asarray(canvas.buffer_rgba())[:, :, :3]
    rows = np.zeros((height, 1 + 3 * width), dtype=np.uint8)  # column 0: each row's filter byte
    rows[:, 1:] = rgb.reshape(height, 3 * width)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit, colour type 2: RGB
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header)
            + _png_chunk(b"IDAT", zlib.compress(rows.tobytes(), 1)) + _png_chunk(b"IEND", b""))


def _decade_limits(values, base_range) -> tuple[float, float]:
    """``base_range`` widened by whole decades until it holds every positive finite value."""
    low, high = base_range
    positive = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if positive:
        while min(positive) < low:
            low /= 10
        while max(positive) > high:
            high *= 10
    return low, high


def _nice_ceiling(value: float, steps=(1, 1.5, 2, 3, 5, 7, 10)) -> float:
    """The smallest of ``steps`` x 10^k that is >= value (value > 0)."""
    exponent = math.floor(math.log10(value))
    for step in steps:
        if step * 10.0**exponent >= value:
            return step * 10.0**exponent
    return 10.0 ** (exponent + 1)


class VolumeView(_View):
    """View 1: bytes per step on the busiest link against n, log-log.

    DataParallel's GPU0 on its copy path (a star, ``2(n-1)P`` plus scatter and gather) and on
    its NCCL path (pipelined chains: about P out and G in), drawn only up to one node; a DDP
    rank's ring all-reduce, ``2(n-1)/n G``, for every n. A dotted line marks the node's size.
    The y range is fixed (``Y_RANGE``) so that switching models moves the curves on unchanged
    axes; it widens by whole decades only when a value falls outside.
    """

    # From ResNet-50 in bf16 on 2 GPUs (~50 MB) to Llama-2 70B's gradients on 1024 (~550 GB) and
    # DP's copy path on 16 GPUs with large outputs.
    Y_RANGE = (1e7, 1e14)

    def __init__(self, gpu_counts):
        super().__init__()
        ax = self.ax = self.figure.add_subplot()
        self.copy_line, = ax.plot([], [], "-", color=style.DP_COLOR, lw=2.5,
                                  label="DP copy path: GPU0 (star)")
        self.nccl_line, = ax.plot([], [], "--", color=style.DP_COLOR, lw=2.5,
                                  label="DP NCCL path: GPU0 (chains)")
        self.ddp_line, = ax.plot([], [], "-", color=style.DDP_COLOR, lw=2.5,
                                 label="DDP: per rank, 2(n-1)/n G")
        self.node_line = ax.axvline(8, color="0.45", ls=":", lw=1.5, label="one node (DP's limit)")
        self.n_line = ax.axvline(1, color="0.3", ls="--", lw=1.0)
        self.copy_mark, = ax.plot([], [], "o", color=style.DP_COLOR, ms=9)
        self.nccl_mark, = ax.plot([], [], "s", color=style.DP_COLOR, ms=8, mfc="white", mew=2)
        self.ddp_mark, = ax.plot([], [], "o", color=style.DDP_COLOR, ms=9)
        self.note = ax.text(0.97, 0.04, "", transform=ax.transAxes, ha="right", va="bottom",
                            fontsize=11, bbox={"facecolor": "white", "edgecolor": "0.7",
                                               "alpha": 0.9, "boxstyle": "round"})
        self.dynamic = [self.copy_line, self.nccl_line, self.ddp_line, self.node_line,
                        self.n_line, self.copy_mark, self.nccl_mark, self.ddp_mark, self.note]
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlim(1 / 1.3, max(gpu_counts) * 1.3)
        ticks = [1] + [n for n in gpu_counts if n & (n - 1) == 0 and round(math.log2(n)) % 2 == 0]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_locator(LogLocator(base=10, numticks=8))
        ax.yaxis.set_major_formatter(FuncFormatter(_bytes_tick))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.set_ylim(*self.Y_RANGE)
        ax.set_xlabel("number of GPUs, n (log scale)")
        ax.set_ylabel("bytes on the busiest link (decimal)")
        ax.set_title("Bytes per training step")
        ax.legend(loc="upper left", fontsize=10)
        # Fixed margins (not tight_layout on every change): the axes stay put, only data moves.
        self.figure.subplots_adjust(left=0.17, right=0.97, bottom=0.14, top=0.91)

    def update(self, gpus, copy, nccl, ddp, n, copy_at_n, nccl_at_n, ddp_at_n,
               gpus_per_node) -> None:
        """Move the curves and the markers to n; DP's markers only where DP runs."""
        self.copy_line.set_data(gpus, copy)
        self.nccl_line.set_data(gpus, nccl)
        self.ddp_line.set_data(gpus, ddp)
        self.node_line.set_xdata([gpus_per_node, gpus_per_node])
        self.n_line.set_xdata([n, n])
        dp_runs = copy_at_n is not None and n > 1
        for mark, value in ((self.copy_mark, copy_at_n), (self.nccl_mark, nccl_at_n)):
            mark.set_data(([n], [value]) if dp_runs and value > 0 else ([], []))
        self.ddp_mark.set_data(([n], [ddp_at_n]) if n > 1 else ([], []))
        if n == 1:
            note = "n = 1: no communication"
        elif copy_at_n is None:
            note = f"n = {n}: DataParallel cannot span machines"
        else:
            # short: text is the costliest artist to draw
            note = f"GPU0/DDP: copy {copy_at_n / ddp_at_n:.3g}x, NCCL {nccl_at_n / ddp_at_n:.3g}x"
        self.note.set_text(note)
        self.ax.set_ylim(*_decade_limits(list(copy) + list(nccl) + list(ddp), self.Y_RANGE))

    def background_key(self):
        return self.ax.get_ylim()

    def data(self) -> dict:
        """What is drawn, read back from the artists (NaN where DP does not run)."""
        def mark(line):
            x = line.get_xdata()
            return float(line.get_ydata()[0]) if len(x) else None

        return {
            "gpus": [float(x) for x in self.ddp_line.get_xdata()],
            "dp_copy": [float(y) for y in self.copy_line.get_ydata()],
            "dp_nccl": [float(y) for y in self.nccl_line.get_ydata()],
            "ddp": [float(y) for y in self.ddp_line.get_ydata()],
            "marker_dp_copy": mark(self.copy_mark),
            "marker_dp_nccl": mark(self.nccl_mark),
            "marker_ddp": mark(self.ddp_mark),
            "n_line": float(self.n_line.get_xdata()[0]),
            "node_line": float(self.node_line.get_xdata()[0]),
            "note": self.note.get_text(),
            "ylim": tuple(float(y) for y in self.ax.get_ylim()),
        }


class StepView(_View):
    """View 2: one training step at the chosen n, compute plus exposed communication.

    One horizontal bar per row (DataParallel's copy and NCCL paths, DDP in a node or, beyond
    one node, DDP with the two-level all-reduce and with a flat ring): compute (forward,
    backward, loss, optimizer on the critical path), then the communication that lengthens the
    step. DP's phases run in series, so all of its communication is exposed; DDP's bucket
    all-reduces run under backward and only the tail is exposed. A thin bar under each shows
    all the communication, hidden or not; the label gives the step time. The x limit snaps to
    1, 2 or 5 x 10^k.
    """

    ROWS = ("DP, copy path", "DP, NCCL path", "DDP", "DDP, flat ring", "HSDP")  # top to bottom
    MAX_BACKGROUNDS = 32  # x limits times the in-node / multi-node row names

    def __init__(self):
        super().__init__()
        ax = self.ax = self.figure.add_subplot()
        y = list(range(len(self.ROWS)))[::-1]  # the first row on top
        self.y = dict(zip(self.ROWS, y, strict=True))
        rows = len(self.ROWS)
        self.compute = ax.barh(y, [0] * rows, height=0.5, color=style.DDP_COLOR, alpha=0.55,
                               label="compute (forward, backward)")
        self.exposed = ax.barh(y, [0] * rows, height=0.5, color=style.DP_COLOR,
                               label="exposed communication")
        self.comm = ax.barh([v - 0.36 for v in y], [0] * rows, height=0.14, color="0.35",
                            label="all communication (hidden or not)")
        self.labels = [ax.text(0, v, "", va="center", ha="left", fontsize=10) for v in y]
        self.dynamic = [*self.compute.patches, *self.exposed.patches, *self.comm.patches,
                        *self.labels]
        self._row_names = list(self.ROWS)
        ax.set_yticks(y, self._row_names)
        ax.set_ylim(-0.8, len(self.ROWS) - 0.4)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_seconds(v, digits=3)))
        ax.set_xlabel("seconds per training step (modelled)")
        ax.set_title("Step time at the chosen n")
        self.figure.legend(loc="lower center", ncol=2, fontsize=9, frameon=False)
        ax.grid(axis="y", visible=False)
        self.figure.subplots_adjust(left=0.23, right=0.94, bottom=0.27, top=0.91)
        self._steps = {}

    def update(self, steps: dict, dp_available: bool, n: int) -> None:
        """Draw ``steps`` (row name -> dpcost.step_time.StepTime); DP rows empty beyond a node."""
        ddp_name = next(name for name in steps if name.startswith("DDP")) if steps else "DDP"
        names = ["DP, copy path", "DP, NCCL path", ddp_name, "DDP, flat ring", "HSDP"]
        self._row_names = [name if i < 3 or name in steps else "" for i, name in enumerate(names)]
        self._steps = {}
        longest = max((st.total_s for st in steps.values()), default=0.0)
        # room for the labels on the right; 1, 2, 5 x 10^k: few axes to cache
        limit = _nice_ceiling(max(longest, 1e-9) * 1.6, (1, 2, 5, 10))
        for i, name in enumerate(names):
            st = steps.get(name)
            self._steps[self.ROWS[i]] = st
            if st is None:
                widths, label = (0.0, 0.0, 0.0), ""
                if name.startswith("DP") and not dp_available:
                    label = " DataParallel cannot span machines"
            else:
                widths = (st.compute_s, st.exposed_communication_s, st.communication_s)
                label = f" {format_seconds(st.total_s)}"  # the readout has the parts
            for bars, width in zip((self.compute, self.exposed, self.comm), widths, strict=True):
                bars.patches[i].set_visible(width > 0)
            self.compute.patches[i].set_width(widths[0])
            self.exposed.patches[i].set_x(widths[0])
            self.exposed.patches[i].set_width(widths[1])
            self.comm.patches[i].set_width(widths[2])
            self.labels[i].set_x(widths[0] + widths[1] if st is not None else 0.0)
            self.labels[i].set_text(label)
        self.ax.set_yticks(list(self.y.values()),
                           [name if i < 3 or name in steps else "" for i, name in enumerate(names)])
        self.ax.set_xlim(0, limit)

    def background_key(self):
        return (self.ax.get_xlim(), tuple(self._row_names))

    def data(self) -> dict:
        """Per row: total, compute, exposed and all communication seconds read back from the
        bars, and the label; the row names as the axis shows them."""
        out = {}
        for i, (row, name) in enumerate(zip(self.ROWS, self._row_names, strict=True)):
            compute = float(self.compute.patches[i].get_width())
            exposed = float(self.exposed.patches[i].get_width())
            out[name if self._steps.get(row) is not None else row] = {
                "total": compute + exposed, "compute": compute, "exposed": exposed,
                "communication": float(self.comm.patches[i].get_width()),
                "label": self.labels[i].get_text()}
        out["xlim"] = tuple(float(x) for x in self.ax.get_xlim())
        return out


class MemoryView(_View):
    """View 3: bytes per GPU under DataParallel (GPU0), DDP and ZeRO-1/2/3, stacked by
    component, against the GPU's capacity (a dashed line).

    The y limit snaps to 1, 1.5, 2, 3, 5 or 7 x 10^k, so a few cached backgrounds serve most
    changes.
    """

    GPUS = ("dp_gpu0", "ddp", "zero1", "zero2", "zero3", "hsdp")  # the explorer's memory keys
    LABELS = ("DP\nGPU0", "DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "HSDP")

    def __init__(self):
        super().__init__()
        ax = self.ax = self.figure.add_subplot()
        x = list(range(len(self.GPUS)))
        self.bars = {}
        for component, color in COMPONENT_COLORS.items():
            self.bars[component] = ax.bar(x, [0] * len(x), width=0.65, color=color,
                                          label=component)
        self.capacity = ax.axhline(80e9, color="0.15", ls="--", lw=1.5, label="GPU capacity")
        self.totals = [ax.text(i, 0, "", ha="center", va="bottom", fontsize=9) for i in x]
        self.dynamic = [p for bars in self.bars.values() for p in bars.patches]
        self.dynamic += [self.capacity, *self.totals]
        ax.set_xticks(x, self.LABELS, fontsize=11)
        ax.set_xlim(-0.5, 8.3)  # room on the right for the legend
        ax.yaxis.set_major_formatter(FuncFormatter(_bytes_tick))
        ax.set_ylabel("bytes per GPU (decimal)")
        ax.set_title("Memory per GPU: fits (✓) or not (✗)")
        # Legend top to bottom in stacking order, so it reads like the bars.
        handles, labels = ax.get_legend_handles_labels()
        ax.legend(handles[::-1], labels[::-1], loc="upper right", fontsize=9)
        ax.grid(axis="x", visible=False)
        self.figure.subplots_adjust(left=0.18, right=0.98, bottom=0.13, top=0.91)

    def update(self, memory: dict, capacity_bytes: float) -> None:
        """Stack ``memory[gpu][component]`` bytes; a GPU missing from ``memory`` (DP beyond one
        node) gets an empty bar and says why."""
        bottoms = [0.0] * len(self.GPUS)
        for component, container in self.bars.items():
            for i, gpu in enumerate(self.GPUS):
                height = float(memory.get(gpu, {}).get(component, 0.0))
                container.patches[i].set_y(bottoms[i])
                container.patches[i].set_height(height)
                bottoms[i] += height
        top = max(max(bottoms), capacity_bytes, 1.0)
        self.ax.set_ylim(0, _nice_ceiling(top * 1.2))
        # Bars under a pixel (about 1/400 of the axis) are not drawn: each patch costs a draw.
        least = self.ax.get_ylim()[1] / 400
        for container in self.bars.values():
            for patch in container.patches:
                patch.set_visible(patch.get_height() >= least)
        for i, text in enumerate(self.totals):
            text.set_y(bottoms[i])
            if self.GPUS[i] not in memory:
                text.set_text("one node")
                text.set_color("0.3")
            else:
                fit = bottoms[i] <= capacity_bytes  # as dpcost.memory.fits
                text.set_text(f"{format_bytes(bottoms[i], digits=3)} {'✓' if fit else '✗'}")
                text.set_color("#2e7d32" if fit else "#c0392b")
        self.capacity.set_ydata([capacity_bytes, capacity_bytes])

    def background_key(self):
        return self.ax.get_ylim()

    def data(self) -> dict:
        """Bar heights by GPU and component, read back from the patches; the capacity line."""
        out = {}
        for i, gpu in enumerate(self.GPUS):
            out[gpu] = {c: float(bars.patches[i].get_height()) for c, bars in self.bars.items()}
        out["capacity"] = float(self.capacity.get_ydata()[0])
        out["labels"] = [t.get_text() for t in self.totals]
        out["ylim"] = tuple(float(y) for y in self.ax.get_ylim())
        return out
