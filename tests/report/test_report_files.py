"""The report embeds only a regular figure file within its cap (through the shared
``posenc._pages.figure_html``, as ``posenc extend``'s page does)."""

from __future__ import annotations

import base64
import os
import sys
from pathlib import Path

import pytest
from tests.experiments.test_files import no_hang

from posenc import PosEncError
from posenc.report.study_html import embedded

RECORD = {"file": "fig.png", "title": "a figure", "width": 2, "height": 1}


def test_a_figure_is_embedded_whole(tmp_path: Path) -> None:
    (tmp_path / "fig.png").write_bytes(b"\x89PNG-bytes")
    data = base64.b64encode(b"\x89PNG-bytes").decode()
    assert embedded(tmp_path, RECORD, "wide") == (
        f'<figure class="wide"><img src="data:image/png;base64,{data}" alt="a figure" '
        'width="2" height="1" data-file="fig.png"><figcaption>a figure '
        "(<code>fig.png</code>)</figcaption></figure>"
    )


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs are POSIX")
def test_a_fifo_figure_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fig.png")
    with pytest.raises(
        PosEncError, match=r"figure '.*fig\.png' must be a regular file, got a FIFO"
    ):
        no_hang(lambda: embedded(tmp_path, RECORD), fifo=tmp_path / "fig.png")
