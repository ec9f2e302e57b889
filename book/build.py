"""Build the course's website from the committed, executed notebooks (no code is run).

    python book/build.py [--out build/site]
    python book/build.py --explorer-only --out /tmp/site   # just <out>/_build/html/explorer/

Jupyter Book 1 (Sphinx) with the repository root as its source, so that links from the lessons
to examples/ and benchmarks/ resolve; book/_toc.yml lists the pages in the course's order.
Warnings are errors (-W, and -n for broken references). The entry page is
<out>/_build/html/index.html. Exits with jupyter-book's status.

Then the explorer page (``build_explorer``): <out>/_build/html/explorer/index.html runs
``dpcost.explorer_model`` on Pyodide in a Web Worker and draws with Vega-Lite. Pyodide, Vega,
Vega-Lite and vega-embed come from npm (site_explorer/package-lock.json, ``npm ci`` when the lock
changed) and are copied next to the page with the model's pure-Python modules, so that the page
loads nothing from another host.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPLORER_SOURCE = ROOT / "site_explorer"
NODE_MODULES = EXPLORER_SOURCE / "node_modules"
PAGE_FILES = ("index.html", "explorer.js", "worker.js", "explorer.css")
# What of each npm package the page loads (Pyodide's loader, its CPython and standard library).
VENDOR_FILES = {
    "pyodide": ["pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip",
                "pyodide-lock.json", "README.md", "package.json"],
    "vega": ["build/vega.min.js", "LICENSE"],
    "vega-lite": ["build/vega-lite.min.js", "LICENSE"],
    "vega-embed": ["build/vega-embed.min.js", "LICENSE"],
}
VENDOR_TARGETS = {  # where index.html and worker.js expect them
    "vega/build/vega.min.js": "vega/vega.min.js",
    "vega-lite/build/vega-lite.min.js": "vega-lite/vega-lite.min.js",
    "vega-embed/build/vega-embed.min.js": "vega-embed/vega-embed.min.js",
}
# Where index.html gets the opening case's answer (``opening_script``).
OPENING_MARK = "<!-- opening case: book/build.py puts the answer it computed here -->"
# Stand-ins for what the model must never import: the page's Python has none of them.
_CLOSURE = (
    "import json, sys\n"
    "for name in ('numpy', 'torch', 'sympy', 'matplotlib', 'ipywidgets'):\n"
    "    sys.modules[name] = None\n"
    "import dpcost.explorer_model\n"
    "print(json.dumps(sorted(m.__file__ for n, m in sys.modules.items()\n"
    "                        if n == 'dpcost' or n.startswith('dpcost.'))))\n")


def build_command(out: Path) -> list[str]:
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    return [str(jupyter_book), "build", str(ROOT), "--config", str(ROOT / "book" / "_config.yml"),
            "--toc", str(ROOT / "book" / "_toc.yml"), "--path-output", str(out),
            "--builder", "html", "-W", "-n", "--keep-going", "--all"]


def npm_ci() -> None:
    """Install the pinned packages into site_explorer/node_modules unless they are current.

    A file lock keeps two builds at once (the tests' parallel lanes) from installing together.
    """
    lock = EXPLORER_SOURCE / "package-lock.json"
    stamp = NODE_MODULES / ".package-lock.json"  # npm writes it on every install
    with open(EXPLORER_SOURCE / ".npm-ci.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        if stamp.exists() and stamp.stat().st_mtime >= lock.stat().st_mtime:
            return
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("make site needs npm (Node.js) to install Pyodide and Vega-Lite")
        subprocess.run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--quiet"],
                       cwd=EXPLORER_SOURCE, check=True)


def model_files() -> list[Path]:
    """The dpcost modules that ``import dpcost.explorer_model`` loads (in a fresh interpreter,
    with numpy, torch, sympy, matplotlib and ipywidgets made unimportable)."""
    done = subprocess.run([sys.executable, "-c", _CLOSURE], capture_output=True, text=True,
                          cwd=ROOT, check=True, timeout=120)
    return [Path(f) for f in json.loads(done.stdout)]


def colors() -> dict:
    """The course's figure colours (dpcost.plots.style), for the page's Vega-Lite specs."""
    from matplotlib.colors import to_hex, to_rgb

    from dpcost.plots import style

    # The step view draws compute in DDP's blue at alpha 0.55 on white (explorer_views.StepView).
    compute = to_hex([0.55 * c + 0.45 for c in to_rgb(style.DDP_COLOR)])
    return {"dp": style.DP_COLOR, "ddp": style.DDP_COLOR, "compute": compute,
            "components": dict(style.COMPONENT_COLORS)}


def build_explorer(html: Path) -> Path:
    """Write the explorer page into ``html/explorer`` (npm ci first if needed); returns it."""
    npm_ci()
    page = html / "explorer"
    shutil.rmtree(page, ignore_errors=True)
    (page / "vendor").mkdir(parents=True)
    for name in PAGE_FILES:
        shutil.copy2(EXPLORER_SOURCE / name, page / name)
    for package, parts in VENDOR_FILES.items():
        for part in parts:
            source = NODE_MODULES / package / part
            if not source.exists():
                raise FileNotFoundError(f"{source} is missing: run npm ci in {EXPLORER_SOURCE}")
            target = page / "vendor" / VENDOR_TARGETS.get(f"{package}/{part}", f"{package}/{part}")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    with zipfile.ZipFile(page / "dpcost_model.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        for path in model_files():
            archive.write(path, path.relative_to(ROOT).as_posix())
    (page / "colors.json").write_text(json.dumps(colors(), indent=1) + "\n")
    index = page / "index.html"
    index.write_text(index.read_text().replace(OPENING_MARK, opening_script()))
    return page


def opening_script() -> str:
    """The opening case computed here, in CPython, as a JSON script for index.html: the page
    draws it at once (marked as precomputed) and makes the controls live when Pyodide has
    loaded and answered the same question in the browser."""
    from dpcost.explorer_model import controls, explore

    built = {"controls": controls(), "colors": colors(), "result": explore(None)}
    text = json.dumps(built, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return f'<script id="opening" type="application/json">{text}</script>'


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "site",
                        help="output folder (default: build/site)")
    parser.add_argument("--explorer-only", action="store_true",
                        help="build only the explorer page, into <out>/_build/html/explorer")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    start = time.perf_counter()
    if args.explorer_only:
        page = build_explorer(out / "_build" / "html")
        print(f"explorer page built in {time.perf_counter() - start:.1f} s: {page / 'index.html'}")
        return 0
    shutil.rmtree(out / "_build", ignore_errors=True)  # a stale page must not survive a rebuild
    status = subprocess.run(build_command(out), cwd=ROOT).returncode
    if status == 0:
        build_explorer(out / "_build" / "html")
    seconds = time.perf_counter() - start
    if status == 0:
        print(f"site built in {seconds:.1f} s: {out / '_build' / 'html' / 'index.html'}")
    else:
        print(f"site build failed (exit {status}) after {seconds:.1f} s", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
