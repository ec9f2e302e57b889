"""The explorer's three figures, drawn once and then updated in place.

Each view owns one matplotlib ``Figure`` (no pyplot: nothing is registered or shown twice) and
keeps handles to its artists, so a control change only moves data (``set_data``,
``set_height``, ``set_ylim``) and renders one PNG. A view renders again only when what it draws
changed: an interconnect change redraws the time view alone, an optimizer change the memory view
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
    NullFormatter,
    NullLocator,
)

from dpcost.plots import style
from dpcost.units import format_bytes

FIGSIZE = (6.4, 4.3)  # two side by side fill a 1280-pixel-wide screen at 100 dpi

# Memory components, bottom to top, with one colour each (dpcost.memory's keys, in its order).
COMPONENT_COLORS = {
    "parameters": "#4c72b0",
    "gradients": "#55a868",
    "optimizer state": "#8172b2",
    "DDP bucket copy": "#64b5cd",
    "DP reduce buffer": "#8c8c8c",
    "activations": "#ccb974",
    "outputs": "#dd8452",
    "loss and output grads": "#c44e52",
}


def format_seconds(seconds: float, digits: int = 3) -> str:
    """A duration for people, to ``digits`` significant digits: 0.0123 s -> "12.3 ms".

    Units: h, min, s, ms, µs, ns; 5400 s -> "1.5 h"."""
    if not math.isfinite(seconds):
        return f"{seconds} s"
    if seconds == 0:
        return "0 s"
    for scale, unit in ((3600.0, "h"), (60.0, "min"), (1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.{digits}g} {unit}"
    return f"{seconds / 1e-9:.{digits}g} ns"


def _bytes_tick(value, _pos) -> str:
    return format_bytes(value, digits=3)


def _seconds_tick(value, _pos) -> str:
    # Decades read best in one unit above a second: "1,000 s", not "16.7 min".
    return f"{value:,.0f} s" if value >= 1 else format_seconds(value, digits=3)


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
            for artist in self.dynamic:
                artist.set_visible(False)
            self.canvas.draw()
            for artist in self.dynamic:
                artist.set_visible(True)
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


class _CurvesView(_View):
    """DP and DDP against n on log-log axes, with markers and a vertical line at the chosen n.

    The y range is fixed (``y_range``, wide enough for every preset) so that switching models
    or links moves the curves on unchanged axes: easy to compare, and no background redraw. It
    widens by whole decades only when a custom model falls outside.
    """

    def __init__(self, title: str, ylabel: str, tick_formatter, dp_label: str, ddp_label: str,
                 gpu_counts, y_range: tuple[float, float], left: float = 0.17):
        super().__init__()
        self.y_range = y_range
        ax = self.ax = self.figure.add_subplot()
        self.dp_line, = ax.plot([], [], "-", color=style.DP_COLOR, lw=2.5, label=dp_label)
        self.ddp_line, = ax.plot([], [], "-", color=style.DDP_COLOR, lw=2.5, label=ddp_label)
        self.n_line = ax.axvline(1, color="0.3", ls="--", lw=1.2)
        self.dp_mark, = ax.plot([], [], "o", color=style.DP_COLOR, ms=10)
        self.ddp_mark, = ax.plot([], [], "o", color=style.DDP_COLOR, ms=10)
        self.note = ax.text(0.97, 0.04, "", transform=ax.transAxes, ha="right", va="bottom",
                            fontsize=12, bbox={"facecolor": "white", "edgecolor": "0.7",
                                               "alpha": 0.9, "boxstyle": "round"})
        self.dynamic = [self.dp_line, self.ddp_line, self.n_line, self.dp_mark, self.ddp_mark,
                        self.note]
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlim(min(gpu_counts) / 1.3, max(gpu_counts) * 1.3)
        ticks = [n for n in gpu_counts if n & (n - 1) == 0 and round(math.log2(n)) % 2 == 0]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_locator(LogLocator(base=10, numticks=7))
        ax.yaxis.set_major_formatter(FuncFormatter(tick_formatter))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.set_ylim(*y_range)
        ax.set_xlabel("number of GPUs, n (log scale)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(loc="upper left", fontsize=11)
        # Fixed margins (not tight_layout on every change): the axes stay put, only data moves.
        self.figure.subplots_adjust(left=left, right=0.97, bottom=0.14, top=0.91)

    def update(self, gpus, dp, ddp, n, dp_at_n, ddp_at_n) -> None:
        """Move the curves (``gpus`` against ``dp``/``ddp``) and the markers to n."""
        self.dp_line.set_data(gpus, dp)
        self.ddp_line.set_data(gpus, ddp)
        if n > 1:
            self.dp_mark.set_data([n], [dp_at_n])
            self.ddp_mark.set_data([n], [ddp_at_n])
            note = f"n = {n}: DP / DDP = {dp_at_n / ddp_at_n:.4g}x"
        else:  # nothing moves on one GPU, and a log axis cannot show 0
            self.dp_mark.set_data([], [])
            self.ddp_mark.set_data([], [])
            note = "n = 1: no communication"
        self.note.set_text(note)  # one short line: text is the costliest artist to draw
        self.n_line.set_xdata([n, n])
        self.ax.set_ylim(*_decade_limits(list(dp) + list(ddp), self.y_range))

    def background_key(self):
        return self.ax.get_ylim()

    def data(self) -> dict:
        """What is drawn, read back from the artists."""
        mark = self.dp_mark.get_xdata()
        return {
            "gpus": [float(x) for x in self.dp_line.get_xdata()],
            "dp": [float(y) for y in self.dp_line.get_ydata()],
            "ddp": [float(y) for y in self.ddp_line.get_ydata()],
            "marker_gpus": float(mark[0]) if len(mark) else None,
            "marker_dp": float(self.dp_mark.get_ydata()[0]) if len(mark) else None,
            "marker_ddp": float(self.ddp_mark.get_ydata()[0]) if len(mark) else None,
            "n_line": float(self.n_line.get_xdata()[0]),
            "note": self.note.get_text(),
            "ylim": tuple(float(y) for y in self.ax.get_ylim()),
        }


def _decade_limits(values, base_range) -> tuple[float, float]:
    """``base_range`` widened by whole decades until it holds every positive finite value."""
    low, high = base_range
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    if positive:
        while min(positive) < low:
            low /= 10
        while max(positive) > high:
            high *= 10
    return low, high


class VolumeView(_CurvesView):
    """View 1: bytes per step on the busiest link, DP's 2(n-1)P against DDP's 2(n-1)/n P."""

    # From ResNet-50 in bf16 on 2 GPUs (~50 MB) to Llama-2 70B in fp32 on 1024 (~565 TB).
    Y_RANGE = (1e7, 1e15)

    def __init__(self, gpu_counts):
        super().__init__(
            "Bytes per training step", "bytes on the busiest link (decimal)", _bytes_tick,
            "DP: through GPU0's link, 2(n-1)P", "DDP: per rank, 2(n-1)/n P", gpu_counts,
            self.Y_RANGE)


class TimeView(_CurvesView):
    """View 2: seconds per step on the busiest link, alpha-beta model, DP against DDP."""

    # From a few latencies (us) to Llama-2 70B in fp32 on 1024 GPUs over 100 GbE (~13 hours).
    Y_RANGE = (1e-5, 1e5)

    def __init__(self, gpu_counts):
        super().__init__(
            "Communication time per step (alpha-beta)", "seconds on the busiest link",
            _seconds_tick, "DP: star through GPU0", "DDP: ring all-reduce", gpu_counts,
            self.Y_RANGE, left=0.2)  # room for "100,000 s"


def _nice_ceiling(value: float) -> float:
    """The smallest 1, 1.5, 2, 3, 5 or 7 x 10^k that is >= value (value > 0)."""
    exponent = math.floor(math.log10(value))
    for step in (1, 1.5, 2, 3, 5, 7, 10):
        if step * 10.0**exponent >= value:
            return step * 10.0**exponent
    return 10.0 ** (exponent + 1)


class MemoryView(_View):
    """View 3: bytes held by DP's GPU0 and by any DDP rank, stacked by component.

    The y limit snaps to 1, 1.5, 2, 3, 5 or 7 x 10^k, so a few cached backgrounds serve most
    changes.
    """

    GPUS = ("dp_gpu0", "ddp_rank")  # keys of dpcost.memory.memory_per_gpu, one bar each
    LABELS = ("DP: GPU0", "DDP: any rank")

    def __init__(self):
        super().__init__()
        ax = self.ax = self.figure.add_subplot()
        x = [0, 1]
        self.bars = {}
        for component, color in COMPONENT_COLORS.items():
            self.bars[component] = ax.bar(x, [0, 0], width=0.6, color=color, label=component)
        self.totals = [ax.text(i, 0, "", ha="center", va="bottom", fontsize=12) for i in x]
        self.dynamic = [p for bars in self.bars.values() for p in bars.patches]
        self.dynamic += self.totals
        ax.set_xticks(x, self.LABELS)
        ax.set_xlim(-0.5, 2.9)  # room on the right for the legend
        ax.yaxis.set_major_formatter(FuncFormatter(_bytes_tick))
        ax.set_ylabel("bytes per GPU (decimal)")
        ax.set_title("Memory per GPU")
        # Legend top to bottom in stacking order, so it reads like the bars.
        handles, labels = ax.get_legend_handles_labels()
        ax.legend(handles[::-1], labels[::-1], loc="upper right", fontsize=11)
        ax.grid(axis="x", visible=False)
        self.figure.subplots_adjust(left=0.17, right=0.97, bottom=0.1, top=0.91)

    def update(self, memory: dict) -> None:
        """Stack ``memory[gpu][component]`` bytes for DP's GPU0 and a DDP rank."""
        bottoms = [0.0, 0.0]
        for component, container in self.bars.items():
            for i, gpu in enumerate(self.GPUS):
                height = float(memory[gpu].get(component, 0.0))
                container.patches[i].set_y(bottoms[i])
                container.patches[i].set_height(height)
                bottoms[i] += height
        for i, text in enumerate(self.totals):
            text.set_y(bottoms[i])
            text.set_text(format_bytes(bottoms[i], digits=3))
        self.ax.set_ylim(0, _nice_ceiling(max(max(bottoms), 1.0) * 1.12))

    def background_key(self):
        return self.ax.get_ylim()

    def data(self) -> dict:
        """Bar heights by GPU and component, read back from the patches."""
        out = {}
        for i, gpu in enumerate(self.GPUS):
            out[gpu] = {c: float(bars.patches[i].get_height()) for c, bars in self.bars.items()}
        out["ylim"] = tuple(float(y) for y in self.ax.get_ylim())
        return out
