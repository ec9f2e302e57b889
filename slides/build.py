"""Build one reveal.js deck per notebook, offline: every script, style sheet and font is local.

    python slides/build.py                        # every notebook in notebooks/ -> build/slides/
    python slides/build.py notebooks/02_ring_allreduce.ipynb --out /tmp/decks
    python slides/build.py --outline              # the slides of each lesson, numbered as shown

nbconvert's reveal template loads reveal.js, RequireJS, jQuery and MathJax 2 from CDNs by
default; here they come from slides/node_modules (``npm ci``, pinned by package-lock.json) and
are copied into ``<out>/vendor`` so the deck folder opens anywhere, without a network. Widgets
cannot run without a kernel, so their views and saved state are left out of the decks (no widget
CDN script either); every widget cell in the course also leaves a static output, which stays.

What a deck projects differs from the notebook in three ways: a code cell tagged
``slides-hide-input`` shows only its output (its figure or table is the point); directive comments
for the tools (``# NBVAL_IGNORE_OUTPUT``, ``# noqa``) are stripped from the code that stays; and
the decks navigate linearly, so the Right arrow visits every slide in the order the outline
numbers them.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

SLIDES_DIR = Path(__file__).resolve().parent
ROOT = SLIDES_DIR.parent
NODE_MODULES = SLIDES_DIR / "node_modules"
TEMPLATE_DIR = SLIDES_DIR / "templates"
DEFAULT_OUT = ROOT / "build" / "slides"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
HIDE_INPUT_TAG = "slides-hide-input"
# Whole-line nbval directives and trailing noqa comments: for the tools, not the room.
_DIRECTIVE_LINE = re.compile(r"^[ \t]*#[ \t]*NBVAL_[A-Z_]+[ \t]*\n?", re.M)
_NOQA = re.compile(r"[ \t]*#[ \t]*noqa\b[^\n]*", re.I)
# What of each npm package the decks load (MathJax's 73 MB package holds far more than needed:
# CommonHTML output, TeX input and the woff fonts it asks for are enough).
THEME = "white"  # its only font is bundled; other themes @import web fonts from Google
VENDOR_FILES = {
    "reveal.js": ["dist/reveal.js", "dist/reveal.css", f"dist/theme/{THEME}.css",
                  "dist/theme/fonts/source-sans-pro", "plugin/notes", "LICENSE"],
    "requirejs": ["require.js"],
    "jquery": ["dist/jquery.min.js", "LICENSE.txt"],
    "mathjax": ["MathJax.js", "LICENSE", "config/TeX-AMS_CHTML-full.js", "config/Safe.js",
                "extensions", "jax/input/TeX", "jax/output/CommonHTML", "jax/element",
                "fonts/HTML-CSS/TeX/woff", "localization/en"],
}
# The deck's own paths to them, relative to the deck (what nbconvert writes into the HTML).
VENDOR_URLS = {
    "reveal_url_prefix": "vendor/reveal.js",
    "require_js_url": "vendor/requirejs/require.js",
    "jquery_url": "vendor/jquery/dist/jquery.min.js",
    "mathjax_url": "vendor/mathjax/MathJax.js?config=TeX-AMS_CHTML-full,Safe",
}
WIDTH, HEIGHT = 1280, 720


def npm_ci() -> None:
    """Install the pinned vendor packages into slides/node_modules unless they are current."""
    lock = SLIDES_DIR / "package-lock.json"
    stamp = NODE_MODULES / ".package-lock.json"  # npm writes it on every install
    if stamp.exists() and stamp.stat().st_mtime >= lock.stat().st_mtime:
        return
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("make slides needs npm (Node.js) to install reveal.js and MathJax")
    subprocess.run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"],
                   cwd=SLIDES_DIR, check=True)


def copy_vendor(out: Path) -> None:
    """Copy the files the decks load from node_modules into ``out/vendor``."""
    vendor = out / "vendor"
    for package, parts in VENDOR_FILES.items():
        for part in parts:
            source, target = NODE_MODULES / package / part, vendor / package / part
            if not source.exists():
                raise FileNotFoundError(f"{source} is missing: run npm ci in {SLIDES_DIR}")
            if source.is_dir():
                shutil.copytree(source, target, dirs_exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)


def projected_source(source: str) -> str:
    """A code cell's source as a deck shows it: without nbval directives or ``# noqa`` comments."""
    return _NOQA.sub("", _DIRECTIVE_LINE.sub("", source)).strip("\n")


def _deck_cells_preprocessor():
    from nbconvert.preprocessors import Preprocessor

    class DeckCells(Preprocessor):
        """Drop widget views and saved widget state (a deck has no kernel to drive them), strip
        directive comments from code, and hide the input of cells tagged ``slides-hide-input``."""

        def preprocess(self, nb, resources):
            nb.metadata.pop("widgets", None)
            for cell in nb.cells:
                if cell.cell_type != "code":
                    continue
                cell.outputs = [out for out in cell.outputs
                                if WIDGET_VIEW not in out.get("data", {})]
                cell.source = projected_source(cell.source)
                if HIDE_INPUT_TAG in cell.metadata.get("tags", []) or not cell.source:
                    # what nbconvert's TagRemovePreprocessor sets to drop an input
                    cell.metadata["transient"] = {"remove_source": True}
            return nb, resources

    return DeckCells


