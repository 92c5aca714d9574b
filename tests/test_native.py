"""posenc's C toolchain (posenc._native): built once, cached privately, loaded once.

The cache directory is private (created 0700, refused if someone else owns it or it is
group/other-writable, never a shared predictable fallback); a cached library is loaded only
if it and its ``.sha256`` are ours, not writable by others, and the bytes match the hash
(anything else is rebuilt); concurrent processes build once under a file lock; each source
is loaded once per process.

The sources here are tiny C files of the test's own. Most tests swap the compiler for a
copy of one real build (``good_library``), so they exercise the cache logic in
milliseconds; the concurrency and compiler tests compile for real.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from tests._native_fixtures import fake_compiler

from posenc import _native

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CC", "cc")) is None, reason="posenc's C kernels need a compiler"
)

ANSWER = "int posenc_answer(void) { return 42; }\n"


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """Two small C files: ``answer`` (returns 42) and ``other`` (returns 7)."""
    folder = tmp_path_factory.mktemp("sources")
    (folder / "answer.c").write_text(ANSWER)
    (folder / "other.c").write_text("int posenc_other(void) { return 7; }\n")
    return {"answer": folder / "answer.c", "other": folder / "other.c"}


@pytest.fixture(scope="module")
def good_library(sources, tmp_path_factory) -> Path:
    """One real, checked build of ``answer.c`` in a cache of its own."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POSENC_CACHE_DIR", str(tmp_path_factory.mktemp("good")))
        return _native.build(sources["answer"])


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process state as if nothing had been built, loaded or logged yet; the cache in
    ``tmp_path / "cache"``."""
    monkeypatch.setattr(_native, "_loaded", {})
    monkeypatch.setattr(_native, "_tmp_dir", None)
    monkeypatch.setattr(_native, "_logged", set())
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def compiles(monkeypatch, good_library):
    """Replace the compiler by a copy of ``good_library``; the list of targets it built."""
    return fake_compiler(monkeypatch, good_library)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# --- the directory -------------------------------------------------------------------------


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("POSENC_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _native.cache_dir() == tmp_path / "xdg" / "posenc"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _native.cache_dir() == tmp_path / "home" / ".cache" / "posenc"
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path / "mine"))
    assert _native.cache_dir() == tmp_path / "mine"


def test_cache_dir_is_created_private(fresh, compiles, sources):
    old = os.umask(0)  # even with a permissive umask
    try:
        library = _native.build(sources["answer"])
    finally:
        os.umask(old)
    assert library.parent == fresh and _mode(fresh) == 0o700
    assert library.name.startswith("answer-") and library.suffix == ".so"
    assert _mode(library) & 0o077 == 0
    assert (fresh / (library.name + ".sha256")).read_text().strip() == _native._sha256(library)
    assert len(compiles) == 1
    assert _native.build(sources["answer"]) == library and len(compiles) == 1  # cached


@pytest.mark.parametrize("how", ["group-writable", "other-writable", "someone else's"])
def test_an_unsafe_cache_dir_is_refused(fresh, compiles, sources, monkeypatch, caplog, how):
    fresh.mkdir()
    if how == "someone else's":
        uid = os.getuid()
        monkeypatch.setattr(_native, "_current_uid", lambda: uid + 1)
        fresh.chmod(0o700)
    else:
        fresh.chmod(0o770 if how == "group-writable" else 0o707)
    with caplog.at_level(logging.INFO, logger="posenc"):
        library = _native.build(sources["answer"])
    assert fresh not in library.parents and list(fresh.iterdir()) == []
    assert library.parent == _native._tmp_dir and _mode(library.parent) == 0o700
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "refusing cache directory" in caplog.text


def test_an_unwritable_home_gets_a_fresh_private_dir_not_a_shared_one(
    fresh, compiles, sources, monkeypatch, tmp_path
):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("POSENC_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # what an old fallback loaded without a check: a predictable path another user can fill
    planted = tmp_path / f"posenc-{os.getuid()}" / "answer-0123456789abcdef.so"
    planted.parent.mkdir()
    planted.write_bytes(b"planted")
    library = _native.build(sources["answer"])
    assert library.parent != planted.parent and library.parent.parent == tmp_path
    assert library.parent.name.startswith("posenc-") and _mode(library.parent) == 0o700
    assert _native.build(sources["answer"]) == library and len(compiles) == 1  # one per process


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
def test_a_library_that_fails_a_check_is_rebuilt_not_loaded(
    fresh, compiles, sources, tamper, caplog
):
    library = _native.build(sources["answer"])
    tamper(library)
    assert _native._check_library(library) is not None
    with caplog.at_level(logging.INFO, logger="posenc"):
        assert _native.build(sources["answer"]) == library
    assert len(compiles) == 2 and "rebuilding the CPU fast path" in caplog.text
    assert _native._check_library(library) is None
    assert library.is_file() and not library.is_symlink()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a file to another user")
def test_a_library_owned_by_someone_else_is_rebuilt(fresh, compiles, sources):
    library = _native.build(sources["answer"])
    os.chown(library, 65534, 65534)
    assert "owned by uid 65534" in _native._check_library(library)
    _native.build(sources["answer"])
    assert os.stat(library).st_uid == os.getuid() and len(compiles) == 2


def test_a_planted_library_is_never_loaded(fresh, compiles, sources, monkeypatch):
    """Garbage at the library's path is replaced before ``ctypes.CDLL`` sees it."""
    library = _native.build(sources["answer"])
    library.write_bytes(b"not an ELF file")  # loading this would raise OSError
    loaded = []
    real = ctypes.CDLL
    monkeypatch.setattr(_native.ctypes, "CDLL", lambda path: loaded.append(path) or real(path))
    lib = _native.load(sources["answer"])
    assert loaded == [str(library)] and len(compiles) == 2
    assert lib.posenc_answer() == 42


