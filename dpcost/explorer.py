"""The interactive explorer: move a control, see DP against DDP in bytes, seconds and memory.

Controls (ipywidgets): model preset or custom parameter count, dtype of parameters and
gradients, number of GPUs n (1 to 1024, powers of two), interconnect preset, optimizer, global
batch size and output elements per sample. Views, updated live on every change:

1. bytes per step on the busiest link against n: DP 2(n-1)P, DDP 2(n-1)/n P (dpcost.core);
2. seconds per step on the busiest link, alpha-beta model (dpcost.alpha_beta);
3. memory per GPU, DP's GPU0 against any DDP rank, stacked by component (dpcost.memory);
4. a readout line: reduction factor, both volumes and times, the verdict in words.

P = parameters x bytes per element of the dtype. Views are ``Image`` widgets updated from an
``observe`` callback (no ``interactive``/``Output``), which is what renders reliably in Voila.
Use it in a notebook as ``Explorer().widget``; tests set ``explorer.controls[name].value``.
"""

from __future__ import annotations

import html
import math
import re
from contextlib import contextmanager
from dataclasses import replace
from functools import lru_cache

import ipywidgets as widgets

from dpcost.alpha_beta import ddp_communication_time, dp_communication_time
from dpcost.core import (
    communication_reduction_factor,
    ddp_communication_volume,
    dp_communication_volume,
)
from dpcost.explorer_views import MemoryView, TimeView, VolumeView, format_seconds
from dpcost.memory import memory_per_gpu
from dpcost.presets import DTYPE_BYTES, INTERCONNECTS, MODELS, custom_model
from dpcost.units import format_bytes, parse_size

CUSTOM = "custom"
GPU_CHOICES = [2**k for k in range(11)]  # the slider: 1, 2, 4, ..., 1024
# The curves: every n from 2 to 1024 that a log axis can tell apart, powers of two included.
CURVE_GPUS = sorted({round(2 ** (k / 16)) for k in range(16, 161)} | set(GPU_CHOICES[1:]))
OPTIMIZERS = [("SGD", "sgd"), ("SGD with momentum", "sgd_momentum"), ("Adam", "adam")]
DEFAULTS = {"model": "GPT-2 XL", "dtype": "fp32", "gpus": 8, "interconnect": "PCIe 4.0 x16",
            "optimizer": "adam", "custom": "1.5e9"}


def parse_parameter_count(text: str) -> int:
    """A parameter count typed by a person: "1.5e9" or "350000000" -> int.

    Plain numbers only (parsed with dpcost.units.parse_size): a unit such as "GB" is a size in
    bytes, not a count, so it is refused. ValueError names the text otherwise.
    """
    shown = repr(text if not isinstance(text, str) or len(text) <= 40 else text[:37] + "...")
    if re.search(r"[a-df-zA-DF-Z]", text or ""):
        raise ValueError(f"custom parameters {shown}: give a plain count such as 1.5e9")
    try:
        value = parse_size(text)
    except (TypeError, ValueError):
        raise ValueError(f"custom parameters {shown} is not a number such as 1.5e9") from None
    if value < 1:
        raise ValueError(f"custom parameters {shown} must be at least 1")
    return int(round(value))


@lru_cache(maxsize=256)
def _curves(size: float, beta: float, alpha: float) -> tuple[tuple[float, ...], ...]:
    """DP and DDP bytes and seconds over CURVE_GPUS; cached, as moving n does not change them."""
    return (tuple(dp_communication_volume(size, k) for k in CURVE_GPUS),
            tuple(ddp_communication_volume(size, k) for k in CURVE_GPUS),
            tuple(dp_communication_time(size, k, beta, alpha) for k in CURVE_GPUS),
            tuple(ddp_communication_time(size, k, beta, alpha) for k in CURVE_GPUS))


def scenario(model, dtype: str, num_gpus: int, interconnect, optimizer: str,
             batch_size: int) -> dict:
    """Every number the explorer shows, for one setting of the controls.

    ``model`` is a dpcost.presets.ModelPreset, ``interconnect`` an InterconnectPreset. Returns
    bytes and seconds per step: the curves over CURVE_GPUS, the values at ``num_gpus``, the
    memory dicts of dpcost.memory.memory_per_gpu and the reduction factor.
    """
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    size = model.parameters * DTYPE_BYTES[dtype]  # P in bytes
    beta, alpha = interconnect.bandwidth_bytes_per_s, interconnect.latency_s
    n = num_gpus
    dp_bytes, ddp_bytes, dp_time, ddp_time = _curves(size, beta, alpha)
    return {
        "model_size_bytes": size,
        "num_gpus": n,
        "curve_gpus": CURVE_GPUS,
        "dp_bytes_curve": dp_bytes,
        "ddp_bytes_curve": ddp_bytes,
        "dp_time_curve": dp_time,
        "ddp_time_curve": ddp_time,
        "dp_bytes": dp_communication_volume(size, n),
        "ddp_bytes": ddp_communication_volume(size, n),
        "dp_seconds": dp_communication_time(size, n, beta, alpha),
        "ddp_seconds": ddp_communication_time(size, n, beta, alpha),
        "ddp_latency_seconds": 2 * (n - 1) * alpha if n > 1 else 0.0,
        "reduction_factor": communication_reduction_factor(size, n),
        "memory": memory_per_gpu(model, n, batch_size, optimizer=optimizer, dtype=dtype),
    }


