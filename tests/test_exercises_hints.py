"""Hints: 3-4 per exercise, revealed one at a time, never the code itself; one source (HINTS)
for the button, its static output and the notebooks' markdown, kept in sync."""

import re

import nbformat
import pytest

from dpcost.exercises import hints as hints_module
from dpcost.exercises.five_functions import FUNCTION_NAMES
from dpcost.exercises.hints import (
    HINTS,
    hint,
    hint_button,
    hint_region,
    hint_text,
    hints_markdown,
    regions,
    solution,
    static_bundle,
    sync_markdown,
    sync_notebook,
)
from dpcost.exercises.ring_step import PHASE_NAMES
from dpcost.exercises.solutions import SOLUTIONS
from dpcost.grading.student import pairs

EXERCISE_HINTS = {"ex1_five_functions": list(FUNCTION_NAMES), "ex2_ring_step": list(PHASE_NAMES),
                  "ex3_migrate": ["train_ddp"]}
NOTEBOOKS = [path for pair in pairs() for path in pair]  # masters and student versions
WIDGET = "application/vnd.jupyter.widget-view+json"


def test_every_exercise_has_three_or_four_hints():
    assert set(HINTS) == set(FUNCTION_NAMES) | set(PHASE_NAMES) | {"train_ddp"}
    for name, hints in HINTS.items():
        assert 3 <= len(hints) <= 4, name
        assert len(set(hints)) == len(hints)


def test_hints_are_not_code():
    for hints in HINTS.values():
        for text in hints:
            for code in ("def ", "range(", "for r in", "lambda", "\n"):
                assert code not in text


def test_hint_prints_the_kth_hint(capsys):
    hint("ddp_communication_volume", 2)
    out = capsys.readouterr().out
    assert out.startswith("Hint 2/4 for ddp_communication_volume: ")
    assert HINTS["ddp_communication_volume"][1] in out


@pytest.mark.parametrize("k", [0, 5, -1])
def test_hint_number_out_of_range(k):
    with pytest.raises(ValueError, match="k must be"):
        hint_text("dp_communication_volume", k)


def test_bad_name_and_type():
    with pytest.raises(ValueError, match="name"):
        hint_text("dp_volume", 1)
    with pytest.raises(TypeError, match="k"):
        hint_text("dp_communication_volume", 1.0)


def test_hint_without_k_gives_the_next_then_points_to_the_solution(capsys, monkeypatch):
    """One form for every exercise: hint(name) for the next hint, hint(name, k) for hint k."""
    monkeypatch.setattr(hints_module, "_next_hint", {})
    for k in range(1, 5):
        hint("train_ddp")
        out = capsys.readouterr().out
        assert out.startswith(f"Hint {k}/4 for train_ddp: {HINTS['train_ddp'][k - 1]}")
    assert "the worked solution: solution('train_ddp')" in out  # said with the last hint
    hint("train_ddp")
    assert capsys.readouterr().out == ("No more hints for train_ddp (all 4 shown). The worked "
                                       "solution: solution('train_ddp').\n")
    with pytest.raises(ValueError, match="name must be one of"):
        hint("train")


def test_solutions_are_the_masters_solution_cells(capsys):
    found = {}
    for master, _ in pairs():
        for cell in nbformat.read(master, as_version=4).cells:
            if cell.metadata.get("nbgrader", {}).get("solution"):
                code = "\n".join(line for line in cell.source.split("\n") if line.strip()
                                 not in ("### BEGIN SOLUTION", "### END SOLUTION"))
                found[re.findall(r"^def (\w+)", code, re.M)[-1]] = code
    assert found == SOLUTIONS
    assert set(SOLUTIONS) == set(HINTS)
    solution("reduce_scatter_sends")
    assert capsys.readouterr().out == ("The worked solution of reduce_scatter_sends:\n\n"
                                       + SOLUTIONS["reduce_scatter_sends"] + "\n")


