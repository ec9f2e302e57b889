"""Exercises: the student writes the five functions and one ring step; checks, hints, versions.

Modules (import the one you need; nothing heavy is imported here):
``five_functions``, ``ring_step`` and ``migrate_check`` hold the worked examples and the test
batteries (``check`` / ``submit``); ``report`` renders results; ``hints`` reveals hints one at
a time; ``solutions`` holds the worked solutions the hints end with. The checkers run student
code through :mod:`dpcost.grading` (the confined sandbox); the out-of-kernel grader that
nbgrader's grade cells run, and the writer of the student notebooks, live there too.
"""

from pathlib import Path

# Where the exercise notebooks live: the instructor masters and the student versions written from
# them (``dpcost.grading.student``), whose hint regions ``hints`` rewrites.
ROOT = Path(__file__).resolve().parents[2]
MASTER_DIR = ROOT / "notebooks" / "instructor"
STUDENT_DIR = ROOT / "notebooks"