def verdict(s: dict, interconnect_name: str) -> str:
    """The scenario's outcome in one sentence."""
    n = s["num_gpus"]
    if n <= 1:
        return "One GPU: nothing to communicate, so DP and DDP cost the same."
    saved = s["dp_seconds"] - s["ddp_seconds"]
    text = (f"DDP wins: its busiest link carries {s['reduction_factor']:g}x fewer bytes, "
            f"saving {format_seconds(saved)} of communication per step over {interconnect_name}")
    if s["ddp_latency_seconds"] > s["ddp_seconds"] / 2:
        text += "; DDP's time is mostly latency here (2(n-1) messages per step)"
    return text + "."


def _memory_total(parts: dict) -> float:
    return float(sum(parts.values()))


class Explorer:
    """The widgets, the three views and the readout, wired so that each change redraws once.

    ``controls``: dict name -> widget ("model", "custom", "dtype", "gpus", "interconnect",
    "optimizer", "batch_size", "outputs"). ``readout``: HTML widget. ``images``: dict view name
    -> Image widget. ``widget``: the whole layout, to display. ``data()``: what is plotted.
    """

    def __init__(self, **initial):
        unknown = set(initial) - set(DEFAULTS) - {"batch_size", "outputs"}
        if unknown:
            raise TypeError(f"unknown explorer setting(s): {sorted(unknown)}")
        settings = {**DEFAULTS, **initial}
        preset = MODELS.get(settings["model"])
        description_style = {"description_width": "130px"}
        wide = widgets.Layout(width="420px")

        def control(cls, description, **kwargs):
            return cls(description=description, style=description_style, layout=wide, **kwargs)

        self.controls = {
            "model": control(widgets.Dropdown, "model", options=[*MODELS, CUSTOM],
                             value=settings["model"]),
            "custom": control(widgets.Text, "custom parameters", value=settings["custom"],
                              placeholder="e.g. 1.5e9", continuous_update=False),
            "dtype": control(widgets.Dropdown, "dtype", options=list(DTYPE_BYTES),
                             value=settings["dtype"]),
            "gpus": control(widgets.SelectionSlider, "GPUs, n",
                            options=[(str(n), n) for n in GPU_CHOICES], value=settings["gpus"]),
            "interconnect": control(widgets.Dropdown, "interconnect",
                                    options=list(INTERCONNECTS), value=settings["interconnect"]),
            "optimizer": control(widgets.Dropdown, "optimizer", options=OPTIMIZERS,
                                 value=settings["optimizer"]),
            "batch_size": control(widgets.BoundedIntText, "global batch", min=1, max=2**20,
                                  value=settings.get("batch_size",
                                                     preset.default_batch_size if preset else 8)),
            "outputs": control(widgets.BoundedIntText, "outputs / sample", min=1, max=10**10,
                               value=settings.get("outputs", preset.output_elements_per_sample
                                                  if preset else 1000)),
        }
        self.readout = widgets.HTML(layout=widgets.Layout(width="100%"))
        self.source = widgets.HTML(layout=widgets.Layout(width="100%"))
        self.views = {"volume": VolumeView(CURVE_GPUS), "time": TimeView(CURVE_GPUS),
                      "memory": MemoryView()}
        self.images = {name: widgets.Image(format="png") for name in self.views}
        self.last = None  # the scenario on screen (None until the first good update)
        self.error = None  # the message shown when the last change was refused
        self._holding = False
        for widget in self.controls.values():
            widget.observe(self._on_change, names="value")
        self.update()
        left = widgets.VBox([self.controls[k] for k in ("model", "custom", "dtype", "gpus")])
        right = widgets.VBox([self.controls[k] for k in ("interconnect", "optimizer",
                                                         "batch_size", "outputs")])
        self.widget = widgets.VBox([
            widgets.HBox([left, right]),
            self.readout,
            widgets.HBox([self.images["volume"], self.images["time"]]),
            widgets.HBox([self.images["memory"], self.source]),
        ])
        self.widget.add_class("dpcost-explorer")  # a handle for the browser test

    @contextmanager
    def hold(self):
        """Change several controls, then redraw once on leaving the block."""
        holding, self._holding = self._holding, True
        try:
            yield self
        finally:
            self._holding = holding
        if not holding:
            self.update()

    def _on_change(self, change) -> None:
        if change["owner"] is self.controls["model"] and change["new"] in MODELS:
            preset = MODELS[change["new"]]  # a new model brings its own batch and outputs
            with self.hold():  # redraws once on leaving, unless an outer hold() is open
                self.controls["batch_size"].value = preset.default_batch_size
                self.controls["outputs"].value = preset.output_elements_per_sample
        elif not self._holding:
            self.update()

    def model(self):
        """The ModelPreset the controls describe (custom: parsed parameters, no activations)."""
        c = self.controls
        name = c["model"].value
        if name == CUSTOM:
            parameters = parse_parameter_count(c["custom"].value)
            return custom_model(parameters, output_elements_per_sample=c["outputs"].value,
                                name=f"custom ({parameters:.3g} parameters)")
        return replace(MODELS[name], output_elements_per_sample=c["outputs"].value)

    def update(self) -> None:
        """Recompute from the controls, move the artists, render the views that changed."""
        c = self.controls
        c["custom"].disabled = c["model"].value != CUSTOM
        interconnect = INTERCONNECTS[c["interconnect"].value]
        try:
            model = self.model()
            s = scenario(model, c["dtype"].value, c["gpus"].value, interconnect,
                         c["optimizer"].value, c["batch_size"].value)
        except (TypeError, ValueError) as error:  # bad input: say so, keep the last figures
            self.error = str(error)
            self.readout.value = (f'<div style="color:#c0392b;font-size:15px">'
                                  f"Cannot update: {html.escape(self.error)}</div>")
            return
        self.error = None
        self.last = s
        n = s["num_gpus"]
        self.views["volume"].update(s["curve_gpus"], s["dp_bytes_curve"], s["ddp_bytes_curve"],
                                    n, s["dp_bytes"], s["ddp_bytes"])
        self.views["time"].update(s["curve_gpus"], s["dp_time_curve"], s["ddp_time_curve"],
                                  n, s["dp_seconds"], s["ddp_seconds"])
        self.views["memory"].update(s["memory"])
        # A view renders again only when what it draws changed (an optimizer change leaves the
        # volume and time views alone), and redraws its axes only when their limits changed.
        keys = {
            "volume": (s["model_size_bytes"], n),
            "time": (s["model_size_bytes"], n, interconnect.bandwidth_bytes_per_s,
                     interconnect.latency_s),
            "memory": tuple(tuple(v.values()) for v in s["memory"].values()),
        }
        for name, view in self.views.items():
            self.images[name].value = view.png(view.background_key(), keys[name])
        self.readout.value = self._readout_html(model, interconnect, s)
        self.source.value = (
            f'<div style="font-size:12px;color:#555;padding:8px">'
            f"<b>{html.escape(model.name)}</b>: {model.parameters:,} parameters "
            f"(source: {html.escape(model.source)})<br><b>{html.escape(interconnect.name)}</b>: "
            f"{format_bytes(interconnect.bandwidth_bytes_per_s, digits=3)}/s per direction, "
            f"{format_seconds(interconnect.latency_s)} per message "
            f"(source: {html.escape(interconnect.source)})</div>")

    def readout_text(self) -> str:
        """The readout line as plain text (tags stripped)."""
        text = re.sub(r"<[^>]+>", "", self.readout.value.replace("<br>", " "))
        return " ".join(html.unescape(text).split())

    def _readout_html(self, model, interconnect, s: dict) -> str:
        n = s["num_gpus"]
        dp_mem = _memory_total(s["memory"]["dp_gpu0"])
        ddp_mem = _memory_total(s["memory"]["ddp_rank"])
        mem_ratio = dp_mem / ddp_mem if ddp_mem > 0 else math.nan
        line = (
            f"<b>n = {n}</b>, P = {format_bytes(s['model_size_bytes'], digits=3)}: "
            f"reduction factor <b>{s['reduction_factor']:g}x</b>. "
            f"Per step on the busiest link: DP {format_bytes(s['dp_bytes'], digits=3)} "
            f"in {format_seconds(s['dp_seconds'])}, "
            f"DDP {format_bytes(s['ddp_bytes'], digits=3)} in {format_seconds(s['ddp_seconds'])}. "
            f"Memory: DP's GPU0 {format_bytes(dp_mem, digits=3)}, a DDP rank "
            f"{format_bytes(ddp_mem, digits=3)} ({mem_ratio:.3g}x).<br>"
            f"<b>{html.escape(verdict(s, interconnect.name))}</b>"
        )
        return f'<div class="dpcost-readout" style="font-size:15px;line-height:1.5">{line}</div>'

    def data(self) -> dict:
        """What the views draw, read back from the artists: {"volume", "time", "memory"}."""
        return {name: view.data() for name, view in self.views.items()}
