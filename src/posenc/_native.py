"""posenc's C toolchain: a C source of posenc compiled once, cached privately, loaded once.

The fused CPU kernels (``rotary/kernels/rope_cpu.c``, ``contextual/cope_cpu.c``) are
compiled on first use with the system C compiler (``$CC``, default ``cc``) and
``-O3 -march=native -ffp-contract=off -fno-strict-aliasing`` (``-fopenmp`` where the compiler
has it, else one thread), into a cache directory keyed by the source, the flags, the
compiler and the CPU, so later processes only load it. ``-ffp-contract=off`` keeps every
product rounded before the sum, as the plain torch twins do.

The cache is private, and nothing in it is loaded on trust:

- the directory (:func:`cache_dir`) is created with mode 0700; one that already exists must
  be owned by the current user and not writable by group or others, else it is refused;
  where it is refused or cannot be created (a read-only home), the library is built in a
  fresh private directory of this process (:func:`tempfile.mkdtemp`), never in a shared,
  predictable path;
- builds run under an exclusive :func:`fcntl.flock` on ``<cache>/.lock``, so concurrent
  processes build once and never see a partial file (it is compiled under a private name
  and renamed);
- beside each library ``<name>.sha256`` holds the SHA-256 of its bytes, written after a
  successful build; before :class:`ctypes.CDLL` the library and its hash file must be
  regular files owned by the current user, not writable by group or others, and the
  library's bytes must match the hash. Anything else is rebuilt.

Each message is logged once per process (logger ``"posenc"``). The standard library only.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import hashlib
import logging
import os
import platform
import re
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not a POSIX system
    fcntl = None  # type: ignore[assignment]

__all__ = ["FLAGS", "build", "cache_dir", "load"]

log = logging.getLogger("posenc")

#: The compiler flags of every build (``-fopenmp`` is added where the compiler has it).
FLAGS = (
    "-O3",
    "-march=native",
    "-ffp-contract=off",
    "-fno-strict-aliasing",
    "-fPIC",
    "-shared",
    "-std=c11",
)

#: A local header a source includes (``#include "name.h"``, beside the file).
_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', re.MULTILINE)

_lock = threading.Lock()
_loaded: dict[Path, ctypes.CDLL] = {}  # source -> its loaded library
# This process's private fallback directory (made on first need, removed at exit).
_tmp_dir: Path | None = None
_logged: set[str] = set()


def cache_dir() -> Path:
    """Where compiled libraries are kept: ``$POSENC_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/posenc``, else ``~/.cache/posenc``."""
    if os.environ.get("POSENC_CACHE_DIR"):
        return Path(os.environ["POSENC_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "posenc"


def _current_uid() -> int:
    return os.getuid() if hasattr(os, "getuid") else -1


def _unsafe(what: str, path: Path, st: os.stat_result) -> str | None:
    """Why ``path`` (with ``os.stat`` result ``st``) may not be trusted, or ``None``."""
    uid = _current_uid()
    if uid >= 0 and st.st_uid != uid:
        return f"{what} {path} is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        mode = stat.S_IMODE(st.st_mode)
        return f"{what} {path} is writable by group or others (mode {mode:o})"
    return None


def _log_once(level: int, message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        log.log(level, "%s", message)


class _Refused(Exception):
    """A cache directory that exists but may not be trusted."""


def _private_dir(path: Path) -> Path:
    """``path`` as a private directory: created with mode 0700, or checked if it exists.

    Raises:
        _Refused: it exists but is not a directory owned by this user, or is writable by
            group or others.
        OSError: it cannot be created.
    """
    try:
        path.mkdir(parents=True, mode=0o700)
        os.chmod(path, 0o700)  # whatever the umask
    except FileExistsError:
        pass
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise _Refused(f"cache directory {path} is not a directory")
    reason = _unsafe("cache directory", path, st)
    if reason is not None:
        raise _Refused(reason)
    return path


def _process_temp_dir() -> Path:
    """A fresh private directory for this process (mode 0700, from ``tempfile.mkdtemp``)."""
    global _tmp_dir
    if _tmp_dir is None or not _tmp_dir.is_dir():
        _tmp_dir = Path(tempfile.mkdtemp(prefix="posenc-"))
        atexit.register(shutil.rmtree, _tmp_dir, ignore_errors=True)
    return _tmp_dir


def _build_dir() -> Path:
    """The checked cache directory, or this process's private temporary one (logged once)."""
    path = cache_dir()
    try:
        return _private_dir(path)
    except _Refused as err:
        level, reason = logging.WARNING, f"refusing {err}"
    except OSError as err:
        level, reason = logging.INFO, f"cannot create cache directory {path}: {err}"
    fallback = _process_temp_dir()
    _log_once(
        level, f"posenc: {reason}; building the CPU fast path in {fallback} (this process only)"
    )
    return fallback


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created 0600) for the block."""
    if fcntl is None:  # pragma: no cover - not a POSIX system
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _hash_path(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def _check_library(target: Path) -> str | None:
    """Why the cached ``target`` may not be loaded (``None``: it may)."""
    checked = {}
    for what, path in (("library", target), ("hash file", _hash_path(target))):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return f"{path} is missing"
        if not stat.S_ISREG(st.st_mode):
            return f"{what} {path} is not a regular file"
        reason = _unsafe(what, path, st)
        if reason is not None:
            return reason
        checked[what] = path
    expected = checked["hash file"].read_bytes().decode("ascii", "replace").strip()
    actual = _sha256(target)
    if actual != expected:
        return f"library {target} does not match its hash ({actual[:12]}... != {expected[:12]}...)"
    return None


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _compile(cc: str, source: Path, target: Path, openmp: bool) -> subprocess.CompletedProcess:
    cmd = [cc, *FLAGS, *(["-fopenmp"] if openmp else []), "-o", str(target), str(source)]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def _build_into(cc: str, source: Path, target: Path) -> None:
    """Compile to a private name, then rename into ``target`` and write its hash file."""
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        result = _compile(cc, source, Path(tmp), openmp=True)
        if result.returncode != 0:  # e.g. a compiler without OpenMP: one thread
            result = _compile(cc, source, Path(tmp), openmp=False)
        if result.returncode != 0:
            raise RuntimeError(
                f"posenc's CPU fast path failed to compile {source.name} with {cc!r}:\n"
                f"{result.stderr[-2000:]}"
            )
        os.chmod(tmp, 0o700)  # the linker's mode follows the umask
        digest = _sha256(Path(tmp))
        os.replace(tmp, target)
        _write_atomic(_hash_path(target), digest.encode() + b"\n")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _cpu_identity() -> str:
    """The CPU's model and feature flags: ``-march=native`` code is only valid on a CPU
    with the same features, so they are part of the cache key."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    keep = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features"))]
    return "\n".join(sorted(set(keep)))


