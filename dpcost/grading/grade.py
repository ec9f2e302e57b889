"""Grade an exercise notebook from its file, in fresh processes: what nbgrader's grade cells run.

    python -I -m dpcost.grading.grade ex1_five_functions.ipynb dp_communication_volume
    python -I -m dpcost.grading.grade --points 2 ex3_migrate.ipynb train_ddp

The kernel that runs a student's notebook runs the student's code, so nothing in it can be
trusted to grade: a cell can redefine ``submit``, or patch any module the kernel has loaded. So
the grade cells start this module in a **new interpreter** (``-I``: no current directory, no
PYTHONPATH on its import path, so a ``dpcost/`` folder beside the notebook is not imported). It

1. reads the notebook **file** (the one nbgrader is grading) and takes the student's code from
   it: every code cell in order, except nbgrader's grade cells and the cell that imports the
   checkers (``check``, ``submit`` and the hints are no-ops here);
2. runs the battery of ``submit`` (the same tests, the same expected values, computed here), with
   the student's code executed only in the sandbox's children, confined as
   ``dpcost.grading.confine`` says (another uid, new PID, mount and network namespaces where
   allowed, resource limits): a child runs the cells, then calls the function, and sends back
   plain values. For ex1 and ex2 the ``dpcost`` package cannot
   be imported there (the reference answers live in it); ex3 gives the cells the names its
   import cell gives the student (``train_dp``, ``make_model``, ...);
3. prints the report, then ``score: X`` last: ``--points`` times ``Report.credit`` (ex1: 80 %
   for the formula and n <= 1, 20 % for the input checks; else the fraction of tests passed),
   rounded to 2 decimals - the partial credit the grade cell hands to nbgrader - where the
   tests of a function that fails its literal check count as failed (:data:`LITERAL`: one exact
   value on an input no worked example uses, so a function returning 0 collects nothing).

``python -m dpcost.grading.autograde`` (the instructor's command) runs this for each grade
cell of each submission, from outside the student's kernel.

Exit status: 0 when it graded (whatever the score), 2 for bad arguments or an unreadable
notebook. What this protects and what it cannot: docs/teaching.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# notebook stem: (functions it grades, the cells that import the checkers, dpcost allowed there)
EXERCISES = {
    "ex1_five_functions": (("dp_communication_volume", "ddp_communication_volume",
                            "dp_gpu0_memory_multiplier", "ddp_gpu0_memory_multiplier",
                            "communication_reduction_factor"), ("imports",), False),
    "ex2_ring_step": (("reduce_scatter_sends", "all_gather_sends"), ("imports",), False),
    "ex3_migrate": (("train_ddp",), ("imports", "given"), True),
}
# notebook stem: {grade cell id: the functions its credit grades} (dpcost.grading.autograde)
GRADE_CELLS = {
    "ex1_five_functions": {f"grade-{i}": (name,) for i, name in
                           enumerate(EXERCISES["ex1_five_functions"][0], start=1)},
    "ex2_ring_step": {"grade-rs": ("reduce_scatter_sends",), "grade-ag": ("all_gather_sends",),
                      "grade-both": ("reduce_scatter_sends", "all_gather_sends")},
    "ex3_migrate": {"submit-hidden": ("train_ddp",)},
}
# no-ops in the student's namespace
_COURSE_NAMES = ("check", "submit", "hint", "hint_button", "solution")


def _noop(*args, **kwargs):
    return None


class _NoDpcost:
    """An import hook (first on ``sys.meta_path``) that refuses the dpcost package."""

    def find_spec(self, name, path=None, target=None):
        if name == "dpcost" or name.startswith("dpcost."):
            raise ImportError(f"{name}: the grader runs your code without the dpcost package, "
                              "whose reference answers you are to write yourself")
        return None


def _block_dpcost() -> None:
    sys.meta_path.insert(0, _NoDpcost())
    for module in [m for m in sys.modules if m == "dpcost" or m.startswith("dpcost.")]:
        del sys.modules[module]


def _python_source(source: str) -> str:
    """A cell's source as plain Python: IPython's magics become calls (which then fail alone)."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:
        return source
    try:
        return TransformerManager().transform_cell(source)
    except Exception:  # a cell IPython cannot parse either: compile() reports it
        return source


class StudentCode:
    """A student's function, defined by running the notebook's cells in the process that calls
    it (a sandbox child or a rank), never in the grader.

    Calling it runs the cells once per process (each in order; a cell that raises is noted and
    skipped, as in a notebook run with errors allowed), then calls the function ``name``.
    """

    def __init__(self, cells: list[tuple[str, str]], name: str, allow_dpcost: bool,
                 given: dict | None = None):
        self.cells, self.__name__, self.allow_dpcost = cells, name, allow_dpcost
        self.given = dict(given or {})
        self._function = None

    def load(self):
        """The student's function, from the cells (run here, on first use)."""
        if self._function is None:
            if not self.allow_dpcost:
                _block_dpcost()
            namespace = {"__name__": "__main__", **dict.fromkeys(_COURSE_NAMES, _noop),
                         **self.given}
            errors = []
            for cell_id, source in self.cells:
                try:
                    exec(compile(_python_source(source), f"<cell {cell_id}>", "exec"), namespace)
                except BaseException as exc:  # noqa: B036 - the next cells still run, as in
                    # a notebook run with errors allowed (SystemExit included)
                    errors.append(f"cell {cell_id} raised {type(exc).__name__}: {exc}")
            function = namespace.get(self.__name__)
            if not callable(function):
                raise NameError(f"{self.__name__} is not defined by the notebook's cells"
                                + (f" ({errors[0]})" if errors else ""))
            self._function = function
        return self._function

    def __call__(self, *args, **kwargs):
        return self.load()(*args, **kwargs)


