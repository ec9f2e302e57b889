"""`make lab` (the README's first command) starts JupyterLab serving the course's notebooks."""

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from dpcost.procs import free_port

ROOT = Path(__file__).resolve().parents[1]


def test_make_lab_serves_the_first_notebook(tmp_path):
    port, token = free_port(), "dpcost-test"
    args = (f"--no-browser --port={port} --ServerApp.ip=127.0.0.1 "
            f"--IdentityProvider.token={token} --ServerApp.port_retries=0")
    if os.geteuid() == 0:
        args += " --allow-root"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    server = subprocess.Popen(["make", "--no-print-directory", "lab", f"LAB_ARGS={args}"], cwd=ROOT,
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    url = f"http://127.0.0.1:{port}/api/contents/00_start_here.ipynb?content=0&token={token}"
    try:
        deadline, answer = time.monotonic() + 90, None
        while time.monotonic() < deadline and answer is None:
            assert server.poll() is None, "make lab exited early"
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    answer = json.load(response)
            except OSError:
                time.sleep(0.5)
        assert answer is not None, "JupyterLab did not answer within 90 s"
        assert answer["type"] == "notebook" and answer["name"] == "00_start_here.ipynb"
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # make and jupyter: the whole process group
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
