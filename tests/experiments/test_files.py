"""Files read back are regular files within their cap: a link to /dev/zero, a FIFO or an
oversized file is one line of PosEncError naming it, at once (never read until memory runs
out, never waited on)."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.experiments._checkpoint_state import CONFIG, checkpoint_state

from posenc import PosEncError
from posenc._files import LOCK_NAME, lock_out_dir, read_head, read_regular
from posenc.experiments import checkpoint as ckpt
from posenc.experiments.data import load_stdlib_corpus

posix = pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and /dev/zero are POSIX")


def no_hang(call: Callable[[], Any], fifo: Path | None = None, seconds: float = 20.0) -> Any:
    """``call()``'s result or raised error; fails (after unblocking a reader of ``fifo``)
    when it has not returned within ``seconds``."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as e:  # handed to the test
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        if fifo is not None:  # a writer that closes at once: the blocked reader sees EOF
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            thread.join(5)
        pytest.fail(f"{call} was still reading after {seconds} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _zero(path: Path) -> Path:
    path.symlink_to("/dev/zero")
    return path


SPECIALS = {
    "fifo": (_fifo, "a FIFO"),
    "dev-zero": (_zero, "a character device"),
    "directory": (lambda p: (p.mkdir(), p)[1], "a directory"),
}


@posix
@pytest.mark.parametrize("kind", list(SPECIALS))
def test_a_checkpoint_that_is_not_a_regular_file_is_refused(tmp_path: Path, kind: str) -> None:
    make, named = SPECIALS[kind]
    path = make(tmp_path / "rope.pt")
    with pytest.raises(PosEncError, match="must be a regular file, got " + named) as info:
        no_hang(lambda: ckpt.load_checkpoint(path, config=CONFIG), fifo=path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_a_checkpoint_larger_than_its_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "rope.pt"
    ckpt.save_checkpoint(path, checkpoint_state())
    size = path.stat().st_size
    assert ckpt.load_checkpoint(path, config=CONFIG, max_bytes=size)["step"] == 3
    with pytest.raises(PosEncError, match=rf"is {size} bytes, more than the {size - 1} bytes"):
        ckpt.load_checkpoint(path, config=CONFIG, max_bytes=size - 1)
    sparse = tmp_path / "sparse.pt"  # 1 TiB that takes no disk: refused by its size alone
    with open(sparse, "wb") as f:
        f.truncate(1 << 40)
    with pytest.raises(PosEncError, match=r"is 1099511627776 bytes, more than"):
        no_hang(lambda: ckpt.load_checkpoint(sparse, config=CONFIG))


def test_the_cap_of_a_model_covers_its_checkpoint(tmp_path: Path) -> None:
    """``checkpoint_max_bytes`` of a real TinyTransformer with AdamW holds its checkpoint,
    and is far below what a /dev/zero read would take."""
    import json

    import torch

    from posenc.experiments.optim import make_optimizer
    from posenc.models import TinyTransformer

    model = TinyTransformer(vocab_size=256, dim=32, num_layers=2, num_heads=2, encoding="rope")
    opt = make_optimizer("adamw", model, lr=1e-3, weight_decay=0.01)
    model(torch.zeros(2, 8, dtype=torch.long)).sum().backward()
    opt.step()
    path = tmp_path / "rope.pt"
    state = {**checkpoint_state(), "model": model.state_dict(), "optimizer": opt.state_dict()}
    state["config"] = json.dumps({"model": model.to_config(), **CONFIG}, sort_keys=True)
    ckpt.save_checkpoint(path, state)
    cap = ckpt.checkpoint_max_bytes(model)
    assert path.stat().st_size <= cap <= 4 * path.stat().st_size + 20 * 2**20


@posix
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_read_regular_and_read_head_refuse_special_files(tmp_path: Path, kind: str) -> None:
    make, named = SPECIALS[kind]
    path = make(tmp_path / "f")
    for read in (read_regular, read_head):
        with pytest.raises(PosEncError, match=rf"^thing '.*f' must be a regular file, got {named}"):
            no_hang(lambda read=read: read(path, what="thing", max_bytes=10), fifo=path)


def test_read_regular_reads_a_file_within_its_cap(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"0123456789")
    assert read_regular(path, what="thing", max_bytes=10) == b"0123456789"
    assert read_head(path, what="thing", max_bytes=4) == b"0123"
    with pytest.raises(PosEncError, match=r"^thing '.*missing' does not exist$"):
        read_regular(tmp_path / "missing", what="thing", max_bytes=10)


@posix
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "symlink"])
def test_a_lock_that_is_not_a_regular_file_is_refused(tmp_path: Path, kind: str) -> None:
    lock = tmp_path / LOCK_NAME
    if kind == "symlink":  # the stamp would truncate the file it points to
        victim = tmp_path / "victim.txt"
        victim.write_text("keep me")
        lock.symlink_to(victim)
        named = "a symbolic link"
    else:  # a link to /dev/zero is refused as a link, not followed
        make, named = SPECIALS[kind]
        make(lock)
        named = "a symbolic link" if kind == "dev-zero" else named

    def take() -> None:
        with lock_out_dir(tmp_path):
            pass

    with pytest.raises(PosEncError, match=rf"cannot be locked: lock file .* got {named}"):
        no_hang(take, fifo=lock)
    if kind == "symlink":
        assert victim.read_text() == "keep me"


@posix
def test_a_fifo_in_the_corpus_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n" * 50)
    fifo = _fifo(tmp_path / "b.py")
    with pytest.raises(PosEncError, match=r"corpus file .*b\.py' must be a regular file"):
        no_hang(
            lambda: load_stdlib_corpus(
                root=tmp_path, max_train_bytes=10**6, max_validation_bytes=10**6
            ),
            fifo=fifo,
        )
