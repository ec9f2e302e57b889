"""Hints: 3-4 per exercise, revealed one at a time, never the code itself; one source (HINTS)
for the button, its static output and the notebooks' markdown, kept in sync."""

import re

import nbformat
import pytest

from dpcost.exercises.five_functions import FUNCTION_NAMES
from dpcost.exercises.hints import (
    HINTS,
    hint,
    hint_button,
    hint_region,
    hint_text,
    hints_bundle,
    hints_markdown,
    regions,
    sync_markdown,
    sync_notebook,
)
from dpcost.exercises.ring_step import PHASE_NAMES
from dpcost.exercises.student import pairs

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


def test_button_reveals_one_at_a_time():
    box = hint_button("communication_reduction_factor")
    button, shown = box.children
    hints = HINTS["communication_reduction_factor"]
    assert shown.value == "" and button.description == f"Show hint 1 of {len(hints)}"
    box.reveal()
    assert shown.value.count("<li>") == 1 and "Show hint 2" in button.description
    for _ in range(10):
        button.click()
    assert shown.value.count("<li>") == len(hints)
    assert button.disabled and box.revealed == len(hints)


def test_displayed_button_leaves_the_widget_and_its_hints_as_static_html():
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    shell = InteractiveShell.instance()
    with capture_output() as captured:
        shell.run_cell('from dpcost.exercises.hints import hint_button\n'
                       'hint_button("all_gather_sends")')
    widget, static = captured.outputs
    assert WIDGET in widget.data
    assert static.data == hints_bundle("all_gather_sends")
    html = static.data["text/html"]
    assert html.count("<details>") == len(HINTS["all_gather_sends"])
    for k, text in enumerate(HINTS["all_gather_sends"], start=1):
        assert f"<summary>Hint {k} of 4</summary>" in html
        assert f"Hint {k}/4: {text}" in static.data["text/plain"]
    # `code` spans become <code>, and the text is escaped
    assert "<code>replicate</code>" in hints_bundle("dp_communication_volume")["text/html"]
    assert "n &lt;= 1" in hints_bundle("dp_communication_volume")["text/html"]


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
def test_hint_button_cells_saved_their_static_hints(path):
    """Committed executed: each button cell's saved outputs are the widget and its hints."""
    cells = [c for c in nbformat.read(path, as_version=4).cells
             if c.cell_type == "code" and "hint_button(" in c.source]
    assert cells
    for cell in cells:
        match = re.search(r'hint_button\("(\w+)"\)', cell.source)
        name = match.group(1) if match else "train_ddp"  # ex3's hint_button() takes no name
        assert [WIDGET in o.get("data", {}) for o in cell.outputs] == [True, False], cell.id
        assert cell.outputs[1].data == hints_bundle(name), f"{path.name} {cell.id}: re-execute"


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
