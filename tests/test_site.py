"""The website: `make site` builds offline without warnings, and a real browser reads it offline.

The build (book/build.py: Jupyter Book 1, no execution) runs once per test session into a
temporary folder. The browser test serves it on 127.0.0.1, blocks every other request, and on
three pages checks that the figures loaded, the math rendered and a folded answer opens on click.
"""

from __future__ import annotations

import json
import re
import shutil
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


def _accepts(spec: str, version: tuple[int, int, int]) -> bool:
    """Whether npm's ``engines.node`` range ``spec`` accepts ``version``: the forms the locks
    use (">=X", "^X", "X.*", alternatives joined by "||")."""
    def parse(text):
        parts = [int(p) for p in text.replace(".*", "").split(".") if p]
        return tuple(parts + [0] * (3 - len(parts)))

    for alternative in spec.split("||"):
        text = alternative.strip().replace(">= ", ">=")
        if text.startswith(">="):
            ok = version >= parse(text[2:])
        elif text.startswith("^"):
            low = parse(text[1:])
            ok = version >= low and version[0] == low[0]
        elif text.endswith(".*"):
            ok = version[0] == parse(text)[0]
        else:
            raise ValueError(f"engines.node {spec!r}: a form this test does not read")
        if ok:
            return True
    return False


def test_every_pinned_npm_package_accepts_the_node_that_ci_and_this_machine_run():
    """npm warns (EBADENGINE) when a package's engines.node rejects the Node that runs it: CI's
    setup-node major (its newest release) and, where Node is installed, this machine's."""
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())
    majors = [step["with"]["node-version"] for job in workflow["jobs"].values()
              for step in job["steps"] if "setup-node" in step.get("uses", "")]
    assert majors, "CI installs no Node"
    versions = {f"CI's Node {m}": (int(m), 99, 0) for m in majors}
    node = subprocess.run(["node", "--version"], capture_output=True, text=True) \
        if shutil.which("node") else None
    if node and node.returncode == 0:
        versions["this machine's " + node.stdout.strip()] = tuple(
            int(p) for p in node.stdout.strip().lstrip("v").split("."))
    assert not _accepts(">=22", (20, 99, 0)) and _accepts("^20.19.0 || >=23", (20, 20, 2))
    for lock in ("site_explorer/package-lock.json", "slides/package-lock.json"):
        packages = json.loads((ROOT / lock).read_text())["packages"]
        for name, package in packages.items():
            spec = (package.get("engines") or {}).get("node") \
                if isinstance(package.get("engines"), dict) else None
            for which, version in versions.items() if spec else ():
                assert _accepts(spec, version), f"{lock}: {name} needs node {spec}; {which}"
