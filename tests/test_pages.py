"""``posenc._pages``: what the report's and ``posenc extend``'s pages share, the shell,
escaping and numbers, a figure embedded from its file, pyplot with its extra named."""

from __future__ import annotations

import base64
import io
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.experiments.test_files import no_hang

from posenc import PosEncError
from posenc._pages import CSS, escape, figure_html, number, page, pyplot, rendered


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "-"),
        (True, "yes"),
        (False, "no"),
        (12, "12"),
        (0.0, "0"),
        (3.14159, "3.14"),
        (1234567.0, "1.23e+06"),
        ("<b>", "&lt;b&gt;"),
    ],
)
def test_number(value: Any, expected: str) -> None:
    assert number(value) == expected


def test_number_digits() -> None:
    assert number(3.14159, 4) == "3.142"


def test_escape_quotes_for_attributes() -> None:
    assert escape("a \"b\" <c> & 'd'") == "a &quot;b&quot; &lt;c&gt; &amp; &#x27;d&#x27;"


def test_the_shell_holds_the_title_the_style_and_the_body() -> None:
    assert page("a <title>", "<main>x</main>") == (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>a &lt;title&gt;</title><style>{CSS}</style></head>\n"
        "<body>\n<main>x</main>\n</body></html>\n"
    )


@pytest.mark.parametrize(
    ("size", "css", "attributes"),
    [(None, "", ""), ((640, 480), "wide", ' width="640" height="480"')],
)
def test_a_figure_is_embedded_whole(
    tmp_path: Path, size: tuple[int, int] | None, css: str, attributes: str
) -> None:
    path = tmp_path / "ppl & more.png"
    path.write_bytes(b"\x89PNG-bytes")
    data = base64.b64encode(b"\x89PNG-bytes").decode()
    assert figure_html(path, 'a "figure"', size=size, css=css) == (
        f'<figure class="{css}"><img src="data:image/png;base64,{data}" '
        f'alt="a &quot;figure&quot;"{attributes} data-file="ppl &amp; more.png">'
        "<figcaption>a &quot;figure&quot; (<code>ppl &amp; more.png</code>)</figcaption></figure>"
    )


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs are POSIX")
def test_a_fifo_figure_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "fig.png"
    os.mkfifo(path)
    with pytest.raises(
        PosEncError, match=r"figure '.*fig\.png' must be a regular file, got a FIFO"
    ):
        no_hang(lambda: figure_html(path, "a figure"), fifo=path)


def test_a_figure_past_the_cap_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import posenc._pages

    monkeypatch.setattr(posenc._pages, "FIGURE_MAX_BYTES", 4)
    (tmp_path / "fig.png").write_bytes(b"12345")
    with pytest.raises(PosEncError, match=r"figure '.*fig\.png' is 5 bytes, more than the 4"):
        figure_html(tmp_path / "fig.png", "a figure")


@pytest.mark.parametrize(("extra", "who"), [("plot", "posenc report"), ("extend", "figures")])
def test_pyplot_names_the_extra_when_matplotlib_is_missing(
    monkeypatch: pytest.MonkeyPatch, extra: str, who: str
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(
        ImportError, match=rf"^{who} needs matplotlib: pip install 'posenc\[{extra}\]'$"
    ):
        pyplot(extra, who)


def test_a_rendered_figure_is_its_png_and_is_closed() -> None:
    plt = pytest.importorskip("matplotlib.pyplot")
    fig = plt.figure(figsize=(1, 1))
    fig.gca().plot([0, 1], [1, 0])
    expected = io.BytesIO()
    fig.savefig(expected, dpi=20, format="png")
    assert plt.fignum_exists(fig.number)
    assert rendered(fig, dpi=20) == expected.getvalue()
    assert not plt.fignum_exists(fig.number)
