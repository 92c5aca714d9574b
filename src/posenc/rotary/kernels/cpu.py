"""The fused CPU path: ``rope_cpu.c`` built once with the system C compiler, called via ctypes.

One pass over q and k (one read, one write), cos/sin loaded per token and reused across
heads, OpenMP threads sharing torch's own OpenMP runtime (``torch.get_num_threads()``).
The source is compiled on first use with ``cc -O3 -march=native -fopenmp
-ffp-contract=off -fno-strict-aliasing`` (a second or two) into a cache directory keyed
by the source, the flags and the CPU, so later processes only load it. Without a working
compiler the build raises :class:`RuntimeError` and the dispatch keeps the plain torch path.

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

``-ffp-contract=off`` keeps every product rounded before the sum, exactly like the plain
torch twin, so the two paths agree bit for bit.
"""

from __future__ import annotations

import array
import atexit
import contextlib
import ctypes
import hashlib
import logging
import os
import platform
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from posenc.rotary.layout import bshd_order

try:
    import fcntl
except ImportError:  # pragma: no cover - not a POSIX system
    fcntl = None  # type: ignore[assignment]

__all__ = ["build", "cache_dir", "launch_cpu", "load", "table_entry", "table_template"]

log = logging.getLogger("posenc")

_SOURCE = Path(__file__).with_name("rope_cpu.c")
_FLAGS = (
    "-O3",
    "-march=native",
    "-ffp-contract=off",
    "-fno-strict-aliasing",
    "-fPIC",
    "-shared",
    "-std=c11",
)
_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.float64: 3}
# Below this many elements one thread is faster than waking the pool.
PARALLEL_MIN_ELEMENTS = 1 << 15

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
# This process's private fallback directory (made on first need, removed at exit).
_tmp_dir: Path | None = None
_logged: set[str] = set()


def cache_dir() -> Path:
    """Where the compiled library is kept: ``$POSENC_CACHE_DIR``, else
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
    cmd = [cc, *_FLAGS, *(["-fopenmp"] if openmp else []), "-o", str(target), str(source)]
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
                f"posenc's CPU fast path failed to compile with {cc!r}:\n{result.stderr[-2000:]}"
            )
        os.chmod(tmp, 0o700)  # the linker's mode follows the umask
        digest = _sha256(Path(tmp))
        os.replace(tmp, target)
        _write_atomic(_hash_path(target), digest.encode() + b"\n")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def build(source: Path | None = None) -> Path:
    """Compile ``rope_cpu.c`` (or find it, checked, in the cache) and return the library's path.

    ``source``: another C file of posenc to build the same way (the fused CoPE rows of
    :mod:`posenc.attend.cope_fused`), cached as ``<stem>-<key>.so``; default ``rope_cpu.c``.

    Raises:
        RuntimeError: no C compiler, compilation failed (the compiler's message is
            included), or no private directory could be made to build in.
    """
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise RuntimeError(f"posenc's CPU fast path needs a C compiler; {cc!r} was not found")
    path = _SOURCE if source is None else source
    text = path.read_bytes()
    key = hashlib.sha256(
        b"\0".join([text, " ".join(_FLAGS).encode(), cc.encode(), _cpu_identity().encode()])
    ).hexdigest()[:16]
    try:
        directory = _build_dir()
        target = directory / f"{path.stem}-{key}.so"
        with _file_lock(directory / ".lock"):
            reason = _check_library(target)
            if reason is None:
                return target
            if os.path.lexists(target):
                _log_once(logging.INFO, f"posenc: rebuilding the CPU fast path: {reason}")
            _build_into(cc, path, target)
    except OSError as err:
        raise RuntimeError(f"posenc's CPU fast path could not be built: {err}") from err
    return target


def _cpu_identity() -> str:
    """The CPU's model and feature flags: ``-march=native`` code is only valid on a CPU
    with the same features, so they are part of the cache key."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    keep = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features"))]
    return "\n".join(sorted(set(keep)))


def _library() -> ctypes.CDLL:
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = build()
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as err:
                raise RuntimeError(f"posenc's CPU fast path could not be loaded: {err}") from err
            for name in ("posenc_rope_packed", "posenc_rope_table_packed"):
                fn = getattr(lib, name)
                fn.restype = ctypes.c_int
                fn.argtypes = [ctypes.c_void_p]  # the packed int64 arguments
            _lib = lib
        return _lib


def load() -> None:
    """Build (if needed) and load the library; raises :class:`RuntimeError` on failure."""
    _library()


def _meta(
    x: tuple[tuple[int, ...], tuple[int, ...]],
    y_strides: tuple[int, ...],
    cos_strides: tuple[int, int],
) -> list[int]:
    """The 15 numbers ``rope_cpu.c`` reads per tensor: the outer dims (b, s, h), sorted by
    x's stride so rows are visited in memory order, then channel strides and d."""
    (b, s, h, d), (sb, ss, sh, sd) = x
    yb, ys, yh, yd = y_strides
    dims = [(b, sb, yb, cos_strides[0]), (s, ss, ys, cos_strides[1]), (h, sh, yh, 0)]
    dims.sort(key=lambda t: -abs(t[1]))
    return [v for dim in dims for v in dim] + [sd, yd, d]


