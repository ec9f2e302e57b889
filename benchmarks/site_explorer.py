"""The site's explorer page in Chromium: time to interactive, update time, bytes downloaded.

    .venv/bin/python benchmarks/site_explorer.py                  # 3 cold, 3 warm, 100 changes
    .venv/bin/python benchmarks/site_explorer.py --loads 5 --site build/site/_build/html
    .venv/bin/python benchmarks/site_explorer.py --check   # exit 1 past the goals: 1 s, 5 s

Builds the explorer page as ``make site`` does (book/build.py's ``build_explorer``, into a
temporary folder) unless ``--site`` names a built site, serves it from 127.0.0.1 with a server
that counts the bytes of every response body, and drives Debian's Chromium (headless) through
Playwright with every other request blocked.

* open to the opening case: from the navigation's start to the opening case's readout and
  figures drawn from the answer ``book/build.py`` computed (marked as precomputed, controls
  disabled; ``precomputedMs`` in the page).
* open to interactive: from the navigation's start to the first answer drawn (the controls
  usable; ``performance.now()`` in the page). Cold: a fresh browser context (empty HTTP cache).
  Warm: a second page in the same context (the HTTP cache and Chromium's compiled-code cache
  are filled; http.server sends Last-Modified, so the browser may revalidate).
* update time: from a control's change event to the three figures redrawn and the readout
  written, over ``--changes`` changes (a seeded random walk over every control), median and
  p90; and how much of it Python took (``explore_json`` in the worker).
* bytes: what the server sent for one cold load.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import random
import statistics
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from browser_support import CHROMIUM, CHROMIUM_ARGS, LOCAL  # noqa: E402


def percentile(values, q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between order statistics."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class CountingServer:
    """Serve ``directory`` on 127.0.0.1; ``sent`` maps each path to the body bytes sent."""

    def __init__(self, directory: Path):
        self.sent: dict[str, int] = {}
        counts = self.sent

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def copyfile(self, source, outputfile):
                size = os.fstat(source.fileno()).st_size
                counts[self.path] = counts.get(self.path, 0) + size
                super().copyfile(source, outputfile)

        handler = functools.partial(Handler, directory=str(directory))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.handle_error = lambda *args: None  # a browser closed mid-download
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.base = f"{LOCAL}:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def tree_cpu_seconds() -> float:
    """CPU seconds (user + system) used so far by this process's descendants that are alive:
    the Playwright driver and Chromium's processes. Less sensitive than wall time to other
    jobs on a shared machine."""
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def block_others(blocked: list):
    def route(route):
        if route.request.url.startswith(LOCAL):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()
    return route


def open_page(context, url: str, timeout_ms: int = 180_000):
    """Open ``url``, wait until the explorer is ready; returns (page, ms to interactive, ms to
    the precomputed opening case or None when the page drew none)."""
    page = context.new_page()
    page.set_default_timeout(timeout_ms)
    page.goto(url)
    page.wait_for_function("document.body.dataset.state !== 'loading'")
    if page.evaluate("document.body.dataset.state") != "ready":
        raise RuntimeError(page.locator("#status").inner_text())
    return (page, page.evaluate("window.dpcostExplorer.readyMs"),
            page.evaluate("window.dpcostExplorer.precomputedMs ?? null"))


def random_changes(page, changes: int, rng: random.Random) -> tuple[list, list]:
    """Change one control at a time (a random one, to a different value); returns the page's
    update times and the worker's Python times, in ms."""
    options = page.evaluate("""() => Object.fromEntries([...document.querySelectorAll(
        '#controls select')].map(s => [s.name, [...s.options].map(o => o.value)]))""")
    texts = {"batch_size": ["1", "8", "32", "64", "256", "1024"],
             "outputs": ["1000", "10000", "32000", "51463168"]}
    choices = {**{k: v for k, v in options.items() if k != "model"}, **texts}
    models = [m for m in options["model"] if m != "custom"]  # custom: its text, not timed here
    updates, python = [], []
    for _ in range(changes):
        name = rng.choice([*choices, "model"])
        values = models if name == "model" else choices[name]
        current = page.evaluate(f"window.dpcostExplorer.formSettings()[{name!r}]")
        value = rng.choice([v for v in values if v != current])
        count = page.evaluate("window.dpcostExplorer.updates.length")
        control = page.locator(f"#control-{name}")
        if name in texts:
            control.fill(value)
            control.press("Tab")
        else:
            control.select_option(value)
        page.wait_for_function(f"window.dpcostExplorer.updates.length > {count}")
        page.wait_for_function("() => { const p = window.dpcostExplorer; return !p.busy()"
                               " && p.renderedKey === JSON.stringify(p.formSettings()); }")
        updates.append(page.evaluate("window.dpcostExplorer.updates.at(-1)"))
        python.append(page.evaluate("window.dpcostExplorer.lastPythonMs"))
        if page.evaluate("document.body.dataset.ok") != "true":
            raise RuntimeError(f"{name} = {value!r} was refused")
    return updates, python


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", type=int, default=3,
                        help="cold loads, each followed by a warm one (default 3)")
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--renderer", choices=["canvas", "svg"],
                        help="Vega's renderer (default: the page's, svg)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the cold medians miss the goals: the opening case "
                        "drawn within 1 s, interactive within 5 s")
    parser.add_argument("--site", type=Path, help="a built site's html folder (default: build "
                        "the explorer page into a temporary folder)")
    args = parser.parse_args(argv)
    if CHROMIUM is None:
        print("no Chromium: install it with `make browser`", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        site = args.site
        if site is None:
            import importlib.util

            spec = importlib.util.spec_from_file_location("site_build", ROOT / "book" / "build.py")
            build = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(build)
            site = Path(tmp) / "html"
            build.build_explorer(site)
        url_path = "/explorer/index.html" + (f"?renderer={args.renderer}" if args.renderer else "")
        print(f"site explorer in headless Chromium, {os.cpu_count()} CPUs, "
              f"load average {os.getloadavg()[0]:.2f} at start")
        blocked: list[str] = []
        with CountingServer(site) as server, sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                cold, warm, sizes, cold_cpu, warm_cpu, phases = [], [], [], [], [], []
                cold_first, warm_first = [], []
                for _ in range(args.loads):
                    context = browser.new_context(viewport={"width": 1280, "height": 720})
                    context.route("**/*", block_others(blocked))
                    server.sent.clear()
                    cpu = tree_cpu_seconds()
                    page, ms, first_ms = open_page(context, server.base + url_path)
                    cold_cpu.append(tree_cpu_seconds() - cpu)
                    cold.append(ms)
                    cold_first.append(first_ms)
                    phases.append(page.evaluate("window.dpcostExplorer.pythonPhases"))
                    sizes.append(dict(server.sent))
                    page.close()
                    cpu = tree_cpu_seconds()  # the same address again, caches filled
                    again, ms, first_ms = open_page(context, server.base + url_path)
                    warm_cpu.append(tree_cpu_seconds() - cpu)
                    warm.append(ms)
                    warm_first.append(first_ms)
                    context.close()
                context = browser.new_context(viewport={"width": 1280, "height": 720})
                context.route("**/*", block_others(blocked))
                page, _, _ = open_page(context, server.base + url_path)
                python_version = page.evaluate("window.dpcostExplorer.python")
                random_changes(page, 5, random.Random(args.seed + 1))  # warm-up
                updates, python = random_changes(page, args.changes, random.Random(args.seed))
                context.close()
            finally:
                browser.close()
        first = sizes[0]
        total = sum(first.values())
        for name, drawn in (("cold", cold_first), ("warm", warm_first)):
            if None in drawn:
                print(f"open to the opening case, {name}: not drawn before Python answered "
                      f"in {drawn.count(None)} of {len(drawn)} loads")
                continue
            print(f"open to the opening case (precomputed at build), {name}, {len(drawn)} "
                  f"loads: median {statistics.median(drawn) / 1e3:.2f} s, "
                  f"min {min(drawn) / 1e3:.2f} s, max {max(drawn) / 1e3:.2f} s")
        for name, wall, cpu in (("cold (new context)", cold, cold_cpu),
                                ("warm (same context)", warm, warm_cpu)):
            print(f"open to interactive, {name}, {len(wall)} loads: median "
                  f"{statistics.median(wall) / 1e3:.2f} s, min {min(wall) / 1e3:.2f} s, "
                  f"max {max(wall) / 1e3:.2f} s; Chromium's CPU time median "
                  f"{statistics.median(cpu):.2f} s")
        print("  of a cold load, in the worker: loadPyodide median "
              f"{statistics.median(p['pyodide'] for p in phases):.2f} s, importing the model "
              f"{statistics.median(p['model'] for p in phases):.2f} s")
        print(f"update time over {len(updates)} changes (change event to figures drawn): "
              f"median {statistics.median(updates):.1f} ms, p90 {percentile(updates, 90):.1f} ms, "
              f"max {max(updates):.1f} ms; of which Python (Pyodide {python_version}) median "
              f"{statistics.median(python):.1f} ms, p90 {percentile(python, 90):.1f} ms")
        print(f"downloaded on a cold load: {total / 1e6:.2f} MB in {len(first)} files; largest:")
        for path, size in sorted(first.items(), key=lambda kv: -kv[1])[:6]:
            print(f"  {size / 1e6:8.3f} MB  {path}")
        print(f"blocked requests to other hosts: {len(blocked)}; "
              f"load average {os.getloadavg()[0]:.2f} at end")
    if args.check:
        missed = []
        if None in cold_first or statistics.median(cold_first) > 1000:
            missed.append("the opening case was not drawn within 1 s (cold median)")
        if statistics.median(cold) > 5000:
            missed.append("not interactive within 5 s (cold median)")
        for line in missed:
            print(f"FAIL: {line}", file=sys.stderr)
        return 1 if missed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
