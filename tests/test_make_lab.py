"""`make lab` (the README's first command) starts JupyterLab serving the course's notebooks, as a
student meets them: without the instructor's masters (notebooks/instructor/: solutions and hidden
tests) and without nbgrader's interface (its JupyterLab extension: the Nbgrader menu, formgrader,
course list, create assignment, validate; its server extensions). `make lab-instructor` serves
both. The two run side by side, each a real server asked through its REST API and its page."""

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from dpcost.procs import free_port

ROOT = Path(__file__).resolve().parents[1]
NBGRADER = "@jupyter/nbgrader"


def _start(target: str, tmp_path: Path) -> tuple[subprocess.Popen, str, str]:
    port, token = free_port(), "dpcost-test"
    args = (f"--no-browser --port={port} --ServerApp.ip=127.0.0.1 "
            f"--IdentityProvider.token={token} --ServerApp.port_retries=0")
    if os.geteuid() == 0:
        args += " --allow-root"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / target / "config"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / target / "runtime"))
    env.pop("JUPYTER_CONFIG_PATH", None)
    server = subprocess.Popen(["make", "--no-print-directory", target, f"LAB_ARGS={args}"],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    return server, f"http://127.0.0.1:{port}", token


def _stop(server: subprocess.Popen) -> None:
    os.killpg(server.pid, signal.SIGTERM)  # make and jupyter: the whole process group
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, ""


@pytest.fixture(scope="module")
def labs(tmp_path_factory):
    """{"lab": (base url, token), "lab-instructor": ...}: both servers, started together."""
    tmp_path = tmp_path_factory.mktemp("labs")
    started = {target: _start(target, tmp_path) for target in ("lab", "lab-instructor")}
    try:
        deadline = time.monotonic() + 90
        for target, (server, base, token) in started.items():
            while True:
                assert server.poll() is None, f"make {target} exited early"
                try:
                    with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2):
                        break
                except OSError:
                    assert time.monotonic() < deadline, f"make {target}: no answer within 90 s"
                    time.sleep(0.5)
        yield {target: (base, token) for target, (_, base, token) in started.items()}
    finally:
        for server, _, _ in started.values():
            _stop(server)


def _listing(base: str, token: str) -> set[str]:
    status, body = _get(f"{base}/api/contents/?content=1&token={token}")
    assert status == 200
    return {item["name"] for item in json.loads(body)["content"]}


def _page_config(base: str, token: str) -> dict:
    """The configuration JupyterLab's page starts with (what the browser's app reads)."""
    status, html = _get(f"{base}/lab?token={token}")
    assert status == 200
    data = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                     html, re.S)
    return json.loads(data.group(1))


def test_make_lab_serves_the_first_notebook(labs):
    base, token = labs["lab"]
    status, body = _get(f"{base}/api/contents/00_start_here.ipynb?content=0&token={token}")
    assert status == 200
    answer = json.loads(body)
    assert answer["type"] == "notebook" and answer["name"] == "00_start_here.ipynb"


def test_a_students_lab_lists_no_instructor_material(labs):
    base, token = labs["lab"]
    names = _listing(base, token)
    assert {"00_start_here.ipynb", "ex1_five_functions.ipynb"} <= names
    assert "instructor" not in names, names
    assert "instructor" in _listing(*labs["lab-instructor"])  # the same folder, served whole


def test_a_students_lab_has_no_nbgrader_interface(labs):
    base, token = labs["lab"]
    config = _page_config(base, token)
    # the extension is installed (the instructor's lab loads it) but disabled here
    assert NBGRADER in [e["name"] for e in config["federated_extensions"]]
    assert NBGRADER in config["disabledExtensions"]  # a list of names in the page
    assert _get(f"{base}/formgrader?token={token}")[0] == 404  # its server extension is off
    assert _get(f"{base}/assignments?token={token}")[0] == 404

    base, token = labs["lab-instructor"]
    config = _page_config(base, token)
    assert NBGRADER not in config.get("disabledExtensions", [])
    assert _get(f"{base}/formgrader?token={token}")[0] == 200  # nbgrader's formgrader answers