def exporter():
    """nbconvert's SlidesExporter, configured for local vendor files and a 1280x720 deck."""
    from nbconvert import SlidesExporter
    from traitlets.config import Config

    config = Config()
    config.SlidesExporter.reveal_url_prefix = VENDOR_URLS["reveal_url_prefix"]
    config.SlidesExporter.reveal_theme = THEME
    config.SlidesExporter.reveal_transition = "none"  # no animation to wait for when presenting
    config.SlidesExporter.reveal_scroll = True  # long outputs scroll instead of being cut off
    config.SlidesExporter.reveal_number = "c/t"  # slide 7/18: the numbers docs/teaching.md cites
    config.SlidesExporter.reveal_width = str(WIDTH)
    config.SlidesExporter.reveal_height = str(HEIGHT)
    config.SlidesExporter.template_name = "dpcost_reveal"
    config.SlidesExporter.extra_template_basedirs = [str(TEMPLATE_DIR)]
    config.SlidesExporter.exclude_input_prompt = True
    config.SlidesExporter.exclude_output_prompt = True
    for name in ("require_js_url", "jquery_url", "mathjax_url"):
        setattr(config.HTMLExporter, name, VENDOR_URLS[name])
    exp = SlidesExporter(config=config)
    exp.register_preprocessor(_deck_cells_preprocessor()(), enabled=True)
    return exp


# A resource the browser would fetch: script/img/iframe/source src, link href, CSS @import/url(),
# and ES module imports. Plain <a href> links are navigation, not loads, and may point anywhere.
_LOADS = [
    re.compile(r"<(?:script|img|iframe|source|embed|audio|video)\b[^>]*\bsrc\s*=\s*"
               r"[\"']?([^\"' >]+)", re.I),
    re.compile(r"<link\b[^>]*\bhref\s*=\s*[\"']?([^\"' >]+)", re.I),
    re.compile(r"@import\s+(?:url\()?[\"']?([^\"')\s;]+)", re.I),
    re.compile(r"\bimport\s+[\w{}\s,*]+\s+from\s+[\"']([^\"']+)", re.I),
]


def external_loads(html: str) -> list[str]:
    """Every resource ``html`` would load from another host (empty for an offline deck)."""
    found = []
    for pattern in _LOADS:
        for url in pattern.findall(html):
            if re.match(r"(?:https?:)?//", url, re.I):
                found.append(url)
    return found


def build_deck(notebook: Path, out: Path, exp=None) -> Path:
    """Write ``out/<notebook>.slides.html`` and refuse a deck that would load anything remote."""
    import nbformat

    exp = exp or exporter()
    nb = nbformat.read(notebook, as_version=4)
    html, _ = exp.from_notebook_node(nb, resources={"metadata": {"name": notebook.stem}})
    remote = external_loads(html)
    if remote:
        raise RuntimeError(f"{notebook.name}: the deck would load {remote}")
    target = out / f"{notebook.stem}.slides.html"
    target.write_text(html, encoding="utf-8")
    return target


def write_index(out: Path, decks: list[Path]) -> None:
    """A page listing the decks, so the folder can be opened at its root."""
    import html

    items = "\n".join(f'<li><a href="{d.name}">{html.escape(d.name.split(".")[0])}</a></li>'
                      for d in sorted(decks))
    (out / "index.html").write_text(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<title>dpcost slide decks</title></head>\n<body><h1>dpcost slide decks</h1>\n"
        f"<ul>\n{items}\n</ul>\n</body></html>\n", encoding="utf-8")


def build(notebooks: list[Path], out: Path) -> list[Path]:
    """npm ci if needed, copy the vendor files, then one deck per notebook."""
    npm_ci()
    out.mkdir(parents=True, exist_ok=True)
    copy_vendor(out)
    exp = exporter()
    decks = [build_deck(nb, out, exp) for nb in notebooks]
    write_index(out, sorted(out.glob("*.slides.html")))
    return decks


# ------------------------------------------------------------------------------------------
# The outline: the slides of a deck as reveal.js numbers them, from the cells' metadata.

def outline(notebook: Path) -> list[tuple[int, str]]:
    """``[(number, title), ...]``: every slide of the deck, numbered as the deck shows it.

    Follows nbconvert's ``_RevealMetadataPreprocessor``: the first visible cell starts a slide,
    "slide" starts the next slide, "subslide" one below it, and "skip" and "notes" cells are not
    shown. The deck numbers slides and subslides together, 1 to N (reveal.js ``c/t``). The title
    is the first markdown heading on the slide, else its first markdown line.
    """
    import nbformat

    titles: list[str | None] = []
    for cell in nbformat.read(notebook, as_version=4).cells:
        kind = cell.metadata.get("slideshow", {}).get("slide_type", "-")
        if kind in ("skip", "notes"):
            continue
        if not titles or kind in ("slide", "subslide"):
            titles.append(None)
        if titles[-1] is None and cell.cell_type == "markdown":
            titles[-1] = _title(cell.source)
    return [(number, title or "(code)") for number, title in enumerate(titles, start=1)]


def _title(markdown: str) -> str | None:
    lines = [line.strip() for line in markdown.splitlines() if line.strip()]
    heading = next((line for line in lines if line.startswith("#")), None)
    if heading:
        return re.sub(r"^#+\s*", "", heading)
    if not lines:
        return None
    text = lines[0].replace("**", "")  # a slide without a heading: its first words
    return text if len(text) <= 60 else text[:60].rsplit(" ", 1)[0] + " …"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python slides/build.py",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="default: build/slides")
    parser.add_argument("--outline", action="store_true",
                        help="print each deck's slides with their numbers, build nothing")
    args = parser.parse_args(argv)
    notebooks = args.notebooks or NOTEBOOKS
    if args.outline:
        for notebook in notebooks:
            slides = outline(notebook)
            print(f"{notebook.stem}: {len(slides)} slides")
            for number, title in slides:
                print(f"  {number:>3}  {title}")
        return 0
    start = time.perf_counter()
    decks = build(notebooks, args.out)
    print(f"wrote {len(decks)} decks to {args.out} in {time.perf_counter() - start:.1f} s "
          f"(open {args.out / 'index.html'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
