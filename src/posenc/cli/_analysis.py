"""Options shared by ``posenc plot``, ``posenc inspect`` and ``posenc report``."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from posenc._errors import PosEncError
from posenc.cli.table import parse_positions

__all__ = ["check_out_dir", "check_out_file", "encoding_config", "positions_arg"]

PARAM_HELP = (
    "Constructor argument of the encoding as KEY=VALUE (repeatable), e.g. --param dim=128 "
    "--param base=500000; VALUE is read as JSON when it parses (numbers, true, [1, 2]), "
    "else as a string."
)


def encoding_config(name: str, params: Sequence[str] | None) -> dict[str, Any]:
    """``{"name": name, **params}`` from ``KEY=VALUE`` strings."""
    config: dict[str, Any] = {"name": name}
    for item in params or ():
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key.isidentifier():
            raise PosEncError(f"--param must be KEY=VALUE with a Python name as KEY, got {item!r}")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        config[key] = value
    return config


def positions_arg(spec: str | None) -> torch.Tensor | None:
    """A position tensor from the ``--positions`` syntax of ``posenc table`` (None: default)."""
    if spec is None:
        return None
    values = parse_positions(spec)
    dtype = torch.float64 if any(isinstance(v, float) for v in values) else torch.long
    return torch.tensor(values, dtype=dtype)


def check_out_file(path: str, suffixes: Sequence[str]) -> Path:
    """``path`` as a Path if its suffix is allowed and its folder exists and is writable."""
    out = Path(path)
    suffix = out.suffix.lstrip(".").lower()
    if suffix not in suffixes:
        raise PosEncError(
            f"--out must end in {' or '.join('.' + s for s in suffixes)}, got {str(out)!r}"
        )
    parent = out.parent if str(out.parent) else Path(".")
    if out.is_dir():
        raise PosEncError(f"--out must be a file, got the directory {str(out)!r}")
    if not parent.is_dir():
        raise PosEncError(f"--out folder does not exist: {str(parent)!r}")
    if not os.access(parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise PosEncError(f"--out is not writable: {str(out)!r}")
    return out


def check_out_dir(path: str) -> Path:
    """``path`` as a Path if it is (or can be created as) a writable directory."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise PosEncError(f"--out must be a directory, got the file {str(out)!r}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PosEncError(f"--out cannot be created: {str(out)!r} ({e.strerror})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise PosEncError(f"--out is not writable: {str(out)!r}")
    return out
