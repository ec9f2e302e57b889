"""What the real-browser tests share: Debian's Chromium, free ports, servers and their shutdown."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import signal
import subprocess
import threading
from contextlib import contextmanager
from pathlib import Path

from dpcost.procs import free_port  # noqa: F401 - the browser tests import it from here

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists()
                                         else None)
# Without the background-networking flags Chromium keeps calling out, and this network refuses.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
NO_CHROMIUM = ("no Chromium at /usr/bin/chromium or on PATH "
               "(install it with `make browser`, i.e. apt-get install -y chromium)")
LOCAL = "http://127.0.0.1"


def stop(process: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL it if it has not gone within ``timeout``."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=timeout)
    except ProcessLookupError:
        pass


@contextmanager
def static_server(directory: Path):
    """Serve ``directory`` on 127.0.0.1 from a thread; yields the base URL, shuts down after."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # keep pytest's output for failures
            pass

    handler = functools.partial(Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{LOCAL}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@contextmanager
def local_page(viewport=(1500, 1500), timeout_ms: int = 60_000):
    """A Chromium page that may only reach 127.0.0.1; yields (page, blocked request URLs)."""
    from playwright.sync_api import sync_playwright

    blocked: list[str] = []

    def route(route):
        if route.request.url.startswith(LOCAL):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
            context.route("**/*", route)
            page = context.new_page()
            page.set_default_timeout(timeout_ms)
            yield page, blocked
        finally:
            browser.close()
