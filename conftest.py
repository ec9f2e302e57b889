"""Which tests start ranks, torchrun or time-bounded processes, and in which lane they run.

`make test` runs three lanes at once:
- TIMED, one test at a time at normal priority (`pytest -m serial`): what starts processes and
  times them (hang timeouts of a second, signals, stalls, timing fits), so that its timeouts and
  orderings stay what they are on an idle machine;
- UNTIMED, one test at a time at nice 19 (`nice -n 19 pytest -m heavy`): what starts ranks or
  torchrun but times nothing (its timeouts are minutes), on the CPU time the timed lane leaves;
- everything else on 2 workers under SCHED_IDLE (`chrt --idle 0 pytest -n 2`), on what both
  leave.
A new test file or notebook that starts processes goes in TIMED (or UNTIMED, if nothing in it is
bounded by seconds); benchmarks/repeat.py repeats every test file in SERIAL, the two together.
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent

TIMED = (
    # hang and set-up timeouts of a second, signals, stalls, killed trees, timing fits
    "tests/test_measure_launch.py",
    "tests/test_measure_cli.py",
    "tests/test_measure_preflight.py",
    "tests/test_measure_timeline.py",
    "tests/test_powersgd_gloo.py",
    "tests/test_migration.py",
    "tests/test_pitfalls.py",
    "tests/test_exercises_migrate.py",
    "tests/test_exercises_sandbox.py",
    "tests/test_grading_sandbox.py",
    "tests/test_procs.py",
    # notebooks that time, stall or grade within seconds
    "notebooks/06_measure_it.ipynb",
    "notebooks/07_time_and_overlap.ipynb",
    "notebooks/08_beyond_ddp.ipynb",
    "notebooks/ex3_migrate.ipynb",
    "notebooks/instructor/ex3_migrate.ipynb",
)
UNTIMED = (
    # ranks over gloo and torchrun agents whose timeouts are minutes
    "tests/test_measure_torchrun.py",
    "tests/test_measure_scenarios.py",
    "tests/test_measure_traffic.py",
    "tests/test_measure_strategies.py",
    "tests/test_measure_hsdp.py",
    "tests/test_examples.py",
    "tests/test_migration_check.py",
    "tests/test_plan_ddp.py",
    "tests/test_plan_measure.py",
    "tests/test_rank_answers.py",
    "tests/test_nbgrader.py",  # ex3's autograde trains on gloo ranks
    "notebooks/09_moving_to_ddp.ipynb",
    "notebooks/09b_ddp_pitfalls.ipynb",
    "notebooks/10_plan_your_own_model.ipynb",
)
SERIAL = TIMED + UNTIMED  # every file that starts processes
LANE_FILES = {"serial": TIMED, "heavy": UNTIMED}


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
        "markers", "serial: starts processes and times them; runs alone (conftest.py's TIMED)")
    config.addinivalue_line(
        "markers", "heavy: starts ranks or torchrun, times nothing; its own lane (UNTIMED)")


def pytest_ignore_collect(collection_path, config):
    """Each lane imports only the files it can run: collecting all of tests/ costs about 15 s of
    CPU (torch, nbformat, nbgrader), paid by each lane and by each parallel worker."""
    lane = config.getoption("markexpr", "")
    if lane not in ("serial", "heavy", "not serial and not heavy") or collection_path.is_dir():
        return None
    try:
        name = collection_path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return None
    if not (name.startswith(("tests/test_", "notebooks/")) and
            name.endswith((".py", ".ipynb"))):
        return None
    if lane in LANE_FILES:
        return name not in LANE_FILES[lane] or None
    return name in SERIAL or None


def pytest_collection_modifyitems(config, items):
    lanes = {ROOT / name: marker for marker, names in LANE_FILES.items() for name in names}
    for item in items:
        marker = lanes.get(Path(str(item.path)).resolve())
        if marker:
            item.add_marker(getattr(pytest.mark, marker))
