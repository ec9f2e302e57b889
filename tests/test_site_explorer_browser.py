"""The site's explorer page in a real browser (Debian's Chromium): the same numbers as CPython.

``book/build.py``'s ``build_explorer`` writes the page (as ``make site`` does, without the rest
of the book) into a temporary folder, served from 127.0.0.1; every other request is blocked.
The page runs ``dpcost.explorer_model`` on Pyodide in a Web Worker; it is opened once, at a
link that names a case. For 23 settings across
every control the test sets the page's controls as a person would, reads the readout (text
and the numbers behind it) and compares it with ``explorer_model.explore`` run here, in
CPython, for the settings the page's form holds. Then bad input, the URL's state, the message
for a browser without WebAssembly, and the console.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
import sys
from pathlib import Path

import pytest
from browser_support import CHROMIUM, NO_CHROMIUM, local_page, static_server

from dpcost import explorer_model as X

ROOT = Path(__file__).resolve().parents[1]
WAIT_MS = 90_000  # the first load compiles 10 MB of WebAssembly; a busy machine takes longer


def _load_build():
    spec = importlib.util.spec_from_file_location("site_build", ROOT / "book" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _load_build()
NPM_MISSING = (shutil.which("npm") is None
               and not (build.NODE_MODULES / ".package-lock.json").exists())

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM),
    pytest.mark.skipif(NPM_MISSING, reason="npm is missing: make site installs Pyodide with npm"),
    pytest.mark.timeout(240),
]

# Each case changes these controls, in this order, from the previous case's state.
CASES = [
    {},
    {"gpus": "64"},
    {"gpus": "1"},
    {"model": "Llama-2 7B", "gpus": "8"},
    {"precision": "fp32"},
    {"precision": "bf16", "attention": "eager"},
    {"gpus_per_node": "16", "gpus": "16"},
    {"intra_link": "PCIe 4.0 x16"},
    {"inter_link": "100 GbE", "gpus": "256"},
    {"gpu": "A100 SXM 80GB", "bucket_cap_mb": "100"},
    {"optimizer": "sgd"},
    {"optimizer": "sgd_momentum", "batch_size": "10"},
    {"batch_size": "3"},
    {"model": "ResNet-50", "gpus": "64"},
    {"model": "custom", "custom": "2e9"},
    {"custom": "7.5e10", "outputs": "32000"},
    {"model": "BERT-base", "gpus_per_node": "4", "gpus": "4"},
    {"model": "Llama-2 70B", "gpus": "1024", "inter_link": "InfiniBand HDR"},
    {"model": "GPT-2 small", "gpus": "2", "bucket_cap_mb": "1"},
    {"model": "Llama-2 13B", "precision": "mixed", "attention": "sdpa", "gpus": "32",
     "gpus_per_node": "2"},
    {"intra_link": "NVLink 3 (A100)", "bucket_cap_mb": "250"},
    {"gpus_per_node": "1", "gpus": "8"},
    {"model": "GPT-2 XL", "batch_size": "1048576", "gpu": "H100 SXM 80GB"},
]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    html = tmp_path_factory.mktemp("site") / "_build" / "html"
    build.build_explorer(html)
    return html


EXAMPLE_LINK = "#model=Llama-2%207B&gpus=64"  # the example: a case linked from a slide


@pytest.fixture(scope="module")
def browser_page(site):
    """The explorer page opened at EXAMPLE_LINK and ready; yields (page, what it first showed,
    console problems, blocked requests)."""
    with static_server(site) as base, local_page(viewport=(1280, 720),
                                                 timeout_ms=WAIT_MS) as (page, blocked):
        problems: list[str] = []
        page.context.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
                        if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.goto(f"{base}/explorer/index.html{EXAMPLE_LINK}", wait_until="domcontentloaded")
        # Until Python answers, the page says that it is loading (Pyodide takes seconds).
        assert page.evaluate("document.body.dataset.state") == "loading"
        assert "Loading Python" in page.locator("#status").inner_text()
        _wait_ready(page)
        yield page, _shown(page), problems, blocked


def _wait_ready(page):
    page.wait_for_function("document.body.dataset.state !== 'loading'")
    state = page.evaluate("document.body.dataset.state")
    assert state == "ready", page.locator("#status").inner_text()
    _wait_rendered(page)


def _wait_rendered(page):
    """Until the answer on screen is the one for the form's current settings."""
    page.wait_for_function("() => { const p = window.dpcostExplorer; return !p.busy()"
                           " && p.renderedKey === JSON.stringify(p.formSettings()); }")


