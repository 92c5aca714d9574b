"""What every HTML page posenc writes shares (``posenc report``, ``posenc extend``): escaping
and numbers, the page shell with its style, a figure embedded from the file it was written
to, and matplotlib's pyplot with the extra to install named.

A figure is embedded by reading it back with :func:`posenc._files.read_regular` (a regular
file within :data:`~posenc._files.FIGURE_MAX_BYTES`) as a base64 PNG data URI, so a page is
one self-contained file. Figures are rendered to bytes (:func:`rendered`) and written with
:func:`posenc._files.atomic_write`.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

from posenc._files import FIGURE_MAX_BYTES, read_regular

__all__ = ["CSS", "escape", "figure_html", "number", "page", "pyplot", "rendered"]

#: The style of every page.
CSS = """
:root { --fg: #1d2330; --muted: #5b6475; --line: #dde2ea; --bg: #f7f8fb; --card: #fff;
        --yes: #17803d; --no: #b42318; --accent: #3355cc; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: var(--fg); background: var(--bg); }
header { background: #182033; color: #fff; padding: 28px 40px 18px; }
header h1 { margin: 0 0 4px; font-size: 28px; }
header .meta { color: #c3cbe0; margin: 0 0 12px; }
header nav a { color: #fff; margin-right: 18px; text-decoration: none; border-bottom: 1px solid #7f8bb0; }
main { max-width: 1220px; margin: 0 auto; padding: 10px 32px 40px; }
section { margin-top: 34px; }
h2 { font-size: 22px; border-bottom: 2px solid var(--line); padding-bottom: 6px; }
h3 { margin: 0 0 6px; font-size: 17px; }
p.lead { color: var(--muted); max-width: 900px; }
table { border-collapse: collapse; background: var(--card); font-size: 13.5px; }
th, td { border-bottom: 1px solid var(--line); padding: 5px 8px; text-align: right; white-space: nowrap; }
th { background: #eef1f7; white-space: normal; vertical-align: bottom; }
td:first-child, th:first-child, td.text, th.text { text-align: left; }
td.yes { color: var(--yes); font-weight: 600; } td.no { color: var(--no); font-weight: 600; }
td.level { color: var(--muted, #666); font-style: italic; }
tr.error td { color: var(--no); white-space: normal; }
.scroll { overflow-x: auto; border: 1px solid var(--line); border-radius: 6px; }
dl.legend { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; font-size: 13px;
            color: var(--muted); margin-top: 10px; }
dl.legend dt { font-weight: 600; color: var(--fg); }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 16px; }
article.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 14px; }
.kind { font-size: 12px; font-weight: 600; padding: 1px 8px; border-radius: 10px; background: #e6ebf7;
        color: var(--accent); margin-left: 6px; vertical-align: middle; }
code, .config { font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size: 12px; }
.config { color: var(--muted); word-break: break-all; margin: 0 0 8px; }
.figs { display: flex; flex-wrap: wrap; gap: 10px; align-items: flex-start; }
figure { margin: 0; }
figure img { max-width: 100%; height: auto; display: block; border: 1px solid var(--line); border-radius: 4px; }
figcaption { font-size: 12px; color: var(--muted); }
.demo { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 14px 18px;
        margin-bottom: 14px; }
.demo h3 span { color: var(--muted); font-weight: 400; }
.verdict { font-weight: 600; }
.absent { background: #fff6e5; border: 1px solid #f0c36d; border-radius: 8px; padding: 12px 16px; }
footer { color: var(--muted); font-size: 13px; margin-top: 40px; }
.range { color: var(--muted); font-size: 12px; }
th.theirs, td.theirs { background: #f3f0fa; }
ul.checks { padding-left: 18px; } ul.checks li.yes b { color: var(--yes); }
ul.checks li.no b { color: var(--no); }
p.answer { font-size: 18px; max-width: 900px; }
pre { white-space: pre-wrap; overflow-wrap: anywhere; font-size: 12px; color: var(--muted); }
pre.command { color: var(--fg); background: #eef1f7; padding: 8px 10px; border-radius: 6px; }
td.wrap { white-space: normal; }
table.pairs th { vertical-align: top; } table.pairs td { overflow-wrap: anywhere; }
.scroll + figure, figure + .scroll { margin-top: 12px; }
"""


def escape(value: Any) -> str:
    """``str(value)`` escaped for HTML text and attribute values."""
    return html.escape(str(value), quote=True)


def number(value: Any, digits: int = 3) -> str:
    """A number as a table shows it: ``-`` for None, ``yes``/``no`` for a bool, an int
    whole, a float to ``digits`` significant digits (0 as ``0``); anything else escaped."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value == 0:
            return "0"
        return f"{value:.{digits}g}"
    return escape(value)


def figure_html(
    path: Path, title: str, *, size: tuple[int, int] | None = None, css: str = ""
) -> str:
    """The PNG at ``path`` embedded as a ``<figure>`` captioned ``title`` (``size``: its
    width and height in pixels, when known).

    Raises:
        PosEncError: ``path`` is missing, not a regular file, or over the figure cap.
    """
    raw = read_regular(path, what="figure", max_bytes=FIGURE_MAX_BYTES)
    data = base64.b64encode(raw).decode("ascii")
    dims = "" if size is None else f' width="{size[0]}" height="{size[1]}"'
    name, alt = escape(path.name), escape(title)
    return (
        f'<figure class="{css}"><img src="data:image/png;base64,{data}" alt="{alt}"{dims} '
        f'data-file="{name}"><figcaption>{alt} (<code>{name}</code>)</figcaption></figure>'
    )


def page(title: str, body: str) -> str:
    """One self-contained HTML page: ``body`` (HTML) under :data:`CSS`, titled ``title``."""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title><style>{CSS}</style></head>
<body>
{body}
</body></html>
"""


def pyplot(extra: str, needed_by: str) -> Any:
    """``matplotlib.pyplot`` on the Agg backend.

    Raises:
        ImportError: matplotlib is missing, naming what needs it (``needed_by``) and the
            extra that installs it (``pip install 'posenc[EXTRA]'``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError(f"{needed_by} needs matplotlib: pip install 'posenc[{extra}]'") from error
    return plt


def rendered(fig: Any, *, dpi: float, format: str = "png") -> bytes:
    """``fig`` rendered as ``format`` bytes at ``dpi``, then closed (its pyplot memory freed);
    write them with :func:`posenc._files.atomic_write`."""
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, dpi=dpi, format=format)
    finally:
        pyplot("plot", "closing a figure").close(fig)
    return buffer.getvalue()
