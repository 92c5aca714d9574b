"""A page in a real browser (headless Chromium), for the tests that look at a page as a user
sees it: ``tests/test_report_browser.py`` and ``tests/extend/test_extend_page.py``.

:func:`probe` opens a copy of the page with a script added that, once the page has loaded,
writes its findings (the JavaScript object ``found`` that the caller's script builds) into
the DOM; ``chromium --dump-dom`` prints the DOM and :func:`probe` reads them back.
:func:`in_browser` marks a test ``browser`` and skips it where Chromium is not installed
(CI installs Debian's ``chromium`` package first).
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)

_Test = TypeVar("_Test", bound=Callable[..., Any])

#: The script added to the page: the caller's statements (which build ``found``) run once
#: the page has loaded, then ``found`` is written as JSON into ``<pre id="posenc-probe">``.
_SCRIPT = """<script>
window.addEventListener("load", () => {
%FINDINGS%
  const pre = document.createElement("pre");
  pre.id = "posenc-probe";
  pre.textContent = JSON.stringify(found);
  document.body.appendChild(pre);
});
</script>"""


def in_browser(test: _Test) -> _Test:
    """``test`` marked ``browser``, and skipped where headless Chromium is not installed."""
    skip = pytest.mark.skipif(
        CHROMIUM is None,
        reason="headless Chromium not installed (apt-get install chromium); CI installs it",
    )
    return pytest.mark.browser(skip(test))


def probe(page: Path, tmp_path: Path, findings: str, *, width: int | None = None) -> dict:
    """Open ``page`` in headless Chromium (``width`` pixels wide, or its default window) with
    ``findings`` (JavaScript statements that build the object ``found``) run once it has
    loaded; return ``found``."""
    assert CHROMIUM is not None, "probe needs Chromium: mark the test with in_browser"
    probed = page.with_name("probed.html")
    script = _SCRIPT.replace("%FINDINGS%", findings)
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", script + "</body>"))
    window = [] if width is None else [f"--window-size={width},900"]
    proc = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            *window,
            "--virtual-time-budget=5000",
            "--dump-dom",
            probed.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    match = re.search(r'<pre id="posenc-probe">(.*?)</pre>', proc.stdout, re.S)
    assert match, f"no probe output (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(html.unescape(match.group(1)))
