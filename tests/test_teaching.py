"""docs/teaching.md cites real slides: numbers that exist, titles that match, minutes that add up.

The slides are counted from the notebooks' slide metadata by slides/build.py's ``outline``,
which numbers them as the decks do (tests/test_slides.py checks that against a built deck).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEACHING = ROOT / "docs" / "teaching.md"
PLANS = {"## A 50-minute lecture": 50,
         "### Session 1": 90,
         "### Session 2": 90}


def _load_build():
    spec = importlib.util.spec_from_file_location("slides_build", ROOT / "slides" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


outline = _load_build().outline


def decks() -> dict[str, list[tuple[int, str]]]:
    """'00' ... '09', 'ex1' ... -> that notebook's slides."""
    return {path.name.split("_")[0]: outline(path)
            for path in sorted((ROOT / "notebooks").glob("*.ipynb"))}


def _plain(text: str) -> str:
    return " ".join(text.replace("`", "").replace("**", "").split())


def _numbers(spec: str) -> list[int]:
    """'1, 4–5' -> [1, 4, 5]."""
    numbers = []
    for part in spec.split(","):
        low, _, high = part.strip().partition("–")
        numbers += list(range(int(low), int(high or low) + 1))
    return numbers


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    level = heading.split()[0]
    end = re.search(rf"^#{{1,{len(level)}}} ", text[start + len(heading):], re.M)
    return text[start: start + len(heading) + end.start()] if end else text[start:]


def problems(text: str) -> list[str]:
    """Everything wrong with ``text``'s slide citations and timings (empty when all is right)."""
    slides = decks()
    found = []

    def check(deck: str, numbers: list[int], where: str):
        if deck not in slides:
            found.append(f"{where}: no deck {deck}")
            return
        for number in numbers:
            if not 1 <= number <= len(slides[deck]):
                found.append(f"{where}: deck {deck} has {len(slides[deck])} slides, no {number}")

    # the counts table
    for deck, count in re.findall(r"^\| (\w+) [^|]*\| (\d+) \|$", text, re.M):
        if deck in slides and int(count) != len(slides[deck]):
            found.append(f"counts: deck {deck} has {len(slides[deck])} slides, not {count}")
    # the plans: minutes add up, slides exist, the quoted title is the first slide's
    for heading, total in PLANS.items():
        rows = re.findall(r"^\| (\d+) \| (\w+) \| ([\d–, ]+) \| (.*) \|$",
                          _section(text, heading), re.M)
        if not rows:
            found.append(f"{heading}: no plan rows")
        minutes = sum(int(row[0]) for row in rows)
        if minutes != total:
            found.append(f"{heading}: {minutes} minutes, not {total}")
        for _, deck, spec, what in rows:
            numbers = _numbers(spec)
            check(deck, numbers, f"{heading} {deck} {spec}")
            for bare in re.findall(r"\bslides? ([\d–]+)", what):  # "run slide 15's ..."
                check(deck, _numbers(bare), f"{heading} {deck}: {bare}")
            quoted = re.match(r'"([^"]+)"', what)
            if deck in slides and numbers and numbers[0] <= len(slides[deck]):
                title = slides[deck][numbers[0] - 1][1]
                if not quoted or _plain(quoted.group(1)) != _plain(title):
                    found.append(f"{heading} {deck} {spec}: slide {numbers[0]} is {title!r}")
    # every "(06, slide 4)" or "| 06, slide 4 |" elsewhere
    for deck, spec in re.findall(r"\b(0\d|ex\d), slides? ([\d–]+)", text):
        check(deck, _numbers(spec), f"{deck}, slide {spec}")
    return found


def test_teaching_md_cites_only_real_slides_and_its_minutes_add_up():
    assert problems(TEACHING.read_text()) == []


def test_every_lesson_deck_is_in_the_counts_table():
    text = TEACHING.read_text()
    listed = set(re.findall(r"^\| (\w+) [^|]*\| \d+ \|$", text, re.M))
    assert listed == set(decks())


def test_the_checker_catches_a_missing_slide_a_wrong_title_and_wrong_minutes():
    text = TEACHING.read_text()
    row = '| 3 | 00 | 1–2 | "00 · Start here'
    assert row in text
    broken = text.replace(row, '| 4 | 00 | 1–99 | "00 · Start here')
    broken = broken.replace('"A worked example: a 1.5 GB model on 8 GPUs"', '"A worked example"')
    broken = broken.replace("(04, slide 13)", "(04, slide 22)")
    found = "\n".join(problems(broken))
    assert "deck 00 has 14 slides, no 99" in found
    assert "51 minutes, not 50" in found
    assert "slide 7 is 'A worked example: a 1.5 GB model on 8 GPUs'" in found
    assert "deck 04 has 21 slides, no 22" in found


def test_the_lecture_adds_up_to_50_minutes_questions_included():
    """The 50-minute lecture's rows sum to 50, and each of its questions is asked inside a row."""
    lecture = _section(TEACHING.read_text(), "## A 50-minute lecture")
    rows = re.findall(r"^\| (\d+) \| (\w+) \| ([\d–, ]+) \| (.*) \|$", lecture, re.M)
    assert sum(int(row[0]) for row in rows) == 50
    asked = sorted(int(q) for row in rows for q in re.findall(r"question (\d)", row[3]))
    assert asked == [1, 2, 3, 4, 5]
    questions = _section(TEACHING.read_text(), "## Questions to ask the room")
    for number in asked:  # the question's slide lies in the row that asks it
        deck, slide = re.search(rf"^{number}\. \((\w+), slide (\d+)\)", questions, re.M).groups()
        row = next(r for r in rows if f"question {number}" in r[3])
        assert row[1] == deck and int(slide) in _numbers(row[2]), (number, row[:3])
