"""nbgrader accepts the masters: its own preprocessors make the committed student versions of them.

nbgrader's ``generate_assignment`` runs a fixed chain of preprocessors on each master; the ones
that need no course database run here, in its order, on notebooks/instructor/ex*.ipynb. What
comes out must equal notebooks/ex*.ipynb (written by dpcost.grading.student) cell by cell -
type, id, source and metadata - apart from the stub's message: nbgrader writes
``raise NotImplementedError()``, the course names the function to write. Outputs are not
compared (the student versions are committed executed). Then the grading itself, end to end with
nbgrader's own ``generate_assignment`` and ``autograde`` on one course directory: a correct
submission scores full marks (ex1, ex2; ex3's: see STUDENTS), a wrong one what its tests say,
and one that forges ``submit`` (and patches the checker's modules) scores 0 on every grade cell.
"""

from __future__ import annotations

import copy
import io
import json
import os
import re
import sys
import warnings
from pathlib import Path

import nbformat
import pytest

from dpcost.grading import autograde
from dpcost.grading.student import make_student, pairs

pytest.importorskip("nbgrader", reason="nbgrader (a dev dependency) is not installed")

from nbgrader.nbgraderformat import MetadataValidator  # noqa: E402
from nbgrader.preprocessors import (  # noqa: E402
    CheckCellMetadata,
    ClearHiddenTests,
    ClearMarkScheme,
    ClearOutput,
    ClearSolutions,
    ComputeChecksums,
    IncludeHeaderFooter,
    LockCells,
)

PAIRS = pairs()
MASTER_PATHS = {master.stem: master for master, _ in PAIRS}
IDS = [master.stem for master, _ in PAIRS]
POINTS = {"ex1_five_functions": 5, "ex2_ring_step": 3, "ex3_migrate": 2}
# nbgrader's GenerateAssignment.preprocessors, less InstantiateTests (no AUTOTEST cells here) and
# SaveCells (writes nbgrader's database).
CHAIN = [IncludeHeaderFooter, LockCells, ClearSolutions, ClearOutput, CheckCellMetadata,
         ComputeChecksums, ClearHiddenTests, ClearMarkScheme, ComputeChecksums, CheckCellMetadata]


def nbgrader_release(master):
    """What nbgrader's generate_assignment makes of ``master`` (a copy; the master is kept)."""
    notebook = copy.deepcopy(master)
    resources = {}
    for preprocessor in CHAIN:
        notebook, resources = preprocessor().preprocess(notebook, resources)
    return notebook


def _course_stub_to_nbgraders(source: str) -> str:
    # The course's stub names the function; nbgrader's is the bare exception.
    return re.sub(r"^(\s*# YOUR CODE HERE\n\s*)raise NotImplementedError\(.*\)$",
                  r"\1raise NotImplementedError()", source, flags=re.M)


def comparable(notebook) -> list[tuple]:
    cells = []
    for cell in notebook.cells:
        metadata = {k: v for k, v in cell.metadata.items() if k != "execution"}
        if "nbgrader" in metadata:  # checksums and cell type: nbgrader's database's business
            metadata["nbgrader"] = {k: v for k, v in metadata["nbgrader"].items()
                                    if k not in ("checksum", "cell_type")}
        cells.append((cell.cell_type, cell.id, _course_stub_to_nbgraders(cell.source),
                      metadata))
    return cells


