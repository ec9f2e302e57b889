"""The course's notebooks: committed executed, presentable, and guarded by strict nbval."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").rglob("*.ipynb"))
NOTEBOOKS = [p for p in NOTEBOOKS if ".ipynb_checkpoints" not in p.parts]


def load(path):
    return json.loads(path.read_text())


def test_the_course_has_its_first_notebook():
    assert (ROOT / "notebooks" / "00_start_here.ipynb") in NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_executed_in_order(path):
    counts = [c.get("execution_count") for c in load(path)["cells"] if c["cell_type"] == "code"]
    assert counts, "a notebook without code"
    assert None not in counts, f"{path.name} has unexecuted cells: run `make notebooks NB={path}`"
    assert counts == list(range(1, len(counts) + 1)), "not run top to bottom in a fresh kernel"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_errors_and_no_trailing_semicolon_silencing(path):
    for cell in load(path)["cells"]:
        if cell["cell_type"] != "code":
            continue
        assert all(o["output_type"] != "error" for o in cell["outputs"]), path.name
        lines = "".join(cell["source"]).rstrip().splitlines()
        if lines:
            assert not lines[-1].rstrip().endswith(";"), f"{path.name}: assign to _ instead of ;"


LESSONS = [p for p in NOTEBOOKS if p.name[:2].isdigit()]


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lessons_have_slides_and_folded_questions(path):
    cells = load(path)["cells"]
    assert all("slideshow" in c["metadata"] for c in cells), "every cell needs slide metadata"
    markdown = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert markdown.count("<details>") >= 2, "end with 2-4 questions whose answers fold away"


def test_strict_nbval_fails_on_a_wrong_number(tmp_path):
    """Change one saved number in notebook 00: the nbval run that CI uses must fail."""
    source = ROOT / "notebooks" / "00_start_here.ipynb"
    notebook = load(source)
    changed = False
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            text = "".join(output.get("text", []))
            if "2.625 GB" in text:
                output["text"] = text.replace("2.625 GB", "2.626 GB")
                changed = True
    assert changed, "the worked example's DDP figure is no longer printed"
    broken = tmp_path / "00_broken.ipynb"
    broken.write_text(json.dumps(notebook))
    shutil.copy(ROOT / "tests" / "nbval_sanitize.cfg", tmp_path / "sanitize.cfg")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", str(broken), "--nbval", "--nbval-current-env",
         "--nbval-sanitize-with", str(tmp_path / "sanitize.cfg"), "-q", "-p", "no:cacheprovider"],
        capture_output=True, text=True, cwd=tmp_path, timeout=240)
    assert result.returncode == 1, result.stdout[-2000:]
    assert "2.626 GB" in result.stdout and "2.625 GB" in result.stdout


CHECKED = [p for p in NOTEBOOKS if any("course-check" in c["metadata"].get("tags", [])
                                        for c in load(p)["cells"])]


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: p.name)
def test_the_course_checks_itself_in_collapsed_silent_cells_out_of_the_slides(path):
    """A cell tagged course-check holds the course's own assertions: its input collapsed in
    JupyterLab (jupyter.source_hidden) and on the website (hide-input), no slide, no output."""
    for cell in load(path)["cells"]:
        if "course-check" not in cell["metadata"].get("tags", []):
            continue
        source = "".join(cell["source"])
        assert cell["metadata"].get("jupyter", {}).get("source_hidden") is True, source[:80]
        assert "hide-input" in cell["metadata"]["tags"], source[:80]
        assert cell["metadata"]["slideshow"]["slide_type"] == "skip", source[:80]
        assert cell["outputs"] == [] and "assert" in source, source[:80]


# The lessons read without the course's self-checks in the way: at most one visible code line
# in ten is an assert; the rest sit in collapsed course-check cells. Not 03, whose asserts are its
# proof's steps, nor 06 and 07, whose loops check each measurement against the model and print
# what they found: the lesson's claim, shown on purpose.
FIRST_LESSONS = ["00_start_here", "01_what_dataparallel_moves", "02_ring_allreduce",
                 "04_gpu0_memory", "05_explorer", "08_beyond_ddp", "09_moving_to_ddp",
                 "09b_ddp_pitfalls", "10_plan_your_own_model"]


@pytest.mark.parametrize("name", FIRST_LESSONS)
def test_few_visible_asserts_in_the_first_lessons(name):
    lines = [line.strip() for cell in load(ROOT / "notebooks" / f"{name}.ipynb")["cells"]
             if cell["cell_type"] == "code"
             and "course-check" not in cell["metadata"].get("tags", [])
             for line in "".join(cell["source"]).splitlines()
             if line.strip() and not line.strip().startswith("#")]
    asserts = [line for line in lines if line.startswith("assert")]
    assert len(asserts) * 10 <= len(lines), asserts
