"""The report page in a real browser (headless Chromium): every image decodes and shows, and
the property table has one row per registered encoding.

``tests/_browser.py`` opens a copy of the page with a script that writes its findings into
the DOM once the page has loaded and reads them back. Skipped where Chromium is not
installed (CI installs Debian's ``chromium`` package first).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests._browser import in_browser, probe

from posenc import registry
from posenc.report import build_report

_FINDINGS = """
  const images = Array.from(document.images);
  const rows = Array.from(document.querySelectorAll("#property-table tbody tr.encoding-row"));
  const found = {
    images: images.length,
    loaded: images.filter(im => im.complete && im.naturalWidth > 0).length,
    broken: images.filter(im => !(im.complete && im.naturalWidth > 0)).map(im => im.alt),
    rows: rows.map(r => r.dataset.encoding),
  };"""


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("browser-report")
    build_report(out, quick=True, lengthgen=False)  # the study's figure is checked in tests/cli
    return out / "index.html"


@in_browser
def test_every_image_loads_and_every_encoding_has_a_row(page, tmp_path):
    found = probe(page, tmp_path, _FINDINGS)
    data = json.loads((page.parent / "report.json").read_text())
    assert found["images"] == len(data["figures"]) > 0
    assert found["broken"] == [] and found["loaded"] == found["images"]
    assert found["rows"] == registry.names()


@in_browser
def test_the_probe_sees_a_broken_image(tmp_path):
    page = tmp_path / "broken.html"
    page.write_text(
        '<html><body><img alt="bad" src="data:image/png;base64,AAAA">'
        '<table id="property-table"><tbody></tbody></table></body></html>'
    )
    found = probe(page, tmp_path, _FINDINGS)
    assert found == {"images": 1, "loaded": 0, "broken": ["bad"], "rows": []}
