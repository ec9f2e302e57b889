"""nbgrader accepts the masters: its own preprocessors make the committed student versions of them.

nbgrader's ``generate_assignment`` runs a fixed chain of preprocessors on each master; the ones
that need no course database run here, in its order, on notebooks/instructor/ex*.ipynb. What
comes out must equal notebooks/ex*.ipynb (written by dpcost.exercises.student) cell by cell -
type, id, source and metadata - apart from the stub's message: nbgrader writes
``raise NotImplementedError()``, the course names the function to write. Outputs are not
compared (the student versions are committed executed). Then the grading itself: the hidden
tests, put back into the student version as nbgrader's autograder does, give the stubs no
points and the solutions all of them.
"""

from __future__ import annotations

import copy
import re

import nbformat
import pytest

from dpcost.exercises.student import pairs

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


def points_scored(notebook, master) -> tuple[int, int]:
    """Autograde ``notebook`` as nbgrader does: grade cells' sources come back from ``master``
    (its OverwriteCells), every code cell runs in one namespace, a grade cell that raises
    scores 0. Returns (points scored, points possible)."""
    hidden = {c.id: c.source for c in master.cells if _grader(c).get("grade")}
    namespace = {"__name__": "__main__"}
    scored = possible = 0
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        source = hidden.get(cell.id, cell.source)
        try:
            exec(compile(source, f"<cell {cell.id}>", "exec"), namespace)
            passed = True
        except AssertionError:
            passed = False
        if cell.id in hidden:
            points = _grader(cell)["points"]
            possible += points
            scored += points if passed else 0
    return scored, possible


@pytest.mark.parametrize("master_path, student_path", PAIRS, ids=IDS)
def test_hidden_tests_give_stubs_nothing_and_solutions_everything(master_path, student_path):
    master = nbformat.read(master_path, as_version=4)
    student = nbformat.read(student_path, as_version=4)
    assert points_scored(student, master) == (0, POINTS[master_path.stem])
    full = POINTS[master_path.stem]
    assert points_scored(master, master) == (full, full)
