"""What the toolchain's tests share: a compiler that copies one real build."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from posenc import _native


def fake_compiler(monkeypatch, library: Path) -> list[Path]:
    """Replace the compiler by a copy of ``library``; the list of targets it built."""
    built: list[Path] = []

    def fake(cc, source, target, openmp):
        shutil.copyfile(library, target)
        built.append(target)
        return subprocess.CompletedProcess([cc], 0, "", "")

    monkeypatch.setattr(_native, "_compile", fake)
    return built
