"""One master, two versions: the generator and the committed notebooks' sync."""

import nbformat
import pytest

from dpcost.grading.student import (
    STUDENT_DIR,
    WIDGET_STATE,
    WIDGET_VIEW,
    main,
    make_student,
    pairs,
    stable_widget_ids,
    structure,
    student_source,
)

MASTER = """def f(x):
    \"\"\"Doc.\"\"\"
    ### BEGIN SOLUTION
    return x + 1
    ### END SOLUTION"""


def test_solution_becomes_an_indented_friendly_stub():
    out = student_source(MASTER, "code")
    assert "return x + 1" not in out and "BEGIN SOLUTION" not in out
    assert out.splitlines()[:2] == ["def f(x):", '    """Doc."""']
    assert out.splitlines()[2] == "    # YOUR CODE HERE"
    assert out.splitlines()[3].startswith("    raise NotImplementedError('f is not written yet")
    assert "check(f)" in out
    namespace = {}
    exec(out, namespace)
    with pytest.raises(NotImplementedError, match="f is not written yet"):
        namespace["f"](1)


def test_hidden_tests_removed_and_markdown_answer():
    source = "x = 1\n### BEGIN HIDDEN TESTS\nassert x == 1\n### END HIDDEN TESTS\ny = 2"
    assert student_source(source, "code") == "x = 1\ny = 2"
    md = "Why?\n### BEGIN SOLUTION\nBecause.\n### END SOLUTION"
    assert student_source(md, "markdown") == "Why?\nYOUR ANSWER HERE"


@pytest.mark.parametrize("bad", ["### BEGIN SOLUTION\nx = 1",
                                 "x = 1\n### END SOLUTION",
                                 "### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION"])
def test_unbalanced_markers(bad):
    with pytest.raises(ValueError, match="cell 3"):
        student_source(bad, "code", "cell 3")


def test_make_student_keeps_ids_drops_hidden_only_cells_and_outputs():
    cells = [nbformat.v4.new_code_cell(MASTER), nbformat.v4.new_code_cell(
        "### BEGIN HIDDEN TESTS\nassert True\n### END HIDDEN TESTS")]
    cells[0].outputs = [nbformat.v4.new_output("stream", text="hi")]
    cells[0].execution_count = 3
    master = nbformat.v4.new_notebook(cells=cells)
    student = make_student(master)
    assert [c.id for c in student.cells] == [cells[0].id]
    assert student.cells[0].outputs == [] and student.cells[0].execution_count is None
    assert "return x + 1" in master.cells[0].source  # the master is left untouched


def test_there_are_three_exercises():
    assert [s.name for _, s in pairs()] == ["ex1_five_functions.ipynb", "ex2_ring_step.ipynb",
                                            "ex3_migrate.ipynb"]


@pytest.mark.parametrize("master_path, student_path", pairs())
def test_committed_student_version_is_what_the_generator_writes(master_path, student_path):
    master = nbformat.read(master_path, as_version=4)
    committed = nbformat.read(student_path, as_version=4)
    assert structure(committed) == structure(make_student(master))
    assert student_path.parent == STUDENT_DIR
    assert any("### BEGIN SOLUTION" in c.source for c in master.cells)
    for cell in committed.cells:
        assert "BEGIN SOLUTION" not in cell.source and "HIDDEN TESTS" not in cell.source
        if cell.cell_type == "code":  # committed executed, without errors
            assert cell.execution_count is not None
            assert all(out.output_type != "error" for out in cell.outputs)


# Stubs report failures and solutions pass: nbval checks that in the six exercise notebooks,
# whose committed submit() outputs read "Score: 0/16 tests passed" (student) and "16/16" (master)
# for the same battery. (A test here ran those cells again, 19 s of CPU; issue 19 merged it.)


def test_grade_cells_stay_and_cells_lock_as_nbgrader_locks_them():
    def grader(kind):
        return {"grade": kind == "grade", "solution": kind == "solution",
                "locked": kind != "solution", "grade_id": kind, "schema_version": 3,
                **({"points": 1} if kind == "grade" else {})}

    cells = [nbformat.v4.new_markdown_cell("Task."), nbformat.v4.new_code_cell(MASTER),
             nbformat.v4.new_code_cell("### BEGIN HIDDEN TESTS\nassert f(1) == 2\n"
                                       "### END HIDDEN TESTS")]
    for cell, kind in zip(cells, ["readonly", "solution", "grade"], strict=True):
        cell.metadata["nbgrader"] = grader(kind)
    student = make_student(nbformat.v4.new_notebook(cells=cells))
    task, solution, grade = student.cells  # nbgrader keeps a grade cell emptied of hidden tests
    assert grade.source == "" and "assert" not in grade.source
    assert (task.metadata["editable"], task.metadata["deletable"]) == (False, False)
    assert (grade.metadata["editable"], grade.metadata["deletable"]) == (False, False)
    assert solution.metadata["deletable"] is False and "editable" not in solution.metadata
    assert all("editable" not in c.metadata for c in cells)  # the master is left untouched


def _executed_with_widgets(box_id: str, button_id: str):
    """A notebook as nbclient leaves it: a box shown by a cell, a button inside it."""
    cell = nbformat.v4.new_code_cell("hint_button()", id="hints")  # a fixed cell id, as committed
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        WIDGET_VIEW: {"model_id": box_id, "version_major": 2, "version_minor": 0},
        "text/plain": "HintButton(...)"})]
    notebook = nbformat.v4.new_notebook(cells=[cell])
    state = {box_id: {"model_name": "VBoxModel",
                      "state": {"children": [f"IPY_MODEL_{button_id}"]}},
             button_id: {"model_name": "ButtonModel", "state": {"description": "Show hint 1"}}}
    notebook.metadata["widgets"] = {WIDGET_STATE: {"version_major": 2, "version_minor": 0,
                                                   "state": state}}
    return notebook


def test_widget_ids_are_renamed_in_a_fixed_order():
    """Two runs draw different random ids; after renaming, the files are the same, and the box
    still shows the button."""
    first = stable_widget_ids(_executed_with_widgets("a" * 32, "b" * 32), "ex.ipynb")
    second = stable_widget_ids(_executed_with_widgets("c" * 32, "d" * 32), "ex.ipynb")
    assert nbformat.writes(first) == nbformat.writes(second)
    state = first.metadata["widgets"][WIDGET_STATE]["state"]
    box = first.cells[0].outputs[0]["data"][WIDGET_VIEW]["model_id"]
    (button,) = set(state) - {box}
    assert state[box]["state"]["children"] == [f"IPY_MODEL_{button}"]
    assert "a" * 32 not in nbformat.writes(first)


def test_check_says_how_many_notebooks_match(capsys):
    assert main(["--check"]) == 0
    said = capsys.readouterr().out.strip()
    assert said == f"{len(pairs())} student notebooks match their masters"