def _set(page, changes: dict) -> None:
    for name, value in changes.items():
        control = page.locator(f"#control-{name}")
        if control.evaluate("e => e.tagName") == "SELECT":
            control.select_option(value)
        else:
            control.fill(value)
            control.press("Tab")  # a text field updates when it is left, as the widget's Text
    _wait_rendered(page)


def _shown(page) -> dict:
    """What the readout shows: its text, and the numbers each row and memory item carry."""
    return page.evaluate("""() => {
        const r = document.getElementById('readout');
        const rows = [...r.querySelectorAll('tr[data-row]')].map(tr => ({
            name: tr.dataset.row,
            cells: [...tr.querySelectorAll('td')].slice(1).map(td => td.textContent),
            values: tr.dataset.values ? JSON.parse(tr.dataset.values) : null}));
        return {head: r.querySelector('p').textContent, rows,
                time_line: r.querySelector('.time').textContent,
                time: JSON.parse(r.querySelector('.time').dataset.values),
                memory_line: r.querySelector('.memory').textContent,
                memory: JSON.parse(r.querySelector('.memory').dataset.values),
                verdict: r.querySelector('.verdict').textContent,
                sources: document.getElementById('sources').textContent,
                form: window.dpcostExplorer.formSettings(), hash: location.hash};
    }""")


def _pixels(page) -> str:
    """The three figures as drawn (Vega's SVG)."""
    return page.locator("#figures").inner_html()


def _expected(form: dict) -> dict:
    """The readout the same model gives in CPython for the settings the page's form holds."""
    result = X.explore(form)
    assert result["ok"], result["errors"]
    r = result["readout"]
    rows = [{"name": row["name"], "cells": row["cells"] if "cells" in row else [row["span"]],
             "values": row.get("values")} for row in r["rows"]]
    return {"head": f"{r['n']} {r['head']}", "rows": rows, "time_line": r["time_line"],
            "time": r["time"], "memory_line": r["memory_line"],
            "memory": r["memory"], "verdict": r["verdict"],
            "sources": "".join(f"{name}: {text}" for name, text in result["sources"]),
            "hash": f"#{result['hash']}" if result["hash"] else ""}


def _text(readout: dict) -> dict:
    """The readout with its numbers left out: what a reader sees."""
    return {k: v for k, v in readout.items() if k not in ("memory", "time")} | {
        "rows": [{**row, "values": None} for row in readout["rows"]], "time": None,
        "memory": [{**item, "bytes": None} for item in readout["memory"]]}


def _numbers_apart(shown, expected, exact: bool) -> list:
    """Every number of ``shown`` that differs from ``expected`` (beyond 1e-12 relative unless
    ``exact``), as (path, shown, expected); bools and texts must be equal."""
    apart = []

    def walk(a, b, path):
        if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
            for key in a:
                walk(a[key], b[key], f"{path}.{key}")
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                walk(x, y, f"{path}[{i}]")
        elif isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)):
            if a != b:
                apart.append((path, a, b))
        elif not isinstance(b, (int, float)) or (a != b if exact else
                                                 not math.isclose(a, b, rel_tol=1e-12)):
            apart.append((path, a, b))

    walk(shown, expected, "")
    return apart


