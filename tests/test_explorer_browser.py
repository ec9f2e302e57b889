"""The explorer as a person uses it: JupyterLab in a real browser (Debian's Chromium).

Starts JupyterLab on a free local port with isolated config, runtime and settings directories,
drives Chromium through Playwright, opens a fresh copy of notebooks/05_explorer.ipynb, runs it,
takes a screenshot of the explorer as the notebook leaves it (Llama-2 7B on 8 H100 in one node),
moves the GPU slider to 1024 (DataParallel refused: it cannot span machines) and changes the
model, and checks that the readout and the figures changed. The screenshot lands in the test's
tmp directory, and in $DPCOST_SCREENSHOT_DIR when that is set (``DPCOST_SCREENSHOT_DIR=docs
pytest tests/test_explorer_browser.py`` refreshes docs/explorer.png). The server and the browser
are shut down in finalisers, also on failure.
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


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on 127.0.0.1 serving a copy of the explorer notebook, outputs cleared."""
    work = tmp_path / "work"
    work.mkdir()
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    for cell in notebook.cells:  # run from scratch: no saved outputs or widget state
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    notebook.metadata.pop("widgets", None)
    nbformat.write(notebook, work / NOTEBOOK.name)

    config = tmp_path / "config"
    (config / "labconfig").mkdir(parents=True)
    # The announcements extension's toast would cover the page.
    (config / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    env = {**os.environ,
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
        yield {"url": f"{base}/lab/tree/{NOTEBOOK.name}?token={token}&reset", "dir": tmp_path}
    finally:
        stop(process)
        log.close()


@pytest.fixture(scope="module")
def page():
    """A Chromium page that may only reach 127.0.0.1, shared by the two tests (each goes to its
    own server): one Chromium start, not two."""
    with local_page(timeout_ms=WAIT_MS) as (page, _blocked):
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
    page.goto(lab["url"])
    page.wait_for_function(KERNEL_READY, timeout=WAIT_MS)
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
    page.goto(voila)
    page.wait_for_function(
        "() => { const r = document.querySelector('.dpcost-readout');"
        " return r && r.innerText.includes('n = 8 GPUs') && r.innerText.includes('ZeRO-3'); }",
        timeout=WAIT_MS)
    assert page.locator(".dpcost-explorer img").count() == 3
    page.locator(".dpcost-explorer .noUi-handle").first.click()
    page.keyboard.press("Home")  # n = 1
    page.wait_for_function(
        "() => document.querySelector('.dpcost-readout').innerText.includes('One GPU')",
        timeout=WAIT_MS)
    assert page.locator(".dpcost-explorer .widget-readout").first.inner_text().strip() == "1"
