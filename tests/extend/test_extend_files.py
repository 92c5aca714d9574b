"""``posenc extend`` reads back only regular files within their cap: a unit's record on
``--resume``, the texts, the model's files and the figures it embeds."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from tests.experiments.test_files import no_hang

from posenc import PosEncError
from posenc.extend.data import documents
from posenc.extend.model import file_sha256
from posenc.extend.run import _saved_unit

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and /dev/zero are POSIX")


def _tokenizer(text: str) -> dict[str, list[int]]:
    return {"input_ids": list(text.encode())}


def _special(path: Path, kind: str) -> str:
    if kind == "fifo":
        os.mkfifo(path)
        return "a FIFO"
    path.symlink_to("/dev/zero")
    return "a character device"


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_special_unit_record_is_refused(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "none-1024.json"
    named = _special(path, kind)
    with pytest.raises(PosEncError, match=rf"unit record '.*' must be a regular file, got {named}"):
        no_hang(lambda: _saved_unit(path, {}), fifo=path)


def test_a_unit_record_missing_damaged_or_oversized(tmp_path: Path) -> None:
    path = tmp_path / "none-1024.json"
    assert _saved_unit(path, {}) is None  # missing: measured
    path.write_text("{")
    assert _saved_unit(path, {}) is None  # damaged: measured again
    path.write_text('{"fingerprint": {}, "record": {"ppl": 2.0}}')
    assert _saved_unit(path, {}) == {"ppl": 2.0}
    with open(path, "wb") as f:
        f.truncate(1 << 30)  # 1 GiB of nothing, sparse
    with pytest.raises(PosEncError, match=r"unit record .* is 1073741824 bytes, more than"):
        _saved_unit(path, {})


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_special_text_is_refused(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "doc.txt"
    named = _special(path, kind)
    with pytest.raises(
        PosEncError, match=rf"^text '.*doc\.txt' must be a regular file, got {named}"
    ):
        no_hang(lambda: documents(_tokenizer, [str(path)], 1), fifo=path)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_special_model_file_is_not_hashed(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "model.safetensors"
    named = _special(path, kind)
    with pytest.raises(PosEncError, match=rf"model file .* must be a regular file, got {named}"):
        no_hang(lambda: file_sha256(path), fifo=path)


def test_a_regular_file_hashes_as_hashlib_does(tmp_path: Path) -> None:
    import hashlib

    path = tmp_path / "model.safetensors"
    path.write_bytes(bytes(range(256)) * 40000)
    assert file_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()
