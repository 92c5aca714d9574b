"""The files a run reads back and writes: regular files only, written whole, one run a folder.

Reading back. Every file a study, a report or ``posenc extend`` reads back (checkpoints, a
unit's record on ``--resume``, the lock's holder, the figures it embeds, the texts it is
given) goes through :func:`read_regular`: the file is opened without blocking (a FIFO would
wait for a writer forever), ``fstat`` must say it is a regular file (a link to ``/dev/zero``
would be read until memory runs out) and its size must be within the cap of what that file
can legitimately be, checked before a byte is read. Each refusal is one line of
:class:`~posenc.PosEncError` naming the file; a file the environment refuses (permissions)
stays an ``OSError``.

Writing. Every file a study, a report or ``posenc extend`` writes goes through
:func:`atomic_write` (or :func:`write_atomically`, which streams): a temporary file
``.NAME.PID.HEX.tmp`` beside it, synced, then renamed over it, so a kill at any moment
leaves the old file or the new one, never half of either. A process bound to its parent
(:func:`bind_to_parent`, a study's worker) writes nothing once that parent is gone.

One run a folder. :func:`make_out_dir` makes ``OUT`` if missing and checks it can be
written (a path that cannot be a folder is the caller's mistake, ``PosEncError``; a folder
the environment refuses an ``OSError``, as it is). :func:`lock_out_dir` takes
``OUT/.posenc.lock`` with an exclusive ``flock``: a second run into the same folder is
refused, naming the process that holds it; a lock whose process is gone holds no ``flock``
any more and is taken over. The lock must be a regular file. While it is held, the
temporary files of interrupted writes in ``OUT`` and ``OUT/checkpoints`` can only be
stale, and are removed (:func:`clean_stale_temps`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import stat
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from posenc._errors import PosEncError

__all__ = [
    "FIGURE_MAX_BYTES",
    "LOCK_NAME",
    "MIB",
    "ORPHANED_EXIT",
    "atomic_write",
    "bind_to_parent",
    "check_parent",
    "clean_stale_temps",
    "file_kind",
    "lock_out_dir",
    "make_out_dir",
    "open_regular",
    "parse_json",
    "read_head",
    "read_regular",
    "write_atomically",
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


# --- writing: a temporary file renamed over the target ----------------------------------------

_TEMP = re.compile(r"^\..+\.\d+\.[0-9a-f]{8}\.tmp$")  # what _temp_name makes
ORPHANED_EXIT = 70  # the exit status of a process whose parent died
_parent: list[int] = []  # the pid this process writes for (empty: none)


def bind_to_parent(parent: int) -> None:
    """From now on, end this process before any write once ``parent`` (the pid of its
    parent, as the parent saw it) is no longer its parent (:func:`check_parent`)."""
    _parent[:] = [parent]


def check_parent() -> None:
    """End this process at once when it is bound to a parent that is gone."""
    if _parent and os.getppid() != _parent[0]:
        os._exit(ORPHANED_EXIT)


def _temp_name(path: Path) -> Path:
    """A fresh name next to ``path`` (same file system, so ``os.replace`` is atomic)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def clean_stale_temps(folder: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary files a killed write left in ``folder``; returns them.

    Call it only while holding the folder's lock (:func:`lock_out_dir`): then no other
    writer can own a temporary file there."""
    folder = Path(folder)
    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    for entry in folder.iterdir():
        if _TEMP.match(entry.name) and entry.is_file():
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``."""
    write_atomically(path, lambda f: f.write(data))


def write_atomically(path: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> None:
    """Call ``write`` on a fresh temporary file next to ``path``, sync it, then rename it
    over ``path``: a kill at any point leaves either the old file or the new one.

    Raises:
        OSError: the file cannot be written (a full disk, permissions), naming ``path``.
    """
    path = Path(path)
    tmp = _temp_name(path)
    check_parent()  # a worker whose study was killed writes nothing more
    try:
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        check_parent()
        os.replace(tmp, path)
    except OSError as e:  # a full disk: name the file it was writing, not a temporary one
        Path(tmp).unlink(missing_ok=True)
        if e.filename is None or str(e.filename) == str(tmp):
            raise OSError(e.errno, e.strerror or str(e), str(path)) from e
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --- one run a folder: the folder made and checked, its lock ----------------------------------

LOCK_NAME = ".posenc.lock"
_LOCK_MAX_BYTES = 4096  # the holder's one line
#: The lock is opened without following a symbolic link (the stamp would truncate the
#: file it points to) or blocking (a FIFO), and must be a regular file.
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock, the rest still holds
    _CAN_LOCK = False
else:
    _CAN_LOCK = True


def make_out_dir(out_dir: str | os.PathLike[str]) -> Path:
    """``out_dir`` as a folder that exists and can be written (made with its parents when
    missing; a temporary file is written and removed to prove it).

    Raises:
        PosEncError: ``out_dir`` is empty, a file, or under a file.
        OSError: the folder cannot be made or written (permissions, a read-only disk).
    """
    out = Path(out_dir)
    if not str(out_dir).strip():
        raise PosEncError(f"out_dir must name a folder, got {str(out_dir)!r}")
    if out.exists() and not out.is_dir():
        raise PosEncError(f"out_dir must be a folder, got the file {str(out)!r}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        raise PosEncError(f"out_dir {str(out)!r} cannot be created ({e.strerror})") from None
    with tempfile.NamedTemporaryFile(dir=out, prefix=".posenc-write-test-"):
        pass
    return out


def _holder(path: Path) -> str:
    try:
        data = read_regular(path, what="lock file", max_bytes=_LOCK_MAX_BYTES)
    except (OSError, PosEncError):
        return "another process"
    text = data.decode("utf-8", errors="replace").strip()
    return text.splitlines()[0][:120] if text else "another process"


def _open_lock(path: Path) -> int:
    """``path`` opened (made when missing) for the lock; refused unless a regular file."""
    try:
        return open_regular(path, what="lock file", flags=_LOCK_FLAGS, mode=0o644)
    except PosEncError as e:
        raise PosEncError(f"--out {str(path.parent)!r} cannot be locked: {e}") from None


def _acquire(path: Path) -> int:
    """An open descriptor of ``path`` holding its exclusive flock."""
    while True:
        fd = _open_lock(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise PosEncError(
                f"--out {str(path.parent)!r} is in use by another posenc run ({_holder(path)}); "
                f"wait for it to finish or use another --out"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:  # the file we locked may have been removed by the previous owner's release
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


@contextlib.contextmanager
def lock_out_dir(out: str | os.PathLike[str]) -> Iterator[None]:
    """Hold ``out``'s lock for the ``with`` block and clean stale temporary files.

    Raises:
        PosEncError: another live process holds the lock, or the lock is not a regular file.
    """
    out = Path(out)
    if not _CAN_LOCK:  # pragma: no cover
        yield
        return
    path = out / LOCK_NAME
    fd = _acquire(path)
    try:
        stamp = f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%H:%M:%S')}\n"
        try:
            os.ftruncate(fd, 0)
            os.write(fd, stamp.encode("utf-8"))
        except OSError as e:  # a full disk: name the file
            raise OSError(e.errno, e.strerror, str(path)) from e
        for folder in (out, out / "checkpoints"):
            clean_stale_temps(folder)
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        os.close(fd)  # releases the flock
