"""The course in JupyterLab as a person meets it, in a real browser (Debian's Chromium, driven
through Playwright): the explorer of lesson 05, its Voila page, and the exercises' report tables.

One JupyterLab server (a free local port; isolated config, runtime, settings and workspace
directories) serves both notebooks, and one Chromium, which may reach only 127.0.0.1, drives every
test: a server and a browser started once, and JupyterLab's scripts loaded once, not twice.

- The explorer: a fresh copy of notebooks/05_explorer.ipynb is run; a screenshot is taken of the
  explorer as the notebook leaves it (Llama-2 7B on 8 H100 in one node); the GPU slider goes to
  1024 (DataParallel refused: it cannot span machines) and the model changes, and the readout and
  the figures must change. The screenshot lands in the test's tmp directory, and in
  $DPCOST_SCREENSHOT_DIR when that is set (``DPCOST_SCREENSHOT_DIR=docs pytest
  tests/test_jupyterlab_browser.py -k explorer_in`` refreshes docs/explorer.png).
- Voila (its own server) shows the explorer as a standalone page; the slider moves to n = 1.
- The student's lab (served with `make lab`'s configuration, jupyter-student/): the file browser
  shows no instructor/ folder, and the page has no Nbgrader menu and none of nbgrader's plugins.
- The check/submit tables at 1280x720. Issue 22: the ``submit`` table was 1,409 px wide in a 968 px
  output area, so "got" and "why it failed" were off-screen. JupyterLab (its file browser open as
  it starts) shows the widest reports the exercises make - five wrong functions in one
  ``submit``, one wrong function, a wrong ring, a failed ``check`` - twice: as saved in the file
  (untrusted: JupyterLab sanitizes the HTML), then run live in the notebook's kernel (trusted, as a
  student runs it). Every table must fit its output area (the old table did not: 1,473 px in an
  848 px area here). No ranks start.

The servers and the browser are shut down in finalisers, also on failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import nbformat
import pytest
from browser_support import CHROMIUM, NO_CHROMIUM, free_port, local_page, stop

from dpcost.presets import MODELS
from dpcost.units import format_bytes

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "05_explorer.ipynb"
WAIT_MS = 60_000  # generous: the machine may be busy; every wait is on a condition
EXPLORER_VIEWPORT = (1500, 1500)
REPORT_VIEWPORT = (1280, 720)  # a projector's, and issue 22's

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM),
    pytest.mark.timeout(180),
]

def _wait_until_served(process, url, server, log_path, timeout_s=60):
    """Poll ``url`` until it answers; fail with the server's log if it exits or never does."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            pytest.fail(f"{server} exited early:\n{log_path.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail(f"{server} did not answer {url.split('?')[0]} within {timeout_s} s")
            time.sleep(0.2)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """One JupyterLab server on 127.0.0.1 for the file: a copy of the explorer notebook, outputs
    cleared, and reports.ipynb. Yields {"url": name -> the notebook's URL, "dir": tmp folder}."""
    tmp_path = tmp_path_factory.mktemp("lab")
    work = tmp_path / "work"
    work.mkdir()
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    for cell in notebook.cells:  # run from scratch: no saved outputs or widget state
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    notebook.metadata.pop("widgets", None)
    nbformat.write(notebook, work / NOTEBOOK.name)
    nbformat.write(_report_notebook(), work / "reports.ipynb")
    (work / "instructor").mkdir()  # as in notebooks/: the masters' folder, hidden from students
    nbformat.write(nbformat.v4.new_notebook(), work / "instructor" / "master.ipynb")

    config = tmp_path / "config"
    (config / "labconfig").mkdir(parents=True)
    # The announcements extension's toast would cover the page.
    (config / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    env = {**os.environ,
           # the student's lab, as `make lab` configures it (the Makefile, jupyter-student/)
           "JUPYTER_CONFIG_PATH": str(ROOT / "jupyter-student"),
           "JUPYTER_CONFIG_DIR": str(config),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "MPLBACKEND": "Agg"}
    port, token = free_port(), uuid.uuid4().hex
    log = (tmp_path / "lab.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}",
         "--ServerApp.ip=127.0.0.1", "--ServerApp.port_retries=0",
         f"--IdentityProvider.token={token}", "--LabApp.expose_app_in_browser=True",
         f"--ServerApp.root_dir={work}", "--allow-root"],
        cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        # ready when the REST API answers
        _wait_until_served(process, f"{base}/api/status?token={token}", "JupyterLab",
                           tmp_path / "lab.log")
        # ?reset: the default layout (file browser open), whatever the last test left
        yield {"url": lambda name: f"{base}/lab/tree/{name}?token={token}&reset",
               "dir": tmp_path}
    finally:
        stop(process)
        log.close()


@pytest.fixture(scope="module")
def page():
    """A Chromium page that may only reach 127.0.0.1, shared by the file's tests: one Chromium
    start; each test sets the viewport it needs before it opens its page."""
    with local_page(viewport=EXPLORER_VIEWPORT, timeout_ms=WAIT_MS) as (page, _blocked):
        yield page


# True once the notebook's own kernel session exists, is connected and idle: the page's idle
# indicators can show before that, and running cells then does nothing.
KERNEL_READY = """() => {
  const app = window.jupyterapp;
  const widget = app && app.shell.currentWidget;
  const context = widget && widget.sessionContext;
  const kernel = context && context.session && context.session.kernel;
  return !!(context && context.isReady && kernel && kernel.connectionStatus === 'connected'
            && kernel.status === 'idle');
}"""


def _open(page, url: str, viewport) -> None:
    page.set_viewport_size({"width": viewport[0], "height": viewport[1]})
    page.goto(url)
    page.wait_for_function(KERNEL_READY, timeout=WAIT_MS)


# ---- the explorer (lesson 05) ----------------------------------------------------------------

def _readout(page) -> str:
    return " ".join(page.locator(".dpcost-readout").inner_text().split())


def _image_sources(page) -> list[str]:
    return page.locator(".dpcost-explorer img").evaluate_all("els => els.map(e => e.src)")


def _screenshot(page, directory: Path) -> None:
    """The explorer as the notebook leaves it (Llama-2 7B on 8 H100 in one node), side panels
    closed so that it fits in the notebook panel; copied to $DPCOST_SCREENSHOT_DIR if set."""
    page.evaluate("() => { const shell = window.jupyterapp.shell;"
                  " shell.collapseLeft(); shell.collapseRight(); }")
    explorer = page.locator(".dpcost-explorer")
    explorer.scroll_into_view_if_needed()
    shot = directory / "explorer.png"
    explorer.screenshot(path=str(shot))
    assert shot.stat().st_size > 20_000
    if os.environ.get("DPCOST_SCREENSHOT_DIR"):
        target = Path(os.environ["DPCOST_SCREENSHOT_DIR"])
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, target / "explorer.png")


