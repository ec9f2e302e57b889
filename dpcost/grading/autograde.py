"""The instructor's one command: nbgrader's autograde, with every grade computed outside the kernel.

    python -m dpcost.grading.autograde COURSE            # every assignment, every submission
    python -m dpcost.grading.autograde COURSE ex1 ex3    # these assignments only

COURSE is an nbgrader course folder (``nbgrader_config.py``, ``source/``, ``submitted/``). It
runs nbgrader's own ``autograde`` on each submission, so the gradebook, the autograded
notebooks and the feedback are nbgrader's as usual, with two changes to what nbgrader does to
the course's exercise notebooks:

1. before the student's kernel runs, each grade cell of ours is emptied (the kernel would only
   compute a credit that is then thrown away, and a solution cell can fake what the kernel
   computes: patch ``subprocess.run``, redefine ``submit``);
2. after the kernel has run, each grade cell gets back its source, and as output the report and
   the credit of ``python -I -m dpcost.grading.grade``, started by this process (which never
   runs the student's code) on the cells nbgrader read from the submitted file. That credit is
   what nbgrader records.

The student's code runs only in the grader's confined children (docs/exercises.md). Exit
status: 0 when every submission was graded, 1 when nbgrader failed on one (its log is printed),
2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

from dpcost.grading.grade import GRADE_CELLS

KERNEL_PLACEHOLDER = "# graded outside the kernel by dpcost.grading.autograde\n"
GRADER_TIMEOUT_S = 600


def _exercise(resources: dict) -> str:
    return str(resources.get("unique_key") or resources.get("metadata", {}).get("name", ""))


class EmptyGradeCells(Preprocessor):
    """Before nbgrader's Execute: our grade cells run nothing in the student's kernel."""

    enabled = Bool(True)  # nbconvert's preprocessors are off unless enabled

    def preprocess(self, nb, resources):
        cells = GRADE_CELLS.get(_exercise(resources), {})
        for cell in nb.cells:
            if cell.get("id") in cells and cell.cell_type == "code":
                cell.metadata["dpcost_source"] = cell.source
                cell.source = KERNEL_PLACEHOLDER
        return nb, resources


class OutOfKernelGrades(Preprocessor):
    """After nbgrader's Execute: each grade cell's output is the out-of-kernel grader's."""

    enabled = Bool(True)

    def preprocess(self, nb, resources):
        exercise = _exercise(resources)
        cells = GRADE_CELLS.get(exercise, {})
        if not cells:
            return nb, resources
        with tempfile.TemporaryDirectory(prefix="dpcost-autograde-") as folder:
            path = Path(folder) / f"{exercise}.ipynb"
            path.write_text(json.dumps(nb), encoding="utf-8")
            for cell in nb.cells:
                if cell.get("id") not in cells or cell.cell_type != "code":
                    continue
                cell.source = cell.metadata.pop("dpcost_source", cell.source)
                points = cell.metadata.get("nbgrader", {}).get("points", 1)
                cell.outputs = grade_outputs(path, cells[cell.id], points)
        return nb, resources


def grade_outputs(path: Path, functions: tuple[str, ...], points) -> list:
    """The outputs of one grade cell: the grader's report, then its credit as the cell's value
    (nbgrader's partial credit); an error output (no credit) when the grader gave none."""
    from nbformat.v4 import new_output

    try:
        done = subprocess.run([sys.executable, "-I", "-m", "dpcost.grading.grade", "--points",
                               str(points), str(path), *functions], capture_output=True,
                              text=True, timeout=GRADER_TIMEOUT_S, cwd=path.parent,
                              stdin=subprocess.DEVNULL)
        report, _, score = done.stdout.rpartition("\nscore: ")
        credit = float(score) if done.returncode == 0 and report else None
        why = done.stderr[-2000:]
    except (subprocess.TimeoutExpired, ValueError) as exc:
        credit, report, why = None, "", str(exc)
    if credit is None:
        return [new_output("error", ename="GradingError", evalue=f"the grader gave no credit: "
                           f"{why.strip() or 'no score line'}", traceback=[])]
    return [new_output("stream", name="stdout", text=report + "\n"),
            new_output("execute_result", data={"text/plain": f"{credit:g}"},
                       execution_count=None)]


