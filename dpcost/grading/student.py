"""Write the student notebooks from the instructor masters (one master, two versions).

Convention: nbgrader's markers, so instructors who know nbgrader read the masters as usual.
In a code cell, the lines from ``### BEGIN SOLUTION`` to ``### END SOLUTION`` become a stub
(``# YOUR CODE HERE`` and a ``raise NotImplementedError("...")`` naming the function to
write), indented like the markers; in a markdown cell they become "YOUR ANSWER HERE". The
lines from ``### BEGIN HIDDEN TESTS`` to ``### END HIDDEN TESTS`` are removed; a cell left
empty by that is dropped, unless it is one of nbgrader's grade cells (nbgrader keeps those).
Every other cell is kept as is, with its id and metadata; outputs and execution counts are
cleared, and the student notebook is then executed so it is committed executed.

The masters carry nbgrader's cell metadata (solution, grade and read-only cells), and the
result is what nbgrader's own ``generate_assignment`` preprocessors make of them apart from the
stub's message (``tests/test_nbgrader.py`` checks it): cells are locked as nbgrader's
``LockCells`` locks them (``editable``/``deletable``), and nbgrader's per-cell checksums, which
only its own database uses, are left out. Before that, the hints in the masters' markdown are
rewritten from ``dpcost.exercises.hints.HINTS``.

    python -m dpcost.grading.student            # write + execute notebooks/ex*.ipynb
    python -m dpcost.grading.student --check    # exit 1 if a committed one is out of sync
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path

from dpcost.exercises import MASTER_DIR, ROOT, STUDENT_DIR

BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


def _stub(indent: str, function: str | None) -> list[str]:
    what = function or "this part"
    message = (f"{what} is not written yet: replace this line with your code"
               + (f", then run check({function})" if function else "") + ". Stuck? Try the hints.")
    return [f"{indent}# YOUR CODE HERE", f"{indent}raise NotImplementedError({message!r})"]


def _regions(lines: list[str], begin: str, end: str, where: str):
    """Yield (start, stop) line indices of each begin..end region (inclusive)."""
    start = None
    for i, line in enumerate(lines):
        text = line.strip()
        if text == begin:
            if start is not None:
                raise ValueError(f"{where}: {begin!r} inside another region (line {i + 1})")
            start = i
        elif text == end:
            if start is None:
                raise ValueError(f"{where}: {end!r} without {begin!r} (line {i + 1})")
            yield start, i
            start = None
    if start is not None:
        raise ValueError(f"{where}: {begin!r} at line {start + 1} is never closed")


def student_source(source: str, cell_type: str, where: str = "cell") -> str:
    """The student version of one cell's source (solutions stubbed, hidden tests removed)."""
    lines = source.split("\n")
    for start, stop in reversed(list(_regions(lines, BEGIN_HIDDEN, END_HIDDEN, where))):
        del lines[start: stop + 1]
    for start, stop in reversed(list(_regions(lines, BEGIN_SOLUTION, END_SOLUTION, where))):
        indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
        if cell_type == "markdown":
            replacement = ["YOUR ANSWER HERE"]
        else:
            defs = [re.match(r"\s*def (\w+)", line) for line in lines[:start]]
            names = [m.group(1) for m in defs if m]
            replacement = _stub(indent, names[-1] if names else None)
        lines[start: stop + 1] = replacement
    return "\n".join(lines).rstrip("\n")


def lock(cell) -> None:
    """Lock ``cell`` as nbgrader's ``LockCells`` does: solution cells cannot be deleted, grade
    and read-only cells can be neither deleted nor edited (nbformat's standard cell keys)."""
    grader = cell.metadata.get("nbgrader", {})
    if grader.get("solution"):
        cell.metadata["deletable"] = False
    elif grader.get("grade") or grader.get("locked"):
        cell.metadata["deletable"] = False
        cell.metadata["editable"] = False


