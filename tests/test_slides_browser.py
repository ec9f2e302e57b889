"""The 50-minute lecture as the room sees it: its decks in Chromium at 1280x720, slide by slide.

Builds every deck that docs/teaching.md's "A 50-minute lecture" cites (as `make slides` does),
opens each in one headless Chromium at 1280x720 with every non-local request blocked, visits every
slide the plan cites, and measures it in the deck's own coordinates (reveal.js lays a slide out at
1280x720 and scales the whole to the window). A slide fails when its content is taller or wider
than 1280x720, or when a printed output (a table) wraps a line. The count of failing slides must
be 0; the message lists each with its measured height in screens. Also checks that the Right arrow
visits every slide in order (linear navigation), so the deck's numbers are the ones the plan cites.

Run as a script to measure every slide of every deck (not only the cited ones):
    python tests/test_slides_browser.py notebooks/04_gpu0_memory.ipynb ...
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest
from browser_support import CHROMIUM, NO_CHROMIUM, local_page, static_server

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_teaching import PLANS, TEACHING, _numbers, _section  # noqa: E402

WIDTH, HEIGHT = 1280, 720
LECTURE = "## A 50-minute lecture"


def _load_build():
    spec = importlib.util.spec_from_file_location("slides_build", ROOT / "slides" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _load_build()
NPM_MISSING = build.shutil.which("npm") is None and not (
    build.NODE_MODULES / ".package-lock.json").exists()


def lecture_slides(text: str) -> dict[str, list[int]]:
    """'00' -> the slide numbers of deck 00 that the 50-minute lecture cites, in order."""
    import re

    cited: dict[str, list[int]] = {}
    for _, deck, spec, _what in re.findall(r"^\| (\d+) \| (\w+) \| ([\d–, ]+) \| (.*) \|$",
                                           _section(text, LECTURE), re.M):
        cited.setdefault(deck, [])
        cited[deck] += [n for n in _numbers(spec) if n not in cited[deck]]
    return cited


def _notebook(deck: str) -> Path:
    return next((ROOT / "notebooks").glob(f"{deck}_*.ipynb"))


READY = """() => {
    if (!window.require) return false;
    require(['vendor/reveal.js/dist/reveal.js'], R => { window.deck = R; });
    return !!(window.deck && window.deck.isReady());
}"""
# MathJax changes heights: wait until every TeX script is typeset (or there is none).
TYPESET = """() => {
    const tex = document.querySelectorAll('script[type^="math/tex"]').length;
    return tex === 0 || (window.MathJax && MathJax.Hub &&
        document.querySelectorAll('.MathJax_CHTML').length === tex);
}"""
# One slide, measured in the deck's coordinates: scrollHeight/Width ignore reveal.js's scaling.
MEASURE = """n => {
    const slide = deck.getSlides()[n - 1];
    deck.slide(...Object.values(deck.getIndices(slide)).slice(0, 2));
    const wrapped = [...slide.querySelectorAll('.jp-OutputArea-output pre')].filter(pre => {
        const lines = pre.textContent.replace(/\\n$/, '').split('\\n').length;
        const style = getComputedStyle(pre);
        const pad = parseFloat(style.paddingTop) + parseFloat(style.paddingBottom);
        return pre.scrollHeight - pad > lines * parseFloat(style.lineHeight) + 2;
    }).length;
    // each figure's on-screen size over its own (reveal.js scales the slide to the window)
    const scales = [...slide.querySelectorAll('img')].filter(img => img.naturalWidth > 0)
        .map(img => img.getBoundingClientRect().width / img.naturalWidth);
    return {height: slide.scrollHeight, width: slide.scrollWidth, wrapped,
            figure_scale: scales.length ? Math.min(...scales) : null,
            current: deck.getSlides().indexOf(deck.getCurrentSlide()) + 1};
}"""


def measure_in(page, base: str, cited: dict[str, list[int] | None]) -> dict[str, dict[int, dict]]:
    """deck -> slide number -> {height, width, wrapped}; ``None`` measures every slide."""
    found: dict[str, dict[int, dict]] = {}
    for deck, numbers in cited.items():
        page.goto(f"{base}/{_notebook(deck).stem}.slides.html")
        page.wait_for_function(READY)
        page.wait_for_function(TYPESET)
        total = page.evaluate("() => deck.getTotalSlides()")
        found[deck] = {}
        for number in numbers or range(1, total + 1):
            result = page.evaluate(MEASURE, number)
            assert result.pop("current") == number
            found[deck][number] = result
    return found


def measure(decks_dir: Path, cited: dict[str, list[int] | None]) -> dict[str, dict[int, dict]]:
    """``measure_in`` a fresh Chromium page that may only reach the decks' local server."""
    with static_server(decks_dir) as base, local_page(viewport=(WIDTH, HEIGHT),
                                                      timeout_ms=30_000) as (page, blocked):
        found = measure_in(page, base, cited)
    assert blocked == []
    return found