def test_explorer_in_jupyterlab_responds_to_slider_and_model(lab, page):
    _open(page, lab["url"](NOTEBOOK.name), EXPLORER_VIEWPORT)
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")

    # The last code cell moves the controls to Llama-2 7B, mixed, on 8 H100 in one node.
    page.wait_for_function(
        "() => [...document.querySelectorAll('.jp-OutputArea-output')]"
        ".some(e => e.innerText.includes('checked: Llama-2 7B'))", timeout=WAIT_MS)
    size_7b = format_bytes(MODELS["Llama-2 7B"].parameters * 2, digits=3)
    page.wait_for_function(
        "([size]) => { const r = document.querySelector('.dpcost-readout');"
        " return r && r.innerText.includes('n = 8 GPUs') && r.innerText.includes('P = ' + size)"
        " && r.innerText.includes('ZeRO-3'); }", arg=[size_7b], timeout=WAIT_MS)
    before_text, before_images = _readout(page), _image_sources(page)
    assert len(before_images) == 3 and all(src.startswith("blob:") for src in before_images)
    assert "DP, NCCL path" in before_text and "DP, copy path" in before_text
    assert "does not fit" in before_text
    _screenshot(page, lab["dir"])

    # The GPU slider: focus its handle and press End, as a person would, to reach n = 1024.
    slider = page.locator(".dpcost-explorer .widget-slider").first
    slider.locator(".noUi-handle").click()
    page.keyboard.press("End")
    page.wait_for_function(
        "() => document.querySelector('.dpcost-readout').innerText.includes('n = 1024')",
        timeout=WAIT_MS)
    assert slider.locator(".widget-readout").inner_text().strip() == "1024"
    after_slider_text = _readout(page)
    assert after_slider_text != before_text
    assert "DataParallel cannot span machines" in after_slider_text
    assert "128 nodes of 8" in after_slider_text and "DDP, two-level" in after_slider_text
    page.wait_for_function(
        "([old]) => { const s = [...document.querySelectorAll('.dpcost-explorer img')]"
        ".map(e => e.src); return s[0] !== old[0] && s[1] !== old[1]; }",
        arg=[before_images], timeout=WAIT_MS)
    after_slider_images = _image_sources(page)

    # The model preset: Llama-2 70B in mixed precision has P = 2 bytes x its parameter count.
    model = page.locator(".dpcost-explorer .widget-dropdown select").first
    model.select_option("Llama-2 70B")
    size = format_bytes(MODELS["Llama-2 70B"].parameters * 2, digits=3)
    page.wait_for_function(
        "([size]) => document.querySelector('.dpcost-readout').innerText"
        ".includes('P = ' + size)", arg=[size], timeout=WAIT_MS)
    after_model_text = _readout(page)
    assert "n = 1024" in after_model_text and after_model_text != after_slider_text
    page.wait_for_function(
        "([old]) => { const s = [...document.querySelectorAll('.dpcost-explorer img')]"
        ".map(e => e.src); return s.every((src, i) => src !== old[i]); }",
        arg=[after_slider_images], timeout=WAIT_MS)


