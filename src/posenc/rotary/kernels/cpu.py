"""The fused CPU path: ``rope_cpu.c`` built once with the system C compiler, called via ctypes.

One pass over q and k (one read, one write), cos/sin loaded per token and reused across
heads, OpenMP threads sharing torch's own OpenMP runtime (``torch.get_num_threads()``).
The source is compiled on first use with ``cc -O3 -march=native -fopenmp
-ffp-contract=off -fno-strict-aliasing`` (a second or two) into a cache directory keyed
by the source, the flags and the CPU, so later processes only load it. Without a working compiler the
build raises :class:`RuntimeError` and the dispatch keeps the plain torch path.

``-ffp-contract=off`` keeps every product rounded before the sum, exactly like the plain
torch twin, so the two paths agree bit for bit.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

__all__ = ["build", "cache_dir", "launch_cpu"]

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
_PARALLEL_MIN_ELEMENTS = 1 << 15

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


def cache_dir() -> Path:
    """Where the compiled library is kept: ``$POSENC_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/posenc``, else ``~/.cache/posenc``."""
    if os.environ.get("POSENC_CACHE_DIR"):
        return Path(os.environ["POSENC_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "posenc"


def _cpu_identity() -> str:
    """The CPU's model and feature flags: ``-march=native`` code is only valid on a CPU
    with the same features, so they are part of the cache key."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    keep = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features"))]
    return "\n".join(sorted(set(keep)))


def _compile(cc: str, source: Path, target: Path, openmp: bool) -> subprocess.CompletedProcess:
    cmd = [cc, *_FLAGS, *(["-fopenmp"] if openmp else []), "-o", str(target), str(source)]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def build() -> Path:
    """Compile ``rope_cpu.c`` (or find it in the cache) and return the library's path.

    Raises:
        RuntimeError: no C compiler, or compilation failed (the compiler's message is
            included).
    """
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise RuntimeError(f"posenc's CPU fast path needs a C compiler; {cc!r} was not found")
    source = _SOURCE.read_bytes()
    key = hashlib.sha256(
        b"\0".join([source, " ".join(_FLAGS).encode(), cc.encode(), _cpu_identity().encode()])
    ).hexdigest()[:16]
    target = cache_dir() / f"rope_cpu-{key}.so"
    if target.exists():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError:  # e.g. a read-only home: a private temporary directory instead
        user = os.getuid() if hasattr(os, "getuid") else "user"
        target = Path(tempfile.gettempdir()) / f"posenc-{user}" / target.name
        if target.exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
    # Compile to a private name and rename: concurrent processes never see a partial file.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        result = _compile(cc, _SOURCE, Path(tmp), openmp=True)
        if result.returncode != 0:  # e.g. a compiler without OpenMP: one thread
            result = _compile(cc, _SOURCE, Path(tmp), openmp=False)
        if result.returncode != 0:
            raise RuntimeError(
                f"posenc's CPU fast path failed to compile with {cc!r}:\n{result.stderr[-2000:]}"
            )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _library() -> ctypes.CDLL:
    global _lib
    with _lock:
        if _lib is None:
            lib = ctypes.CDLL(str(build()))
            lib.posenc_rope.restype = ctypes.c_int
            lib.posenc_rope.argtypes = [
                ctypes.c_int,  # dtype
                ctypes.c_int,  # interleaved
                ctypes.c_int,  # sign
                ctypes.c_int,  # inplace
                ctypes.c_int,  # ntensors
                ctypes.POINTER(ctypes.c_int64),  # meta
                ctypes.POINTER(ctypes.c_void_p),  # x pointers
                ctypes.POINTER(ctypes.c_void_p),  # y pointers
                ctypes.c_void_p,  # cos
                ctypes.c_void_p,  # sin
                ctypes.c_int64,  # r/2
                ctypes.c_int,  # threads
            ]
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


def launch_cpu(
    xs: list[tuple[tuple[int, ...], tuple[int, ...]]],
    x_tensors: list[torch.Tensor],
    y_strides: list[tuple[int, ...]],
    y_tensors: list[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    cos_strides: tuple[int, int],
    *,
    interleaved: bool,
    conjugate: bool,
    inplace: bool,
) -> None:
    """Rotate ``x_tensors`` into ``y_tensors`` (the same tensors when ``inplace``).

    ``xs`` are the ``(B, S, H, D)`` sizes and strides of each x, ``y_strides`` those of
    each y (element strides in b, s, h, d order); cos/sin are ``[.., S, R/2]`` with
    contiguous last dimension, in the compute dtype, and ``cos_strides`` their (b, s)
    strides.
    """
    lib = _library()
    meta: list[int] = []
    for x, ys in zip(xs, y_strides):
        meta += _meta(x, ys, cos_strides)
    n = len(x_tensors)
    elements = sum(t.numel() for t in x_tensors)
    threads = torch.get_num_threads() if elements >= _PARALLEL_MIN_ELEMENTS else 1
    rc = lib.posenc_rope(
        _DTYPES[x_tensors[0].dtype],
        int(interleaved),
        -1 if conjugate else 1,
        int(inplace),
        n,
        (ctypes.c_int64 * len(meta))(*meta),
        (ctypes.c_void_p * n)(*[t.data_ptr() for t in x_tensors]),
        (ctypes.c_void_p * n)(*[t.data_ptr() for t in y_tensors]),
        cos.data_ptr(),
        sin.data_ptr(),
        cos.shape[-1],
        threads,
    )
    if rc != 0:  # pragma: no cover - the dtype table above and the C switch agree
        raise RuntimeError(f"posenc's CPU rotary kernel failed with code {rc}")