def test_button_reveals_one_hint_at_a_time_then_the_solution():
    box = hint_button("communication_reduction_factor")
    button, shown = box.children
    hints = HINTS["communication_reduction_factor"]
    assert shown.value == "" and button.description == f"Show hint 1 of {len(hints)}"
    box.reveal()
    assert shown.value.count("<li>") == 1 and "Show hint 2" in button.description
    for _ in range(len(hints) - 1):
        button.click()
    assert shown.value.count("<li>") == len(hints) and "<pre>" not in shown.value
    assert button.description == "Show the worked solution" and not button.disabled
    for _ in range(10):
        button.click()
    assert button.disabled and box.revealed == len(hints) and box.solution_shown
    assert shown.value.count("<li>") == len(hints)  # each hint once
    assert "return float(n)" in shown.value and "<pre>" in shown.value


def test_displayed_button_is_one_short_line_and_a_static_pointer():
    """Issue 22: the text form was the raw ``HintButton(children=(...`` repr, and after a click
    every hint showed twice (in the box and in the static folds beside it)."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    shell = InteractiveShell.instance()
    with capture_output() as captured:
        shell.run_cell('from dpcost.exercises.hints import hint_button\n'
                       'hint_button("all_gather_sends")')
    widget, static = captured.outputs
    assert WIDGET in widget.data
    assert widget.data["text/plain"] == ("Hint button: 4 hints for all_gather_sends, then its "
                                         "worked solution")
    assert static.data == static_bundle("all_gather_sends")
    for text in HINTS["all_gather_sends"]:  # the hints themselves show only in the box
        assert text not in static.data["text/plain"]
        assert text not in static.data["text/html"]
    assert '"Hints without widgets" at the end of this notebook' in static.data["text/plain"]


def _exercise(path):
    return path.stem


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_notebook_markdown_holds_every_hint_generated_from_hints(path):
    notebook = nbformat.read(path, as_version=4)
    found = []
    for cell in notebook.cells:
        if cell.cell_type != "markdown":
            continue
        for names, text in regions(cell.source):
            assert text == hints_markdown(names), f"{path.name}: stale hints for {names}"
            found += names
    assert found == EXERCISE_HINTS[_exercise(path)]
    markdown = "".join(c.source for c in notebook.cells if c.cell_type == "markdown")
    for name in found:
        for k, text in enumerate(HINTS[name], start=1):
            block = f"<details><summary>Hint {k} of {len(HINTS[name])}</summary>\n\n{text}\n"
            assert markdown.count(block) >= 1, (name, k)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_hint_button_cells_saved_their_static_line(path):
    """Committed executed: each button cell's saved outputs are the widget (its text form one
    short line) and the static line, and the notebook has the section that line points to."""
    notebook = nbformat.read(path, as_version=4)
    cells = [c for c in notebook.cells if c.cell_type == "code" and "hint_button(" in c.source]
    assert cells
    assert any(c.source.startswith("## Hints without widgets") for c in notebook.cells)
    for cell in cells:
        name = re.search(r'hint_button\("(\w+)"\)', cell.source).group(1)
        assert [WIDGET in o.get("data", {}) for o in cell.outputs] == [True, False], cell.id
        assert cell.outputs[0].data["text/plain"].startswith(f"Hint button: 4 hints for {name}")
        assert cell.outputs[1].data == static_bundle(name), f"{path.name} {cell.id}: re-execute"


def test_sync_rewrites_a_stale_region_and_leaves_the_rest():
    fresh = "Intro.\n\n" + hint_region(["train_ddp"]) + "\n\nAfter."
    stale = fresh.replace("DistributedSampler(dataset, seed=seed)", "a sampler")
    assert stale != fresh and regions(stale)[0][1] != hints_markdown(["train_ddp"])
    assert sync_markdown(stale) == fresh
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(stale)])
    assert sync_notebook(notebook) and notebook.cells[0].source == fresh
    assert not sync_notebook(notebook)  # already current


def test_sync_refuses_unknown_names_and_unclosed_regions():
    unknown = hint_region(["train_ddp"]).replace("HINTS train_ddp", "HINTS no_such_exercise")
    with pytest.raises(ValueError, match="name must be one of"):
        sync_markdown(unknown)
    with pytest.raises(ValueError, match="without its"):
        sync_markdown(hint_region(["train_ddp"]).replace("<!-- END HINTS -->", ""))
