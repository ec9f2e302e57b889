"""The explorer's three figures, drawn once and then updated in place.

Each view owns one matplotlib ``Figure`` (no pyplot: nothing is registered or shown twice) and
keeps handles to its artists, so a control change only moves data (``set_data``,
``set_height``, ``set_ylim``) and renders one PNG. A view renders again only when what it draws
changed: a bucket-cap change redraws the step view alone, an optimizer change the memory view
alone. Units: bytes and seconds in, human units on the axes (decimal kB/MB/GB).
"""

from __future__ import annotations

import math
import struct
import zlib
from collections import OrderedDict

import matplotlib as mpl
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Patch
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
# Shown at their own size (not scaled down as in a deck), so 11 pt (15 px) is the least.
RC = {"font.size": 12, "axes.titlesize": 15, "axes.labelsize": 13, "xtick.labelsize": 12,
      "ytick.labelsize": 12, "legend.fontsize": 11}

COMPONENT_COLORS = style.COMPONENT_COLORS  # memory components, bottom to top


class _Boxes:
    """Axis-aligned rectangles in one PolyCollection: one draw call for all of them (a bar
    chart's separate patches cost a draw each). ``set`` takes the corners; ``extents`` gives
    them back, as set (a box drawn empty keeps its extent here)."""

    def __init__(self, ax, colors):
        self.colors = list(colors)
        self.collection = PolyCollection([], facecolors=self.colors, linewidths=0)
        ax.add_collection(self.collection, autolim=False)
        self._extents = np.zeros((len(self.colors), 4))

    def set(self, extents, drawn=None) -> None:
        """``extents``: rows of (x0, y0, x1, y1); ``drawn``: which to draw (all by default)."""
        self._extents = np.asarray(extents, dtype=float).reshape(len(self.colors), 4)
        shown = np.ones(len(self.colors), bool) if drawn is None else np.asarray(drawn, bool)
        x0, y0, x1, y1 = self._extents[shown].T
        self.collection.set_verts(np.stack([np.stack([x0, y0], 1), np.stack([x1, y0], 1),
                                            np.stack([x1, y1], 1), np.stack([x0, y1], 1)], 1))
        self.collection.set_facecolor([c for c, on in zip(self.colors, shown, strict=True) if on])

    def extents(self):
        return self._extents


def _bytes_tick(value, _pos) -> str:
    return format_bytes(value, digits=3)


def _style():
    """The course's figure style with the explorer's type sizes, while a view builds its
    artists (the ticks made later copy the first ones)."""
    return mpl.rc_context({**style.RC, **RC})


