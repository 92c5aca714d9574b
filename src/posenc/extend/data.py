"""What ``posenc extend`` feeds the model: long documents, for perplexity and as the
probes' haystack (:mod:`posenc.extend.probes`).

Documents are the longest Python standard-library sources by default (every machine has
them; ``pydoc_data`` is left out: it is generated help text, not source), or the files the
user names. A document is cut to the length measured, so it must have at least that many
tokens; shorter ones are skipped at that length.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posenc._errors import PosEncError
from posenc._files import MIB, read_regular

__all__ = ["Document", "documents", "stdlib_sources"]

#: The most a text file may hold (a document far longer than any context measured).
MAX_TEXT_BYTES = 64 * MIB


@dataclasses.dataclass(frozen=True)
class Document:
    """One document: its name, SHA-256 and token ids."""

    name: str
    sha256: str
    ids: tuple[int, ...]


def stdlib_sources(count: int) -> list[Path]:
    """The ``count`` largest ``.py`` files of this interpreter's standard library (tests,
    site-packages and ``pydoc_data`` left out), largest first."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idlelib", "pydoc_data"}
    files = [p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts)]
    files.sort(key=lambda p: (-p.stat().st_size, str(p)))
    return files[:count]


def documents(tokenizer: Any, texts: Sequence[str], count: int) -> list[Document]:
    """The documents, tokenized as the model's tokenizer does by default, longest first: the files ``texts``
    or, when empty, the ``count`` largest standard-library sources."""
    paths = [Path(t) for t in texts] if texts else stdlib_sources(count)
    out = []
    for path in paths:
        try:
            raw = read_regular(path, what="text", max_bytes=MAX_TEXT_BYTES)
        except OSError as error:
            raise PosEncError(f"text {str(path)!r} cannot be read ({error.strerror})") from None
        text = raw.decode("utf-8", errors="replace")
        ids = tuple(tokenizer(text)["input_ids"])  # the model's own special tokens (BOS)
        if not ids:
            raise PosEncError(f"text {str(path)!r} has no tokens")
        out.append(Document(path.name, hashlib.sha256(raw).hexdigest(), ids))
    out.sort(key=lambda d: -len(d.ids))
    return out
