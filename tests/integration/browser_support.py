"""Shared by the browser tests: headless Chromium (Debian's ``chromium``) loads a page and reports what a reader
would meet: script errors, console messages, images that did not load, and a screenshot of the first screen.
Skipped without Chromium, failed instead when ``CHAOSBENCH_REQUIRE`` contains ``chromium``."""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers import require

#: Chromium's names on Debian (``chromium``) and elsewhere.
BINARIES = ("chromium", "chromium-browser")

#: Injected first into the page's <head> (in a copy beside it, so relative paths resolve the same): records every
#: uncaught error, failed resource load and console.error; makes lazy images load (a reader scrolls to them);
#: once the page has loaded, writes what it saw and every image's state into the DOM for ``--dump-dom``.
PROBE = """<script>
(function () {
  var seen = {errors: [], images: []};
  window.addEventListener('error', function (e) {
    var t = e.target;
    if (t && t !== window && t.tagName) { seen.errors.push('failed to load ' + t.tagName + ' ' + (t.src || t.href)); }
    else { seen.errors.push('uncaught: ' + e.message); }
  }, true);
  window.addEventListener('unhandledrejection', function (e) { seen.errors.push('unhandled rejection: ' + e.reason); });
  var original = console.error;
  console.error = function () {
    seen.errors.push('console.error: ' + Array.prototype.join.call(arguments, ' '));
    original.apply(console, arguments);
  };
  document.addEventListener('DOMContentLoaded', function () {
    document.querySelectorAll('img').forEach(function (img) { img.loading = 'eager'; });
  });
  window.addEventListener('load', function () {
    document.querySelectorAll('img').forEach(function (img) {
      seen.images.push({src: img.getAttribute('src').slice(0, 120), complete: img.complete, width: img.naturalWidth,
                        height: img.naturalHeight});
    });
    var out = document.createElement('pre');
    out.id = 'chaosbench-browser-check';
    out.textContent = JSON.stringify(seen);
    document.body.appendChild(out);
  });
})();
</script>"""

_RESULT = re.compile(r'<pre id="chaosbench-browser-check">(.*?)</pre>', re.S)
#: A console message of the page in Chromium's own log (``--enable-logging=stderr``), whatever its level.
_CONSOLE = re.compile(r":CONSOLE[:(]\d+\)?\] (.*)")


def chromium() -> str | None:
    """The Chromium binary on PATH, or None."""
    return next((p for b in BINARIES if (p := shutil.which(b))), None)


def require_chromium() -> None:
    """Module level: skip without Chromium; fail instead when ``CHAOSBENCH_REQUIRE`` contains ``chromium``."""
    require("chromium", None if chromium() else "no chromium on PATH (apt-get install -y chromium)")


@dataclass
class PageCheck:
    """What loading a page showed: ``errors`` (uncaught errors, failed loads, console.error: the probe's),
    ``console`` (every console message of the unmodified page, from Chromium's log), ``images`` (each <img>:
    src, complete, natural width and height) and the first screen's screenshot."""

    errors: list[str]
    console: list[str]
    images: list[dict[str, Any]]
    screenshot: Path
    dom: str = field(repr=False)


def _run(argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run Chromium in its own session; on a timeout its whole process group (only what this call started) ends."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"chromium did not finish within {timeout_s} s: {err[-2000:]}") from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def check_page(
    page: Path, work: Path, width: int = 1280, height: int = 800, timeout_s: float = 90
) -> PageCheck:
    """Load ``page`` in headless Chromium twice: a copy with :data:`PROBE` beside it (``--dump-dom``), and the
    page itself for a ``width`` x ``height`` screenshot with the console logged. ``work``: a scratch directory
    (profiles, the screenshot)."""
    binary = chromium()
    assert binary is not None, "no chromium"
    work.mkdir(parents=True, exist_ok=True)
    html = page.read_text()
    head = re.search(r"<head[^>]*>", html)
    assert head is not None, f"{page}: no <head>"
    probed = page.with_name(page.stem + ".browser-check.html")
    probed.write_text(html[: head.end()] + PROBE + html[head.end() :])
    common = [
        binary,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--no-first-run",
        "--virtual-time-budget=10000",
        f"--window-size={width},{height}",
    ]
    try:
        dumped = _run(
            [*common, f"--user-data-dir={work / 'profile-dom'}", "--dump-dom", probed.as_uri()], timeout_s
        )
    finally:
        probed.unlink()
    found = _RESULT.search(dumped.stdout)
    assert found is not None, f"the probe wrote nothing (rc {dumped.returncode}): {dumped.stderr[-2000:]}"
    seen = json.loads(_unescape(found.group(1)))
    shot = work / "first-screen.png"
    shown = _run(
        [
            *common,
            f"--user-data-dir={work / 'profile-shot'}",
            "--enable-logging=stderr",
            "--v=0",
            f"--screenshot={shot}",
            page.as_uri(),
        ],
        timeout_s,
    )
    assert shot.is_file(), f"no screenshot (rc {shown.returncode}): {shown.stderr[-2000:]}"
    console = [m.group(1) for line in shown.stderr.splitlines() if (m := _CONSOLE.search(line))]
    return PageCheck(seen["errors"], console, seen["images"], shot, dumped.stdout)


def _unescape(text: str) -> str:
    return html.unescape(text)


def non_background_share(screenshot: Path) -> tuple[int, float]:
    """(how many colours the image has, the share of its pixels that differ from its most common colour)."""
    from PIL import Image

    with Image.open(screenshot) as im:
        rgb = im.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 24) or []
        total = rgb.size[0] * rgb.size[1]
    most = max((n for n, _ in colours), default=total)
    return len(colours), 1 - most / total


def pixels_of(screenshot: Path, colour: str) -> int:
    """How many pixels of the image are exactly ``colour`` (``#rrggbb``)."""
    from PIL import Image

    want = tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))
    with Image.open(screenshot) as im:
        return sum(n for n, c in im.convert("RGB").getcolors(maxcolors=1 << 24) or [] if c == want)
