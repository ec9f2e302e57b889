"""Nothing is blank without a kernel: every cell that shows a widget also leaves a static output.

A widget's saved output is only a reference to a model that lives in a kernel; the website, a
notebook viewer and a printout cannot draw it. So each such cell (the explorer, the hint
buttons) must also save a picture or text of what the widget shows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("**/*.ipynb"))
WIDGET = "application/vnd.jupyter.widget-view+json"
STATIC = ("image/png", "image/svg+xml", "text/html", "text/markdown")


def _static_outputs(outputs):
    for output in outputs:
        data = output.get("data", {})
        if WIDGET in data:
            continue
        if output["output_type"] == "stream" and "".join(output["text"]).strip():
            yield output
        elif any(kind in data for kind in STATIC):
            yield output


def _widget_cells(path):
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        if any(WIDGET in o.get("data", {}) for o in cell.get("outputs", [])):
            yield index, cell


def test_the_course_has_widget_cells_to_check():
    assert sum(1 for path in NOTEBOOKS for _ in _widget_cells(path)) >= 1


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_widget_cell_leaves_a_static_output(path):
    for index, cell in _widget_cells(path):
        assert list(_static_outputs(cell["outputs"])), (
            f"{path.name} cell {index} shows a widget and nothing a reader without a kernel "
            f"can see: {''.join(cell['source'])[:80]!r}")
