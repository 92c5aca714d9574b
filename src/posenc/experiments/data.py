"""The ``lm`` corpus: the standard library's own Python sources, as bytes.

Every machine that runs posenc has a Python interpreter, and with it a few
megabytes of real, varied source code in its ``Lib`` directory
(``sysconfig.get_paths()["stdlib"]``). That is the language-modelling corpus:
no download, no data set to ship.

- Files: every ``*.py`` under the stdlib directory except ``site-packages``
  (not the standard library, differs per machine), ``test``/``tests`` (the test
  suites, which some distributions strip) and ``__pycache__``.
- Split: each file goes to ``validation`` when the BLAKE2b hash of its path
  relative to the stdlib directory falls in the first ``validation_percent``
  of the hash range, else to ``train``. The split depends only on the path, so
  it is the same on every machine and does not move when files are added.
- Order: files are concatenated in hash order (a mix of packages, not an
  alphabetical run of ``asyncio/``), each split capped at a byte budget.
- Vocabulary: bytes, ``VOCAB_SIZE = 256``; tokens are ``uint8`` stored and
  ``int64`` when fed to a model.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import sysconfig
from pathlib import Path

import torch

from posenc._errors import PosEncError, check_int
from posenc._files import read_head

__all__ = [
    "VOCAB_SIZE",
    "Corpus",
    "decode",
    "encode",
    "load_stdlib_corpus",
    "split_of",
    "stdlib_files",
]

VOCAB_SIZE = 256
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "__pycache__"})


def encode(text: str | bytes) -> torch.Tensor:
    """UTF-8 bytes of ``text`` as a ``uint8`` tensor.

    Shape: ``[len(bytes)]``.

    Examples:
        >>> encode("hi").tolist()
        [104, 105]
    """
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return (
        torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if data
        else torch.empty(0, dtype=torch.uint8)
    )


def decode(tokens: torch.Tensor) -> str:
    """The text of byte tokens (invalid UTF-8 replaced).

    Examples:
        >>> decode(encode("héllo"))
        'héllo'
    """
    return bytes(tokens.to(torch.uint8).tolist()).decode("utf-8", errors="replace")


def _hash(relpath: str) -> int:
    return int.from_bytes(hashlib.blake2b(relpath.encode("utf-8"), digest_size=8).digest(), "big")


def split_of(relpath: str, validation_percent: int = 10) -> str:
    """``"train"`` or ``"validation"``: the split of a file given its path relative
    to the stdlib directory (POSIX separators).

    Examples:
        >>> split_of("json/decoder.py") in ("train", "validation")
        True
        >>> split_of("json/decoder.py", 0), split_of("json/decoder.py", 100)
        ('train', 'validation')
    """
    validation_percent = check_int("validation_percent", validation_percent, min=0, max=100)
    return "validation" if _hash(relpath) % 100 < validation_percent else "train"


def stdlib_files(root: str | os.PathLike[str] | None = None) -> list[str]:
    """Paths (relative to ``root``, POSIX separators) of the corpus's ``*.py`` files,
    sorted by their hash. ``root`` defaults to the running interpreter's stdlib directory.
    """
    base = Path(sysconfig.get_paths()["stdlib"] if root is None else root)
    if not base.is_dir():
        raise PosEncError(f"root must be a directory of Python sources, got {str(base)!r}")
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        rel = Path(dirpath).relative_to(base)
        found.extend((rel / f).as_posix() for f in filenames if f.endswith(".py"))
    found.sort(key=lambda p: (_hash(p), p))
    return found


@dataclasses.dataclass(frozen=True)
class Corpus:
    """Byte streams of the two splits and where they came from.

    Attributes:
        train: ``uint8 [n_train]``, the training files laid end to end.
        validation: ``uint8 [n_validation]``.
        root: the directory the files were read from.
        num_files: ``(train files, validation files)`` used.
    """

    train: torch.Tensor
    validation: torch.Tensor
    root: str
    num_files: tuple[int, int]


@functools.lru_cache(maxsize=4)
def _load(
    root: str, max_train_bytes: int, max_validation_bytes: int, validation_percent: int
) -> Corpus:
    budgets = {"train": max_train_bytes, "validation": max_validation_bytes}
    chunks: dict[str, list[bytes]] = {"train": [], "validation": []}
    sizes = {"train": 0, "validation": 0}
    for rel in stdlib_files(root):
        split = split_of(rel, validation_percent)
        if sizes[split] >= budgets[split]:
            if all(sizes[s] >= budgets[s] for s in budgets):
                break
            continue
        left = budgets[split] - sizes[split]
        data = read_head(Path(root) / rel, what="corpus file", max_bytes=left)
        chunks[split].append(data)
        sizes[split] += len(data)
    streams = {s: encode(b"".join(chunks[s])) for s in chunks}
    return Corpus(
        train=streams["train"],
        validation=streams["validation"],
        root=root,
        num_files=(len(chunks["train"]), len(chunks["validation"])),
    )


def load_stdlib_corpus(
    *,
    max_train_bytes: int = 4_000_000,
    max_validation_bytes: int = 500_000,
    validation_percent: int = 10,
    root: str | os.PathLike[str] | None = None,
) -> Corpus:
    """Read the corpus (cached per arguments within a process).

    Args:
        max_train_bytes: byte budget of the train stream (files past it are skipped).
        max_validation_bytes: byte budget of the validation stream.
        validation_percent: share of files (by path hash) held out for validation.
        root: a directory to read instead of the interpreter's stdlib (tests).

    Shape: ``Corpus.train`` ``[<= max_train_bytes]``, ``Corpus.validation``
    ``[<= max_validation_bytes]``, both ``uint8``.

    Examples:
        >>> c = load_stdlib_corpus(max_train_bytes=1000, max_validation_bytes=500)
        >>> c.train.shape, c.validation.shape
        (torch.Size([1000]), torch.Size([500]))
    """
    max_train_bytes = check_int("max_train_bytes", max_train_bytes, min=1)
    max_validation_bytes = check_int("max_validation_bytes", max_validation_bytes, min=1)
    validation_percent = check_int("validation_percent", validation_percent, min=1, max=99)
    base = str(Path(sysconfig.get_paths()["stdlib"] if root is None else root).resolve())
    corpus = _load(base, max_train_bytes, max_validation_bytes, validation_percent)
    if corpus.train.numel() == 0 or corpus.validation.numel() == 0:
        raise PosEncError(
            f"root must hold Python files for both splits, got {corpus.num_files[0]} train and "
            f"{corpus.num_files[1]} validation files under {base!r}"
        )
    return corpus
