"""The one atomic writer and the out-dir lock of ``posenc._files``: a write is whole or
absent, a killed write's temporary file is cleaned, a process bound to a dead parent writes
nothing, and the old import paths in ``experiments`` still work, with a warning."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from posenc import PosEncError, _files


def test_a_write_replaces_the_file_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_bytes(b"old")
    _files.atomic_write(path, b"new contents")
    assert path.read_bytes() == b"new contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_a_write_killed_before_its_rename_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "index.html"
    path.write_bytes(b"old page")

    def killed(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        _files.atomic_write(path, b"new page")
    assert path.read_bytes() == b"old page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.html"]


def test_a_write_the_disk_refuses_names_the_file_not_its_temporary(tmp_path: Path) -> None:
    path = tmp_path / "missing-folder" / "a.json"
    with pytest.raises(FileNotFoundError) as info:
        _files.atomic_write(path, b"x")
    assert info.value.filename == str(path)


def test_write_atomically_streams_what_its_callback_writes(tmp_path: Path) -> None:
    path = tmp_path / "run.pt"
    _files.write_atomically(path, lambda f: (f.write(b"body"), f.write(b"-seal")))
    assert path.read_bytes() == b"body-seal"


def test_only_the_temporaries_of_a_killed_write_are_cleaned(tmp_path: Path) -> None:
    stale = [tmp_path / ".a.json.123.0123abcd.tmp", tmp_path / ".index.html.9.deadbeef.tmp"]
    keep = [tmp_path / "notes.tmp", tmp_path / ".hidden", tmp_path / ".a.json.x.0123abcd.tmp"]
    for path in stale + keep:
        path.write_bytes(b"half")
    assert sorted(_files.clean_stale_temps(tmp_path)) == sorted(stale)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in keep)
    assert _files.clean_stale_temps(tmp_path / "absent") == []


def test_a_process_bound_to_a_dead_parent_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "late.json"
    code = textwrap.dedent(
        f"""
        import os
        from posenc import _files
        _files.bind_to_parent(os.getppid() + 1)  # not its parent: as if it had died
        _files.atomic_write({str(path)!r}, b"written after the parent died")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert done.returncode == _files.ORPHANED_EXIT, done.stderr.decode()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("value", "match"),
    [("", r"^out_dir must name a folder, got ''$"), ("file", "out_dir must be a folder")],
)
def test_make_out_dir_refuses_what_cannot_be_a_folder(
    tmp_path: Path, value: str, match: str
) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(PosEncError, match=match):
        _files.make_out_dir(str(tmp_path / value) if value else value)


def test_make_out_dir_makes_the_folder_and_its_parents(tmp_path: Path) -> None:
    out = _files.make_out_dir(tmp_path / "a" / "b")
    assert out == tmp_path / "a" / "b" and out.is_dir() and list(out.iterdir()) == []


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("posenc.experiments.checkpoint", "atomic_write"),
        ("posenc.experiments.checkpoint", "clean_stale_temps"),
        ("posenc.experiments.outdir", "make_out_dir"),
        ("posenc.experiments.outdir", "lock_out_dir"),
        ("posenc.experiments.outdir", "LOCK_NAME"),
    ],
)
def test_the_old_import_paths_work_with_a_warning(module: str, name: str) -> None:
    old = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=rf"{module}\.{name} moved to posenc\._files"):
        got = getattr(old, name)
    assert got is getattr(_files, name)


def test_a_name_that_never_was_there_is_an_attribute_error() -> None:
    from posenc.experiments import outdir

    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        outdir.nothing  # noqa: B018
