"""Which tests run serially: those that start ranks, torchrun or time-bounded processes.

`make test` runs these one at a time (`pytest -m serial`) and, beside them, everything else on 2
workers under SCHED_IDLE (`chrt --idle 0 pytest -n 2 -m "not serial"`): Linux runs the idle lane
only on CPU time that these leave, so a multi-process test keeps its cores whenever it can use
them, and its timeouts and orderings stay what they are on an idle machine. A new test file or
notebook that starts processes goes in this list; benchmarks/repeat.py repeats every test file in
it.
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent

SERIAL = (
    # ranks over gloo, torchrun agents, or timed hangs and signals
    "tests/test_measure_torchrun.py",
    "tests/test_measure_launch.py",
    "tests/test_measure_cli.py",
    "tests/test_measure_preflight.py",
    "tests/test_measure_scenarios.py",
    "tests/test_measure_traffic.py",
    "tests/test_measure_timeline.py",
    "tests/test_measure_bucket_order.py",
    "tests/test_measure_strategies.py",
    "tests/test_powersgd_gloo.py",
    "tests/test_examples.py",
    "tests/test_migration.py",
    "tests/test_migration_check.py",
    "tests/test_pitfalls.py",
    "tests/test_exercises_migrate.py",
    "tests/test_exercises_sandbox.py",
    "tests/test_procs.py",
    "tests/test_plan_ddp.py",
    "tests/test_plan_measure.py",
    # notebooks that start process groups
    "notebooks/06_measure_it.ipynb",
    "notebooks/07_time_and_overlap.ipynb",
    "notebooks/08_beyond_ddp.ipynb",
    "notebooks/09_moving_to_ddp.ipynb",
    "notebooks/09b_ddp_pitfalls.ipynb",
    "notebooks/10_plan_your_own_model.ipynb",
    "notebooks/ex3_migrate.ipynb",
    "notebooks/instructor/ex3_migrate.ipynb",
)
# Files with some tests marked serial in the file itself (the rest run in the parallel lane).
MIXED = ("tests/test_nbgrader.py",)


# The lessons that need no torch. Under nbval their kernel (and its children) start with torch made
# unimportable, so the run that checks their outputs is also the check that they run without it.
TORCH_FREE = ("00_start_here", "02_ring_allreduce", "03_the_proof", "04_gpu0_memory",
              "05_explorer", "ex1_five_functions", "ex2_ring_step")
_no_torch_site: list[Path] = []


def no_torch_site() -> Path:
    """A folder whose sitecustomize.py makes torch unimportable (None in sys.modules, which is
    also what importlib.util.find_spec reports for a missing module); put it on PYTHONPATH."""
    if not _no_torch_site:
        site = Path(tempfile.mkdtemp(prefix="nbval-no-torch-"))
        (site / "sitecustomize.py").write_text(
            'import sys\nsys.modules["torch"] = None  # as if torch were not installed\n')
        _no_torch_site.append(site)
    return _no_torch_site[0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    # nbval starts a notebook's kernel while its first cell is set up; the kernel inherits this
    blocked = item.path.suffix == ".ipynb" and item.path.stem in TORCH_FREE
    before = os.environ.get("PYTHONPATH")
    if blocked:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(no_torch_site()), before]))
    try:
        yield
    finally:
        if blocked:
            if before is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = before


def pytest_unconfigure(config):
    for site in _no_torch_site:
        shutil.rmtree(site, ignore_errors=True)
    _no_torch_site.clear()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "serial: starts ranks or time-bounded processes; runs alone (conftest.py)")


def pytest_ignore_collect(collection_path, config):
    """Each lane imports only the files it can run: collecting all of tests/ costs about 15 s of
    CPU (torch, nbformat, nbgrader), paid by the serial lane and by each parallel worker."""
    lane = config.getoption("markexpr", "")
    if lane not in ("serial", "not serial") or collection_path.is_dir():
        return None
    try:
        name = collection_path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return None
    if not (name.startswith(("tests/test_", "notebooks/")) and
            name.endswith((".py", ".ipynb"))):
        return None
    if lane == "serial":
        return name not in SERIAL + MIXED or None
    return name in SERIAL or None


def pytest_collection_modifyitems(config, items):
    serial = {ROOT / name for name in SERIAL}
    for item in items:
        if Path(str(item.path)).resolve() in serial:
            item.add_marker(pytest.mark.serial)
