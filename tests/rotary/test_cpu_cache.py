"""The rotary CPU fast path is the default, and it loads only a checked library.

The toolchain itself (the private cache, the hash checks, the lock, one build for
concurrent processes) is tested in ``tests/test_native.py``; here the rotary switch on it:
on by default, a planted library never reaches ``ctypes.CDLL``, without a compiler the
plain path runs with one log line, ``POSENC_CPU_FAST_PATH=0`` opts out.

Most tests swap the compiler for a copy of one real build (``good_library``).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
import torch
from tests._native_fixtures import fake_compiler

import posenc
from posenc import _native
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
    monkeypatch.setattr(_native, "_loaded", {})
    monkeypatch.setattr(_native, "_tmp_dir", None)
    monkeypatch.setattr(_native, "_logged", set())
    monkeypatch.delenv("POSENC_CPU_FAST_PATH", raising=False)
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def compiles(monkeypatch, good_library):
    """Replace the compiler by a copy of ``good_library``; the list of targets it built."""
    return fake_compiler(monkeypatch, good_library)


# --- the library ---------------------------------------------------------------------------


def test_a_planted_library_is_never_loaded(fresh, compiles, monkeypatch):
    """End to end: garbage at the library's path is replaced before ``ctypes.CDLL``."""
    library = cpu.build()
    library.write_bytes(b"not an ELF file")  # loading this would raise OSError
    loaded = []
    real = _native.ctypes.CDLL
    monkeypatch.setattr(_native.ctypes, "CDLL", lambda path: loaded.append(path) or real(path))
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

    def no_build(source):
        raise AssertionError("built with POSENC_CPU_FAST_PATH=0")

    monkeypatch.setattr(_native, "build", no_build)
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