class _View:
    """One figure on an Agg canvas, rendered in three layers to keep updates fast.

    1. The static layer: everything but the moving artists and the axis whose limits move
       (``moving_axis``): title, legend, the other axis, spines. It depends only on
       ``static_key`` and is drawn once per key (the legend is the costliest artist).
    2. The background: the static layer plus the moving axis (its ticks, labels and grid) at
       ``background_key``, its limits. Cached as pixels, the least recently used dropped
       beyond ``MAX_BACKGROUNDS``; a new limit draws that one axis, not the whole figure.
    3. The ``dynamic`` artists, drawn over the restored background on every change
       (matplotlib's blitting, here into a PNG).
    """

    MAX_BACKGROUNDS = 48  # about 1.1 MB of pixels each
    moving_axis = "y"  # the axis whose limits follow the data

    def __init__(self, *args):
        self.figure = Figure(figsize=FIGSIZE)
        self.canvas = FigureCanvasAgg(self.figure)
        self.dynamic = []  # artists that move with the controls, drawn last, in this order
        self._statics = {}  # static_key -> pixels
        self._backgrounds = OrderedDict()  # (static_key, background_key) -> pixels
        self._key = None
        self._png = b""
        self._rows = None  # the PNG's rows, reused (see pixel_rows)
        with _style():
            self._build(*args)

    def _build(self, *args) -> None:
        """Make the figure's artists (each view's own)."""
        raise NotImplementedError

    def static_key(self):
        """What the static layer depends on besides the figure itself (e.g. row names)."""
        return ()

    def _axis(self):
        return self.ax.yaxis if self.moving_axis == "y" else self.ax.xaxis

    def _hide_and_draw(self, hidden) -> None:
        shown = [artist.get_visible() for artist in hidden]
        for artist in hidden:
            artist.set_visible(False)
        try:
            self.canvas.draw()
        finally:
            for artist, visible in zip(hidden, shown, strict=True):
                artist.set_visible(visible)

    def _background(self, background_key):
        static_key = self.static_key()
        key = (static_key, background_key)
        background = self._backgrounds.get(key)
        if background is not None:
            self._backgrounds.move_to_end(key)
            self.canvas.restore_region(background)
            return background
        static = self._statics.get(static_key)
        if static is None:
            self._hide_and_draw([*self.dynamic, self._axis()])
            static = self._statics[static_key] = self.canvas.copy_from_bbox(self.figure.bbox)
        else:
            self.canvas.restore_region(static)
        axis = self._axis()
        axis.draw(self.canvas.get_renderer())
        self._legend_on_top(static)  # over the moving axis's grid, as in a full draw
        background = self._backgrounds[key] = self.canvas.copy_from_bbox(self.figure.bbox)
        while len(self._backgrounds) > self.MAX_BACKGROUNDS:
            self._backgrounds.popitem(last=False)
        return background

    def _legend_on_top(self, pixels) -> None:
        """Put back a legend inside the axes from ``pixels``: a full draw draws it last."""
        legend = self.ax.get_legend()
        if legend is not None:
            box = legend.get_window_extent().padded(2)
            top, bottom = self.figure.bbox.height - box.y1, self.figure.bbox.height - box.y0
            # Agg counts pixel rows from the top; xy places the saved region's origin
            self.canvas.restore_region(pixels, bbox=(box.x0, top, box.x1, bottom), xy=(0, 0))

    def png(self, background_key, key, compress=None):
        """The figure as PNG bytes, rendered again only when ``key`` (what is drawn) changed.

        ``compress``: an executor (``concurrent.futures``) to run the zlib step on; then the
        result is a Future of the bytes (zlib lets other threads run, so the next figure draws
        meanwhile) or, when nothing changed, the bytes themselves.
        """
        full_key = (self.static_key(), background_key, key)
        if full_key == self._key:
            return self._png
        background = self._background(background_key)
        renderer = self.canvas.get_renderer()
        for artist in self.dynamic:
            artist.draw(renderer)
        self._legend_on_top(background)
        self._rows = pixel_rows(self.canvas, self._rows)
        self._key = full_key
        if compress is None:
            return self._encode()
        return compress.submit(self._encode)

    def _encode(self) -> bytes:
        self._png = png_bytes(self._rows)  # set before the Future completes
        return self._png

    def render_full(self) -> bytes:
        """The whole figure drawn from scratch as PNG (to check the layered render against)."""
        self.canvas.draw()
        return encode_png(self.canvas)


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def pixel_rows(canvas, rows=None):
    """The canvas's RGBA pixels as PNG rows: a filter byte (0: none) then the row's bytes.
    ``rows``: the buffer from last time, reused when the size fits. RGBA, as Agg holds them:
    copying whole rows is about 40 times faster than picking out RGB, and zlib's extra work on
    the (constant) alpha costs less than that saves."""
    width, height = canvas.get_width_height()
    if rows is None or rows.shape != (height, 1 + 4 * width):
        rows = np.zeros((height, 1 + 4 * width), dtype=np.uint8)
    rows[:, 1:] = np.asarray(canvas.buffer_rgba()).reshape(height, 4 * width)
    return rows


def png_bytes(rows) -> bytes:
    """``pixel_rows`` as an 8-bit RGBA PNG, written directly (PNG spec, ISO/IEC 15948).

    Rows unfiltered and zlib level 1: about twice as fast as Pillow's encoder here, at a
    similar size (~50 kB), because a PNG is made on every control change.
    """
    height, row_bytes = rows.shape
    header = struct.pack(">IIBBBBB", (row_bytes - 1) // 4, height, 8, 6, 0, 0, 0)  # 8-bit RGBA
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header)
            + _png_chunk(b"IDAT", zlib.compress(rows, 1)) + _png_chunk(b"IEND", b""))


