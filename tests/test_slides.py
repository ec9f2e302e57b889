"""`make slides`: reveal.js decks that open offline, checked in the HTML and in a real browser.

Builds two decks into a temporary folder with slides/build.py (as `make slides` does for every
notebook): lesson 03, which has math, and exercise 2, which has widgets. The HTML must load
nothing from another host and every local file it names must exist; in Chromium, with every
request that is not to 127.0.0.1 blocked, the deck must start, advance a slide on the Right key,
typeset its math with the local MathJax, and need nothing it could not get.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import time
from pathlib import Path

import pytest
from browser_support import CHROMIUM, NO_CHROMIUM, local_page, static_server

ROOT = Path(__file__).resolve().parents[1]
MATH_DECK = ROOT / "notebooks" / "03_the_proof.ipynb"
WIDGET_DECK = ROOT / "notebooks" / "ex2_ring_step.ipynb"
WAIT_MS = 30_000


def _load_build():
    spec = importlib.util.spec_from_file_location("slides_build", ROOT / "slides" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _load_build()
NPM_MISSING = (shutil.which("npm") is None
               and not (build.NODE_MODULES / ".package-lock.json").exists())


@pytest.fixture(scope="module")
def decks(tmp_path_factory):
    """The two decks, built as `make slides` builds them; the build time is printed."""
    if NPM_MISSING:
        pytest.skip("npm is missing: make slides installs reveal.js and MathJax with npm ci")
    out = tmp_path_factory.mktemp("slides")
    start = time.perf_counter()
    build.build([MATH_DECK, WIDGET_DECK], out)
    print(f"built 2 decks in {time.perf_counter() - start:.1f} s")
    return out


def _html(decks, notebook):
    return (decks / f"{notebook.stem}.slides.html").read_text()


def test_decks_load_nothing_from_another_host(decks):
    for notebook in (MATH_DECK, WIDGET_DECK):
        assert build.external_loads(_html(decks, notebook)) == []
    for css in (decks / "vendor").rglob("*.css"):  # themes may @import web fonts
        assert not re.search(r"url\(\s*[\"']?(?:https?:)?//", css.read_text()), css


def test_the_check_finds_nbconverts_cdn_defaults():
    """The same notebook through nbconvert's unconfigured exporter loads from CDNs: caught."""
    import nbformat
    from nbconvert import SlidesExporter

    html, _ = SlidesExporter().from_notebook_node(nbformat.read(MATH_DECK, as_version=4))
    remote = " ".join(build.external_loads(html))
    for cdn in ("unpkg.com/reveal.js", "require.js", "mathjax", "jquery", "mermaid"):
        assert cdn in remote.lower(), cdn


def test_every_local_file_a_deck_names_exists(decks):
    for notebook in (MATH_DECK, WIDGET_DECK):
        html = _html(decks, notebook)
        local = re.findall(r"(?:src|href)=\"(vendor/[^\"?]+)", html)
        local += re.findall(r"\"(vendor/[^\"?]+\.js)\"", html)  # reveal.js, loaded by RequireJS
        assert len(set(local)) >= 6
        for path in set(local):
            assert (decks / path).is_file(), path


def test_widgets_are_left_out_and_their_static_hints_stay(decks):
    html = _html(decks, WIDGET_DECK)
    assert "widget-view+json" not in html and "widget-state+json" not in html
    assert html.count('class="dpcost-hints"') == 2  # one static output per hint button
    assert "Hint 4 of 4" in html


