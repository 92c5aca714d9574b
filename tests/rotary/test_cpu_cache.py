"""The CPU fast path is the default, and its on-disk cache is safe.

The cache directory is private (created 0700, refused if someone else owns it or it is
group/other-writable, never a shared predictable fallback); a cached library is loaded only
if it and its ``.sha256`` are ours, not writable by others, and the bytes match the hash
(anything else is rebuilt); concurrent processes build once under a file lock; without a
compiler the plain path runs with one log line; ``POSENC_CPU_FAST_PATH=0`` opts out.

Most tests swap the compiler for a copy of one real build (``good_library``), so they
exercise the cache logic in milliseconds; the concurrency test compiles for real.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import posenc
from posenc.rotary import kernels
from posenc.rotary.kernels import backends, cpu
from posenc.rotary.kernels.plain import apply_rotary_torch

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CC", "cc")) is None, reason="the CPU fast path needs a C compiler"
)


@pytest.fixture(scope="module")
def good_library() -> Path:
    """One real, checked build (from the user's cache when it is there already)."""
    return cpu.build()


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process state as if nothing had been decided, built or logged yet; the cache in
    ``tmp_path / "cache"``."""
    monkeypatch.setattr(backends, "_cpu_on", None)
    monkeypatch.setattr(cpu, "_lib", None)
    monkeypatch.setattr(cpu, "_tmp_dir", None)
    monkeypatch.setattr(cpu, "_logged", set())
    monkeypatch.delenv("POSENC_CPU_FAST_PATH", raising=False)
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def compiles(monkeypatch, good_library):
    """Replace the compiler by a copy of ``good_library``; the list of targets it built."""
    built: list[Path] = []

    def fake(cc, source, target, openmp):
        shutil.copyfile(good_library, target)
        built.append(target)
        return subprocess.CompletedProcess([cc], 0, "", "")

    monkeypatch.setattr(cpu, "_compile", fake)
    return built


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# --- the directory -------------------------------------------------------------------------


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("POSENC_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cpu.cache_dir() == tmp_path / "xdg" / "posenc"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cpu.cache_dir() == tmp_path / "home" / ".cache" / "posenc"
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path / "mine"))
    assert cpu.cache_dir() == tmp_path / "mine"


def test_cache_dir_is_created_private(fresh, compiles):
    old = os.umask(0)  # even with a permissive umask
    try:
        library = cpu.build()
    finally:
        os.umask(old)
    assert library.parent == fresh and _mode(fresh) == 0o700
    assert _mode(library) & 0o077 == 0
    assert (fresh / (library.name + ".sha256")).read_text().strip() == cpu._sha256(library)
    assert len(compiles) == 1
    assert cpu.build() == library and len(compiles) == 1  # cached: checked, not rebuilt


@pytest.mark.parametrize("how", ["group-writable", "other-writable", "someone else's"])
def test_an_unsafe_cache_dir_is_refused(fresh, compiles, monkeypatch, caplog, how):
    fresh.mkdir()
    if how == "someone else's":
        uid = os.getuid()
        monkeypatch.setattr(cpu, "_current_uid", lambda: uid + 1)
        fresh.chmod(0o700)
    else:
        fresh.chmod(0o770 if how == "group-writable" else 0o707)
    with caplog.at_level(logging.INFO, logger="posenc"):
        library = cpu.build()
    assert fresh not in library.parents and list(fresh.iterdir()) == []
    assert library.parent == cpu._tmp_dir and _mode(library.parent) == 0o700
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "refusing cache directory" in caplog.text


def test_an_unwritable_home_gets_a_fresh_private_dir_not_a_shared_one(
    fresh, compiles, monkeypatch, tmp_path, good_library
):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("POSENC_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # what the old fallback loaded without a check: a predictable path another user can fill
    planted = tmp_path / f"posenc-{os.getuid()}" / "rope_cpu-0123456789abcdef.so"
    planted.parent.mkdir()
    planted.write_bytes(b"planted")
    library = cpu.build()
    assert library.parent != planted.parent and library.parent.parent == tmp_path
    assert library.parent.name.startswith("posenc-") and _mode(library.parent) == 0o700
    assert cpu.build() == library and len(compiles) == 1  # one private dir per process


# --- the library ---------------------------------------------------------------------------


def _wrong_hash(lib: Path) -> None:
    (lib.parent / (lib.name + ".sha256")).write_text("0" * 64 + "\n")


def _binary_hash(lib: Path) -> None:
    (lib.parent / (lib.name + ".sha256")).write_bytes(b"\xff\xfe" * 40)


def _no_hash(lib: Path) -> None:  # a library planted without going through the build
    (lib.parent / (lib.name + ".sha256")).unlink()


def _changed_bytes(lib: Path) -> None:
    with open(lib, "ab") as f:
        f.write(b"\0")


def _writable_library(lib: Path) -> None:
    lib.chmod(0o666)


def _writable_hash(lib: Path) -> None:
    (lib.parent / (lib.name + ".sha256")).chmod(0o622)


def _symlink(lib: Path) -> None:
    elsewhere = lib.parent.parent / "elsewhere.so"
    shutil.copyfile(lib, elsewhere)
    lib.unlink()
    lib.symlink_to(elsewhere)


TAMPERING = [
    _wrong_hash,
    _binary_hash,
    _no_hash,
    _changed_bytes,
    _writable_library,
    _writable_hash,
    _symlink,
]


@pytest.mark.parametrize("tamper", TAMPERING, ids=lambda f: f.__name__.strip("_"))
def test_a_library_that_fails_a_check_is_rebuilt_not_loaded(fresh, compiles, tamper, caplog):
    library = cpu.build()
    tamper(library)
    assert cpu._check_library(library) is not None
    with caplog.at_level(logging.INFO, logger="posenc"):
        assert cpu.build() == library
    assert len(compiles) == 2 and "rebuilding the CPU fast path" in caplog.text
    assert cpu._check_library(library) is None
    assert library.is_file() and not library.is_symlink()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a file to another user")
def test_a_library_owned_by_someone_else_is_rebuilt(fresh, compiles):
    library = cpu.build()
    os.chown(library, 65534, 65534)
    assert "owned by uid 65534" in cpu._check_library(library)
    cpu.build()
    assert os.stat(library).st_uid == os.getuid() and len(compiles) == 2


def test_a_planted_library_is_never_loaded(fresh, compiles, monkeypatch):
    """End to end: garbage at the library's path is replaced before ``ctypes.CDLL``."""
    library = cpu.build()
    library.write_bytes(b"not an ELF file")  # loading this would raise OSError
    loaded = []
    real = cpu.ctypes.CDLL
    monkeypatch.setattr(cpu.ctypes, "CDLL", lambda path: loaded.append(path) or real(path))
    assert kernels.cpu_fast_path_enabled()
    assert loaded == [str(library)] and len(compiles) == 2
    rope = posenc.RotaryEmbedding(8)
    q = torch.randn(1, 2, 3, 8)
    torch.testing.assert_close(rope(q, q)[0], apply_rotary_torch(q, *rope.cos_sin(torch.arange(3))))


# --- the switch ----------------------------------------------------------------------------


def test_on_by_default(fresh, compiles, caplog):
    with caplog.at_level(logging.INFO, logger="posenc"):
        assert kernels.cpu_fast_path_enabled()
        x = torch.randn(1, 2, 3, 8)
        assert kernels.select_backend(x, x, x) == "cpu"
    assert caplog.records == [] and len(compiles) == 1


def test_no_compiler_means_the_plain_path_and_one_log_line(fresh, monkeypatch, caplog):
    monkeypatch.setenv("CC", "/nonexistent")
    rope = posenc.RotaryEmbedding(8)
    q = torch.randn(1, 2, 3, 8)
    with caplog.at_level(logging.INFO, logger="posenc"):
        for _ in range(3):
            q_out, _ = rope(q, q)
            assert kernels.select_backend(q, q, q) == "torch"
    assert len(caplog.records) == 1
    (record,) = caplog.records
    assert record.name == "posenc" and record.levelno == logging.WARNING
    assert "'/nonexistent' was not found" in record.getMessage()
    assert "POSENC_CPU_FAST_PATH=0" in record.getMessage()
    assert not fresh.exists()  # nothing built, nothing created
    torch.testing.assert_close(q_out, apply_rotary_torch(q, *rope.cos_sin(torch.arange(3))))


def test_env_var_zero_opts_out_without_building(fresh, monkeypatch, caplog):
    monkeypatch.setenv("POSENC_CPU_FAST_PATH", "0")

    def no_build():
        raise AssertionError("built with POSENC_CPU_FAST_PATH=0")

    monkeypatch.setattr(cpu, "build", no_build)
    x = torch.randn(1, 2, 3, 8)
    with caplog.at_level(logging.INFO, logger="posenc"):
        assert not kernels.cpu_fast_path_enabled()
        assert kernels.select_backend(x, x, x) == "torch"
    assert caplog.records == []


def test_decided_outside_the_trace_when_compiling_first(fresh, tmp_path, monkeypatch):
    """Compiled before any eager call: the switch is decided by a function dynamo runs
    outside the trace (torch.compiler.assume_constant_result), so the library is built
    (not traced) and the graph holds the decision as a constant."""
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()
    rope = posenc.RotaryEmbedding(16)
    compiled = torch.compile(rope, fullgraph=True, backend="aot_eager")
    q = torch.randn(1, 2, 5, 16)
    got = compiled(q, q)
    assert backends._cpu_on is True  # decided, and on: the library was built outside the trace
    assert all(torch.equal(a, b) for a, b in zip(got, rope(q, q)))
    torch._dynamo.reset()


# --- concurrency ---------------------------------------------------------------------------

_RACER = """
import sys, time
from pathlib import Path
from posenc.rotary.kernels import cpu

barrier, me = Path(sys.argv[1]), sys.argv[2]
compiles = []
real = cpu._compile
cpu._compile = lambda *a, **kw: compiles.append(1) or real(*a, **kw)
(barrier / me).touch()
deadline = time.time() + 120
while len(list(barrier.iterdir())) < 2 and time.time() < deadline:
    time.sleep(0.005)
cpu.load()
print(cpu.build(), len(compiles))
"""


def test_concurrent_processes_build_one_library(tmp_path):
    cache, barrier = tmp_path / "cache", tmp_path / "barrier"
    barrier.mkdir()
    env = {**os.environ, "POSENC_CACHE_DIR": str(cache)}
    env.pop("POSENC_CPU_FAST_PATH", None)
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(barrier), name],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    results = [racer.communicate(timeout=300) for racer in racers]
    for racer, (_, err) in zip(racers, results):
        assert racer.returncode == 0, err
    paths = {out.split()[0] for out, _ in results}
    counts = sorted(int(out.split()[1]) for out, _ in results)
    assert len(paths) == 1 and counts[0] == 0 and counts[1] >= 1  # one of them compiled
    library = Path(paths.pop())
    names = sorted(p.name for p in cache.iterdir())
    assert names == [".lock", library.name, library.name + ".sha256"]  # no partial files
    assert cpu._check_library(library) is None