def student_cells(notebook: dict, skipped: tuple[str, ...]) -> list[tuple[str, str]]:
    """(cell id, source) of the code cells that hold the student's code, in order."""
    cells = []
    for index, cell in enumerate(notebook.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        grader = cell.get("metadata", {}).get("nbgrader", {})
        cell_id = str(cell.get("id", index))
        if (grader.get("grade") and not grader.get("solution")) or cell_id in skipped:
            continue
        source = cell.get("source", "")
        cells.append((cell_id, "".join(source) if isinstance(source, list) else str(source)))
    return cells


def grade(exercise: str, cells: list[tuple[str, str]], names: list[str]):
    """The :class:`~dpcost.exercises.report.Report` of the full battery for ``names``."""
    allow_dpcost = EXERCISES[exercise][2]
    if exercise == "ex1_five_functions":
        from dpcost.exercises import five_functions

        named = [(name, StudentCode(cells, name, allow_dpcost)) for name in names]
        return five_functions.battery_report(named)
    if exercise == "ex2_ring_step":
        from dpcost.exercises import ring_step

        return ring_step.simulator_report(
            {name: StudentCode(cells, name, allow_dpcost) for name in names})
    from dpcost.exercises import migrate_check

    given = {name: getattr(migrate_check, name)
             for name in ("ShuffleEachEpoch", "make_dataset", "make_model", "train_dp")}
    return migrate_check.settings_report(StudentCode(cells, "train_ddp", allow_dpcost, given))


# The literal check of each graded function, on an input no worked example uses: a function
# that fails it gets no credit, so one that returns 0 does not collect the tests that 0 happens
# to pass (n <= 1, model size 0). ex1: the exact float; ex2: one step of 5 ranks in which every
# rank sends once and receives once. (ex3's stub or a wrong return fails every run anyway.)
LITERAL = {
    "dp_communication_volume": ((3e9, 5), 2.4e10),
    "ddp_communication_volume": ((2e9, 4), 3e9),
    "dp_gpu0_memory_multiplier": ((6,), 6.0),
    "ddp_gpu0_memory_multiplier": ((6,), 1.0),
    "communication_reduction_factor": ((2e9, 6), 6.0),
    "reduce_scatter_sends": ((5, 2), None),
    "all_gather_sends": ((5, 2), None),
}


def _literal_passes(value, expected) -> bool:
    if expected is not None:
        return type(value) is float and value == expected
    sends = value if type(value) is list else []
    if not sends or not all(type(s) in (tuple, list) and len(s) == 3 for s in sends):
        return False
    return sorted(s[0] for s in sends) == sorted(s[1] for s in sends) == list(range(5))


def literal_failures(exercise: str, cells, names) -> list[str]:
    """The literal checks that ``names`` fail, in words (sandboxed, as the battery)."""
    from dpcost.grading.sandbox import run_many

    checked = [name for name in names if name in LITERAL]
    allow_dpcost = EXERCISES[exercise][2]
    outcomes = run_many([(StudentCode(cells, name, allow_dpcost), LITERAL[name][0], {})
                         for name in checked], max_timeouts=2)
    return [f"{name}{LITERAL[name][0]} gave {outcome.describe()}" for name, outcome
            in zip(checked, outcomes, strict=True)
            if not (outcome.returned and _literal_passes(outcome.value, LITERAL[name][1]))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -I -m dpcost.grading.grade",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("notebook", type=Path, help="the exercise notebook's file, e.g. "
                        "ex1_five_functions.ipynb")
    parser.add_argument("functions", nargs="+", help="the functions to grade, e.g. "
                        "dp_communication_volume")
    parser.add_argument("--points", type=float, default=1.0,
                        help="the grade cell's points (the score is points x Report.credit)")
    args = parser.parse_args(argv)
    exercise = args.notebook.stem
    if exercise not in EXERCISES:
        parser.error(f"notebook must be one of {', '.join(e + '.ipynb' for e in EXERCISES)}; "
                     f"got {args.notebook.name!r}")
    names, skipped, _ = EXERCISES[exercise]
    unknown = [f for f in args.functions if f not in names]
    if unknown:
        parser.error(f"functions of {exercise} are {', '.join(names)}; got {unknown[0]!r}")
    if not (args.points > 0 and args.points < float("inf")):
        parser.error(f"--points must be a number > 0; got {args.points!r}")
    try:
        notebook = json.loads(args.notebook.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        parser.error(f"notebook {str(args.notebook)!r} cannot be read: {exc}")
    cells = student_cells(notebook, skipped)
    report = grade(exercise, cells, args.functions)
    print(report)
    failed = literal_failures(exercise, cells, args.functions)
    if failed:
        print(f"literal check failed, so no credit for it: {'; '.join(failed)}")
    gated = {text.split("(", 1)[0] for text in failed}
    score = round(args.points * report.credit(exclude=gated), 2)
    print(f"score: {score:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
