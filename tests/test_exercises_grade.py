"""The grader that nbgrader's grade cells start: a new interpreter, the notebook's file, no dpcost
in the student's code. (tests/test_nbgrader.py runs it under nbgrader's autograde.)"""

import json
import subprocess
import sys

import pytest

from dpcost.exercises import MASTER_DIR
from dpcost.grading.grade import StudentCode, student_cells


def _grade(folder, *args):
    return subprocess.run([sys.executable, "-I", "-m", "dpcost.grading.grade", *args],
                          cwd=folder, capture_output=True, text=True, timeout=120)


def _notebook_with(tmp_path, name, changes):
    notebook = json.loads((MASTER_DIR / name).read_text())
    for cell in notebook["cells"]:
        if cell["id"] in changes:
            cell["source"] = changes[cell["id"]]
    (tmp_path / name).write_text(json.dumps(notebook))


def test_the_masters_solutions_score_full_marks():
    done = _grade(MASTER_DIR, "--points", "2", "ex2_ring_step.ipynb", "reduce_scatter_sends",
                  "all_gather_sends")
    assert done.returncode == 0, done.stderr
    assert "Score: 23/23 tests passed" in done.stdout
    assert done.stdout.endswith("\nscore: 2\n")


def test_the_students_code_cannot_import_dpcosts_answers(tmp_path):
    """A notebook that imports the reference instead of writing it: the function fails, the
    other one (written out) passes, so the score is half."""
    _notebook_with(tmp_path, "ex1_five_functions.ipynb", {
        "solution-3": "from dpcost.core import dp_gpu0_memory_multiplier\n"})
    (tmp_path / "dpcost").mkdir()  # a package beside the notebook is not imported either (-I)
    (tmp_path / "dpcost" / "__init__.py").write_text("raise SystemExit('imported the fake')\n")
    done = _grade(tmp_path, "ex1_five_functions.ipynb", "dp_gpu0_memory_multiplier",
                  "ddp_gpu0_memory_multiplier")
    assert done.returncode == 0, done.stderr
    assert "dp_gpu0_memory_multiplier: 0/16" in done.stdout
    assert "ddp_gpu0_memory_multiplier: 16/16" in done.stdout
    assert "the grader runs your code without the dpcost package" in done.stdout
    assert done.stdout.endswith("\nscore: 0.5\n")


def test_a_cell_that_raises_or_exits_does_not_stop_the_others():
    cells = [("a", "def f(x):\n    return x + 1\n"), ("b", "raise SystemExit('no')\n"),
             ("c", "%timeit f(1)\n"), ("d", "g = f\n")]
    assert StudentCode(cells, "g", allow_dpcost=True)(1) == 2
    with pytest.raises(NameError, match=r"h is not defined by the notebook's cells \(cell b "
                                        r"raised SystemExit: no\)"):
        StudentCode(cells, "h", allow_dpcost=True).load()


def test_grade_cells_and_the_checkers_imports_are_not_the_students_code():
    notebook = json.loads((MASTER_DIR / "ex2_ring_step.ipynb").read_text())
    ids = [cell_id for cell_id, _ in student_cells(notebook, ("imports",))]
    assert ids[:2] == ["solution-rs", "check-rs"]
    assert not {"imports", "grade-rs", "grade-ag", "grade-both"} & set(ids)


@pytest.mark.parametrize("args, message", [
    (["ex9.ipynb", "f"], "notebook must be one of ex1_five_functions.ipynb"),
    (["ex2_ring_step.ipynb", "f"], "functions of ex2_ring_step are reduce_scatter_sends"),
    (["--points", "0", "ex2_ring_step.ipynb", "all_gather_sends"], "--points must be"),
    (["--points", "nan", "ex2_ring_step.ipynb", "all_gather_sends"], "--points must be"),
])
def test_bad_arguments_get_one_line(tmp_path, args, message):
    done = _grade(tmp_path, *args)
    assert done.returncode == 2 and message in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("python -I -m dpcost.grading.grade")


def test_a_missing_notebook_names_it(tmp_path):
    done = _grade(tmp_path, "ex1_five_functions.ipynb", "dp_communication_volume")
    assert done.returncode == 2 and "notebook 'ex1_five_functions.ipynb' cannot be read" in (
        done.stderr)
