"""Build the course's website from the committed, executed notebooks (no code is run).

    python book/build.py [--out build/site]

Jupyter Book 1 (Sphinx) with the repository root as its source, so that links from the lessons
to examples/ and benchmarks/ resolve; book/_toc.yml lists the pages in the course's order.
Warnings are errors (-W, and -n for broken references). The entry page is
<out>/_build/html/index.html. Exits with jupyter-book's status.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_command(out: Path) -> list[str]:
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    return [str(jupyter_book), "build", str(ROOT), "--config", str(ROOT / "book" / "_config.yml"),
            "--toc", str(ROOT / "book" / "_toc.yml"), "--path-output", str(out),
            "--builder", "html", "-W", "-n", "--keep-going", "--all"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "site",
                        help="output folder (default: build/site)")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    shutil.rmtree(out / "_build", ignore_errors=True)  # a stale page must not survive a rebuild
    start = time.perf_counter()
    status = subprocess.run(build_command(out), cwd=ROOT).returncode
    seconds = time.perf_counter() - start
    if status == 0:
        print(f"site built in {seconds:.1f} s: {out / '_build' / 'html' / 'index.html'}")
    else:
        print(f"site build failed (exit {status}) after {seconds:.1f} s", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
