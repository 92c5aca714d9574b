"""Golden vectors on disk: byte-identical writes, a faithful round trip, and one-line
refusals of every malformed file."""

from __future__ import annotations

import io
import json
import os
import shutil
import zipfile

import numpy as np
import pytest

from posenc import PosEncError
from posenc.conformance import Vectors, load_vectors, write_vectors
from posenc.conformance.vectors import NPZ_MAX_BYTES


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("golden")
    write_vectors(out)
    return out


def test_two_writes_are_byte_identical(written, tmp_path):
    write_vectors(tmp_path / "again")
    for name in ("manifest.json", "vectors.npz", "README.md"):
        assert (written / name).read_bytes() == (tmp_path / "again" / name).read_bytes(), name


def test_the_set_is_small(written):
    total = sum(os.path.getsize(written / n) for n in ("manifest.json", "vectors.npz"))
    assert total < 4 * 2**20


def test_round_trip(written):
    loaded = load_vectors(written)
    built = Vectors.build()
    assert loaded.names() == built.names()
    for a, b in zip(loaded, built):
        assert (a.family, a.operation, a.far, a.doc) == (b.family, b.operation, b.far, b.doc)
        assert dict(a.convention) == dict(b.convention)
        assert json.dumps(dict(a.parameters)) == json.dumps(dict(b.parameters))
        for field in ("inputs", "expected", "magnitude", "angle_bound"):
            for key, array in getattr(b, field).items():
                np.testing.assert_array_equal(getattr(a, field)[key], array)
                assert getattr(a, field)[key].dtype == array.dtype
        assert {d: dict(v) for d, v in a.tolerances.items()} == {
            d: dict(v) for d, v in b.tolerances.items()
        }


def test_manifest_documents_itself(written):
    manifest = json.loads((written / "manifest.json").read_text())
    assert manifest["format"] == "posenc-vectors" and manifest["version"] == 1
    assert "float32 angles fail" in manifest["tolerance_model"]
    readme = (written / "README.md").read_text()
    assert "## Tolerance" in readme and "`sinusoidal.flax.d64@far`" in readme


def test_write_a_subset(tmp_path):
    write_vectors(tmp_path, cases="alibi.*")
    assert all(n.startswith("alibi.") for n in load_vectors(tmp_path).names())


def _copy(written, tmp_path):
    out = tmp_path / "v"
    shutil.copytree(written, out)
    return out


def _edit_manifest(folder, edit):
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def _set(path, value):
    def edit(manifest):
        target = manifest
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


FIRST = "sinusoidal.half.d64@near"  # the first case of the set
BAD_MANIFESTS = [
    (
        "unknown-case",
        ("cases", 0, "name"),
        "sinusoidal.spiral.d64@near",
        "case 'sinusoidal.spiral.d64@near' field name must be a case posenc knows",
    ),
    (
        "unknown-operation",
        ("cases", 0, "operation"),
        "shift",
        f"case '{FIRST}' field operation must be one of 'table'",
    ),
    (
        "unknown-family",
        ("cases", 0, "family"),
        "wavelet",
        f"case '{FIRST}' field family must be one of 'sinusoidal'",
    ),
    (
        "wrong-shape",
        ("cases", 0, "expected", "table", "shape"),
        [14, 65],
        rf"case '{FIRST}' field expected\['table'\] must be float64 of shape \[14, 65\]",
    ),
    (
        "wrong-dtype",
        ("cases", 0, "expected", "table", "dtype"),
        "int64",
        rf"case '{FIRST}' field expected\['table'\] must be int64 of shape",
    ),
    (
        "missing-array",
        ("cases", 0, "expected", "table", "array"),
        "nope/expected/table",
        rf"case '{FIRST}' field expected\['table'\] must be an array of vectors.npz \(member "
        r"'nope/expected/table'\), got 'absent'",
    ),
    ("bad-format", ("format",), "other", "field format must be 'posenc-vectors'"),
    ("bad-version", ("version",), 2, "field version must be 1"),
    (
        "bad-tolerance",
        ("cases", 0, "tolerance", "float32", "output"),
        -1.0,
        rf"case '{FIRST}' field tolerance\['float32'\]\['output'\] must be a finite number >= 0",
    ),
    (
        "unknown-key",
        ("cases", 0, "extra"),
        1,
        r"case \d+\]\['extra'\]|field cases\[0\]\['extra'\]",
    ),
]


@pytest.mark.parametrize(
    ("path", "value", "message"), [b[1:] for b in BAD_MANIFESTS], ids=[b[0] for b in BAD_MANIFESTS]
)
def test_a_malformed_manifest_is_one_line(written, tmp_path, path, value, message):
    folder = _copy(written, tmp_path)
    _edit_manifest(folder, _set(path, value))
    with pytest.raises(PosEncError, match=message) as info:
        load_vectors(folder)
    assert "\n" not in str(info.value)


def test_manifest_not_json(written, tmp_path):
    folder = _copy(written, tmp_path)
    (folder / "manifest.json").write_text("{not json")
    with pytest.raises(PosEncError, match=r"manifest .* is not valid JSON"):
        load_vectors(folder)


def test_malformed_npz(written, tmp_path):
    folder = _copy(written, tmp_path)
    (folder / "vectors.npz").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(PosEncError, match=r"vectors .* is not a readable npz file"):
        load_vectors(folder)


def test_npz_with_a_pickle_is_refused(written, tmp_path):
    folder = _copy(written, tmp_path)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        data = io.BytesIO()
        np.lib.format.write_array(data, np.array([{"a": 1}], dtype=object), allow_pickle=True)
        zf.writestr(f"{FIRST}/expected/table.npy", data.getvalue())
    (folder / "vectors.npz").write_bytes(buffer.getvalue())
    with pytest.raises(PosEncError, match=r"is not a readable npz file .*pickle"):
        load_vectors(folder)


def test_npz_member_that_is_not_an_array(written, tmp_path):
    folder = _copy(written, tmp_path)
    with zipfile.ZipFile(folder / "vectors.npz", "a") as zf:
        zf.writestr("evil.txt", b"hello")
    with pytest.raises(PosEncError, match=r"member 'evil.txt' must be a .npy array"):
        load_vectors(folder)


def test_npz_over_the_cap_is_refused_before_reading(written, tmp_path):
    folder = _copy(written, tmp_path)
    os.truncate(folder / "vectors.npz", NPZ_MAX_BYTES + 1)  # sparse: nothing is written
    with pytest.raises(PosEncError, match=f"more than the {NPZ_MAX_BYTES} bytes it can be"):
        load_vectors(folder)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_manifest_is_refused(written, tmp_path):
    folder = _copy(written, tmp_path)
    (folder / "manifest.json").unlink()
    os.mkfifo(folder / "manifest.json")
    with pytest.raises(PosEncError, match=r"manifest .* must be a regular file, got a FIFO"):
        load_vectors(folder)


def test_a_directory_manifest_is_refused(written, tmp_path):
    folder = _copy(written, tmp_path)
    (folder / "manifest.json").unlink()
    (folder / "manifest.json").mkdir()
    with pytest.raises(PosEncError, match=r"must be a regular file, got a directory"):
        load_vectors(folder)


def test_missing_directory(tmp_path):
    with pytest.raises(PosEncError, match=r"directory must be a directory holding manifest.json"):
        load_vectors(tmp_path / "none")
    with pytest.raises(PosEncError, match=r"manifest .* does not exist"):
        load_vectors(tmp_path)


def test_write_into_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(PosEncError, match=r"out must be a folder"):
        write_vectors(tmp_path / "f", cases="alibi.*")
