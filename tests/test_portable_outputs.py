"""No nbval-checked output of a torch notebook holds a float with more digits than it means.

float32 training and timing give other last digits on other CPUs, kernel sets
(``ATEN_CPU_CAPABILITY``) and thread counts: lesson 09's loss printed at full precision took four
values on one machine, none of them the committed one. So in a notebook that needs torch, a
checked output shows such a number rounded to what it means, or the cell is marked
``# NBVAL_IGNORE_OUTPUT`` and asserts it with a tolerance. A cell that prints an exact float
(integer arithmetic, say) says why with a comment ``# exact: <reason>``.

This is the cheap, static half; ``make portable`` re-runs those notebooks under other kernel
sets and thread counts (the dynamic half).
"""

import importlib.util
import json
import re
from pathlib import Path

import pytest
from test_package import TORCH_FREE

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb")
                   if ".ipynb_checkpoints" not in p.parts)
TORCH_NOTEBOOKS = [p for p in NOTEBOOKS if p.stem not in TORCH_FREE]
MAX_DIGITS = 7  # float32 carries about 7 significant decimal digits
FLOAT = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+)(?![\w.])")
IGNORED_BY_NBVAL = ("NBVAL_IGNORE_OUTPUT", "NBVAL_SKIP")
IGNORED_TAGS = ("nbval-ignore-output", "nbval-skip")


def significant_digits(text: str) -> int:
    """Digits from the first to the last non-zero one of the mantissa: 0.3782 -> 4, 21000.0 -> 2."""
    mantissa = re.split("[eE]", text.lstrip("+-"))[0].replace(".", "")
    return len(mantissa.strip("0"))


def checked(cell) -> bool:
    source = "".join(cell["source"])
    tags = cell.get("metadata", {}).get("tags", [])
    return (cell["cell_type"] == "code" and not any(m in source for m in IGNORED_BY_NBVAL)
            and not any(t in tags for t in IGNORED_TAGS))


def overlong_floats(notebook: dict) -> list[str]:
    """'cell N: <float>' for each float of over MAX_DIGITS digits in a checked text output."""
    found = []
    for index, cell in enumerate(notebook["cells"]):
        if not checked(cell) or "# exact:" in "".join(cell["source"]):
            continue
        for output in cell.get("outputs", []):
            text = "".join(output.get("text", [])) + "".join(
                output.get("data", {}).get("text/plain", []))
            found += [f"cell {index}: {m.group(0)}" for m in FLOAT.finditer(text)
                      if significant_digits(m.group(0)) > MAX_DIGITS]
    return found


def test_the_torch_notebooks_are_the_ones_the_issue_names():
    names = {str(p.relative_to(ROOT / "notebooks")) for p in TORCH_NOTEBOOKS}
    assert {"06_measure_it.ipynb", "09_moving_to_ddp.ipynb", "ex3_migrate.ipynb",
            "instructor/ex3_migrate.ipynb"} <= names
    assert "00_start_here.ipynb" not in names


@pytest.mark.parametrize("path", TORCH_NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_checked_output_shows_more_digits_than_it_means(path):
    found = overlong_floats(json.loads(path.read_text()))
    assert not found, (f"{path.name}: round these to what they mean (a loss to 4 significant "
                       f"digits), or mark the cell # NBVAL_IGNORE_OUTPUT and assert with a "
                       f"tolerance, or say '# exact: why': {found}")


def _cell(source, text, tags=()):
    return {"cell_type": "code", "source": [source], "metadata": {"tags": list(tags)},
            "outputs": [{"output_type": "stream", "name": "stdout", "text": [text]}]}


def test_the_check_catches_lesson_09s_full_precision_loss():
    """The output that failed on another CPU (issue 19) is caught; its rounded form is not."""
    full = _cell("print(json.dumps(line, indent=1))",
                 '{\n "final_loss": 0.3781767189502716,\n "param_checksum": 125.73381007976423\n}')
    assert overlong_floats({"cells": [full]}) == ["cell 0: 0.3781767189502716",
                                                   "cell 0: 125.73381007976423"]
    shown = _cell("print(json.dumps(rounded(line), indent=1))",
                  '{\n "final_loss": 0.3782,\n "param_checksum": 125.7\n}')
    assert overlong_floats({"cells": [shown]}) == []


def test_ignored_cells_and_stated_exact_values_pass():
    text = "1.2345678901 and 3.14159265e-07\n"
    assert len(overlong_floats({"cells": [_cell("x", text)]})) == 2
    assert overlong_floats({"cells": [_cell("# NBVAL_IGNORE_OUTPUT\nx", text)]}) == []
    assert overlong_floats({"cells": [_cell("x", text, tags=["nbval-ignore-output"])]}) == []
    assert overlong_floats({"cells": [_cell("# exact: integer arithmetic\nx", text)]}) == []


@pytest.mark.parametrize("text, digits", [("0.3782", 4), ("21000000000.0", 2), ("1.5e+09", 2),
                                          ("0.000125", 3), ("-125.73381007976423", 17),
                                          ("1e-05", 1), ("100.0", 1)])
def test_significant_digits(text, digits):
    assert significant_digits(text) == digits


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _root_conftest():
    return _load("root_conftest", ROOT / "conftest.py")


def _makefile_list(name: str) -> list[str]:
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if line.startswith(f"{name} :=")]
    return line.split(":=", 1)[1].split()


def test_make_portable_reruns_every_notebook_that_trains_or_times():
    """The notebooks that start process groups (conftest.py's serial ones) all run again; 01, which
    imports torch only to read module shapes and DDP's buckets, is left to the static check."""
    portable = _makefile_list("PORTABLE_NOTEBOOKS")
    serial = [name for name in _root_conftest().SERIAL if name.startswith("notebooks/")]
    assert sorted(portable) == sorted(serial)
    assert set(portable) <= {str(p.relative_to(ROOT)) for p in TORCH_NOTEBOOKS}
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ci.index("make portable") > ci.index("make test"), ".ci/run: make portable after test"


def test_serial_tests_are_the_multiprocess_ones():
    """conftest.py's SERIAL runs alone in make test; benchmarks/repeat.py repeats what starts
    processes, read from SERIAL. Every serial test file is repeated, and every serial notebook
    needs torch."""
    repeat = _load("repeat", ROOT / "benchmarks" / "repeat.py")
    serial = _root_conftest().SERIAL
    assert {name for name in serial if name.startswith("tests/")} <= set(repeat.MULTIPROCESS_TESTS)
    assert all((ROOT / name).exists() for name in serial)
    torch_notebooks = {str(p.relative_to(ROOT)) for p in TORCH_NOTEBOOKS}
    assert {name for name in serial if name.startswith("notebooks/")} <= torch_notebooks


def test_each_lane_collects_every_file_that_holds_its_tests():
    """Each lane of make test collects only its own files (conftest.py's pytest_ignore_collect),
    and marks every test in them: a lane marker written in a test file would be a second list,
    and a file in both lists would run twice."""
    conftest = _root_conftest()
    marked = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
              if re.search(r"(@|marks=)pytest\.mark\.(serial|heavy)\b", p.read_text())]
    assert marked == []
    assert not set(conftest.TIMED) & set(conftest.UNTIMED)
    assert conftest.SERIAL == conftest.TIMED + conftest.UNTIMED
