"""Exercises: the student writes the five functions and one ring step; checks, hints, versions.

Modules (import the one you need; nothing heavy is imported here):
``sandbox`` runs student code in a confined child (``confine``: its own user id, namespaces
and resource limits) with a time limit; ``five_functions`` and
``ring_step`` hold the worked examples and the test batteries (``check`` / ``submit``);
``report`` renders results; ``hints`` reveals hints one at a time; ``student`` writes the
student notebooks from the instructor masters; ``grade`` grades a notebook's file in a new
interpreter (what nbgrader's grade cells run).
"""

from pathlib import Path

# Where the exercise notebooks live: the instructor masters and the student versions written from
# them (``student``), whose hint regions ``hints`` rewrites.
ROOT = Path(__file__).resolve().parents[2]
MASTER_DIR = ROOT / "notebooks" / "instructor"
STUDENT_DIR = ROOT / "notebooks"
