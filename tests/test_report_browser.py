"""The report page in a real browser (headless Chromium): every image decodes and shows, and
the property table has one row per registered encoding.

A copy of the page gets a script that writes its findings into the DOM once the page has
loaded; ``chromium --dump-dom`` prints the DOM and the test reads them back. Skipped where
Chromium is not installed (CI installs Debian's ``chromium`` package first).
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from posenc import registry
from posenc.report import build_report

pytestmark = pytest.mark.browser

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)

_PROBE = """<script>
window.addEventListener("load", () => {
  const images = Array.from(document.images);
  const rows = Array.from(document.querySelectorAll("#property-table tbody tr.encoding-row"));
  const found = {
    images: images.length,
    loaded: images.filter(im => im.complete && im.naturalWidth > 0).length,
    broken: images.filter(im => !(im.complete && im.naturalWidth > 0)).map(im => im.alt),
    rows: rows.map(r => r.dataset.encoding),
  };
  const pre = document.createElement("pre");
  pre.id = "posenc-probe";
  pre.textContent = JSON.stringify(found);
  document.body.appendChild(pre);
});
</script>"""


def _probe(page: Path, tmp_path: Path) -> dict:
    """Open ``page`` (with the probe script added) in headless Chromium; return its findings."""
    probed = page.with_name("probed.html")
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", _PROBE + "</body>"))
    profile = tmp_path / "chromium-profile"
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
            f"--user-data-dir={profile}",
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


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    if CHROMIUM is None:
        pytest.skip("headless Chromium not installed (apt-get install chromium); CI installs it")
    out = tmp_path_factory.mktemp("browser-report")
    build_report(out, quick=True, lengthgen=False)  # the study's figure is checked in tests/cli
    return out / "index.html"


def test_every_image_loads_and_every_encoding_has_a_row(page, tmp_path):
    found = _probe(page, tmp_path)
    data = json.loads((page.parent / "report.json").read_text())
    assert found["images"] == len(data["figures"]) > 0
    assert found["broken"] == [] and found["loaded"] == found["images"]
    assert found["rows"] == registry.names()


def test_the_probe_sees_a_broken_image(tmp_path):
    if CHROMIUM is None:
        pytest.skip("headless Chromium not installed (apt-get install chromium); CI installs it")
    page = tmp_path / "broken.html"
    page.write_text(
        '<html><body><img alt="bad" src="data:image/png;base64,AAAA">'
        '<table id="property-table"><tbody></tbody></table></body></html>'
    )
    found = _probe(page, tmp_path)
    assert found == {"images": 1, "loaded": 0, "broken": ["bad"], "rows": []}
