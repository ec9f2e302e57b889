"""The interactive explorer: move a control, see DataParallel against DDP in bytes, time, memory.

Controls (ipywidgets): model preset or custom parameter count; precision mode (fp32, mixed,
bf16: ``dpcost.memory``); attention (eager or sdpa); GPUs n (1 to 1024, powers of two); GPUs
per node g (8 by default); the link inside a node and the link between nodes; the GPU (A100,
H100: peak FLOP/s and memory from ``dpcost.presets.GPUS``); DDP's bucket cap (MiB; 25, torch's
default, leaves DDP its own caps: a first bucket of 1 MiB, then 25 MiB); the optimizer; the global
batch b and the output elements per sample. Views, updated on every change:

1. bytes per step on the busiest link against n: DataParallel's GPU0 on its copy path (a star)
   and on its NCCL path (pipelined chains), and a DDP rank's ring all-reduce, ``2(n-1)/n G``;
   DataParallel stops at one node;
2. the step time at the chosen n, compute plus exposed communication: DP's serial sum on each
   path, DDP's backward overlapped with bucket all-reduces (beyond one node: the two-level
   all-reduce beside the flat ring), and HSDP (sharded in a node, replicated across nodes).
   Compute is ``dpcost.gpu_time``'s (the later of the host's clock, launching kernels, and the
   device's), communication at the rates NCCL achieves (``dpcost.nccl_achieved``); DDP's
   backward carries its own host work (each bucket about 0.19 ms: small caps cost time, large
   ones leave more of the last bucket's all-reduce exposed), DataParallel's step its host work
   (``replicate`` and one interpreter launching every replica's forward);
3. memory per GPU for DP's GPU0, DDP, ZeRO-1/2/3 and HSDP against the GPU's capacity, with a
   fits / does not fit verdict for each;
4. a readout table with every number, which path it is for, a line saying which clock bounds
   the compute, DDP's buckets and both sides' host work, and the verdict in words.
Every number is ``dpcost.evaluate.evaluate``'s for the setting the controls describe.

"your module" beside the presets: a spec (``package.module:callable``, imported and called:
it runs that code) and the input of one sample; ``dpcost.plan`` builds it on the meta device
and traces it once at the chosen precision, and the explorer takes its model facts from that
trace: its tensors and their ready order (DDP's real buckets), FLOPs, outputs and
activations. Needs PyTorch; the presets do not.

DataParallel is one process on one machine (``torch/nn/parallel/data_parallel.py``: its
``device_ids`` are that machine's GPUs; PyTorch's DDP tutorial, "Comparison between
DataParallel and DistributedDataParallel"), so the explorer offers it only for n <= g. It
scatters the batch with ``torch.chunk``'s sizes and replicates only to
``device_ids[:len(inputs)]`` (``dpcost.evaluate.dp_batch_split``), so a batch smaller
than n uses fewer GPUs.

What the views show is computed by ``dpcost.explorer_model`` (no ipywidgets, no matplotlib); this
module is the widget. Views are ``Image`` and ``HTML`` widgets updated from an ``observe`` callback
(no ``interactive``/``Output``), which is what renders reliably in Voila. Use it in a notebook as
``Explorer().show()`` (the widget, then a static snapshot for readers without a kernel; under
Voila, the lecture page's own face instead) or ``Explorer().widget``; tests set
``explorer.controls[name].value``. Each change renders only the parts of a figure that moved
(``dpcost.explorer_views``); ``benchmarks/explorer_update_time.py`` times it.
"""

from __future__ import annotations

import html
import os
import re
import textwrap
from contextlib import contextmanager
from dataclasses import replace
from functools import lru_cache

import ipywidgets as widgets

from dpcost.explorer_model import (
    CANNOT_SPAN,
    CURVE_GPUS,
    CUSTOM,
    DDP_FLAT,
    DDP_RING,
    DDP_TWO_LEVEL,
    DEFAULTS,
    DP_COPY,
    DP_NCCL,
    GPU_CHOICES,
    GPUS_PER_NODE_CHOICES,
    INTER_NODE_LINKS,
    INTRA_NODE_LINKS,
    MAX_BATCH_SIZE,
    MAX_OUTPUTS,
    OPTIMIZERS,
    PRECISION_CHOICES,
    STRATEGY_NAMES,
    bucket_cap_setting,
    controls,
    model_for,
    parse_parameter_count,
    readout,
    scenario,
    sources,
    verdict,
)
from dpcost.explorer_views import MemoryView, StepView, VolumeView
from dpcost.memory import ATTENTIONS
from dpcost.presets import GPUS, INTERCONNECTS, MODELS

