"""One run per output folder: the folder made and checked, a lock file, and the leftovers
of a killed run cleaned.

:func:`make_out_dir` makes ``OUT`` if missing and checks it can be written: a path that
cannot be a folder is the caller's mistake (``PosEncError``), a folder the environment
refuses (permissions, a read-only or full file system) an ``OSError``, as it is.

:func:`lock_out_dir` takes ``OUT/.posenc.lock`` with an exclusive ``flock``: a second run
into the same folder is refused, naming the process that holds it; a lock whose process
is gone (killed, crashed) holds no ``flock`` any more and is simply taken over, since the
kernel releases it when its owner dies. The lock must be a regular file (a symbolic link,
a FIFO or a device there is refused in one line). While the lock is held, the temporary files of
interrupted atomic writes (``.NAME.PID.HEX.tmp``) in ``OUT`` and ``OUT/checkpoints`` can
only be stale, and are removed.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from posenc._errors import PosEncError
from posenc._files import open_regular, read_regular
from posenc.experiments.checkpoint import clean_stale_temps

__all__ = ["LOCK_NAME", "lock_out_dir", "make_out_dir"]

LOCK_NAME = ".posenc.lock"


def make_out_dir(out_dir: str | os.PathLike[str]) -> Path:
    """``out_dir`` as a folder that exists and can be written (made with its parents when
    missing; a temporary file is written and removed to prove it)."""
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


try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock, the rest still holds
    _CAN_LOCK = False
else:
    _CAN_LOCK = True


_LOCK_MAX_BYTES = 4096  # the holder's one line


def _holder(path: Path) -> str:
    try:
        data = read_regular(path, what="lock file", max_bytes=_LOCK_MAX_BYTES)
    except (OSError, PosEncError):
        return "another process"
    text = data.decode("utf-8", errors="replace").strip()
    return text.splitlines()[0][:120] if text else "another process"


#: The lock is opened without following a symbolic link (the stamp would truncate the
#: file it points to) or blocking (a FIFO), and must be a regular file.
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


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
        PosEncError: another live process holds the lock.
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