@pytest.fixture
def voila(tmp_path):
    """Voilà serving notebooks/05_explorer.ipynb as a standalone page on 127.0.0.1."""
    env = {**os.environ,
           "JUPYTER_CONFIG_DIR": str(tmp_path / "voila-config"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "voila-runtime"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "MPLBACKEND": "Agg"}
    port = free_port()
    log = (tmp_path / "voila.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "voila", str(NOTEBOOK), "--no-browser", f"--port={port}",
         "--Voila.ip=127.0.0.1"],
        cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        # a static file: a GET of / would start a kernel
        _wait_until_served(process, f"{base}/voila/static/voila.js", "Voilà",
                           tmp_path / "voila.log")
        yield base + "/"
    finally:
        stop(process)
        log.close()


def test_explorer_as_a_voila_page(voila, page):
    """The lecture calculator: `voila notebooks/05_explorer.ipynb` shows a live explorer."""
    page.set_viewport_size({"width": EXPLORER_VIEWPORT[0], "height": EXPLORER_VIEWPORT[1]})
    page.goto(voila)
    page.wait_for_function(
        "() => { const r = document.querySelector('.dpcost-readout');"
        " return r && r.innerText.includes('n = 8 GPUs') && r.innerText.includes('ZeRO-3'); }",
        timeout=WAIT_MS)
    assert page.locator(".dpcost-explorer img").count() == 3
    # the page's own face: one explorer, none of the lesson's notebook-only prose
    assert page.locator(".dpcost-explorer").count() == 1
    assert "Run the cell below" not in page.inner_text("body")
    page.locator(".dpcost-explorer .noUi-handle").first.click()
    page.keyboard.press("Home")  # n = 1
    page.wait_for_function(
        "() => document.querySelector('.dpcost-readout').innerText.includes('One GPU')",
        timeout=WAIT_MS)
    assert page.locator(".dpcost-explorer .widget-readout").first.inner_text().strip() == "1"


# ---- the exercises' report tables (issue 22) -------------------------------------------------

# The reports, made by the real checkers on wrong code (each line of the battery's widest rows:
# numpy calls near 2**62, reasons that name a mistake).
REPORTS = '''\
from dpcost.exercises.five_functions import check, submit
from dpcost.exercises import ring_step

def dp_communication_volume(model_size_bytes, num_gpus):
    return float((num_gpus - 1) * model_size_bytes)

def ddp_communication_volume(model_size_bytes, num_gpus):
    return float(2 * (num_gpus - 1) * model_size_bytes)

def dp_gpu0_memory_multiplier(num_gpus):
    return 1.0

def ddp_gpu0_memory_multiplier(num_gpus):
    return num_gpus

def communication_reduction_factor(model_size_bytes, num_gpus):
    return dp_communication_volume(model_size_bytes, num_gpus) / ddp_communication_volume(
        model_size_bytes, num_gpus)

def all_gather_sends(num_ranks, step):
    return [(r, (r - 1) % num_ranks, r) for r in range(num_ranks)]
'''
CELLS = [REPORTS,
         "submit()",
         "submit(ddp_communication_volume)",
         "check(communication_reduction_factor)",
         "ring_step.submit(all_gather_sends)"]


def _report_notebook():
    """The cells above, with their outputs made here, in this process, as a file committed
    executed has them (JupyterLab shows them without running anything)."""
    cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    namespace = {"__name__": "__main__"}
    exec(REPORTS, namespace)
    for cell in cells[1:]:
        report = eval(cell.source, namespace)
        cell.outputs = [nbformat.v4.new_output(
            "execute_result", data={"text/html": report._repr_html_(),
                                    "text/plain": str(report)}, execution_count=1)]
        cell.execution_count = 1
    notebook = nbformat.v4.new_notebook(cells=cells)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    return notebook


# For every output that holds a table: the output area's width, the table's, and how far the
# output scrolls sideways (0 when nothing is cut off).
MEASURE = """() => Array.from(document.querySelectorAll('.jp-OutputArea-output'))
  .filter(out => out.querySelector('table'))
  .map(out => {
    const table = out.querySelector('table');
    return {area: out.clientWidth, table: Math.ceil(table.getBoundingClientRect().width),
            overflow: out.scrollWidth - out.clientWidth,
            text: table.innerText.slice(0, 60)};
  })"""


def _tables(page) -> list[dict]:
    page.wait_for_function(f"() => ({MEASURE})().length === {len(CELLS) - 1}", timeout=WAIT_MS)
    return page.evaluate(MEASURE)


def _assert_fit(tables: list[dict]) -> None:
    assert len(tables) == len(CELLS) - 1
    for table in tables:
        assert table["area"] > 600, table  # the notebook panel as JupyterLab lays it out
        assert table["table"] <= table["area"] and table["overflow"] <= 0, tables


def test_every_report_table_fits_jupyterlabs_output_area(lab, page):
    _open(page, lab["url"]("reports.ipynb"), REPORT_VIEWPORT)
    _assert_fit(_tables(page))  # saved in the file, sanitized
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs')")
    page.wait_for_function(f"() => ({MEASURE})().length === 0", timeout=WAIT_MS)
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    _assert_fit(_tables(page))  # made live by the kernel, as a student's run makes them


# ---- the student's lab: no instructor material (issue 38) -----------------------------------

def test_the_students_lab_shows_no_instructor_material(lab, page):
    """`make lab`'s configuration in the browser: the work folder holds instructor/ (as notebooks/
    does), but the file browser does not list it; JupyterLab runs its own plugins and none of
    nbgrader's (no Nbgrader menu, formgrader, create assignment, course list, validate)."""
    _open(page, lab["url"]("reports.ipynb"), REPORT_VIEWPORT)
    page.wait_for_function(
        "() => [...document.querySelectorAll('.jp-DirListing-itemText')]"
        ".some(e => e.innerText.trim() === 'reports.ipynb')", timeout=WAIT_MS)
    listed = [t.strip() for t in page.locator(".jp-DirListing-itemText").all_inner_texts()]
    assert "05_explorer.ipynb" in listed and "instructor" not in listed, listed
    menus = [t.strip() for t in page.locator(".lm-MenuBar-itemLabel").all_inner_texts()]
    assert "File" in menus and not any("nbgrader" in m.lower() for m in menus), menus
    plugins = page.evaluate("() => window.jupyterapp.listPlugins()")
    assert "@jupyterlab/notebook-extension:tracker" in plugins
    assert not [p for p in plugins if p.startswith("@jupyter/nbgrader")], plugins