__all__ = ["Explorer", "scenario", "verdict", "parse_parameter_count", "CUSTOM", "GPU_CHOICES",
           "GPUS_PER_NODE_CHOICES", "INTRA_NODE_LINKS", "INTER_NODE_LINKS", "OPTIMIZERS",
           "PRECISION_CHOICES", "DEFAULTS", "CANNOT_SPAN", "STRATEGY_NAMES", "CURVE_GPUS",
           "DP_COPY", "DP_NCCL", "DDP_RING", "DDP_TWO_LEVEL", "DDP_FLAT", "YOUR_MODULE",
           "planned_model"]

YOUR_MODULE = "your module"
# The Voila page's head: a title and one line, and a style that hides every cell of the notebook
# but the one that shows the explorer (markdown, checks and their printouts are the lesson's).
PAGE_HEAD = """<style>
body[data-voila] #rendered_cells .jp-Cell:not(:has(.dpcost-page)) { display: none; }
.dpcost-page h1 { font-size: 28px; margin: 8px 0 4px; }
.dpcost-page p { font-size: 17px; margin: 0 0 10px; }
</style>
<div class="dpcost-page">
<h1>DataParallel against DDP: the explorer</h1>
<p>Move a control: the bytes on the busiest link, the step time and the memory per GPU follow,
with the readout naming the path or algorithm behind every number (dpcost's models, lesson 05).</p>
</div>"""
MODULE_SETTINGS = {"spec": "dpcost.torch_models:small_cnn", "module_input": "3,32,32"}


@lru_cache(maxsize=16)
def planned_model(spec: str, per_sample: str, precision: str = "fp32"):
    """The ``ModelFacts`` of the module ``spec`` builds, from one ``dpcost.plan`` trace on meta
    at ``precision`` and one sample: exact trainable tensors and the order autograd readies
    their gradients (DDP's buckets, DataParallel's chunks), FLOPs, outputs and activations.
    ``per_sample``: one sample's float input shape ("3,32,32") or "tokens S". ValueError
    (``dpcost.plan.PlanError``) names what is wrong."""
    try:
        from dpcost.plan import traced_facts
    except ImportError:
        raise ValueError("your module needs PyTorch: pip install 'dpcost[measure]'") from None
    text = per_sample.strip()
    if text.startswith("tokens"):
        seq = text.removeprefix("tokens").strip()
        if not seq.isdigit():
            raise ValueError(f"input per sample: 'tokens S' needs a whole S, got {per_sample!r}")
        facts, _, _ = traced_facts(spec, precision, None, 1, int(seq))
    else:
        facts, _, _ = traced_facts(spec, precision, f"1,{text}", None, None)
    return replace(facts, name=f"your module {spec}",
                   source="dpcost.plan: counted on the meta device from one traced forward "
                          "and backward (parameters, tensors and their ready order, FLOPs, "
                          "outputs, activations)")


def in_voila() -> bool:
    """Whether this kernel was started by Voila (it sets SERVER_SOFTWARE to voila/<version>)."""
    return os.environ.get("SERVER_SOFTWARE", "").startswith("voila/")


@lru_cache(maxsize=1)
def _compressor():
    """Two threads that compress the views' PNGs (one per core on a small machine)."""
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=2, thread_name_prefix="dpcost-png")


