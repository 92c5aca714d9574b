"""What ``posenc extend`` feeds the model: long documents (perplexity) and passkey prompts.

Documents are the longest Python standard-library sources by default (every machine has
them; ``pydoc_data`` is left out: it is generated help text, not source), or the files the
user names. A document is cut to the length measured, so it must have at least that many
tokens; shorter ones are skipped at that length.

Passkey prompts follow Mohtashami & Jaggi (2023, "Landmark attention"): an instruction, a
filler of the same sentences repeated, the passkey (five digits) at a given depth of the
filler, and the question. They are assembled from token ids, so a prompt has exactly the
length asked for; digits and the filler's phase come from the seed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posenc._errors import PosEncError
from posenc._files import MIB, read_regular

__all__ = ["Document", "Passkey", "documents", "passkey_prompt", "stdlib_sources"]

#: The most a text file may hold (a document far longer than any context measured).
MAX_TEXT_BYTES = 64 * MIB

_INSTRUCTION = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and "
    "memorize it. I will quiz you about the important information there."
)
_FILLER = (
    " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
)
_QUESTION = " What is the pass key? The pass key is"


@dataclasses.dataclass(frozen=True)
class Document:
    """One document: its name, SHA-256 and token ids."""

    name: str
    sha256: str
    ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Passkey:
    """One passkey prompt: its ids, the key, and where the key sits (a token index)."""

    ids: list[int]
    key: str
    depth: float
    at: int


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


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def passkey_prompt(tokenizer: Any, length: int, depth: float, rng: random.Random) -> Passkey:
    """A passkey prompt of exactly ``length`` tokens with the key at ``depth`` of its filler."""
    key = str(rng.randrange(10_000, 100_000))
    head = list(tokenizer(_INSTRUCTION)["input_ids"])  # with the model's BOS, if it takes one
    needle = _ids(tokenizer, f" The pass key is {key}. Remember it. {key} is the pass key.")
    tail = _ids(tokenizer, _QUESTION)
    filler = _ids(tokenizer, _FILLER)
    room = length - len(head) - len(needle) - len(tail)
    if room < len(filler):
        raise PosEncError(
            f"length {length} is too short for a passkey prompt (needs {len(head) + len(needle) + len(tail) + len(filler)} tokens)"
        )
    phase = rng.randrange(len(filler))
    stream = (filler * (room // len(filler) + 2))[phase : phase + room]
    cut = round(depth * room)
    ids = head + stream[:cut] + needle + stream[cut:] + tail
    return Passkey(ids, key, depth, len(head) + cut)
