"""What every ``posenc`` option is checked against at parse time, and the size limit.

Each option gets a ``callback`` from here, so a bad value is refused while the command
line is parsed, before anything is built: one line naming the option, the rule and the
value (``--width must be finite, got inf``), exit code 2. Sizes are estimated before
anything is allocated and refused over :func:`byte_limit`, with the estimate.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from posenc._errors import PosEncError, check_float, check_int

__all__ = [
    "MAX_BYTES",
    "byte_limit",
    "check_bytes",
    "check_out_dir",
    "check_out_file",
    "choice",
    "human_bytes",
    "integer",
    "number",
    "option",
    "text",
]

#: The most memory one ``posenc`` command may ask for (less when less is free).
MAX_BYTES = 8 * 2**30
#: Errors of the environment, not of the command line: exit code 1.
_ENVIRONMENT = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT}


def _available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def byte_limit(cap: int | None = MAX_BYTES) -> int:
    """``cap`` (:data:`MAX_BYTES`), or half the free memory when that is less; ``cap=None``:
    half the free memory (or :data:`MAX_BYTES` where it cannot be read)."""
    free = _available()
    if free is None:
        return MAX_BYTES if cap is None else cap
    return free // 2 if cap is None else min(cap, free // 2)


def human_bytes(n: float) -> str:
    """``80 GB``, ``3.2 TB``: decimal units, three digits."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} PB"  # pragma: no cover


def check_bytes(what: str, nbytes: float) -> None:
    """Refuse ``what`` when it needs more than :func:`byte_limit` bytes."""
    limit = byte_limit()
    if nbytes > limit:
        raise PosEncError(
            f"{what} needs about {human_bytes(nbytes)} of memory, over the limit of "
            f"{human_bytes(limit)}; ask for fewer positions or channels"
        )


def option(help: str, check: Callable[[Any], Any], *names: str) -> Any:
    """A typer option: its help text and its parse-time ``check`` (one of the callbacks
    below); ``names`` (``"--out", "-o"``) where the parameter's own name is not enough."""
    return typer.Option(*names, help=help, callback=check)


def text(option: str) -> Callable[[Any], Any]:
    """A callback refusing an empty (or all-blank) string, or one holding a NUL."""

    def check(value: Any) -> Any:
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is None:
                continue
            if not str(item).strip():
                raise PosEncError(f"{option} must not be empty, got {str(item)!r}")
            if "\x00" in str(item):
                raise PosEncError(f"{option} must not hold a NUL character, got {str(item)!r}")
        return value

    return check


def choice(option: str, choices: tuple[str, ...] | list[str]) -> Callable[[Any], Any]:
    """A callback: None, or one of ``choices`` (an empty string is not the default)."""

    def check(value: Any) -> Any:
        if value is not None and value not in choices:
            listed = ", ".join(repr(c) for c in choices)
            raise PosEncError(f"{option} must be one of {listed}, got {value!r}")
        return value

    return check


def number(
    option: str, *, min: float | None = None, max: float | None = None, exclusive: bool = False
) -> Callable[[Any], Any]:
    """A callback: None, or a finite float in the bounds (``exclusive``: above ``min``)."""

    def check(value: Any) -> Any:
        if value is None:
            return None
        return check_float(option, value, min=min, max=max, min_exclusive=exclusive)

    return check


def integer(option: str, *, min: int | None = None, max: int | None = None) -> Callable[[Any], Any]:
    """A callback: None, or an integer in ``[min, max]``."""

    def check(value: Any) -> Any:
        return None if value is None else check_int(option, value, min=min, max=max)

    return check


def _refused(option: str, path: Path, e: OSError) -> OSError | PosEncError:
    """The environment's refusal as an OSError (exit 1), a bad path as a PosEncError."""
    if e.errno in _ENVIRONMENT:
        return OSError(e.errno, f"{option} {str(path)!r} cannot be written ({e.strerror})")
    return PosEncError(f"{option} {str(path)!r} cannot be created ({e.strerror})")


def check_out_file(path: str, suffixes: tuple[str, ...] | list[str], option: str = "--out") -> Path:
    """``path`` as a Path if its suffix is allowed and its folder exists and is writable.

    Raises:
        PosEncError: empty, a directory, a wrong suffix, or a folder that does not exist.
        OSError: the folder (or the file) is not writable.
    """
    text(option)(path)
    out = Path(path)
    suffix = out.suffix.lstrip(".").lower()
    if suffix not in suffixes:
        raise PosEncError(
            f"{option} must end in {' or '.join('.' + s for s in suffixes)}, got {str(out)!r}"
        )
    parent = out.parent if str(out.parent) else Path(".")
    if out.is_dir():
        raise PosEncError(f"{option} must be a file, got the directory {str(out)!r}")
    if not parent.is_dir():
        raise PosEncError(f"{option} folder does not exist: {str(parent)!r}")
    if not os.access(parent, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise OSError(errno.EACCES, f"{option} is not writable: {str(out)!r}")
    return out


def check_out_dir(path: str, option: str = "--out", *, create: bool = True) -> Path:
    """``path`` as a Path if it is (or can be created as) a writable directory.

    ``create=False`` checks without creating anything: the nearest existing folder above
    ``path`` must be a writable directory (the command creates the rest once its other
    options are known to be good).

    Raises:
        PosEncError: empty, an existing file, or under a file.
        OSError: the directory cannot be created or written (permissions, a read-only or
            full file system).
    """
    text(option)(path)
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise PosEncError(f"{option} must be a directory, got the file {str(out)!r}")
    if not create:
        existing = next(p for p in (out, *out.absolute().parents) if p.exists())
        if not existing.is_dir():
            raise PosEncError(
                f"{option} {str(out)!r} cannot be created (Not a directory: {str(existing)!r})"
            )
        if not os.access(existing, os.W_OK | os.X_OK):
            raise OSError(errno.EACCES, f"{option} is not writable: {str(out)!r}")
        return out
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _refused(option, out, e) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise OSError(errno.EACCES, f"{option} is not writable: {str(out)!r}")
    return out