def test_outline_numbers_slides_as_nbconvert_cuts_them(decks):
    """Slides in the HTML (inner <section>s) = the outline's count."""
    html = _html(decks, MATH_DECK)
    sections = html.count("<section")
    outer = len(re.findall(r"<section[^>]*>\s*<section", html))
    assert sections - outer == len(build.outline(MATH_DECK))


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
@pytest.mark.timeout(120)
def test_deck_advances_and_renders_math_offline(decks):
    slides = build.outline(MATH_DECK)
    failed, errors = [], []
    with static_server(decks) as base, local_page(viewport=(1280, 720),
                                                  timeout_ms=WAIT_MS) as (page, blocked):
        page.on("response", lambda r: failed.append(f"{r.status} {r.url}")
                if r.status >= 400 else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{base}/{MATH_DECK.stem}.slides.html")
        # reveal.js is an AMD module here (loaded by RequireJS), not a global: ask RequireJS.
        page.wait_for_function("""() => {
            if (!window.require) return false;
            require(['vendor/reveal.js/dist/reveal.js'], R => { window.deck = R; });
            return !!(window.deck && window.deck.isReady());
        }""")
        first = page.evaluate("() => [deck.getIndices(), deck.getTotalSlides(),"
                              " deck.getCurrentSlide().innerText]")
        assert first[0]["h"] == 0 and first[1] == len(slides)
        assert page.locator(".slide-number").inner_text().split() == ["1", "/", str(len(slides))]

        # math: every TeX script MathJax found is typeset, with no error
        page.wait_for_function("""() => window.MathJax && MathJax.Hub &&
            document.querySelectorAll('script[type^="math/tex"]').length > 0 &&
            document.querySelectorAll('.MathJax_CHTML').length ===
            document.querySelectorAll('script[type^="math/tex"]').length""")
        assert page.locator(".MathJax_Error, .mjx-merror").count() == 0

        page.keyboard.press("ArrowRight")
        page.wait_for_function("() => deck.getIndices().h === 1")
        second = page.evaluate("() => deck.getCurrentSlide().innerText")
        assert second != first[2]
        assert slides[1][1].lower() in " ".join(second.split()).lower()
        assert page.locator(".slide-number").inner_text().split()[0] == "2"
    assert blocked == [] and failed == [] and errors == []


def test_projected_code_drops_tool_directives_and_tagged_inputs(tmp_path):
    """A deck shows neither nbval's directives nor the input of a cell tagged slides-hide-input."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    shown = nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nx = 41 + 1  # noqa: F841\nprint(x)")
    hidden = nbformat.v4.new_code_cell("print('the figure alone')",
                                       metadata={"tags": [build.HIDE_INPUT_TAG]})
    hidden.outputs = [nbformat.v4.new_output("stream", text="the figure alone\n")]
    nb.cells = [nbformat.v4.new_markdown_cell("# A deck"), shown, hidden]
    path = tmp_path / "tiny.ipynb"
    nbformat.write(nb, path)
    html = build.build_deck(path, tmp_path).read_text()
    assert "NBVAL" not in html and "noqa" not in html
    assert "x</span> <span class=\"o\">=</span> <span class=\"mi\">41</span>" in html
    assert "print(&#39;the figure alone&#39;)" not in html and "print</span>" in html
    assert html.count("the figure alone") == 1  # its output stays
    assert build.projected_source("  # NBVAL_SKIP\ny = 1  # noqa\n") == "y = 1"


def test_decks_navigate_linearly():
    """The Right arrow visits every subslide in order (reveal.js's default skips them)."""
    template = (build.TEMPLATE_DIR / "dpcost_reveal" / "index.html.j2").read_text()
    assert 'navigationMode: "linear"' in template


def test_every_slide_of_the_lessons_has_a_heading():
    """The overview (Esc) and the outline show each slide's heading: no "(code)", no sentence."""
    import nbformat

    for notebook in sorted((ROOT / "notebooks").glob("0[0-8]_*.ipynb")):
        titles = dict(build.outline(notebook))
        cells = nbformat.read(notebook, as_version=4).cells
        first = [cell for cell in cells
                 if cell.metadata.get("slideshow", {}).get("slide_type") in ("slide", "subslide")]
        for number, cell in enumerate(first, start=1):
            assert cell.cell_type == "markdown" and cell.source.lstrip().startswith("#"), (
                f"{notebook.name} slide {number} ({titles.get(number)}) starts without a heading")
