"""Reading back a file a run wrote: regular files only, and never more than they can be.

Every file a study, a report or ``posenc extend`` reads back (checkpoints, a unit's record
on ``--resume``, the lock's holder, the figures it embeds, the texts it is given) goes
through :func:`read_regular`: the file is opened without blocking (a FIFO would wait for a
writer forever), ``fstat`` must say it is a regular file (a link to ``/dev/zero`` would be
read until memory runs out) and its size must be within the cap of what that file can
legitimately be, checked before a byte is read. Each refusal is one line of
:class:`~posenc.PosEncError` naming the file; a file the environment refuses
(permissions) stays an ``OSError``.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from posenc._errors import PosEncError

__all__ = [
    "FIGURE_MAX_BYTES",
    "MIB",
    "file_kind",
    "open_regular",
    "parse_json",
    "read_head",
    "read_regular",
]

MIB = 1 << 20
#: The most a figure a page embeds may be (a PNG of the report is well under 2 MiB).
FIGURE_MAX_BYTES = 64 * MIB
_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int) -> str:
    """What a file of ``stat`` mode ``mode`` is, for a message: ``"a FIFO"``, ``"a
    directory"``, ... (``"not a regular file"`` for any other kind)."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def open_regular(
    path: str | os.PathLike[str], *, what: str, flags: int = _FLAGS, mode: int = 0o644
) -> int:
    """A descriptor of ``path`` opened with ``flags`` (without blocking; ``mode`` for a file
    ``O_CREAT`` makes), after ``fstat`` says it is a regular file; the caller closes it.

    Raises:
        PosEncError: ``path`` is missing, or is not a regular file (a directory, a FIFO,
            a device, a socket, or a symbolic link where ``flags`` has ``O_NOFOLLOW``).
    """
    where = f"{what} {str(path)!r}"
    try:
        fd = os.open(path, flags | getattr(os, "O_NONBLOCK", 0), mode)
    except FileNotFoundError:
        raise PosEncError(f"{where} does not exist") from None
    except IsADirectoryError:
        raise PosEncError(f"{where} must be a regular file, got a directory") from None
    except OSError:
        if Path(path).is_symlink() and flags & getattr(os, "O_NOFOLLOW", 0):
            raise PosEncError(f"{where} must be a regular file, got a symbolic link") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise PosEncError(f"{where} must be a regular file, got {file_kind(mode)}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str | os.PathLike[str], *, what: str, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, refused when it holds more than
    ``max_bytes`` (its size checked before reading; a file that grows while it is read
    is refused too). ``what`` names the file in the message (``"checkpoint"``).

    Raises:
        PosEncError: ``path`` is missing, not a regular file, or larger than ``max_bytes``.
        OSError: the file cannot be read (permissions, an I/O error).
    """
    where = f"{what} {str(path)!r}"
    fd = open_regular(path, what=what)
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise PosEncError(
                f"{where} is {size} bytes, more than the {max_bytes} bytes it can be here"
            )
        data = _read_upto(fd, max_bytes + 1)  # one more: a file grown past the cap is seen
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise PosEncError(f"{where} grew past the {max_bytes} bytes it can be while it was read")
    return data


def read_head(path: str | os.PathLike[str], *, what: str, max_bytes: int) -> bytes:
    """The first ``max_bytes`` bytes (or fewer) of the regular file ``path``.

    Raises:
        PosEncError: ``path`` is missing or not a regular file.
    """
    fd = open_regular(path, what=what)
    try:
        return _read_upto(fd, max_bytes)
    finally:
        os.close(fd)


def _read_upto(fd: int, limit: int) -> bytes:
    """At most ``limit`` bytes from ``fd``, up to its end, read in 16 MiB chunks."""
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, 16 * MIB))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes, where: str, *, too_deep: str = "too deep to read") -> Any:
    """The JSON value in ``raw`` (a file's bytes); text that is not UTF-8, not JSON,
    nested past the interpreter's recursion limit or holding an integer of more digits
    than Python reads is a one-line PosEncError beginning with ``where`` (``"results
    'x.json'"``); ``too_deep`` says how deep is too deep.
    """
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise PosEncError(f"{where} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise PosEncError(f"{where} is not valid JSON ({e})") from None
    except RecursionError:
        raise PosEncError(f"{where} nests JSON arrays or objects {too_deep}") from None
    except ValueError:  # an integer over sys.get_int_max_str_digits() digits
        raise PosEncError(
            f"{where} holds an integer of over {sys.get_int_max_str_digits()} digits"
        ) from None
