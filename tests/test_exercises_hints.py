"""Hints: 3-4 per exercise, revealed one at a time, never the code itself."""

import pytest

from dpcost.exercises.five_functions import FUNCTION_NAMES
from dpcost.exercises.hints import HINTS, hint, hint_button, hint_text
from dpcost.exercises.ring_step import PHASE_NAMES


def test_every_exercise_has_three_or_four_hints():
    assert set(HINTS) == set(FUNCTION_NAMES) | set(PHASE_NAMES)
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