def test_readout_numbers_equal_cpython_for_23_settings_across_every_control(browser_page):
    """The page's readout equals CPython's, text for text; its numbers bit for bit when this
    CPython sums floats as Pyodide's does. CPython 3.12 made sum() of floats compensated
    (Neumaier), so under 3.11 a sum of many terms can differ in its last bit (measured: the DP
    copy path's 0.10933931032888888 s here, 0.1093393103288889 s under 3.12, 3.13 and
    Pyodide's 3.14); then the numbers agree to 1e-12 and the texts exactly."""
    page, _, problems, _ = browser_page
    pyodide = tuple(int(x) for x in page.evaluate("window.dpcostExplorer.python").split(".")[:2])
    exact = (sys.version_info >= (3, 12)) == (pyodide >= (3, 12))
    touched, previous = set(), None
    for case in CASES:
        _set(page, case)
        touched |= set(case)
        shown = _shown(page)
        assert {name: shown["form"][name] for name in case} == case, shown["form"]
        if case.get("model") in X.MODELS and "batch_size" not in case:  # as the widget does
            preset = X.MODELS[case["model"]]
            assert shown["form"]["batch_size"] == str(preset.default_batch_size)
            assert shown["form"]["outputs"] == str(preset.output_elements_per_sample)
        elif case.get("model") == X.CUSTOM:  # custom keeps the batch and outputs it had
            assert [shown["form"][k] for k in ("batch_size", "outputs")] == previous
        previous = [shown["form"][k] for k in ("batch_size", "outputs")]
        expected = _expected(shown["form"])
        shown.pop("form")
        assert _numbers_apart(shown, expected, exact) == _numbers_apart(expected, expected, True)
        assert _text(shown) == _text(expected), case
    assert touched == set(X.CONTROL_LABELS)  # every control was moved
    assert problems == []


def test_bad_input_shows_the_widgets_message_next_to_the_field_and_keeps_the_figures(
        browser_page):
    page, _, problems, _ = browser_page
    _set(page, {"model": "custom", "custom": "3e9", "batch_size": "8"})
    before = (_shown(page), _pixels(page))
    for name, bad in (("custom", "abc"), ("custom", "1GB"), ("custom", "2e12"),
                      ("batch_size", "0"), ("batch_size", "x"), ("batch_size", "2e3")):
        _set(page, {name: bad})
        with pytest.raises((TypeError, ValueError)) as error:  # what the widget shows
            if name == "custom":
                X.parse_parameter_count(bad)
            else:
                X.parse_whole_number(bad, "batch_size", X.MAX_BATCH_SIZE)
        assert page.locator(f"#error-{name}").inner_text() == str(error.value)
        assert page.locator(f"#error-{name}").is_visible()
        assert page.evaluate("document.body.dataset.ok") == "false"
        after = _shown(page)
        after["form"], after["hash"] = before[0]["form"], before[0]["hash"]
        assert after == before[0] and _pixels(page) == before[1]
        _set(page, {name: {"custom": "3e9", "batch_size": "8"}[name]})  # the worker lives on
        assert page.locator(f"#error-{name}").inner_text() == ""
        assert page.evaluate("document.body.dataset.ok") == "true"
    assert problems == []


