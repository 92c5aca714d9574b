"""The lm corpus: which files, which split, which bytes."""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import pytest
import torch

from posenc import PosEncError
from posenc.experiments.data import (
    VOCAB_SIZE,
    decode,
    encode,
    load_stdlib_corpus,
    split_of,
    stdlib_files,
)


def _fake_stdlib(root: Path) -> dict[str, bytes]:
    files = {
        "os.py": b"import sys\n",
        "json/__init__.py": b"from .decoder import *\n",
        "json/decoder.py": "# d\u00e9codeur\n".encode(),
        "email/parser.py": b"class Parser: pass\n",
        "a.py": b"x = 1\n",
        "b.py": b"y = 2\n",
        "c.py": b"z = 3\n",
        # never part of the corpus:
        "site-packages/pkg/mod.py": b"third party\n",
        "test/test_os.py": b"test suite\n",
        "json/tests/test_x.py": b"test suite\n",
        "__pycache__/os.cpython-311.py": b"cache\n",
        "README.txt": b"not python\n",
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def _blake(rel: str) -> int:
    return int.from_bytes(hashlib.blake2b(rel.encode(), digest_size=8).digest(), "big")


def test_stdlib_files_skips_site_packages_tests_and_caches(tmp_path: Path) -> None:
    _fake_stdlib(tmp_path)
    expected = [
        "a.py",
        "b.py",
        "c.py",
        "email/parser.py",
        "json/__init__.py",
        "json/decoder.py",
        "os.py",
    ]
    expected.sort(key=lambda p: (_blake(p), p))
    assert stdlib_files(tmp_path) == expected


@pytest.mark.parametrize("rel", ["os.py", "json/decoder.py", "asyncio/tasks.py"])
def test_split_is_a_function_of_the_path_hash(rel: str) -> None:
    expected = "validation" if _blake(rel) % 100 < 10 else "train"
    assert split_of(rel) == expected
    assert split_of(rel, 0) == "train"
    assert split_of(rel, 100) == "validation"


def test_corpus_is_the_files_of_each_split_in_hash_order(tmp_path: Path) -> None:
    files = _fake_stdlib(tmp_path)
    corpus = load_stdlib_corpus(root=tmp_path, validation_percent=40)
    order = stdlib_files(tmp_path)
    train = b"".join(files[r] for r in order if split_of(r, 40) == "train")
    validation = b"".join(files[r] for r in order if split_of(r, 40) == "validation")
    assert train and validation  # the fixture puts files in both splits at 40%
    assert torch.equal(corpus.train, torch.tensor(list(train), dtype=torch.uint8))
    assert torch.equal(corpus.validation, torch.tensor(list(validation), dtype=torch.uint8))
    assert corpus.num_files == (
        sum(split_of(r, 40) == "train" for r in order),
        sum(split_of(r, 40) == "validation" for r in order),
    )


def test_corpus_budgets_cut_the_streams(tmp_path: Path) -> None:
    files = _fake_stdlib(tmp_path)
    corpus = load_stdlib_corpus(
        root=tmp_path, validation_percent=40, max_train_bytes=15, max_validation_bytes=5
    )
    order = stdlib_files(tmp_path)
    train = b"".join(files[r] for r in order if split_of(r, 40) == "train")[:15]
    assert torch.equal(corpus.train, torch.tensor(list(train), dtype=torch.uint8))
    assert corpus.validation.numel() == 5


def test_real_stdlib_corpus_is_python_source() -> None:
    corpus = load_stdlib_corpus(max_train_bytes=200_000, max_validation_bytes=50_000)
    assert corpus.root == str(Path(sysconfig.get_paths()["stdlib"]).resolve())
    assert corpus.train.numel() == 200_000 and corpus.validation.numel() == 50_000
    text = decode(corpus.train[:20_000])
    assert "def " in text and "import " in text
    assert int(corpus.train.max()) < VOCAB_SIZE


@pytest.mark.parametrize("text", ["", "abc", "h\u00e9llo \u2603", "\n\t"])
def test_encode_decode_round_trip(text: str) -> None:
    tokens = encode(text)
    assert tokens.dtype == torch.uint8
    assert torch.equal(tokens, torch.tensor(list(text.encode()), dtype=torch.uint8))
    assert decode(tokens) == text


def test_bad_roots_and_budgets(tmp_path: Path) -> None:
    with pytest.raises(PosEncError, match="root must be a directory"):
        stdlib_files(tmp_path / "missing")
    with pytest.raises(PosEncError, match="root must hold Python files for both splits"):
        load_stdlib_corpus(root=tmp_path)
    with pytest.raises(PosEncError, match="max_train_bytes must be >= 1, got 0"):
        load_stdlib_corpus(max_train_bytes=0)
    with pytest.raises(PosEncError, match="validation_percent must be <= 99, got 100"):
        load_stdlib_corpus(validation_percent=100)
    with pytest.raises(PosEncError, match="validation_percent must be <= 100, got 101"):
        split_of("a.py", 101)