# --- loading -------------------------------------------------------------------------------


def test_each_source_is_loaded_once_and_declared_once(fresh, sources):
    declared = []

    def declare(lib):
        lib.posenc_answer.restype = ctypes.c_int
        declared.append(lib)

    first = _native.load(sources["answer"], declare)
    assert _native.load(sources["answer"], declare) is first and declared == [first]
    other = _native.load(sources["other"])
    assert other is not first and other.posenc_other() == 7 and first.posenc_answer() == 42
    names = sorted(p.name.split("-")[0] for p in fresh.iterdir() if p.suffix == ".so")
    assert names == ["answer", "other"]


def test_a_failed_declaration_keeps_nothing(fresh, sources):
    def declare(lib):
        lib.posenc_missing  # noqa: B018 - a symbol the library does not have

    with pytest.raises(AttributeError, match="posenc_missing"):
        _native.load(sources["answer"], declare)
    assert _native._loaded == {}
    assert _native.load(sources["answer"]).posenc_answer() == 42


def test_a_library_that_cannot_be_loaded_is_a_runtime_error(fresh, compiles, sources, monkeypatch):
    def broken(path):
        raise OSError("cannot load")

    monkeypatch.setattr(_native.ctypes, "CDLL", broken)
    with pytest.raises(RuntimeError, match="could not be loaded: cannot load"):
        _native.load(sources["answer"])
    assert _native._loaded == {}


# --- the compiler --------------------------------------------------------------------------


def test_no_compiler_is_a_runtime_error_naming_it(fresh, sources, monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler-posenc")
    with pytest.raises(RuntimeError, match="'no-such-compiler-posenc' was not found"):
        _native.build(sources["answer"])
    assert not fresh.exists()  # nothing built, nothing created


def test_a_compile_error_carries_the_compilers_message(fresh, tmp_path):
    bad = tmp_path / "bad.c"
    bad.write_text("int posenc_bad(void) { return not_declared_anywhere; }\n")
    with pytest.raises(RuntimeError, match=r"failed to compile bad\.c") as err:
        _native.build(bad)
    assert "not_declared_anywhere" in str(err.value)
    assert [p.name for p in fresh.iterdir()] == [".lock"]  # no partial library


def test_without_openmp_it_builds_for_one_thread(fresh, sources, monkeypatch):
    real, flags = _native._compile, []

    def no_openmp(cc, source, target, openmp):
        flags.append(openmp)
        if openmp:
            return subprocess.CompletedProcess([cc], 1, "", "cc: unrecognised -fopenmp")
        return real(cc, source, target, openmp)

    monkeypatch.setattr(_native, "_compile", no_openmp)
    assert _native.load(sources["answer"]).posenc_answer() == 42
    assert flags == [True, False]


def test_a_local_header_is_part_of_the_key(fresh, tmp_path):
    """A source that includes a header of its own: changing the header builds anew (a
    system header in quotes, not beside the source, is not ours and is left out)."""
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "value.h").write_text("#define VALUE 5\n")
    (folder / "deeper.h").write_text('#include "value.h"\n')
    source = folder / "uses.c"
    source.write_text(
        '#include "deeper.h"\n#include "stdint.h"\nint posenc_value(void) { return VALUE; }\n'
    )
    first = _native.build(source)
    assert _native.build(source) == first
    (folder / "value.h").write_text("#define VALUE 6\n")
    second = _native.build(source)
    assert second != first and ctypes.CDLL(str(second)).posenc_value() == 6


# --- concurrency ---------------------------------------------------------------------------

_RACER = """
import sys, time
from pathlib import Path
from posenc import _native
from tests._native_fixtures import fake_compiler


barrier, me, source = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
compiles = []
real = _native._compile
_native._compile = lambda *a, **kw: compiles.append(1) or real(*a, **kw)
(barrier / me).touch()
deadline = time.time() + 120
while len(list(barrier.iterdir())) < 2 and time.time() < deadline:
    time.sleep(0.005)
_native.load(source)
print(_native.build(source), len(compiles))
"""


def test_concurrent_processes_build_one_library(tmp_path, sources):
    cache, barrier = tmp_path / "cache", tmp_path / "barrier"
    barrier.mkdir()
    env = {**os.environ, "POSENC_CACHE_DIR": str(cache)}
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(barrier), name, str(sources["answer"])],
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
    assert _native._check_library(library) is None