def make_student(master):
    """The student notebook (a new nbformat node) made from the master notebook."""
    student = copy.deepcopy(master)
    cells = []
    for index, cell in enumerate(student.cells):
        hidden = BEGIN_HIDDEN in cell.source
        cell.source = student_source(cell.source, cell.cell_type, f"cell {index}")
        if hidden and not cell.source.strip() and not cell.metadata.get("nbgrader"):
            continue  # the cell held only hidden tests
        lock(cell)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        cell.metadata.pop("execution", None)
        cells.append(cell)
    student.cells = cells
    student.metadata.pop("widgets", None)
    return student


def structure(notebook) -> list[tuple]:
    """What must match between a committed and a generated notebook: cells, ids, sources."""
    return [(cell.cell_type, cell.get("id"), cell.source,
             {k: v for k, v in cell.metadata.items() if k != "execution"})
            for cell in notebook.cells]


def pairs() -> list[tuple[Path, Path]]:
    """(master, student) paths for every exercise master."""
    return [(path, STUDENT_DIR / path.name) for path in sorted(MASTER_DIR.glob("ex*.ipynb"))]


def execute(notebook, path: Path) -> None:
    """Run ``notebook`` top to bottom in a fresh python3 kernel (working dir: its folder)."""
    from nbclient import NotebookClient

    NotebookClient(notebook, timeout=300, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(path.parent)}}).execute()


WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def stable_widget_ids(notebook, name: str):
    """``notebook`` (executed) with its widget model ids renamed in a fixed order, so that
    executing it again writes the same file (ipywidgets draws the ids at random, uuid4).

    The order: the models the outputs show, cell by cell, then the models they refer to
    (``IPY_MODEL_<id>`` in their state), breadth first; each gets uuid5(``name``/position).
    Returns a new nbformat node.
    """
    import json
    import uuid

    import nbformat

    state = notebook.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    if not state:
        return notebook
    order = [output.get("data", {}).get(WIDGET_VIEW, {}).get("model_id")
             for cell in notebook.cells for output in cell.get("outputs", [])]
    order = list(dict.fromkeys(m for m in order if m in state))
    for model in order:  # grows while it is walked: breadth first
        text = json.dumps(state[model], sort_keys=True)
        order += [m for m in dict.fromkeys(re.findall(r"IPY_MODEL_([0-9a-f]{32})", text))
                  if m in state and m not in order]
    order += sorted(set(state) - set(order))  # models nothing shows: none in these notebooks
    text = nbformat.writes(notebook)
    for position, model in enumerate(order):
        text = text.replace(model, uuid.uuid5(uuid.NAMESPACE_URL, f"{name}/{position}").hex)
    return nbformat.reads(text, as_version=4)


def main(argv: list[str] | None = None) -> int:
    import nbformat

    from dpcost.exercises.hints import sync_notebook

    parser = argparse.ArgumentParser(prog="python -m dpcost.grading.student",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="only compare the committed student notebooks with the masters")
    parser.add_argument("--no-execute", action="store_true", help="write without executing")
    args = parser.parse_args(argv)
    stale = []
    for master_path, student_path in pairs():
        master = nbformat.read(master_path, as_version=4)
        if sync_notebook(master):  # the hints in the master's markdown were stale
            if args.check:
                stale.append(master_path)
            else:
                nbformat.write(master, master_path)
                print(f"rewrote the hints in {master_path.relative_to(ROOT)}")
        student = make_student(master)
        if args.check:
            committed = nbformat.read(student_path, as_version=4) if student_path.exists() else None
            if committed is None or structure(committed) != structure(student):
                stale.append(student_path)
            continue
        if not args.no_execute:
            # The grade cells grade the notebook's file: it must be this version when they run.
            nbformat.write(student, student_path)
            execute(student, student_path)
            student = stable_widget_ids(student, student_path.name)
        nbformat.write(student, student_path)
        print(f"wrote {student_path.relative_to(ROOT)} from {master_path.relative_to(ROOT)}")
    for path in stale:
        print(f"out of sync: {path.relative_to(ROOT)} (run: python -m dpcost.grading.student)")
    if args.check and not stale:
        print(f"{len(pairs())} student notebooks match their masters")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
