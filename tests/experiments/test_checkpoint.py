"""Checkpoints: atomic writes, weights-only loads, config checks, generator states."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import random
from pathlib import Path

import pytest
import torch
from tests.experiments._checkpoint_state import CONFIG, checkpoint_state

from posenc import PosEncError
from posenc.experiments import checkpoint as ckpt


def _assert_same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


def test_round_trip(tmp_path: Path) -> None:
    state = checkpoint_state()
    path = tmp_path / "sub" / "run.pt"
    ckpt.save_checkpoint(path, state)
    loaded = ckpt.load_checkpoint(path, config=json.loads(json.dumps(CONFIG)))
    _assert_same({"format": ckpt.FORMAT, **state}, loaded)
    assert sorted(p.name for p in path.parent.iterdir()) == ["run.pt"]  # no temp files left


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "run.pt"
    ckpt.save_checkpoint(path, checkpoint_state(step=3))
    before = path.read_bytes()

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # a kill between writing the temp file and the rename

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_checkpoint(path, checkpoint_state(step=4))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.pt"]
    monkeypatch.undo()
    assert ckpt.load_checkpoint(path, config=CONFIG)["step"] == 3


@pytest.mark.parametrize("keep", [0, 10, 0.5, -1])
def test_truncated_checkpoints_are_refused(tmp_path: Path, keep: float) -> None:
    path = tmp_path / "run.pt"
    ckpt.save_checkpoint(path, checkpoint_state())
    data = path.read_bytes()
    cut = data[: int(len(data) * keep)] if isinstance(keep, float) else data[:keep]
    path.write_bytes(cut)
    with pytest.raises(PosEncError, match=r"run\.pt' (is truncated or corrupt|has no sha256)"):
        ckpt.load_checkpoint(path, config=CONFIG)


class _Payload:
    def __reduce__(self):
        return (print, ("a checkpoint must never run code",))


def test_a_checkpoint_that_would_execute_code_is_refused(tmp_path: Path, capsys) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"model": _Payload()}, path)
    with pytest.raises(PosEncError, match="is refused: it holds pickled Python objects") as info:
        ckpt.load_checkpoint(path, config=CONFIG)
    message = str(info.value)
    assert "truncated" not in message and "weights_only" not in message
    assert "\n" not in message
    assert "never run code" not in capsys.readouterr().out
    path.write_bytes(pickle.dumps([1, 2], protocol=2))
    with pytest.raises(PosEncError, match="is truncated or corrupt"):
        ckpt.load_checkpoint(path, config=CONFIG)


def test_other_files_and_formats_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "run.pt"
    torch.save({"weights": torch.zeros(2)}, path)
    with pytest.raises(PosEncError, match=r"has no sha256 trailer.* not a posenc checkpoint"):
        ckpt.load_checkpoint(path, config=CONFIG)
    ckpt.save_checkpoint(path, {**checkpoint_state(), "format": 99})
    with pytest.raises(PosEncError, match="has format 99, this posenc reads 2"):
        ckpt.load_checkpoint(path, config=CONFIG)
    with pytest.raises(PosEncError, match="does not exist"):
        ckpt.load_checkpoint(tmp_path / "missing.pt", config=CONFIG)
    with pytest.raises(PosEncError, match=r"state must hold the keys .* missing \['seconds'\]"):
        ckpt.save_checkpoint(path, {k: v for k, v in checkpoint_state().items() if k != "seconds"})
    with pytest.raises(PosEncError, match=r"state must hold the keys .* unknown \['junk'\]"):
        ckpt.save_checkpoint(path, {**checkpoint_state(), "junk": 1})  # load would refuse it


def test_a_file_with_an_unknown_key_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "run.pt"
    state = {"format": ckpt.FORMAT, **checkpoint_state(), "junk": 1}
    body = io.BytesIO()
    torch.save(state, body)
    sealed = body.getvalue()
    path.write_bytes(sealed + ckpt.TRAILER + hashlib.sha256(sealed).hexdigest().encode() + b"\n")
    with pytest.raises(
        PosEncError, match=r"is not a posenc checkpoint \(unknown keys \['junk'\]\)"
    ):
        ckpt.load_checkpoint(path, config=CONFIG)


def test_a_different_configuration_is_refused_naming_the_difference(tmp_path: Path) -> None:
    path = tmp_path / "run.pt"
    ckpt.save_checkpoint(path, checkpoint_state())
    other = {**CONFIG, "train": {"steps": 20}}
    with pytest.raises(
        PosEncError,
        match=r'different configuration \(train: \{"steps": 10\} '
        r'!= \{"steps": 20\}\)',
    ):
        ckpt.load_checkpoint(path, config=other)


def test_rng_state_round_trip() -> None:
    state = ckpt.get_rng_state()
    a = (torch.rand(5), random.random())
    ckpt.set_rng_state(state)
    b = (torch.rand(5), random.random())
    assert torch.equal(a[0], b[0]) and a[1] == b[1]