def _grader(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


@pytest.mark.parametrize("master_path, student_path", PAIRS, ids=IDS)
def test_nbgrader_makes_the_committed_student_version(master_path, student_path):
    master = nbformat.read(master_path, as_version=4)
    released = nbgrader_release(master)
    committed = nbformat.read(student_path, as_version=4)
    assert [c.id for c in released.cells] == [c.id for c in committed.cells]
    for mine, nbgraders in zip(comparable(committed), comparable(released), strict=True):
        assert mine == nbgraders
    # nbgrader really did something: solutions gone, hidden tests gone, cells locked
    assert any("### BEGIN SOLUTION" in c.source for c in master.cells)
    assert all("BEGIN SOLUTION" not in c.source and "HIDDEN TESTS" not in c.source
               for c in released.cells)
    assert any(c.metadata.get("editable") is False for c in released.cells)


@pytest.mark.parametrize("master_path", [m for m, _ in PAIRS], ids=IDS)
def test_masters_carry_valid_nbgrader_metadata(master_path):
    master = nbformat.read(master_path, as_version=4)
    MetadataValidator().validate_nb(master)  # nbgrader's own schema check
    graded = [_grader(c) for c in master.cells if _grader(c).get("grade")]
    assert sum(g["points"] for g in graded) == POINTS[master_path.stem]
    for cell in master.cells:
        grader = _grader(cell)
        if cell.cell_type == "markdown":  # the instructions are read-only
            assert grader.get("locked"), f"markdown cell {cell.id} is not locked"
        if not grader:  # a free cell: check(...), submit(...), the hint buttons
            assert "### BEGIN" not in cell.source, cell.id
            continue
        assert grader["schema_version"] == 3 and grader["grade_id"] == cell.id
        assert grader["solution"] == ("### BEGIN SOLUTION" in cell.source), cell.id
        assert grader["grade"] == ("### BEGIN HIDDEN TESTS" in cell.source), cell.id
        if grader["grade"]:
            assert grader["locked"] and cell.source.startswith("# Autograded by nbgrader")


def test_without_the_metadata_nbgrader_refuses_the_masters():
    """The failure the metadata fixes: solution markers in cells nbgrader does not know."""
    master = nbformat.read(PAIRS[0][0], as_version=4)
    for cell in master.cells:
        cell.metadata.pop("nbgrader", None)
    with pytest.raises(RuntimeError, match="Solution region detected in a non-solution cell"):
        nbgrader_release(master)


# ---- end to end: nbgrader's generate_assignment and autograde --------------------------------

ASSIGNMENTS = {"ex1": "ex1_five_functions", "ex2": "ex2_ring_step", "ex3": "ex3_migrate"}
KINDS = ("correct", "wrong", "forged")  # the three students
# ex3 has no correct student: its grade cell would run the master's solution again (a kernel
# with torch, the battery on 2 gloo ranks: about 6 s of CPU). notebooks/instructor/ex3_migrate
# .ipynb runs it under nbval, which checks its output (16/16, credit 2.0), and that output is
# full marks by nbgrader's own determine_grade (test_validate_fails_the_stubs_by_the_grade_cells_
# credit). ex3's wrong student goes through the same autograde and gets its partial credit.
STUDENTS = {"ex1": KINDS + ("eve", "eve_honest"), "ex2": KINDS,
            "ex3": ("wrong", "forged", "alone", "alone_forged")}
# Issue 39's forgeries, each beside the same code without the forgery. ex1's eve: the right
# formulas without the contract's input checks (partial credit), plus a subprocess.run that
# says full marks. ex3's alone_forged: no DDP (train_dp on the public data) and a made-up perfect
# report (the rank{N}.json file, a line on every descriptor, os._exit(0)), plus the same
# subprocess.run; alone: each rank trains train_dp alone and returns it.
FAKE_GRADER = """
import subprocess


def _fake_run(args, *rest, **kwargs):  # a grader that always says full marks
    return subprocess.CompletedProcess(args, 0, "all passed\\nscore: {points}", "")


subprocess.run = _fake_run
"""
NO_CHECKS = {
    "solution-1": "def dp_communication_volume(model_size_bytes, num_gpus):\n"
                  "    n = num_gpus\n"
                  "    return 0.0 if n <= 1 else float(2 * (n - 1) * model_size_bytes)\n",
    "solution-2": None,  # NO_CHECKS_DDP, below
    "solution-3": "def dp_gpu0_memory_multiplier(num_gpus):\n    return float(num_gpus)\n",
    "solution-4": "def ddp_gpu0_memory_multiplier(num_gpus):\n    return 1.0\n",
    "solution-5": "def communication_reduction_factor(model_size_bytes, num_gpus):\n"
                  "    return 1.0 if num_gpus <= 1 else float(num_gpus)\n",
}
FORGED_SUBMIT = """
class _Passed:
    total, passed, all_passed = 27, 27, True

    def __getattr__(self, name):
        return 27


def submit(*args, **kwargs):  # the forgery: every grade cell that calls submit() passes
    return _Passed()


report = submit()
import importlib
import subprocess
import sys

for _module in ("dpcost.exercises.five_functions", "dpcost.exercises.ring_step",
                "dpcost.exercises.migrate_check"):  # and the checker's modules, patched
    _checker = importlib.import_module(_module)
    _checker.submit = submit
    for _name in ("battery_report", "simulator_report", "settings_report"):
        if hasattr(_checker, _name):
            setattr(_checker, _name, submit)
_real_run = subprocess.run


def _fake_run(args, *rest, **kwargs):  # a grader that always says full marks
    return subprocess.CompletedProcess(args, 0, "all passed\nscore: 2", "")


subprocess.run = _fake_run
"""
# ex1's wrong submission: one function right, one with the right formula but no input checks
# (partial credit), three returning 0.0.
NO_CHECKS_DDP = ("def ddp_communication_volume(model_size_bytes, num_gpus):\n"
                 "    n = num_gpus\n"
                 "    return 0.0 if n <= 1 else float(2 * (n - 1) / n * model_size_bytes)\n")
WRONG = {
    "ex1": {"solution-2": NO_CHECKS_DDP, "solution-3": "zero", "solution-4": "zero",
            "solution-5": "zero"},
    "ex2": {"solution-ag": "def all_gather_sends(num_ranks, step):\n    return []\n"},
    "ex3": {"solution": "no set_epoch"},
}
NO_CHECKS["solution-2"] = NO_CHECKS_DDP


def _solution(master_source: str) -> str:
    """The master's solution cell without nbgrader's markers: what a student would write."""
    return "\n".join(line for line in master_source.split("\n")
                     if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION"))


def _zero(source: str, value: str = "0.0") -> str:
    """The stub's body replaced by ``return value``."""
    return re.sub(r"# YOUR CODE HERE\n(\s*)raise NotImplementedError\(.*\)",
                  rf"\1return {value}", source)


def _submission(master, kind: str, assignment: str):
    """The student version of ``master`` filled in as a correct, wrong or forged submission."""
    notebook = make_student(master)
    solutions = {c.id: _solution(c.source) for c in master.cells
                 if _grader(c).get("solution")}
    if kind in ("eve", "eve_honest", "alone", "alone_forged"):
        from test_exercises_migrate import ALONE, FORGER

        for cell in notebook.cells:
            if cell.id in NO_CHECKS and assignment == "ex1":
                cell.source = NO_CHECKS[cell.id]
            elif cell.id == "solution":
                cell.source = FORGER if kind == "alone_forged" else ALONE
            elif cell.id == "check":
                cell.source = ""  # a student may clear it; it saves a run of the ranks
        if kind in ("eve", "alone_forged"):
            last = max(i for i, c in enumerate(notebook.cells) if c.id in solutions)
            notebook.cells[last].source += "\n\n" + FAKE_GRADER.replace(
                "{points}", "1" if assignment == "ex1" else "2")
        return notebook
    for cell in notebook.cells:
        if cell.id not in solutions:
            continue
        change = WRONG[assignment].get(cell.id) if kind == "wrong" else None
        if kind == "correct" or (kind == "wrong" and change is None):
            cell.source = solutions[cell.id]
        elif kind == "forged":
            cell.source = _zero(cell.source, "[]" if assignment == "ex2" else "0")
        elif change == "zero":
            cell.source = _zero(cell.source)
        elif change == "no set_epoch":
            cell.source = solutions[cell.id].replace("sampler.set_epoch(epoch)", "pass")
        else:
            cell.source = change
    if kind == "forged":  # the forgery goes in the last solution cell, before the grade cells
        last = max(i for i, c in enumerate(notebook.cells) if c.id in solutions)
        notebook.cells[last].source += "\n\n" + FORGED_SUBMIT
    return notebook


def _venv_path() -> str:
    # nbgrader runs alembic (its database migrations) by name: the venv's bin goes first on PATH
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def _graded_course(tmp_path_factory, assignments: tuple[str, ...]):
    """One nbgrader course with ``assignments``, three students each, all autograded."""
    course = tmp_path_factory.mktemp("course")
    (course / "nbgrader_config.py").write_text(
        "c = get_config()\n"
        "c.CourseDirectory.course_id = 'dpcost'\n"
        "c.Execute.timeout = 300\n")  # ex3's grade cell trains on 2 ranks, twice
    for assignment in assignments:
        stem = ASSIGNMENTS[assignment]
        master = nbformat.read(MASTER_PATHS[stem], as_version=4)
        source = course / "source" / assignment
        source.mkdir(parents=True)
        nbformat.write(master, source / f"{stem}.ipynb")
        for kind in STUDENTS[assignment]:
            folder = course / "submitted" / kind / assignment
            folder.mkdir(parents=True)
            nbformat.write(_submission(master, kind, assignment), folder / f"{stem}.ipynb")
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings():
        # SQLAlchemy's SAWarnings from nbgrader's own session handling (nbgrader/api.py)
        warnings.filterwarnings("ignore", message="Object of type <Submitted")
        patch.setenv("PATH", _venv_path())
        patch.chdir(course)
        # the instructor's one command (docs/teaching.md), in this process: its own nbgrader
        # API, so no new interpreter imports nbgrader
        assert autograde.main([str(course), *assignments]) == 0
    from nbgrader.api import Gradebook

    scores = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", course_id="dpcost") as gradebook:
        for assignment in assignments:
            for kind in STUDENTS[assignment]:
                notebook = gradebook.find_submission_notebook(ASSIGNMENTS[assignment],
                                                              assignment, kind)
                scores[assignment, kind] = {g.name: (g.score, g.max_score)
                                            for g in notebook.grades}
    return course, scores


# One course for the three exercises: generate_assignment and autograde run once for it.
# ex3's grade cells start gloo ranks: the file runs in the lane of untimed ranks (conftest.py).
@pytest.fixture(scope="module")
def course(tmp_path_factory):
    return _graded_course(tmp_path_factory, ("ex1", "ex2", "ex3"))


EACH = ["ex1", "ex2", "ex3"]


@pytest.mark.parametrize("assignment", ["ex1", "ex2"])  # ex3: see STUDENTS
def test_autograde_gives_the_correct_submission_full_marks(course, assignment):
    _, scores = course
    graded = scores[assignment, "correct"]
    assert graded and all(score == full for score, full in graded.values()), graded
    assert sum(full for _, full in graded.values()) == POINTS[ASSIGNMENTS[assignment]]


@pytest.mark.parametrize("assignment", EACH)
def test_autograde_gives_the_forged_submit_nothing(course, assignment):
    """Functions returning 0 (ex2: no sends), a submit() that says all passed, the checker's
    modules and subprocess.run patched: 0 on every grade cell."""
    _, scores = course
    graded = scores[assignment, "forged"]
    assert graded and all(score == 0 for score, _ in graded.values()), graded


@pytest.mark.parametrize("assignment, forged, honest", [("ex1", "eve", "eve_honest"),
                                                        ("ex3", "alone_forged", "alone")])
def test_the_instructors_command_scores_each_forgery_like_the_honest_code(course, assignment,
                                                                          forged, honest):
    """Issue 39: a patched subprocess.run (and, in ex3, a made-up report of ranks that trained
    alone) scored 1.0 of 1 (ex1) and 2.0 of 2 (ex3) under nbgrader's autograde; under the
    instructor's command each grade cell scores what the same code without the forgery does."""
    _, scores = course
    assert scores[assignment, forged] == scores[assignment, honest], scores
    full = sum(points for _, points in scores[assignment, honest].values())
    assert sum(score for score, _ in scores[assignment, honest].values()) < full


def _autograded_output(course, assignment, kind, cell_id) -> str:
    stem = ASSIGNMENTS[assignment]
    notebook = json.loads((course / "autograded" / kind / assignment / f"{stem}.ipynb")
                          .read_text())
    cell = next(c for c in notebook["cells"] if c["id"] == cell_id)
    return "".join("".join(o.get("text", "")) for o in cell["outputs"])


def test_autograde_scores_the_wrong_submissions_by_their_tests(course):
    """ex1: one function right (1), one with the formula but no input checks (partial credit,
    recomputed here by the checker), three returning 0.0 (0: the literal check fails). ex2: a
    right reduce-scatter (1), an empty all-gather (0, and 0 together)."""
    from dpcost.exercises import five_functions

    path, scores = course
    namespace = {}
    exec(NO_CHECKS_DDP, namespace)
    partial = five_functions.submit(namespace["ddp_communication_volume"])
    assert 0 < partial.passed < partial.total == 27
    assert scores["ex1", "wrong"] == {
        "grade-1": (1.0, 1.0), "grade-2": (round(partial.credit(), 2), 1.0),
        "grade-3": (0.0, 1.0), "grade-4": (0.0, 1.0), "grade-5": (0.0, 1.0)}
    assert f"ddp_communication_volume: {partial.passed}/27" in _autograded_output(
        path, "ex1", "wrong", "grade-2")
    assert scores["ex2", "wrong"] == {"grade-rs": (1.0, 1.0), "grade-ag": (0.0, 1.0),
                                      "grade-both": (0.0, 1.0)}


def test_autograde_scores_the_wrong_migration_by_its_tests(course):
    """ex3: no set_epoch, so the order never changes and the parameters drift: 12 of 16 tests,
    1.5 of 2 points."""
    path, scores = course
    assert scores["ex3", "wrong"] == {"submit-hidden": (1.5, 2.0)}
    assert "train_ddp: 12/16" in _autograded_output(path, "ex3", "wrong", "submit-hidden")


# ---- nbgrader's Validate button (the lab extension `make lab` installs) ----------------------

def test_validate_fails_the_stubs_by_the_grade_cells_credit():
    """Issue 22: Validate said "Success!" for the untouched stubs, whose grade cells were empty.
    They now call the grader; Validate reads their credit with nbgrader's own determine_grade:
    0 in every committed student version, full marks in every master."""
    from nbgrader.utils import determine_grade, is_grade

    for master_path, student_path in PAIRS:
        for path, full in ((student_path, False), (master_path, True)):
            cells = [c for c in nbformat.read(path, as_version=4).cells
                     if is_grade(c) and c.cell_type == "code"]
            assert len(cells) == len([c for c in nbformat.read(master_path, as_version=4).cells
                                      if _grader(c).get("grade")])
            for cell in cells:
                score, points = determine_grade(cell)
                assert score == (points if full else 0), (path.name, cell.id, score)


def test_nbgrader_validate_fails_the_released_stubs(tmp_path):
    """The Validate button on ex2 as released: it said "Success! Your notebook passes all the
    tests." before. The button's server handler calls nbgrader's Validator in the server's process
    (nbgrader/server_extensions/validate_assignment/handlers.py), as `nbgrader validate` does
    (apps/validateapp.py: validate_and_print); so does this test, and reads what it prints. (That
    a correct notebook gets full marks from the same cells: the autograde tests above, and the
    masters' credit.)"""
    from nbgrader.validator import Validator

    master = nbformat.read(MASTER_PATHS["ex2_ring_step"], as_version=4)
    nbformat.write(make_student(master), tmp_path / "ex2_ring_step.ipynb")
    validator = Validator()
    validator.stream = io.StringIO()
    validator.validate_and_print(str(tmp_path / "ex2_ring_step.ipynb"))
    said = validator.stream.getvalue()
    assert "Success!" not in said and "VALIDATION FAILED ON 3 CELL(S)" in said, said
    assert said.count("Partial credit; passed some but not all of the tests") == 3, said