def _source_bytes(source: Path) -> bytes:
    """The bytes of ``source`` and of every local header it includes, however deeply (a
    quoted name not beside its includer is a system header): what the library is built
    from, so all of it is in the cache key."""
    parts: list[bytes] = []
    seen: set[Path] = set()
    todo = [source]
    while todo:
        path = todo.pop(0)
        if path not in seen and (path == source or path.is_file()):
            seen.add(path)
            text = path.read_bytes()
            parts.append(text)
            todo += [path.parent / name.decode() for name in _INCLUDE.findall(text)]
    return b"\0".join(parts)


def build(source: Path) -> Path:
    """Compile the C file ``source`` (or find it, checked, in the cache) and return the
    shared library's path, ``<cache>/<stem>-<key>.so``. The key covers the source, the
    local headers it includes (``#include "x.h"``), the flags, the compiler and the CPU.

    Raises:
        RuntimeError: no C compiler, compilation failed (the compiler's message is
            included), or no private directory could be made to build in.
    """
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise RuntimeError(f"posenc's CPU fast path needs a C compiler; {cc!r} was not found")
    try:
        text = _source_bytes(source)
        key = hashlib.sha256(
            b"\0".join([text, " ".join(FLAGS).encode(), cc.encode(), _cpu_identity().encode()])
        ).hexdigest()[:16]
        directory = _build_dir()
        target = directory / f"{source.stem}-{key}.so"
        with _file_lock(directory / ".lock"):
            reason = _check_library(target)
            if reason is None:
                return target
            if os.path.lexists(target):
                _log_once(logging.INFO, f"posenc: rebuilding the CPU fast path: {reason}")
            _build_into(cc, source, target)
    except OSError as err:
        raise RuntimeError(f"posenc's CPU fast path could not be built: {err}") from err
    return target


def load(source: Path, declare: Callable[[ctypes.CDLL], None] | None = None) -> ctypes.CDLL:
    """The library of ``source``, built (:func:`build`) and loaded once per process.

    ``declare(lib)`` sets its functions' ``argtypes`` / ``restype``, once, before the
    library is handed out (its errors, e.g. a missing symbol's ``AttributeError``, are
    raised and nothing is kept). Thread-safe.

    Raises:
        RuntimeError: the library could not be built or loaded.
    """
    lib = _loaded.get(source)
    if lib is not None:
        return lib
    with _lock:
        lib = _loaded.get(source)
        if lib is None:
            path = build(source)
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as err:
                raise RuntimeError(f"posenc's CPU fast path could not be loaded: {err}") from err
            if declare is not None:
                declare(lib)
            _loaded[source] = lib
        return lib