def test_the_url_carries_the_state_both_ways(browser_page):
    page, first, problems, _ = browser_page
    # Opened at the example link, the page showed that case (the rest at its defaults).
    assert first["hash"] == EXAMPLE_LINK
    assert first["form"] == {**X.explore({})["settings"], "model": "Llama-2 7B", "gpus": "64",
                             "batch_size": str(X.MODELS["Llama-2 7B"].default_batch_size),
                             "outputs": str(X.MODELS["Llama-2 7B"].output_elements_per_sample),
                             "gpus_per_node": "8", "bucket_cap_mb": "25", "custom": "1.5e9"}
    assert X.CANNOT_SPAN in first["verdict"]
    # Each change writes the address; following it again brings the same case back.
    _set(page, {"model": "Llama-2 13B", "gpus": "128", "precision": "bf16",
                "intra_link": "PCIe 5.0 x16", "batch_size": "96", "bucket_cap_mb": "5"})
    shown = _shown(page)
    assert shown["hash"] == "#" + X.settings_to_hash(shown["form"])
    assert "model=Llama-2%2013B" in shown["hash"] and "gpus=128" in shown["hash"]
    page.evaluate("location.hash = ''")  # the opening case
    page.wait_for_function("window.dpcostExplorer.formSettings().model === 'GPT-2 XL'")
    _wait_rendered(page)
    assert _shown(page)["form"] == {k: str(v) for k, v in X.explore({})["settings"].items()}
    page.evaluate(f"location.hash = {shown['hash']!r}")
    page.wait_for_function("window.dpcostExplorer.formSettings().model === 'Llama-2 13B'")
    _wait_rendered(page)
    assert _shown(page) == shown
    # A link with a bad value says so next to its control.
    page.evaluate("location.hash = '#gpus=3'")
    page.wait_for_function("document.getElementById('error-gpus').textContent !== ''")
    assert "gpus must be one of" in page.locator("#error-gpus").inner_text()
    assert _shown(page)["form"]["gpus"] == "8"  # the control holds a valid choice meanwhile
    _set(page, {"gpus": "16"})
    assert page.locator("#error-gpus").inner_text() == ""
    assert problems == []


def test_a_browser_without_webassembly_is_told_so(browser_page):
    page, _, problems, _ = browser_page
    base = page.url.split("/explorer/")[0]
    bare = page.context.new_page()  # the same browser, with WebAssembly taken away
    try:
        bare.add_init_script("delete globalThis.WebAssembly")
        bare.goto(f"{base}/explorer/index.html")
        bare.wait_for_function("document.body.dataset.state === 'failed'")
        text = bare.locator("#status").inner_text()
        assert "cannot run WebAssembly or Web Workers" in text and "Lesson 05" in text
        assert bare.locator("#status").is_visible() and bare.locator("#controls").is_hidden()
    finally:
        bare.close()
    assert problems == []


def test_nothing_came_from_the_network_and_the_console_stayed_clean(browser_page):
    page, _, problems, blocked = browser_page
    assert blocked == [], f"the page asked the network for {blocked}"
    assert problems == []
    # The page's Python came from the site: CPython on WebAssembly, not a kernel.
    assert page.evaluate("window.dpcostExplorer.python").startswith("3.")
    assert len(page.evaluate("window.dpcostExplorer.updates")) >= len(CASES)


def test_the_opening_case_shows_at_once_from_the_build_marked_until_python_answers(
        browser_page):
    """Opened bare, the page draws the opening case that book/build.py computed (CPython) before
    Pyodide has loaded: the readout and the three figures, the controls disabled, the page
    marked as precomputed; once Python answers here, the same case is live."""
    page, _, problems, _ = browser_page
    base = page.url.split("/explorer/")[0]
    bare = page.context.new_page()
    try:
        bare.goto(f"{base}/explorer/index.html", wait_until="domcontentloaded")
        bare.wait_for_function("() => window.dpcostExplorer.precomputedMs !== undefined"
                               " || document.body.dataset.state !== 'loading'")
        if bare.evaluate("document.body.dataset.state") == "loading":  # drawn before Python
            assert bare.evaluate("document.body.dataset.shown") == "precomputed"
            assert "computed when this site was built" in bare.locator("#status").inner_text()
            assert bare.locator("#status").is_visible()
            assert bare.locator("#control-gpus").is_disabled()
        assert bare.evaluate("window.dpcostExplorer.precomputedMs") is not None
        early = _shown(bare)
        assert bare.locator("#figures svg").count() == 3
        _wait_ready(bare)
        assert bare.evaluate("document.body.dataset.shown") == "live"
        assert bare.locator("#control-gpus").is_enabled() and bare.locator("#status").is_hidden()
        live = _shown(bare)
        expected = _expected(live["form"])
        assert early.pop("form") == live.pop("form") == {
            k: str(v) for k, v in X.explore({})["settings"].items()}
        assert _text(early) == _text(live) == _text(expected)
        assert _numbers_apart(early, expected, False) == []
    finally:
        bare.close()
    assert problems == []
