"""Checkpoints that survive a kill and never execute code.

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts:

``{"format", "config", "step", "model", "optimizer", "rng", "data", "seconds", "loss"}``

- written atomically: ``torch.save`` to a temporary file in the same directory,
  ``fsync``, then ``os.replace`` over the old one, so a kill at any moment
  leaves either the previous checkpoint or the new one, never half a file;
- read with ``torch.load(weights_only=True)``: the unpickler accepts only
  tensors and plain containers, so a checkpoint file cannot run code;
- ``config`` is the run's configuration as a JSON string; resuming under another
  configuration is refused, naming the keys that differ;
- ``rng`` holds the torch CPU (and CUDA) generator states and Python's
  ``random`` state (NumPy's global generator is not used by posenc);
- ``data`` holds the data iterator position: batches are keyed by step
  (:mod:`.seeding`), so the position is the next step to run.
"""

from __future__ import annotations

import json
import os
import random
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch

from posenc._errors import PosEncError

__all__ = [
    "FORMAT",
    "atomic_write",
    "get_rng_state",
    "load_checkpoint",
    "save_checkpoint",
    "set_rng_state",
]

FORMAT = 1
_KEYS = ("format", "config", "step", "model", "optimizer", "rng", "data", "seconds", "loss")


def get_rng_state() -> dict[str, Any]:
    """The global generator states as tensors and plain containers."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": {"version": version, "state": list(internal), "gauss": gauss},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`get_rng_state` returned."""
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _temp_name(path: Path) -> Path:
    """A fresh name next to ``path`` (same file system, so ``os.replace`` is atomic)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def save_checkpoint(path: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically (temporary file + ``os.replace``).

    ``state`` must hold the keys listed in the module docstring; ``format`` is added.
    """
    missing = [k for k in _KEYS if k != "format" and k not in state]
    if missing:
        raise PosEncError(f"state must hold the keys {list(_KEYS[1:])}, missing {missing}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(path, lambda f: torch.save({"format": FORMAT, **state}, f))
    try:  # make the rename itself durable (POSIX); harmless where unsupported
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``."""
    _write_atomically(Path(path), lambda f: f.write(data))


def _write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Call ``write`` on a fresh temporary file next to ``path``, sync it, then rename it
    over ``path``: a kill at any point leaves either the old file or the new one."""
    tmp = _temp_name(path)
    try:
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _differences(saved: dict[str, Any], wanted: dict[str, Any]) -> str:
    keys = sorted(set(saved) | set(wanted))
    diffs = [
        f"{k}: {json.dumps(saved.get(k))} != {json.dumps(wanted.get(k))}"
        for k in keys
        if saved.get(k) != wanted.get(k)
    ]
    return "; ".join(diffs[:4]) + ("; ..." if len(diffs) > 4 else "")


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    config: dict[str, Any],
    map_location: str | torch.device = "cpu",
) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` for the run ``config``.

    Raises:
        PosEncError: the file is truncated or corrupt, is not a posenc checkpoint, or
            was written by a run with a different configuration.
    """
    path = Path(path)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise PosEncError(f"checkpoint {str(path)!r} does not exist") from None
    except Exception as e:  # zip / unpickling / EOF errors of a damaged file
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PosEncError(f"checkpoint {str(path)!r} is truncated or corrupt ({reason})") from e
    if not isinstance(state, dict) or any(k not in state for k in _KEYS):
        raise PosEncError(f"checkpoint {str(path)!r} is not a posenc checkpoint (missing keys)")
    if state["format"] != FORMAT:
        raise PosEncError(
            f"checkpoint {str(path)!r} has format {state['format']!r}, this posenc reads {FORMAT}"
        )
    saved = json.loads(state["config"]) if isinstance(state["config"], str) else state["config"]
    config = json.loads(json.dumps(config))  # tuples -> lists, as saved
    if saved != config:
        raise PosEncError(
            f"checkpoint {str(path)!r} was written by a different configuration "
            f"({_differences(saved, config)}); use another --out or drop --resume"
        )
    return state