# Argument templates per call shape (see posenc_rope_packed in rope_cpu.c): the pointers
# are written into a copy per call, so concurrent calls never share one.
_PLANS: dict[tuple, array.array] = {}
_PLANS_MAX = 256
_POINTERS = 7  # first pointer slot


def _plan(key: tuple) -> array.array:
    dtype, seq_dim, interleaved, conjugate, inplace, cos_strides, r2, threads, tensors = key
    meta: list[int] = []
    for shape, strides, y_strides in tensors:
        x = bshd_order(shape, strides, seq_dim)
        meta += _meta(x, bshd_order(shape, y_strides, seq_dim)[1], cos_strides)
    header = [_DTYPES[dtype], int(interleaved), -1 if conjugate else 1, int(inplace)]
    plan = array.array("q", [*header, len(tensors), r2, threads, 0, 0, 0, 0, 0, 0, *meta])
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


def launch_cpu(
    x_tensors: list[torch.Tensor],
    y_tensors: list[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    cos_strides: tuple[int, int],
    *,
    seq_dim: int,
    interleaved: bool,
    conjugate: bool,
    inplace: bool,
) -> None:
    """Rotate ``x_tensors`` (q, and k if given) into ``y_tensors`` (the same tensors when
    ``inplace``), checked beforehand by :func:`posenc.rotary.kernels.ops.check_launch`.

    Tensors are ``[b, h, s, d]`` (``seq_dim=-2``) or ``[b, s, h, d]`` (``-3``) with any
    strides; cos/sin are ``[.., S, R/2]`` with a contiguous last dimension, in the compute
    dtype, with (b, s) element strides ``cos_strides``. The numbers the C loop reads are
    built once per shape and strides (a template), so a call costs a dictionary lookup,
    six pointers and one foreign call.
    """
    lib = _library()
    q = x_tensors[0]
    elements = q.numel() + (x_tensors[1].numel() if len(x_tensors) == 2 else 0)
    threads = torch.get_num_threads() if elements >= PARALLEL_MIN_ELEMENTS else 1
    key = (
        q.dtype,
        seq_dim,
        interleaved,
        conjugate,
        inplace,
        cos_strides,
        cos.shape[-1],
        threads,
        tuple((x.shape, x.stride(), y.stride()) for x, y in zip(x_tensors, y_tensors)),
    )
    plan = _PLANS.get(key)
    if plan is None:
        plan = _plan(key)
    args = array.array("q", plan)
    args[_POINTERS] = q.data_ptr()
    args[_POINTERS + 2] = y_tensors[0].data_ptr()
    if len(x_tensors) == 2:
        args[_POINTERS + 1] = x_tensors[1].data_ptr()
        args[_POINTERS + 3] = y_tensors[1].data_ptr()
    args[_POINTERS + 4] = cos.data_ptr()
    args[_POINTERS + 5] = sin.data_ptr()
    rc = lib.posenc_rope_packed(args.buffer_info()[0])
    if rc != 0:  # pragma: no cover - the dtype table above and the C switch agree
        raise RuntimeError(f"posenc's CPU rotary kernel failed with code {rc}")


def table_entry() -> Callable[[int], int]:
    """``posenc_rope_table_packed`` (see ``rope_cpu.c``): the rotation at positions read
    from a cos/sin table in one foreign call, taking the address of its packed arguments
    (a :func:`table_template` copy with the pointers written in); returns 0, or 1 (nothing
    written) where a position lies outside the table's rows."""
    return _library().posenc_rope_table_packed


def table_template(
    dtype: torch.dtype,
    seq_dim: int,
    interleaved: bool,
    threads: int,
    tensors: Sequence[tuple[Sequence[int], Sequence[int], Sequence[int]]],
    r2: int,
    positions: tuple[int, int, int, int, int] | None,
) -> array.array:
    """The arguments of :func:`table_entry` for one call shape, pointers and the table's
    row count left 0 (written per call: slots 7-13 and 16).

    Args:
        dtype: of q and k (float32, bfloat16 or float16: the table is float32).
        tensors: ``(shape, strides, output strides)`` of q and k, checked beforehand.
        r2: half the rotary dim; the table's rows are ``2 * r2`` float32 (cos, then sin).
        positions: ``(int32, batch, seq, batch stride, seq stride)`` of the positions
            (batch stride 0 when they are shared), or ``None``: the table's first rows.
    """
    if positions is None:
        pos = [0, 0, 1, tensors[0][0][2 if seq_dim == -2 else 1], 0, 0]
        cos_strides = (0, 2 * r2)
    else:
        int32, pb, ps, psb, pss = positions
        pos = [int(int32), 0, pb, ps, psb, pss]
        cos_strides = (psb, pss)
    meta: list[int] = []
    for shape, strides, y_strides in tensors:
        x = bshd_order(shape, strides, seq_dim)
        meta += _meta(x, bshd_order(shape, y_strides, seq_dim)[1], cos_strides)
    header = [_DTYPES[dtype], int(interleaved), 1, 0, len(tensors), r2, threads]
    # slots 7-12 pointers, 13 positions, 14 int32, 15 row stride, 16 rows, 17-20 positions
    values = [*header, 0, 0, 0, 0, 0, 0, 0, pos[0], 2 * r2, pos[1], *pos[2:], *meta]
    return array.array("q", values)
