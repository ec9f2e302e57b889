"""The website: `make site` builds offline without warnings, and a real browser reads it offline.

The build (book/build.py: Jupyter Book 1, no execution) runs once per test session into a
temporary folder. The browser test serves it on 127.0.0.1, blocks every other request, and on
three pages checks that the figures loaded, the math rendered and a folded answer opens on click.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from browser_support import CHROMIUM, NO_CHROMIUM, local_page, static_server

ROOT = Path(__file__).resolve().parents[1]
TOC = yaml.safe_load((ROOT / "book" / "_toc.yml").read_text())
TOC_FILES = [TOC["root"]] + [chapter["file"] for part in TOC["parts"]
                             for chapter in part["chapters"]]
EXTERNAL_ASSET = re.compile(  # a script, style sheet, image or frame fetched from another host
    r"""<(?:script|link|img|iframe)\b[^>]*?\b(?:src|href)=["'](?:https?:)?//""")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    run = subprocess.run([sys.executable, str(ROOT / "book" / "build.py"), "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"the site build failed or warned:\n{run.stdout[-4000:]}\n" \
        f"{run.stderr[-4000:]}"
    return out / "_build" / "html"


def test_the_toc_lists_every_lesson_and_exercise_in_the_course_order():
    notebooks = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    lessons = [f.removeprefix("notebooks/") for f in TOC_FILES if f.startswith("notebooks/")]
    assert lessons == notebooks  # 00..09 then ex1..ex3: sorted names are the course order
    for file in TOC_FILES:
        assert any((ROOT / f"{file}{suffix}").exists() for suffix in (".md", ".ipynb")), file


def test_the_site_builds_offline_with_every_page_no_remote_asset_and_answers_folded(site):
    for file in TOC_FILES:
        page = site / f"{file}.html"
        assert page.exists(), f"{file} has no page"
        html = page.read_text()
        assert not EXTERNAL_ASSET.search(html), f"{file} loads something from the network"
        # Every folded answer stays folded: no <details> is opened by the build.
        assert not re.search(r"<details[^>]*\bopen\b", html), f"{file} has an open <details>"
    assert (site / "_static" / "mathjax" / "tex-chtml.js").exists()  # math without a CDN
    explorer = (site / "notebooks" / "05_explorer.html").read_text()
    assert "Snapshot at these settings" in explorer and explorer.count("<img") >= 3
    # the live explorer page (tests/test_site_explorer_browser.py drives it): Pyodide and the
    # model's files are served by the site itself
    live = site / "explorer" / "index.html"
    assert live.exists() and not EXTERNAL_ASSET.search(live.read_text())


PAGES = {  # page: what it must show (each page checks figures, math and answers it has)
    "notebooks/02_ring_allreduce": {"figures": 3, "math": 0},
    "notebooks/03_the_proof": {"figures": 0, "math": 5},
    "notebooks/05_explorer": {"figures": 3, "math": 0},
}


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
@pytest.mark.timeout(180)
def test_three_pages_show_figures_math_and_folded_answers_in_a_browser_offline(site):
    with static_server(site) as base, local_page(viewport=(1280, 720)) as (page, blocked):
        for name, expected in PAGES.items():
            page.goto(f"{base}/{name}.html", wait_until="load")
            images = page.locator("main img").evaluate_all(
                "els => els.map(e => [e.complete, e.naturalWidth])")
            assert len(images) >= expected["figures"], f"{name}: {len(images)} figures"
            assert all(done and width > 0 for done, width in images), f"{name}: {images}"

            math = page.locator("main .math").count()
            assert math >= expected["math"], f"{name}: {math} formulas"
            if math:  # Sphinx loads MathJax only on pages that have math
                page.wait_for_function("() => window.MathJax && MathJax.startup &&"
                                       " MathJax.startup.promise")
                page.evaluate("() => MathJax.startup.promise")
                rendered = page.locator("main .math mjx-container")
                assert rendered.count() == math, f"{name}: {rendered.count()} of {math} rendered"
                box = rendered.first.bounding_box()
                assert box and box["width"] > 0 and box["height"] > 0

            answers = page.locator("main details")
            assert answers.count() >= 1, f"{name} has no folded answer"
            assert answers.evaluate_all("els => els.every(e => !e.open)"), f"{name}: not folded"
            answer = answers.first
            body = answer.locator(":scope > :not(summary)").first
            assert not body.is_visible()
            answer.locator("summary").click()
            assert answer.evaluate("e => e.open") and body.is_visible()
    assert blocked == [], f"the site asked the network for {blocked}"
