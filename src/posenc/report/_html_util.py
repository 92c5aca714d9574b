"""Small HTML helpers of the report page: escaping, numbers, embedded figures."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from posenc._files import FIGURE_MAX_BYTES, read_regular

__all__ = ["_e", "_img", "_num"]


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any, digits: int = 3) -> str:
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
    return _e(value)


def _img(out: Path, record: dict[str, Any], css: str = "") -> str:
    raw = read_regular(out / record["file"], what="figure", max_bytes=FIGURE_MAX_BYTES)
    data = base64.b64encode(raw).decode("ascii")
    return (
        f'<figure class="{css}"><img src="data:image/png;base64,{data}" '
        f'alt="{_e(record["title"])}" width="{record["width"]}" height="{record["height"]}" '
        f'data-file="{_e(record["file"])}"><figcaption>{_e(record["title"])} '
        f"(<code>{_e(record['file'])}</code>)</figcaption></figure>"
    )