def encode_png(canvas) -> bytes:
    """The canvas's pixels as an 8-bit RGB PNG."""
    return png_bytes(pixel_rows(canvas))


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

    def _build(self, gpu_counts):
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
        ax.legend(loc="upper left", fontsize=11)
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
    1, 1.5, 2, 3, 5 or 7 x 10^k.
    """

    # top to bottom; the flat ring, beyond one node only, is last: in a node its row is cut off
    ROWS = ("DP, copy path", "DP, NCCL path", "DDP", "HSDP", "DDP, flat ring")
    moving_axis = "x"  # seconds; the rows' names are static (in a node, or beyond one)

    def _build(self):
        ax = self.ax = self.figure.add_subplot()
        y = list(range(len(self.ROWS)))[::-1]  # the first row on top
        self.y = dict(zip(self.ROWS, y, strict=True))
        rows = len(self.ROWS)
        # per row: compute, then the exposed communication after it, and a thin bar under both
        # with all the communication, hidden or not
        colors = {"compute (forward, backward)": to_rgba(style.DDP_COLOR, 0.55),
                  "exposed communication": to_rgba(style.DP_COLOR),
                  "all communication (hidden or not)": to_rgba("0.35")}
        self.bars = _Boxes(ax, [c for c in colors.values() for _ in range(rows)])
        self.labels = [ax.text(0, v, "", va="center", ha="left", fontsize=11) for v in y]
        self.dynamic = [self.bars.collection, *self.labels]
        self._widths = np.zeros((3, rows))
        self._row_names = list(self.ROWS)
        ax.set_yticks(y, self._row_names)
        ax.set_ylim(-0.8, len(self.ROWS) - 0.4)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_seconds(v, digits=3)))
        ax.set_xlabel("seconds per training step (modelled)")
        ax.set_title("Step time at the chosen n")
        self.figure.legend([Patch(color=c) for c in colors.values()], list(colors),
                           loc="lower center", ncol=2, fontsize=11, frameon=False)
        ax.grid(axis="y", visible=False)
        self.figure.subplots_adjust(left=0.23, right=0.94, bottom=0.27, top=0.91)
        self._steps = {}

    def update(self, steps: dict, dp_available: bool, n: int) -> None:
        """Draw ``steps`` (row name -> dpcost.step_time.StepTime); DP rows empty beyond a node."""
        ddp_name = next(name for name in steps if name.startswith("DDP")) if steps else "DDP"
        names = ["DP, copy path", "DP, NCCL path", ddp_name, "HSDP", "DDP, flat ring"]
        self._row_names = [name if i < 3 or name in steps else "" for i, name in enumerate(names)]
        self._steps = {}
        longest = max((st.total_s for st in steps.values()), default=0.0)
        # room for the labels on the right, snapped to a few values (few axes to cache)
        limit = _nice_ceiling(max(longest, 1e-9) * 1.4, (1, 1.5, 2, 3, 5, 7, 10))
        widths = np.zeros((3, len(self.ROWS)))  # compute, exposed, all communication
        for i, name in enumerate(names):
            st = steps.get(name)
            self._steps[self.ROWS[i]] = st
            if st is None:
                label = ""
                if name.startswith("DP") and not dp_available:
                    label = " DataParallel cannot span machines"
            else:
                widths[:, i] = (st.compute_s, st.exposed_communication_s, st.communication_s)
                label = f" {format_seconds(st.total_s)}"  # the readout has the parts
            self.labels[i].set_x(widths[0, i] + widths[1, i] if st is not None else 0.0)
            self.labels[i].set_text(label)
        self._widths = widths
        y = np.array([self.y[row] for row in self.ROWS], dtype=float)
        compute, exposed, comm = widths
        self.bars.set(np.concatenate([
            np.stack([0 * y, y - 0.25, compute, y + 0.25], 1),
            np.stack([compute, y - 0.25, compute + exposed, y + 0.25], 1),
            np.stack([0 * y, y - 0.43, comm, y - 0.29], 1)]), drawn=widths.ravel() > 0)
        self.ax.set_yticks(list(self.y.values()),
                           [name if i < 3 or name in steps else "" for i, name in enumerate(names)])
        # in a node there is no flat ring: its row, the bottom one, is left out of the axes
        self.ax.set_ylim(-0.8 if "DDP, flat ring" in steps else 0.35, len(self.ROWS) - 0.4)
        self.ax.set_xlim(0, limit)

    def static_key(self):
        return tuple(self._row_names)

    def background_key(self):
        return self.ax.get_xlim()

    def data(self) -> dict:
        """Per row: total, compute, exposed and all communication seconds read back from the
        bars, and the label; the row names as the axis shows them."""
        out = {}
        extents = self.bars.extents()
        rows = len(self.ROWS)
        width = extents[:, 2] - extents[:, 0]
        for i, (row, name) in enumerate(zip(self.ROWS, self._row_names, strict=True)):
            compute, exposed = float(width[i]), float(width[rows + i])
            out[name if self._steps.get(row) is not None else row] = {
                "total": compute + exposed, "compute": compute, "exposed": exposed,
                "communication": float(width[2 * rows + i]),
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

    def _build(self):
        ax = self.ax = self.figure.add_subplot()
        x = list(range(len(self.GPUS)))
        # every component's bar on every GPU, stacked: one rectangle each, in one collection
        self.bars = _Boxes(ax, [to_rgba(color) for color in COMPONENT_COLORS.values()
                                for _ in self.GPUS])
        self.capacity = ax.axhline(80e9, color="0.15", ls="--", lw=1.5, label="GPU capacity")
        self.totals = [ax.text(i, 0, "", ha="center", va="bottom", fontsize=11,
                               multialignment="center", linespacing=1.1) for i in x]
        self.dynamic = [self.bars.collection, self.capacity, *self.totals]
        self._heights = np.zeros((len(COMPONENT_COLORS), len(self.GPUS)))
        ax.set_xticks(x, self.LABELS, fontsize=11)
        ax.set_xlim(-0.5, 8.3)  # room on the right for the legend
        ax.yaxis.set_major_formatter(FuncFormatter(_bytes_tick))
        ax.set_ylabel("bytes per GPU (decimal)")
        ax.set_title("Memory per GPU: fits (✓) or not (✗)")
        # Legend top to bottom in stacking order, so it reads like the bars.
        handles = [self.capacity, *(Patch(color=c, label=name)
                                    for name, c in reversed(COMPONENT_COLORS.items()))]
        ax.legend(handles=handles, loc="upper right", fontsize=11)
        ax.grid(axis="x", visible=False)
        self.figure.subplots_adjust(left=0.18, right=0.98, bottom=0.13, top=0.91)

    def update(self, memory: dict, capacity_bytes: float) -> None:
        """Stack ``memory[gpu][component]`` bytes; a GPU missing from ``memory`` (DP beyond one
        node) gets an empty bar and says why."""
        heights = np.array([[float(memory.get(gpu, {}).get(component, 0.0)) for gpu in self.GPUS]
                            for component in COMPONENT_COLORS])
        tops = np.cumsum(heights, axis=0)
        bottoms = list(tops[-1])
        top = max(max(bottoms), capacity_bytes, 1.0)
        self.ax.set_ylim(0, _nice_ceiling(top * 1.2))
        # Bars under a pixel (about 1/400 of the axis) are not drawn.
        least = self.ax.get_ylim()[1] / 400
        x = np.tile(np.arange(len(self.GPUS), dtype=float), len(COMPONENT_COLORS))
        self.bars.set(np.stack([x - 0.325, (tops - heights).ravel(), x + 0.325, tops.ravel()], 1),
                      drawn=heights.ravel() >= least)
        self._heights = heights
        for i, text in enumerate(self.totals):
            text.set_y(bottoms[i])
            if self.GPUS[i] not in memory:
                text.set_text("one node")
                text.set_color("0.3")
            else:
                fit = bottoms[i] <= capacity_bytes  # as dpcost.memory.fits
                # two lines: at 11 pt a one-line label is wider than a bar's slot
                text.set_text(f"{format_bytes(bottoms[i], digits=3)}\n{'✓' if fit else '✗'}")
                text.set_color("#2e7d32" if fit else "#c0392b")
        self.capacity.set_ydata([capacity_bytes, capacity_bytes])

    def background_key(self):
        return self.ax.get_ylim()

    def data(self) -> dict:
        """Bar heights by GPU and component, as drawn; the capacity line and the labels."""
        out = {}
        for i, gpu in enumerate(self.GPUS):
            out[gpu] = {c: float(self._heights[k, i]) for k, c in enumerate(COMPONENT_COLORS)}
        out["capacity"] = float(self.capacity.get_ydata()[0])
        out["labels"] = [t.get_text() for t in self.totals]
        out["ylim"] = tuple(float(y) for y in self.ax.get_ylim())
        return out