def nbgrader_api(course: Path):
    """nbgrader's NbGraderAPI on ``course``, configured by its nbgrader_config.py, with the
    two preprocessors around Execute and a time limit per cell of at least 300 s."""
    from nbgrader.apps import NbGrader, NbGraderAPI
    from nbgrader.converters import Autograde
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.preprocessors import Execute

    app = NbGrader()
    app.config_file_paths.append(str(course))
    app.load_config_file()
    config = app.config
    chain = list(Autograde.class_traits()["autograde_preprocessors"].default())
    if "autograde_preprocessors" in config.Autograde:
        chain = list(config.Autograde.autograde_preprocessors)
    at = chain.index(Execute)
    config.Autograde.autograde_preprocessors = (
        chain[:at] + [EmptyGradeCells, Execute, OutOfKernelGrades] + chain[at + 1:])
    if "timeout" not in config.Execute:
        config.Execute.timeout = 300  # a notebook cell of ex3 trains on 2 ranks, twice
    return NbGraderAPI(coursedir=CourseDirectory(root=str(course), config=config),
                       config=config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dpcost.grading.autograde",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("course", type=Path, help="the nbgrader course folder (holds "
                        "nbgrader_config.py, source/ and submitted/)")
    parser.add_argument("assignments", nargs="*", help="assignments to grade (default: every "
                        "folder in source/)")
    args = parser.parse_args(argv)
    course = args.course.resolve()
    if not (course / "source").is_dir():
        parser.error(f"course must be an nbgrader course folder with source/; got "
                     f"{str(args.course)!r}")
    assignments = args.assignments or sorted(p.name for p in (course / "source").iterdir()
                                             if p.is_dir())
    missing = [a for a in assignments if not (course / "source" / a).is_dir()]
    if missing:
        parser.error(f"assignments must be folders of {course / 'source'}; got {missing[0]!r}")
    # nbgrader starts alembic by name: this environment's bin goes first on PATH
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent),
                                          os.environ.get("PATH", "")])
    os.chdir(course)
    api = nbgrader_api(course)
    failed = 0
    for assignment in assignments:
        submitted = course / "submitted"
        students = sorted(p.name for p in submitted.iterdir()
                          if (p / assignment).is_dir()) if submitted.is_dir() else []
        if students and not _in_gradebook(api, assignment):  # autograde needs it there
            done = api.generate_assignment(assignment, force=True, create=True)
            if not done["success"]:
                print(done.get("error", "") + done.get("log", "")[-3000:], file=sys.stderr)
                return 1
        for student in students:
            done = api.autograde(assignment, student, force=True, create=True)
            if not done["success"]:
                failed += 1
                print(f"{assignment} {student}: nbgrader failed\n"
                      + done.get("error", "") + done.get("log", "")[-3000:], file=sys.stderr)
                continue
            print(f"{assignment} {student}: {submission_score(api, assignment, student)}")
    return 1 if failed else 0


def _gradebook(api):
    from nbgrader.api import Gradebook

    return Gradebook(api.coursedir.db_url, course_id=api.coursedir.course_id)


def _in_gradebook(api, assignment: str) -> bool:
    from nbgrader.api import MissingEntry

    with _gradebook(api) as gradebook:
        try:
            gradebook.find_assignment(assignment)
        except MissingEntry:
            return False
    return True


def submission_score(api, assignment: str, student: str) -> str:
    """'X / Y' points of one autograded submission, from nbgrader's gradebook."""
    with _gradebook(api) as gradebook:
        submission = gradebook.find_submission(assignment, student)
        return f"{submission.score:g} / {submission.max_score:g}"


if __name__ == "__main__":
    sys.exit(main())
