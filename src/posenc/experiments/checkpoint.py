"""Checkpoints that survive a kill, never execute code, and refuse any damage in one line.

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts:

``{"format", "config", "step", "model", "optimizer", "rng", "data", "seconds", "loss"}``

- written atomically (:func:`posenc._files.write_atomically`): ``torch.save`` to a
  temporary file in the same directory, ``fsync``, then ``os.replace`` over the old one, so
  a kill at any moment leaves either the previous checkpoint or the new one, never half a
  file;
- sealed: the ``torch.save`` bytes are followed by one trailer line holding their
  sha256 (:data:`TRAILER`); any flipped, missing or added byte is refused before
  anything is unpickled. ``torch.load`` ignores the trailer, so the file still
  loads with ``torch.load(path, weights_only=True)``;
- read with ``torch.load(weights_only=True)``: the unpickler accepts only
  tensors and plain containers, so a checkpoint file cannot run code; a file
  holding other pickled objects is refused as such;
- every field is checked on load (:mod:`.checkpoint_fields`): a crafted value is one
  line of :class:`~posenc.PosEncError`, never a traceback or a silent resume;
- ``config`` is the run's configuration as a JSON string; resuming under another
  configuration is refused, naming the keys that differ;
- ``rng`` holds the torch CPU (and CUDA) generator states and Python's
  ``random`` state (NumPy's global generator is not used by posenc);
- ``data`` holds the data iterator position: batches are keyed by step
  (:mod:`.seeding`), so the position is the next step to run.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import random
import re
from pathlib import Path
from typing import Any

import torch

from posenc._deprecated import moved
from posenc._errors import MAX_ALLOC_BYTES, PosEncError, check_int
from posenc._files import MIB, read_regular, write_atomically
from posenc.experiments.checkpoint_fields import KEYS, check_fields

__all__ = [
    "FORMAT",
    "TRAILER",
    "checkpoint_max_bytes",
    "default_max_bytes",
    "get_rng_state",
    "load_checkpoint",
    "save_checkpoint",
    "set_rng_state",
]

FORMAT = 2  # 2: sha256 trailer and checked fields; 1 (no trailer) is refused
#: The last line of a checkpoint: ``TRAILER + sha256(torch.save bytes).hexdigest() + b"\n"``.
TRAILER = b"\nposenc-checkpoint-sha256:"
_TRAILER_LEN = len(TRAILER) + 64 + 1
#: Moved to :mod:`posenc._files` (one atomic writer for every room); the old names warn.
_MOVED = ("atomic_write", "clean_stale_temps")


def __getattr__(name: str) -> Any:
    return moved(__name__, name, "posenc._files", _MOVED)


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
    """Restore what :func:`get_rng_state` returned (checked by :func:`load_checkpoint`)."""
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically (temporary file + ``os.replace``), sealed
    with the sha256 trailer.

    ``state`` must hold the keys listed in the module docstring and no other;
    ``format`` is added.
    """
    missing = [k for k in KEYS if k != "format" and k not in state]
    unknown = [k for k in state if k not in KEYS]
    if missing or unknown:  # load_checkpoint would refuse a file with either
        shown = f"missing {missing}" if missing else f"unknown {unknown}"
        raise PosEncError(f"state must hold the keys {list(KEYS[1:])}, {shown:.200}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, **state}, buffer)
    body = buffer.getvalue()
    seal = TRAILER + hashlib.sha256(body).hexdigest().encode("ascii") + b"\n"
    write_atomically(path, lambda f: (f.write(body), f.write(seal)))
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


def _differences(saved: dict[str, Any], wanted: dict[str, Any]) -> str:
    keys = sorted(set(saved) | set(wanted))
    diffs = [
        f"{k}: {json.dumps(saved.get(k))} != {json.dumps(wanted.get(k))}"
        for k in keys
        if saved.get(k) != wanted.get(k)
    ]
    return "; ".join(diffs[:4]) + ("; ..." if len(diffs) > 4 else "")


def _unseal(data: bytes) -> tuple[bytes, str | None]:
    """``(body, None)`` when the trailer is intact and matches, else ``(body, why)``."""
    tail = data[-_TRAILER_LEN:]
    if len(data) < _TRAILER_LEN or not tail.startswith(TRAILER) or not tail.endswith(b"\n"):
        return data, "no sha256 trailer: cut short, or not written by this posenc"
    body, digest = data[:-_TRAILER_LEN], tail[len(TRAILER) : -1]
    if hashlib.sha256(body).hexdigest().encode("ascii") != digest:
        return body, "its sha256 does not match the one it was saved with"
    return body, None


def default_max_bytes() -> int:
    """The most a checkpoint may be when its model is not known: half this machine's
    memory (and at most :data:`~posenc._errors.MAX_ALLOC_BYTES`)."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: the cap alone
        memory = MAX_ALLOC_BYTES
    return int(min(MAX_ALLOC_BYTES, max(memory // 2, MIB)))


def checkpoint_max_bytes(model: torch.nn.Module, world_size: int = 1) -> int:
    """The most a checkpoint of ``model`` can legitimately be: its weights, an optimizer
    state of twice as much (AdamW's two moments; Muon keeps one), their steps, every
    rank's generator states and the run's small fields, each with room to spare."""
    tensors = list(model.state_dict().values())
    weights = sum(t.numel() * t.element_size() for t in tensors)
    return 4 * weights + 16384 * (len(tensors) + 1) + 65536 * max(1, world_size) + 16 * MIB


def _read(path: Path, map_location: str | torch.device, max_bytes: int) -> Any:
    """Check the seal, then unpickle with ``weights_only=True``; every failure one line."""
    where = f"checkpoint {str(path)!r}"
    data = read_regular(path, what="checkpoint", max_bytes=max_bytes)
    body, damage = _unseal(data)
    if damage is not None and (body is not data or not body.startswith(b"PK")):
        # a seal that does not match, or not even a torch zip archive: unpickle nothing
        raise PosEncError(f"{where} is truncated or corrupt ({damage})")
    try:
        state = torch.load(io.BytesIO(body), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        if found:  # unsealed (another tool's file) or sealed with a pickled object inside
            raise PosEncError(
                f"{where} is refused: it holds pickled Python objects ({found.group(1)}), and "
                f"posenc loads only tensors and plain containers (a pickled object could run code)"
            ) from None
        raise PosEncError(f"{where} is truncated or corrupt ({damage or 'unreadable'})") from None
    except Exception as e:  # zip / EOF / storage errors of a damaged file
        reason = damage or (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PosEncError(f"{where} is truncated or corrupt ({reason[:200]})") from None
    if damage is not None and _whole_archive(body):  # an archive that was never sealed
        raise PosEncError(
            f"{where} has no sha256 trailer: cut short at its end, or not a posenc checkpoint "
            f"of format {FORMAT} (written by another tool or an older posenc); drop --resume "
            f"or use another --out to start afresh"
        )
    if damage is not None:  # bytes after the archive that are not a seal
        raise PosEncError(f"{where} is truncated or corrupt (its sha256 trailer is damaged)")
    return state


def _whole_archive(data: bytes) -> bool:
    """``data`` ends exactly where its zip end-of-central-directory record ends."""
    end = data.rfind(b"PK\x05\x06")
    return end >= 0 and end + 22 + int.from_bytes(data[end + 20 : end + 22], "little") == len(data)


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    config: dict[str, Any],
    map_location: str | torch.device = "cpu",
    max_bytes: int | None = None,
) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` for the run ``config``.

    ``max_bytes`` is the most the file may hold (:func:`checkpoint_max_bytes` of the model
    it is for; None: :func:`default_max_bytes`), checked before a byte is read; only a
    regular file is read (a FIFO or a link to a device is refused, never waited on).

    Raises:
        PosEncError: the file is missing, not a regular file or larger than ``max_bytes``,
            is truncated or corrupt (the sha256 trailer does not match),
            holds pickled objects, is not a posenc checkpoint, has a field out of its
            rules (:func:`~posenc.experiments.checkpoint_fields.check_fields`), or was
            written by a run with a different configuration.
    """
    path = Path(path)
    if max_bytes is None:
        max_bytes = default_max_bytes()
    max_bytes = check_int("max_bytes", max_bytes, min=0)
    state = _read(path, map_location, max_bytes)
    where = f"checkpoint {str(path)!r}"
    if not isinstance(state, dict):
        raise PosEncError(f"{where} is not a posenc checkpoint (not a dict of its fields)")
    missing = [k for k in KEYS if k not in state]
    unknown = [k for k in state if k not in KEYS]
    if missing or unknown:  # an unknown key is refused: nothing here would read it
        shown = f"missing keys {missing}" if missing else f"unknown keys {unknown}"
        raise PosEncError(f"{where} is not a posenc checkpoint ({shown:.200})")
    if type(state["format"]) is not int or state["format"] != FORMAT:
        raise PosEncError(f"{where} has format {state['format']!r:.40}, this posenc reads {FORMAT}")
    try:
        saved = json.loads(state["config"]) if isinstance(state["config"], str) else None
    except (json.JSONDecodeError, RecursionError):  # RecursionError: nested too deep
        saved = None
    if not isinstance(saved, dict):
        raise PosEncError(
            f"{where} field config must be a JSON object, got {state['config']!r:.80}"
        )
    config = json.loads(json.dumps(config))  # tuples -> lists, as saved
    train, wanted = saved.get("train"), config.get("train")
    if isinstance(train, dict) and isinstance(wanted, dict) and "optimizer" not in train:
        if "optimizer" in wanted:  # written before the setting existed: trained with AdamW
            saved["train"] = {**train, "optimizer": "adamw"}
    if saved != config:
        raise PosEncError(
            f"{where} was written by a different configuration "
            f"({_differences(saved, config)}); use another --out or drop --resume"
        )
    check_fields(where, state, config)
    return state