def overflowing(found: dict[str, dict[int, dict]]) -> list[str]:
    """'04 slide 12: 1.42 screens tall, 2 wrapped outputs' for each slide that does not fit."""
    bad = []
    for deck, slides in found.items():
        for number, m in slides.items():
            why = []
            if m["height"] > HEIGHT:
                why.append(f"{m['height'] / HEIGHT:.2f} screens tall")
            if m["width"] > WIDTH:
                why.append(f"{m['width']} px wide")
            if m["wrapped"]:
                why.append(f"{m['wrapped']} wrapped output(s)")
            if why:
                bad.append(f"{deck} slide {number}: " + ", ".join(why))
    return bad


@pytest.fixture(scope="module")
def lecture(tmp_path_factory):
    """The lecture's decks, built as `make slides` builds them, served on 127.0.0.1, and one
    Chromium page at 1280x720 that may reach nothing else: shared by the tests below."""
    if NPM_MISSING:
        pytest.skip("npm is missing: make slides installs reveal.js and MathJax with npm ci")
    if CHROMIUM is None:
        pytest.skip(NO_CHROMIUM)
    cited = lecture_slides(TEACHING.read_text())
    out = tmp_path_factory.mktemp("lecture_slides")
    start = time.perf_counter()
    build.build([_notebook(deck) for deck in cited], out)
    print(f"built {len(cited)} decks in {time.perf_counter() - start:.1f} s")
    with static_server(out) as base, local_page(viewport=(WIDTH, HEIGHT),
                                                timeout_ms=30_000) as (page, blocked):
        yield {"base": base, "page": page, "cited": cited}
    assert blocked == []


def test_the_lecture_plan_is_50_minutes_and_cites_slides():
    assert PLANS[LECTURE] == 50  # test_teaching.py adds the rows up against this
    cited = lecture_slides(TEACHING.read_text())
    assert cited and all(cited.values())


@pytest.mark.timeout(180)
def test_no_slide_of_the_lecture_overflows_1280x720(lecture):
    start = time.perf_counter()
    found = measure_in(lecture["page"], lecture["base"], lecture["cited"])
    print(f"measured {sum(map(len, found.values()))} slides of {len(found)} decks in "
          f"{time.perf_counter() - start:.1f} s")
    assert overflowing(found) == []
    # Figure text at least 14 px on a 1280x720 screen: the course's figures set no text below
    # 13 pt (dpcost.plots.style; 100 dpi, 18 px at their own size), so no figure of the lecture
    # may be shown below 14 / 18.06 of its size.
    scales = {f"{deck} slide {n}": m["figure_scale"] for deck, slides in found.items()
              for n, m in slides.items() if m["figure_scale"] is not None}
    smallest = 14 / (13 * 100 / 72)
    assert scales and {k: round(v, 3) for k, v in scales.items() if v < smallest} == {}


@pytest.mark.timeout(120)
def test_the_right_arrow_visits_every_subslide_in_order(lecture):
    page, deck = lecture["page"], next(iter(lecture["cited"]))
    page.goto(f"{lecture['base']}/{_notebook(deck).stem}.slides.html")
    page.wait_for_function(READY)
    total = page.evaluate("() => deck.getTotalSlides()")
    presses = total + page.locator(".fragment").count()  # a fragment takes a press too
    seen = [page.locator(".slide-number").inner_text().split()[0]]
    for _ in range(presses):
        page.keyboard.press("ArrowRight")
        number = page.locator(".slide-number").inner_text().split()[0]
        if number != seen[-1]:
            seen.append(number)
    assert seen == [str(k) for k in range(1, total + 1)]


def test_the_overflow_check_catches_a_tall_a_wide_and_a_wrapped_slide():
    found = {"04": {12: {"height": 1023, "width": 1280, "wrapped": 0},
                    13: {"height": 700, "width": 1400, "wrapped": 0},
                    14: {"height": 700, "width": 1280, "wrapped": 2},
                    15: {"height": 720, "width": 1280, "wrapped": 0}}}
    assert overflowing(found) == ["04 slide 12: 1.42 screens tall", "04 slide 13: 1400 px wide",
                                  "04 slide 14: 2 wrapped output(s)"]


if __name__ == "__main__":  # measure whole decks: python tests/test_slides_browser.py NB ...
    import tempfile

    names = [Path(a).name.split("_")[0] for a in sys.argv[1:]] or list(
        lecture_slides(TEACHING.read_text()))
    with tempfile.TemporaryDirectory() as tmp:
        build.build([_notebook(d) for d in names], Path(tmp))
        result = measure(Path(tmp), dict.fromkeys(names))
    for deck, slides in result.items():
        for number, m in slides.items():
            print(f"{deck} {number:3} {m['height'] / HEIGHT:5.2f} screens {m['width']:5} px"
                  f" wrapped {m['wrapped']}")
    print("\n".join(overflowing(result)) or "no slide overflows")