class Explorer:
    """The widgets, the three views and the readout, wired so that each change redraws once.

    ``controls``: dict name -> widget (the keys of ``DEFAULTS`` plus "batch_size" and
    "outputs"). ``readout``: HTML widget. ``images``: dict view name -> Image widget.
    ``widget``: the whole layout, to display. ``data()``: what is plotted. ``last``: the
    scenario on screen.
    """

    def __init__(self, **initial):
        unknown = set(initial) - set(DEFAULTS) - {"batch_size", "outputs", *MODULE_SETTINGS}
        if unknown:
            raise TypeError(f"unknown explorer setting(s): {sorted(unknown)}")
        settings = {**DEFAULTS, **MODULE_SETTINGS, **initial}
        preset = MODELS.get(settings["model"])
        description_style = {"description_width": "130px"}
        wide = widgets.Layout(width="400px")

        def control(cls, description, **kwargs):
            return cls(description=description, style=description_style, layout=wide, **kwargs)

        self.controls = {
            "model": control(widgets.Dropdown, "model", options=[*MODELS, CUSTOM, YOUR_MODULE],
                             value=settings["model"]),
            "custom": control(widgets.Text, "custom parameters", value=settings["custom"],
                              placeholder="e.g. 1.5e9", continuous_update=False),
            "precision": control(widgets.Dropdown, "precision",
                                 options=list(PRECISION_CHOICES), value=settings["precision"]),
            "attention": control(widgets.Dropdown, "attention", options=list(ATTENTIONS),
                                 value=settings["attention"]),
            "gpus": control(widgets.SelectionSlider, "GPUs, n",
                            options=[(str(n), n) for n in GPU_CHOICES], value=settings["gpus"]),
            "gpus_per_node": control(widgets.Dropdown, "GPUs per node",
                                     options=GPUS_PER_NODE_CHOICES,
                                     value=settings["gpus_per_node"]),
            "intra_link": control(widgets.Dropdown, "link in a node",
                                  options=list(INTRA_NODE_LINKS), value=settings["intra_link"]),
            "inter_link": control(widgets.Dropdown, "link between nodes",
                                  options=list(INTER_NODE_LINKS), value=settings["inter_link"]),
            "gpu": control(widgets.Dropdown, "GPU", options=list(GPUS), value=settings["gpu"]),
            "bucket_cap_mb": control(widgets.Dropdown, "DDP bucket cap (MiB)",
                                     options=[tuple(o) for o in
                                              controls()["options"]["bucket_cap_mb"]],
                                     value=settings["bucket_cap_mb"]),
            "optimizer": control(widgets.Dropdown, "optimizer", options=OPTIMIZERS,
                                 value=settings["optimizer"]),
            "batch_size": control(widgets.BoundedIntText, "global batch", min=1, max=MAX_BATCH_SIZE,
                                  value=settings.get("batch_size",
                                                     preset.default_batch_size if preset else 8)),
            "outputs": control(widgets.BoundedIntText, "outputs / sample", min=1, max=MAX_OUTPUTS,
                               value=settings.get("outputs", preset.output_elements_per_sample
                                                  if preset else 1000)),
            "spec": control(widgets.Text, "module spec", value=settings["spec"],
                            placeholder="package.module:callable (runs it)",
                            continuous_update=False),
            "module_input": control(widgets.Text, "input per sample",
                                    value=settings["module_input"],
                                    placeholder="3,32,32 or tokens 512", continuous_update=False),
        }
        self.readout = widgets.HTML(layout=widgets.Layout(width="100%"))
        self.source = widgets.HTML(layout=widgets.Layout(width="100%"))
        self.views = {"volume": VolumeView(CURVE_GPUS), "time": StepView(), "memory": MemoryView()}
        self.images = {name: widgets.Image(format="png") for name in self.views}
        self.last = None  # the scenario on screen (None until the first good update)
        self.page = None  # under Voila, the page's own explorer (show_page)
        self.error = None  # the message shown when the last change was refused
        self._holding = False
        for widget in self.controls.values():
            widget.observe(self._on_change, names="value")
        self.update()
        columns = (("model", "custom", "precision", "attention", "gpus"),
                   ("gpus_per_node", "intra_link", "inter_link", "gpu"),
                   ("bucket_cap_mb", "optimizer", "batch_size", "outputs", "spec",
                    "module_input"))
        self.widget = widgets.VBox([
            widgets.HBox([widgets.VBox([self.controls[k] for k in column]) for column in columns]),
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
        """The ModelPreset the controls describe (custom: parsed parameters, no activations;
        your module: ``planned_model``)."""
        c = self.controls
        if c["model"].value == YOUR_MODULE:
            return planned_model(c["spec"].value, c["module_input"].value,
                                 c["precision"].value)
        return model_for(c["model"].value, c["custom"].value, c["outputs"].value)

    def update(self) -> None:
        """Recompute from the controls, move the artists, render the views that changed."""
        c = self.controls
        c["custom"].disabled = c["model"].value != CUSTOM
        for name in ("spec", "module_input"):
            c[name].disabled = c["model"].value != YOUR_MODULE
        c["outputs"].disabled = c["model"].value == YOUR_MODULE  # the trace's outputs
        intra, inter = INTERCONNECTS[c["intra_link"].value], INTERCONNECTS[c["inter_link"].value]
        gpu = GPUS[c["gpu"].value]
        try:
            model = self.model()
            s = scenario(model, c["precision"].value, c["gpus"].value, c["gpus_per_node"].value,
                         intra, inter, gpu, bucket_cap_setting(c["bucket_cap_mb"].value),
                         c["optimizer"].value,
                         c["batch_size"].value, c["attention"].value)
        except (TypeError, ValueError) as error:  # bad input: say so, keep the last figures
            self.error = str(error)
            self.readout.value = (f'<div style="color:#c0392b;font-size:15px">'
                                  f"Cannot update: {html.escape(self.error)}</div>")
            return
        self.error = None
        self.last = s
        n = s["num_gpus"]
        dp_n = s["dp_bytes"] or {"copy": None, "nccl": None}
        self.views["volume"].update(s["curve_gpus"], s["dp_copy_curve"], s["dp_nccl_curve"],
                                    s["ddp_curve"], n, dp_n["copy"], dp_n["nccl"],
                                    s["ddp_bytes"], s["gpus_per_node"])
        self.views["time"].update(s["steps"], s["dp_available"], n)
        self.views["memory"].update(s["memory"], s["capacity_bytes"])
        # A view renders again only when what it draws changed (an optimizer change leaves the
        # volume view alone), and redraws its axes only when their limits changed.
        keys = {
            "volume": (s["dp_copy_curve"], s["dp_nccl_curve"], s["ddp_curve"], n,
                       s["gpus_per_node"]),
            "time": tuple((name, st.total_s, st.exposed_communication_s, st.compute_s)
                          for name, st in s["steps"].items()),
            "memory": (tuple(tuple(v.values()) for v in s["memory"].values()),
                       s["capacity_bytes"]),
        }
        # zlib runs on another thread while the next figure draws (it releases the GIL).
        pngs = {name: view.png(view.background_key(), keys[name], _compressor())
                for name, view in self.views.items()}
        readout_html = self._readout_html(model, intra, inter, gpu, s)
        for name, png in pngs.items():
            self.images[name].value = png if isinstance(png, bytes) else png.result()
        self.readout.value = readout_html
        self.source.value = (
            '<div style="font-size:12px;color:#555;padding:8px">'
            + "<br>".join(f"<b>{html.escape(name)}</b>: {html.escape(text)}"
                          for name, text in sources(model, gpu, c["precision"].value, intra,
                                                    inter))
            + "</div>")

    def readout_text(self) -> str:
        """The readout as plain text (tags stripped)."""
        text = re.sub(r"<[^>]+>", " ", self.readout.value.replace("<br>", " "))
        return " ".join(html.unescape(text).split())

    def readout_lines(self) -> list[str]:
        """The readout as plain text, one line per sentence block and per table row."""
        marked = re.sub(r"<br>|<table[^>]*>|</?tr>", "\n", self.readout.value)
        marked = re.sub(r"</t[hd]>", " | ", marked)
        lines = (" ".join(html.unescape(re.sub(r"<[^>]+>", " ", line)).split()).rstrip(" |")
                 for line in marked.split("\n"))
        return [line for line in lines if line]

    def show(self) -> None:
        """Display the live explorer, then a static snapshot of what it shows now.

        The widget needs a running kernel; the snapshot (the readout as text, the three views
        as PNG) stays in the saved notebook, so the website, a notebook viewer without a kernel
        and a printout still show the explorer at these settings. Under Voila the page gets
        its own face instead (``show_page``).
        """
        from IPython.display import Image, display

        if in_voila():
            self.show_page()
            return
        display(self.widget)
        print("Snapshot at these settings (static: what a reader without a kernel sees;\n"
              "the live explorer above redraws, this does not):")
        # Wrapped to fit a page; continuation lines are indented.
        print("\n".join(textwrap.fill(line, 96, subsequent_indent="    ")
                        for line in self.readout_lines()))
        for name in self.views:
            display(Image(data=self.images[name].value, format="png"))

    def settings(self) -> dict:
        """The controls' values, as ``Explorer(**settings)`` takes them."""
        return {name: widget.value for name, widget in self.controls.items()}

    def show_page(self) -> None:
        """The lecture page's face (Voila): a title, one line, and a live explorer of its own at
        these settings, with every other cell of the notebook hidden. The lesson's later cells
        move this explorer for their checks; the page's stays where it opened, the opening
        case of the site's explorer page."""
        from IPython.display import HTML, display

        display(HTML(PAGE_HEAD))
        self.page = Explorer(**self.settings())
        display(self.page.widget)

    def _readout_html(self, model, intra, inter, gpu, s: dict) -> str:
        """``explorer_model.readout`` as HTML: the sentence, the table, memory, the verdict."""
        r = readout(s, self.controls["precision"].value, intra, inter, gpu)
        cell = '<td style="padding:1px 10px">'
        rows = []
        for row in r["rows"]:
            name = f"<tr>{cell}<b>{html.escape(row['name'])}</b></td>"
            if "span" in row:
                rows.append(f'{name}<td colspan="4" style="padding:1px 10px">'
                            f"{html.escape(row['span'])}</td></tr>")
            else:
                rows.append(name + "".join(f"{cell}{html.escape(text)}</td>"
                                           for text in row["cells"]) + "</tr>")
        header = "".join(f'<th style="padding:1px 10px;text-align:left">{h}</th>'
                         for h in r["columns"])
        table = f'<table style="font-size:14px">{header}{"".join(rows)}</table>'
        line = (f"<b>{r['n']}</b> {html.escape(r['head'])}{table}"
                f"{html.escape(r['time_line'])}<br>"
                f"{html.escape(r['memory_line'])}<br><b>{html.escape(r['verdict'])}</b>")
        return f'<div class="dpcost-readout" style="font-size:15px;line-height:1.5">{line}</div>'

    def data(self) -> dict:
        """What the views draw, read back from the artists: {"volume", "time", "memory"}."""
        return {name: view.data() for name, view in self.views.items()}
