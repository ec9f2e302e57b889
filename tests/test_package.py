"""Packaging: `import dpcost` stays light; ranges in pyproject.toml, exact versions in
constraints.txt, environment.yml and binder/ in step with it; torch is the `measure` extra and the
torch-free lessons really run without it (in this environment with torch blocked, and in a fresh
virtual environment holding only the wheel)."""

import email
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import nbformat
import pytest
import yaml
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
HEAVY = ["torch", "sympy", "matplotlib", "ipywidgets", "numpy"]
# The lessons and exercises that must run without torch (issue 13); every other notebook needs it.


def _root_conftest():
    """The repository's conftest.py (TORCH_FREE, the torch blocker nbval's kernels start with)."""
    spec = importlib.util.spec_from_file_location("dpcost_root_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ROOT_CONFTEST = _root_conftest()
TORCH_FREE = list(ROOT_CONFTEST.TORCH_FREE)
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
NO_TORCH_MESSAGE = "dpcost.measure needs PyTorch: pip install 'dpcost[measure]'"
# conda-forge's names where they differ from PyPI's (checked on conda-forge's recipes)
CONDA_TO_PYPI = {"jupyterlab_rise": "jupyterlab-rise", "pytorch": "torch"}


def test_import_dpcost_is_light():
    code = (
        "import sys, time; t = time.process_time(); import dpcost; "
        "print(time.process_time() - t); "
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out[1] == "[]", f"import dpcost pulled in {out[1]}"
    # CPU time, not wall time: the parallel lane runs under SCHED_IDLE, where waiting for a core
    # took 0.2 s once. Typically 2-3 ms.
    assert float(out[0]) < 0.15


# --- pyproject.toml: ranges; constraints.txt: the exact versions -------------------------------

def _project():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirements():
    """{extra or "": [Requirement]} for the dependencies and every extra."""
    project = _project()
    found = {"": [Requirement(r) for r in project["dependencies"]]}
    for extra, requirements in project["optional-dependencies"].items():
        found[extra] = [Requirement(r) for r in requirements]
    return found


def _public(version: str) -> Version:
    return Version(Version(version).public)  # torch's +cpu is a build, not another version


def _constraints():
    pins = {}
    for number, line in enumerate((ROOT / "constraints.txt").read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][^\s;]*)", line)
        assert match, f"constraints.txt:{number}: not an exact pin: {line!r}"
        name = canonicalize_name(match.group(1))
        assert name not in pins, f"constraints.txt:{number}: {name} pinned twice"
        pins[name] = Version(match.group(2))
    return pins


def test_pyproject_has_ranges_and_torch_only_in_measure():
    requirements = _requirements()
    for extra, group in requirements.items():
        for requirement in group:
            operators = {spec.operator for spec in requirement.specifier}
            assert operators and not operators & {"==", "==="}, \
                f"{requirement} ({extra or 'dependencies'}) must be a compatible range"
    torch_in = [extra for extra, group in requirements.items()
                if any(canonicalize_name(r.name) == "torch" for r in group)]
    assert torch_in == ["measure"]


def test_requires_python_is_what_the_dependencies_need():
    needs = SpecifierSet(_project()["requires-python"])
    # the three, read from the metadata of the versions installed here
    for name in ("numpy", "matplotlib", "ipykernel"):
        declared = SpecifierSet(metadata.metadata(name)["Requires-Python"])
        assert "3.10.99" not in declared and "3.11.99" in declared, (name, str(declared))
    assert "3.10.99" not in needs and "3.11.0" in needs, f"requires-python is {needs}"
    for group in _requirements().values():
        for requirement in group:
            declared = metadata.metadata(requirement.name)["Requires-Python"]
            if declared:  # nothing we depend on may need more than requires-python allows
                assert "3.11.99" in SpecifierSet(declared), (requirement.name, declared)


def test_constraints_pin_everything_installed_here():
    """What make lab/test install is reproducible: each distribution here is pinned, at its
    version. Regenerate with `make constraints` after a deliberate upgrade in .venv."""
    pins = _constraints()
    unpinned, differ = [], []
    # The environment's own site-packages, as pip freeze sees it: under pytest, setuptools'
    # vendored copies (setuptools/_vendor/*.dist-info) can be on sys.path too.
    site_packages = sorted({sysconfig.get_paths()[key] for key in ("purelib", "platlib")})
    for dist in metadata.distributions(path=site_packages):
        name = canonicalize_name(dist.metadata["Name"])
        if name == "dpcost":
            continue
        if name not in pins:
            unpinned.append(f"{name}=={dist.version}")
        elif _public(dist.version) != pins[name]:
            differ.append(f"{name}: installed {dist.version}, constraints.txt {pins[name]}")
    assert not unpinned and not differ, f"run `make constraints`: {unpinned} {differ}"


def test_pyproject_ranges_admit_the_constraints():
    pins = _constraints()
    for extra, group in _requirements().items():
        for requirement in group:
            pinned = pins.get(canonicalize_name(requirement.name))
            assert pinned is not None, f"{requirement.name} is not in constraints.txt"
            assert requirement.specifier.contains(pinned, prereleases=True), \
                f"{requirement} ({extra or 'dependencies'}) excludes constraints.txt's {pinned}"


def _environment():
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda, pip = {}, []
    for dependency in environment["dependencies"]:
        if isinstance(dependency, dict):
            pip = dependency["pip"]
            continue
        name, _, version = dependency.partition("=")
        conda[name] = version
    return environment, conda, pip


def test_environment_yml_matches_constraints():
    environment, conda, pip = _environment()
    assert environment["channels"] == ["conda-forge"]
    pins, requirements = _constraints(), _requirements()
    floor = min(spec.version for spec in SpecifierSet(_project()["requires-python"])
                if spec.operator == ">=")
    assert conda.pop("python") == floor and conda.pop("pip") == ""
    provided = set()
    for name, version in conda.items():
        pypi = canonicalize_name(CONDA_TO_PYPI.get(name, name))
        assert Version(version) == pins.get(pypi), \
            f"environment.yml: {name}={version}, constraints.txt: {pins.get(pypi)}"
        provided.add(pypi)
    options = [line for line in pip if line.startswith("-")]
    assert f"--extra-index-url {CPU_INDEX}" in options and "-c constraints.txt" in options
    assert "-e .[dev,slides,measure]" in options
    for line in set(pip) - set(options):
        requirement = Requirement(line)
        (spec,) = requirement.specifier
        name = canonicalize_name(requirement.name)
        assert spec.operator == "==" and _public(spec.version) == pins.get(name), line
        provided.add(name)
    assert Requirement(next(p for p in pip if p.startswith("torch"))).specifier == \
        SpecifierSet(f"=={pins['torch']}+cpu"), "torch: the CPU-only build"
    wanted = {canonicalize_name(r.name) for group in requirements.values() for r in group}
    assert wanted <= provided, f"environment.yml lacks {sorted(wanted - provided)}"
    assert not provided & {"pytorch", "jupyterlab-rise"} - wanted  # PyPI names on conda-forge


# --- Binder --------------------------------------------------------------------------------------

def test_binder_requirements_install_the_cpu_build_at_the_constraints():
    lines = [line.strip() for line in (ROOT / "binder" / "requirements.txt").read_text()
             .splitlines() if line.strip() and not line.startswith("#")]
    assert f"--extra-index-url {CPU_INDEX}" in lines
    assert "-c ../constraints.txt" in lines  # pip reads -c relative to this file
    assert f"torch=={_constraints()['torch']}+cpu" in lines
    assert "-e .[measure,slides]" in lines  # repo2docker runs pip in the repository's root
    assert (ROOT / "binder" / "runtime.txt").read_text().strip() == "python-3.11"


def test_repo2docker_dry_run_builds_the_binder_environment():
    """`--no-build` renders the Dockerfile without a container engine (none runs here); a local
    directory is read in place, nothing is written."""
    run = subprocess.run([str(Path(sys.executable).with_name("jupyter-repo2docker")),
                          "--no-build", "--debug", "--user-id", "1000", "--user-name", "jovyan",
                          str(ROOT)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Building conda environment for python=3.11" in run.stderr
    dockerfile = run.stdout
    install = dockerfile.index('pip install --no-cache-dir -r "binder/requirements.txt"')
    assert dockerfile.index("COPY --chown=1000:1000 src/ ${REPO_DIR}/") < install, \
        "the whole repository (constraints.txt, the package) must be there before pip runs"


# --- the wheel, without torch --------------------------------------------------------------------

@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel, built from a copy of the sources (no build/ or egg-info left in the checkout)."""
    where = tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, where / name)
    shutil.copytree(ROOT / "dpcost", where / "dpcost",
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "-w", str(where / "dist"), str(where)], check=True,
                   timeout=120, capture_output=True)
    (built,) = (where / "dist").glob("dpcost-*.whl")
    return built


def test_wheel_metadata_has_torch_only_under_measure_and_no_pins(wheel):
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        message = email.message_from_bytes(archive.read(name))
    assert message["Requires-Python"] == ">=3.11"
    requires = [Requirement(r) for r in message.get_all("Requires-Dist")]
    plain = {r.name for r in requires if r.marker is None}
    assert plain == {"numpy", "sympy", "matplotlib", "ipywidgets"}
    (torch,) = [r for r in requires if r.name == "torch"]
    assert str(torch.marker) == 'extra == "measure"'
    assert not [str(r) for r in requires if {s.operator for s in r.specifier} & {"==", "==="}]


def _kernelspec(where: Path, name: str, python: str, env: dict) -> Path:
    """A kernelspec naming its interpreter, so the notebook runs where we say, not in a default."""
    spec = where / "kernels" / name
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": name, "language": "python", "env": env}))
    return where


def _execute(notebook: str, kernel: str, extra_cell: str = ""):
    nb = nbformat.read(NOTEBOOKS / f"{notebook}.ipynb", as_version=4)
    if extra_cell:
        nb.cells.append(nbformat.v4.new_code_cell(extra_cell))
    NotebookClient(nb, timeout=300, kernel_name=kernel,
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return nb


def test_fresh_venv_without_torch_runs_lesson_02(wheel, tmp_path, monkeypatch):
    """The real thing: the wheel and its dependencies at the constraints, no torch, lesson 02."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    # our uv (make's installer) or pip installs into it (--python); ipykernel is the notebook's
    # kernel, not a dependency. No byte-compiling: compiling all of sympy and IPython took longer
    # than importing from source what lesson 02 needs (the test: 43 s with, 21 s without, on 2
    # cores, with pip; uv takes a few seconds).
    uv = Path(sys.executable).with_name("uv")
    installer = ([str(uv), "pip", "install", "--python", python] if uv.exists() else
                 [sys.executable, "-m", "pip", "--python", python, "install", "--no-compile"])
    install = subprocess.run([*installer, "--quiet", "-c", str(ROOT / "constraints.txt"),
                              str(wheel), "ipykernel"], capture_output=True, text=True,
                             timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    probe = subprocess.run([python, "-c", "import importlib.util, dpcost; "
                            "print(importlib.util.find_spec('torch'))"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "None", "torch got installed into the torch-free environment"
    measure = subprocess.run([python, "-c", "import dpcost.measure"], capture_output=True,
                             text=True)
    assert measure.returncode == 1 and NO_TORCH_MESSAGE in measure.stderr.splitlines()[-1]
    monkeypatch.setenv("JUPYTER_PATH", str(_kernelspec(tmp_path / "jupyter", "dpcost-fresh",
                                                       python, {})))
    nb = _execute("02_ring_allreduce", "dpcost-fresh",
                  "import sys, importlib.util\n"
                  f"assert sys.prefix == {str(venv)!r}, sys.prefix\n"
                  "assert importlib.util.find_spec('torch') is None\n"
                  "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    assert nb.cells[-1].outputs[0]["text"] == "[]\n"


# --- in this environment, with torch made unimportable -------------------------------------------

@pytest.fixture(scope="module")
def blocker():
    """conftest.py's torch blocker; its folder is removed after this module's tests."""
    yield ROOT_CONFTEST
    ROOT_CONFTEST.pytest_unconfigure(None)


@pytest.fixture(scope="module")
def no_torch(tmp_path_factory, blocker):
    """Kernel and child processes see torch as not installed: conftest.py's blocker, the one
    nbval's kernels start with for the TORCH_FREE lessons (so their nbval run is the check that
    they run without torch)."""
    where = tmp_path_factory.mktemp("no_torch")
    # ROOT too: the kernel and its children import this checkout's dpcost
    env = {"PYTHONPATH": os.pathsep.join([str(blocker.no_torch_site()), str(ROOT)])}
    _kernelspec(where, "dpcost-no-torch", sys.executable, env)
    return where, env


class _Cell:  # what the blocker reads of an nbval item: its notebook's path
    def __init__(self, path):
        self.path = path


@pytest.mark.parametrize("notebook, blocked", [
    (NOTEBOOKS / "02_ring_allreduce.ipynb", True),
    (NOTEBOOKS / "instructor" / "ex1_five_functions.ipynb", True),
    (NOTEBOOKS / "01_what_dataparallel_moves.ipynb", False),
    (ROOT / "tests" / "test_package.py", False)])
def test_nbval_starts_the_torch_free_lessons_kernels_with_torch_blocked(notebook, blocked,
                                                                       blocker):
    """While a cell of a TORCH_FREE lesson is set up (nbval starts its kernel then), a new
    interpreter cannot import torch; for any other, it can; and PYTHONPATH comes back after."""
    before = os.environ.get("PYTHONPATH")
    setup = blocker.pytest_runtest_setup(_Cell(notebook))
    next(setup)
    try:
        probe = subprocess.run([sys.executable, "-c", "import importlib.util as u; "
                                "print(u.find_spec('torch') is None)"],
                               capture_output=True, text=True, timeout=60)
    finally:
        setup.close()
    assert probe.stdout.strip() == str(blocked), probe.stderr
    assert os.environ.get("PYTHONPATH") == before


def test_the_blocker_stops_a_lesson_that_needs_torch(no_torch, monkeypatch):
    monkeypatch.setenv("JUPYTER_PATH", str(no_torch[0]))
    with pytest.raises(CellExecutionError, match="import of torch halted"):
        _execute("01_what_dataparallel_moves", "dpcost-no-torch")


def test_notebooks_that_need_torch_say_so_first():
    needing = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb") if p.stem not in TORCH_FREE)
    assert {"01_what_dataparallel_moves", "06_measure_it", "ex3_migrate"} <= set(needing)
    for name in needing + TORCH_FREE:
        first = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4).cells[0]
        # the install command is the notice: the torch-free ones must not ask for it
        says = first.cell_type == "markdown" and 'pip install "dpcost[measure]"' in first.source
        assert says == (name in needing), \
            f"{name}: the first cell must give the install command exactly when torch is needed"


def test_measure_without_torch_names_the_extra(no_torch):
    env = dict(os.environ, **no_torch[1])
    imported = subprocess.run([sys.executable, "-c", "import dpcost.measure.launch"],
                              capture_output=True, text=True, env=env, cwd=ROOT)
    assert imported.returncode == 1
    assert imported.stderr.splitlines()[-1].startswith(f"ImportError: {NO_TORCH_MESSAGE}")
    cli = subprocess.run([sys.executable, "-m", "dpcost.measure", "--world-size", "2"],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    assert (cli.returncode, cli.stdout) == (2, "")
    assert cli.stderr == f"python -m dpcost.measure: error: {NO_TORCH_MESSAGE} " \
                         "(from a clone: pip install -e '.[measure]')\n"
    # with torch present the import stays light: the launcher imports torch only in the ranks
    light = subprocess.run([sys.executable, "-c", "import sys, dpcost.measure; "
                            "print('torch' in sys.modules)"], capture_output=True, text=True,
                           check=True, cwd=ROOT)
    assert light.stdout == "False\n"
