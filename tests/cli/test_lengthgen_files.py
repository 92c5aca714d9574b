"""``posenc lengthgen --resume`` on a checkpoint or lock that is not a regular file: one
line, exit code 2, naming the file, at once."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from tests.experiments.test_files import no_hang
from tests.experiments.tiny import CLI_COPY, check_one_line_error, run_cli

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and /dev/zero are POSIX")

BASE = [*CLI_COPY, "--eval-lens", "8"]


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_a_special_checkpoint_is_refused_in_one_line(tmp_path: Path, capsys, kind: str) -> None:
    out = tmp_path / "out"
    path = out / "checkpoints" / "rope.pt"
    path.parent.mkdir(parents=True)
    if kind == "dev-zero":
        path.symlink_to("/dev/zero")
    else:
        os.mkfifo(path)
    argv = [*BASE, "--out", str(out), "--resume"]
    code, _, err = no_hang(lambda: run_cli(argv, capsys), fifo=path)
    named = "a character device" if kind == "dev-zero" else "a FIFO"
    check_one_line_error(code, err, rf"checkpoint '.*rope\.pt' must be a regular file, got {named}")
    assert not (out / "results.json").exists()


def test_a_fifo_lock_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / ".posenc.lock")
    code, _, err = no_hang(
        lambda: run_cli([*BASE, "--out", str(out)], capsys), fifo=out / ".posenc.lock"
    )
    check_one_line_error(
        code,
        err,
        r"cannot be locked: lock file '.*\.posenc\.lock' must be a regular file, got a FIFO",
    )
