"""MkDocs hooks of the posenc site (``hooks:`` in ``mkdocs.yml``).

1. **Every Python example runs.** Each ```` ```python ```` (or ``py``) fence of a page becomes
   a markdown-exec block executed while the site is built, in one session per page (a
   page's blocks share their names, top to bottom). Its source is shown, and whatever it
   prints is shown under it. An exception in a block is a markdown-exec warning, and
   ``mkdocs build --strict`` fails on it. A fence that already says ``exec="..."`` keeps its
   own options (a picture drawn as HTML, say). There is no way to show a Python block without
   running it: commands that must not run here (training, the report) are shell blocks
   (```` ```bash ````), shown and never executed. Each page's first block starts, unseen,
   with ``torch.manual_seed(0)``, so the random inputs of an example are the same at every
   build (a tolerance that holds once holds always).
2. **Sphinx roles in docstrings.** posenc's docstrings name objects as ``:func:`name```;
   the API pages show the name as code without the role.
"""

from __future__ import annotations

import re
from typing import Any

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>.*)$")
_PYTHON = re.compile(r"^\{?\s*\.?(python|py)\b(?P<rest>.*)$")
_ROLE = re.compile(r":(?:func|class|mod|data|meth|attr|exc|obj|const|py:\w+):(<code>)~?")


_SEED = "import torch; torch.manual_seed(0)  # markdown-exec: hide"


def _session(page: Any) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", page.file.src_uri)


def executed(markdown: str, session: str) -> str:
    """``markdown`` with every Python fence made a markdown-exec block (see the module)."""
    out: list[str] = []
    seeded = False
    block: list[str] | None = None  # the lines of the fenced block we are in, opener first
    closing = ""  # the fence that closes it
    for line in markdown.split("\n"):
        match = _FENCE.match(line)
        if block is None:
            if match:
                block, closing = [line], match["fence"]
            else:
                out.append(line)
            continue
        block.append(line)
        if not (match and match["fence"].startswith(closing) and not match["info"].strip()):
            continue
        opener = _FENCE.match(block[0])
        info = opener["info"].strip() if opener else ""
        python = _PYTHON.match(info)
        if opener and python and "exec=" not in info:
            # output is shown as text (never read as Markdown) when the block prints, itself
            # or through cli.md's posenc_cli helper
            prints = any("print(" in b or "posenc_cli(" in b for b in block[1:-1])
            shows = ' result="text"' if prints else ""
            block[0] = (
                f'{opener["indent"]}{opener["fence"]}python exec="on" session="{session}" '
                f'source="above"{shows}{python["rest"]}'
            )
            if not seeded:
                block.insert(1, f"{opener['indent']}{_SEED}")
                seeded = True
        out.extend(block)
        block = None
    if block is not None:  # an unclosed fence: leave it to Markdown
        out.extend(block)
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    return executed(markdown, _session(page))


def on_page_content(html: str, **kwargs: Any) -> str:
    return _ROLE.sub(r"\1", html)
