"""Bad input for the conformance check that ``test_vectors.py`` and ``test_check.py`` leave
out: vector files that are links, devices, FIFOs, over a cap, truncated, or that hold arrays
of the wrong shape or dtype; the manifest's other fields; adapter outputs of the wrong shape
or dtype for frequencies, rotations and biases; bad arguments to the entry points.

Each is refused in one line naming the file, the case and the field (or the parameter), and
``posenc conformance --vectors`` exits 2 with that line (1 for an error of the environment).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.cli._command import run

from posenc import PosEncError, reference
from posenc.conformance import Adapter, Vectors, check, load_vectors, write_vectors
from posenc.conformance.pytest_plugin import assert_conforms
from posenc.conformance.vectors import MANIFEST_MAX_BYTES, NPZ_MAX_BYTES

try:
    import torch
except ImportError:  # a torch-free install: the one case of a torch tensor goes
    torch = None

NEAR = "sinusoidal.interleaved.d64@near"  # the first of the two cases written
SUBSET = "sinusoidal.interleaved.d64@*"
ADAPTER = """
import numpy as np
from posenc import reference
from posenc.conformance import Adapter

REFERENCE = Adapter(
    "reference", "table", "sinusoidal",
    lambda positions, dim, *, base: reference.sinusoidal_table(positions, dim, base=base),
    dtype="float64",
)
"""


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_vectors(tmp_path_factory.mktemp("golden"), cases=SUBSET)


@pytest.fixture
def folder(written: Path, tmp_path: Path) -> Path:
    out = tmp_path / "v"
    shutil.copytree(written, out)
    return out


def _one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text, text
    return text


# --- the files ------------------------------------------------------------------------------


def _link(name: str, to: str | Callable[[Path], Path]) -> Callable[[Path], None]:
    def setup(folder: Path) -> None:
        (folder / name).unlink()
        (folder / name).symlink_to(to(folder) if callable(to) else to)

    return setup


def _fifo(name: str) -> Callable[[Path], None]:
    def setup(folder: Path) -> None:
        (folder / name).unlink()
        os.mkfifo(folder / name)

    return setup


def _truncate(name: str, size: Callable[[int], int]) -> Callable[[Path], None]:
    def setup(folder: Path) -> None:
        os.truncate(folder / name, size(os.path.getsize(folder / name)))

    return setup


def _rewrite_npz(change: Callable[[str, bytes], list[tuple[str, bytes]]]) -> Callable[[Path], None]:
    """Rewrite vectors.npz, each member ``(name, .npy bytes)`` replaced by ``change``'s."""

    def setup(folder: Path) -> None:
        path = folder / "vectors.npz"
        with zipfile.ZipFile(path) as zf:
            members = [(i.filename, zf.read(i)) for i in zf.infolist()]
        with (
            zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf,
            warnings.catch_warnings(),
        ):
            warnings.filterwarnings("ignore", "Duplicate name", UserWarning)  # meant
            for name, data in members:
                for new_name, new_data in change(name, data):
                    zf.writestr(new_name, new_data)

    return setup


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _member(key: str, make: Callable[[np.ndarray], Any]) -> Callable[[Path], None]:
    """vectors.npz with the member ``<NEAR>/<key>.npy`` replaced by ``make(array)``: an
    array, raw ``bytes``, or a list of arrays (several members of that name)."""

    def change(name: str, data: bytes) -> list[tuple[str, bytes]]:
        if name != f"{NEAR}/{key}.npy":
            return [(name, data)]
        made = make(np.lib.format.read_array(io.BytesIO(data)))
        if isinstance(made, bytes):
            return [(name, made)]
        return [(name, _npy(a)) for a in (made if isinstance(made, list) else [made])]

    return _rewrite_npz(change)


def _bomb(folder: Path) -> None:
    """A member that deflates to a few KiB and unpacks past the cap."""
    _rewrite_npz(lambda name, data: [(name, data)])(folder)
    with zipfile.ZipFile(folder / "vectors.npz", "a", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("zeros.npy", bytes(NPZ_MAX_BYTES + 1))


FIELD = rf"case '{re.escape(NEAR)}' field "
AS_SAID = "as the manifest says, got an array of shape"
FILES: list[tuple[str, Callable[[Path], None], str]] = [
    (
        "manifest-links-to-dev-zero",
        _link("manifest.json", "/dev/zero"),
        r"manifest '[^']*/manifest.json' must be a regular file, got a character device",
    ),
    (
        "npz-links-to-dev-zero",
        _link("vectors.npz", "/dev/zero"),
        r"vectors '[^']*/vectors.npz' must be a regular file, got a character device",
    ),
    (
        "manifest-links-to-a-folder",
        _link("manifest.json", lambda f: f.parent),
        r"manifest '[^']*/manifest.json' must be a regular file, got a directory",
    ),
    (
        "npz-dangling-link",
        _link("vectors.npz", "nowhere.npz"),
        r"vectors '[^']*/vectors.npz' does not exist",
    ),
    (
        "npz-fifo",
        _fifo("vectors.npz"),
        r"vectors '[^']*/vectors.npz' must be a regular file, got a FIFO",
    ),
    (
        "manifest-over-the-cap",
        _truncate("manifest.json", lambda n: MANIFEST_MAX_BYTES + 1),
        rf"manifest '[^']*/manifest.json' is {MANIFEST_MAX_BYTES + 1} bytes, more than the "
        rf"{MANIFEST_MAX_BYTES} bytes it can be here",
    ),
    (
        "npz-unpacks-past-the-cap",
        _bomb,
        rf"vectors '[^']*/vectors.npz' unpacks to \d+ bytes, more than the {NPZ_MAX_BYTES} it",
    ),
    ("npz-empty", _truncate("vectors.npz", lambda n: 0), r"vectors '[^']*' is not a readable npz"),
    (
        "npz-truncated",
        _truncate("vectors.npz", lambda n: n // 2),
        r"vectors '[^']*' is not a readable npz file",
    ),
    (
        "npz-member-float32",
        _member("expected/table", lambda a: a.astype(np.float32)),
        rf"{FIELD}expected\['table'\] must be float64 of shape \[14, 64\] {AS_SAID} "
        r"\(14, 64\) and dtype float32",
    ),
    (
        "npz-member-reshaped",
        _member("expected/table", lambda a: a.reshape(-1)),
        rf"{FIELD}expected\['table'\] must be float64 of shape \[14, 64\] {AS_SAID} "
        r"\(896,\) and dtype float64",
    ),
    (
        "npz-positions-as-float",
        _member("inputs/positions", lambda a: a.astype(np.float64)),
        rf"{FIELD}inputs\['positions'\] must be int64 of shape \[14\] {AS_SAID} "
        r"\(14,\) and dtype float64",
    ),
    (
        "npz-member-twice",  # which one is meant is unknowable: refused, named
        _member("expected/table", lambda a: [a, a[:3]]),
        rf"vectors '[^']*' member '{re.escape(NEAR)}/expected/table' is stored twice",
    ),
    (
        "npz-member-not-npy",  # the message names the member: the case and the field
        _member("expected/table", lambda a: b"\x93NUMPY not an array header"),
        rf"vectors '[^']*' .*{re.escape(NEAR)}/expected/table",
    ),
]


@pytest.mark.parametrize(("setup", "message"), [f[1:] for f in FILES], ids=[f[0] for f in FILES])
def test_a_bad_file_is_one_line(folder, setup, message):
    setup(folder)
    with pytest.raises(PosEncError) as info:
        load_vectors(folder)
    assert re.search(message, _one_line(info.value)), info.value


@pytest.mark.parametrize(("setup", "message"), [f[1:] for f in FILES], ids=[f[0] for f in FILES])
def test_conformance_refuses_a_bad_file_in_one_line(capsys, tmp_path, folder, setup, message):
    (tmp_path / "adapters.py").write_text(ADAPTER)
    setup(folder)
    code, out, err = run(
        capsys, "conformance", f"{tmp_path}/adapters.py:REFERENCE", "--vectors", str(folder)
    )
    assert (code, out) == (2, ""), err
    assert err.startswith("posenc: error: ") and err.count("\n") == 1, err
    assert re.search(message, err), err


def test_a_symlink_loop_is_one_line(capsys, tmp_path, folder):
    """A link to itself cannot be opened: an error of the file system (OSError, exit 1 in
    the CLI) or a refusal (PosEncError, exit 2), naming the manifest either way."""
    _link("manifest.json", "manifest.json")(folder)
    with pytest.raises((PosEncError, OSError)) as info:
        load_vectors(folder)
    assert str(folder / "manifest.json") in _one_line(info.value)
    (tmp_path / "adapters.py").write_text(ADAPTER)
    code, _, err = run(
        capsys, "conformance", f"{tmp_path}/adapters.py:REFERENCE", "--vectors", str(folder)
    )
    assert code in (1, 2) and err.count("\n") == 1 and err.startswith("posenc: error: "), err


def test_a_link_to_good_files_is_read_as_they_are(written, tmp_path, folder):
    """Links are followed to regular files (as every posenc reader does): the same cases."""
    for name in ("manifest.json", "vectors.npz"):
        _link(name, lambda f, name=name: written / name)(folder)
    linked, direct = load_vectors(folder), load_vectors(written)
    assert linked.names() == direct.names() == [NEAR, NEAR.replace("near", "far")]
    for a, b in zip(linked, direct):
        for field in ("inputs", "expected"):
            for key, array in getattr(b, field).items():
                np.testing.assert_array_equal(getattr(a, field)[key], array)


# --- the manifest's fields that test_vectors.py does not edit ----------------------------------


def _edit(edit: Callable[[Any], Any]) -> Callable[[Path], None]:
    def setup(folder: Path) -> None:
        path = folder / "manifest.json"
        manifest = json.loads(path.read_text())
        replaced = edit(manifest)
        path.write_text(json.dumps(manifest if replaced is None else replaced))

    return setup


def _case(key: str, value: Any) -> Callable[[Any], None]:
    return lambda m: m["cases"][0].__setitem__(key, value)


def _table(key: str, value: Any) -> Callable[[Any], None]:
    return lambda m: m["cases"][0]["expected"]["table"].__setitem__(key, value)


MANIFESTS: list[tuple[str, Callable[[Any], Any], str]] = [
    ("a-list", lambda m: [m], r"manifest '[^']*' must be an object, got \["),
    ("no-cases", lambda m: m.pop("cases") and None, r"field cases must be present"),
    ("cases-a-string", lambda m: m.__setitem__("cases", "all"), r"field cases must be a non-empty"),
    ("no-case", lambda m: m.__setitem__("cases", []), r"field cases must be a non-empty list"),
    (
        "a-case-twice",
        lambda m: m["cases"].append(m["cases"][0]),
        rf"field cases\[2\]\['name'\] must be unique \(each case once\), got '{re.escape(NEAR)}'",
    ),
    ("a-case-not-an-object", lambda m: m["cases"].__setitem__(0, "x"), r"field cases\[0\] must be"),
    ("a-name-not-a-string", _case("name", 3), r"field cases\[0\]\['name'\] must be a string"),
    ("version-true", lambda m: m.__setitem__("version", True), r"field version must be 1"),
    ("posenc-empty", lambda m: m.__setitem__("posenc", ""), r"field posenc must be a string"),
    ("other-dtypes", lambda m: m.__setitem__("dtypes", ["float32"]), r"field dtypes must be \["),
    (
        "family-of-another-operation",
        _case("operation", "bias"),
        rf"{FIELD}family must be one of 'alibi', .* got 'sinusoidal'",
    ),
    ("far-a-string", _case("far", "yes"), rf"{FIELD}far must be True or False, got 'yes'"),
    ("doc-a-number", _case("doc", 3), rf"{FIELD}doc must be a string, got 3"),
    ("convention-a-list", _case("convention", ["layout"]), rf"{FIELD}convention must be an object"),
    ("parameters-a-number", _case("parameters", 3), rf"{FIELD}parameters must be an object, got 3"),
    (
        "an-input-missing",
        lambda m: m["cases"][0]["inputs"].pop("positions") and None,
        rf"{FIELD}inputs\['positions'\] must be present \(an input of table\), got 'absent'",
    ),
    (
        "an-output-too-many",
        lambda m: m["cases"][0]["expected"].__setitem__("bias", m["cases"][0]["expected"]["table"]),
        rf"{FIELD}expected must be the outputs \['table'\], got \['bias', 'table'\]",
    ),
    ("no-output", lambda m: m["cases"][0]["expected"].clear(), rf"{FIELD}expected must be the"),
    (
        "a-negative-size",
        _table("shape", [-14, 64]),
        rf"{FIELD}expected\['table'\]\['shape'\]\[0\] must be a size \(an integer >= 0\), got -14",
    ),
    (
        "a-bool-size",
        _table("shape", [True, 64]),
        rf"{FIELD}expected\['table'\]\['shape'\]\[0\] must be a size .* got True",
    ),
    (
        "a-float32-array",
        _table("dtype", "float32"),
        rf"{FIELD}expected\['table'\]\['dtype'\] must be 'float64' or 'int64', got 'float32'",
    ),
    ("an-array-a-number", _table("array", 3), rf"{FIELD}expected\['table'\]\['array'\] must be"),
    (
        "a-tolerance-missing",
        lambda m: m["cases"][0]["tolerance"].pop("bfloat16") and None,
        rf"{FIELD}tolerance\['bfloat16'\] must be present",
    ),
    (
        "a-tolerance-a-string",
        lambda m: m["cases"][0]["tolerance"]["float32"].__setitem__("output", "NaN"),
        rf"{FIELD}tolerance\['float32'\]\['output'\] must be a number, got 'NaN'",
    ),
]


@pytest.mark.parametrize(
    ("edit", "message"), [m[1:] for m in MANIFESTS], ids=[m[0] for m in MANIFESTS]
)
def test_a_bad_manifest_field_is_one_line(folder, edit, message):
    _edit(edit)(folder)
    with pytest.raises(PosEncError) as info:
        load_vectors(folder)
    text = _one_line(info.value)
    assert text.startswith(f"manifest '{folder / 'manifest.json'}' "), text
    assert re.search(message, text), text


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe{", r"is not UTF-8 text \(invalid start byte at byte 0\)"),
        (b"[" * 100_000 + b"]" * 100_000, r"nests JSON arrays or objects too deep to read"),
    ],
    ids=["not-utf8", "nested-too-deep"],
)
def test_an_unreadable_manifest_is_one_line(folder, content, message):
    (folder / "manifest.json").write_bytes(content)
    with pytest.raises(PosEncError, match=message) as info:
        load_vectors(folder)
    _one_line(info.value)


# --- adapter outputs of the wrong shape or dtype (test_check.py has the table's) -----------------

FREQUENCIES = "rope.frequencies.yarn.d64"
ROTATION = "rope.rotate.half.default.d64.full@near"
BIAS = "alibi.causal.h8@near"


def _inv_freq(dim: int, **kw: Any) -> tuple[np.ndarray, float]:
    return reference.rope_frequencies(
        dim, base=kw["base"], scaling=kw["scaling"], seq_len=kw["seq_len"]
    )


def _bias(value: Callable[[int, int, int], Any]) -> Callable[..., Any]:
    return lambda q, k, *, heads, **parameters: value(heads, len(q), len(k))


OUTPUTS: list[tuple[str, str, str, Callable[..., Any], str]] = [
    (
        "inv-freq-short",
        "frequencies",
        FREQUENCIES,
        lambda dim, **kw: _inv_freq(dim, **kw)[0][:-1],
        "field inv_freq must have shape [32], got [31]",
    ),
    (
        "inv-freq-2d",
        "frequencies",
        FREQUENCIES,
        lambda dim, **kw: _inv_freq(dim, **kw)[0][None],
        "field inv_freq must have shape [32], got [1, 32]",
    ),
    (
        "three-values",
        "frequencies",
        FREQUENCIES,
        lambda dim, **kw: (*_inv_freq(dim, **kw), 1.0),
        "field output must be inv_freq or (inv_freq, attention_scale), got 3 values",
    ),
    (
        "scale-a-string",
        "frequencies",
        FREQUENCIES,
        lambda dim, **kw: (_inv_freq(dim, **kw)[0], "x"),
        "field attention_scale must be real numbers, got dtype <U1",
    ),
    (
        "scale-an-array",
        "frequencies",
        FREQUENCIES,
        lambda dim, **kw: (_inv_freq(dim, **kw)[0], np.ones(2)),
        "field attention_scale must have shape [], got [2]",
    ),
    (
        "scale-nan",
        "frequencies",
        FREQUENCIES,
        lambda dim, **kw: (_inv_freq(dim, **kw)[0], float("nan")),
        "field attention_scale must be finite, got nan at attention scale",
    ),
    (
        "none",
        "frequencies",
        FREQUENCIES,
        lambda dim, **kw: None,
        "field inv_freq must be real numbers, got dtype object",
    ),
    (
        "bool",
        "frequencies",
        FREQUENCIES,
        lambda dim, **kw: np.ones(dim // 2, dtype=bool),
        "field inv_freq must be real numbers, got dtype bool",
    ),
    (
        "inf",
        "frequencies",
        FREQUENCIES,
        lambda dim, **kw: np.full(dim // 2, np.inf),
        "field inv_freq must be finite, got inf at inv_freq[0]",
    ),
    (
        "q-a-channel-short",
        "rotate",
        ROTATION,
        lambda q, k, p, **kw: (q[..., :-1], k),
        "field q must have shape [14, 2, 64], got [14, 2, 63]",
    ),
    (
        "q-heads-first",
        "rotate",
        ROTATION,
        lambda q, k, p, **kw: (q.transpose(1, 0, 2), k),
        "field q must have shape [14, 2, 64], got [2, 14, 64]",
    ),
    (
        "k-complex",
        "rotate",
        ROTATION,
        lambda q, k, p, **kw: (q, k.astype(complex)),
        "field k must be real numbers, got dtype complex128",
    ),
    (
        "k-nan",
        "rotate",
        ROTATION,
        lambda q, k, p, **kw: (q, np.full_like(k, np.nan)),
        "field k must be finite, got nan at k: position 0, head 0, channel 0",
    ),
    (
        "three-arrays",
        "rotate",
        ROTATION,
        lambda q, k, p, **kw: (q, k, q),
        "field output must be (q_rot, k_rot), got tuple",
    ),
    (
        "a-dict",
        "rotate",
        ROTATION,
        lambda q, k, p, **kw: {"q": q, "k": k},
        "field output must be (q_rot, k_rot), got dict",
    ),
    (
        "a-key-too-many",
        "bias",
        BIAS,
        _bias(lambda h, m, n: np.zeros((h, m, n + 1))),
        "field bias must have shape [8, 8, 10], got [8, 8, 11]",
    ),
    (
        "no-heads-axis",
        "bias",
        BIAS,
        _bias(lambda h, m, n: np.zeros((m, n))),
        "field bias must have shape [8, 8, 10], got [8, 10]",
    ),
    (
        "a-string",
        "bias",
        BIAS,
        _bias(lambda h, m, n: "bias"),
        "field bias must be real numbers, got dtype <U4",
    ),
    (
        "minus-inf-where-finite",
        "bias",
        BIAS,
        _bias(lambda h, m, n: np.full((h, m, n), -np.inf)),
        "field bias must be finite, got -inf at head 0, query 0, key 0",
    ),
]
if torch is not None:
    OUTPUTS.append(
        (
            "torch-bfloat16",
            "frequencies",
            FREQUENCIES,
            lambda dim, **kw: torch.zeros(dim // 2, dtype=torch.bfloat16),
            "field inv_freq must be an array NumPy can read, got Tensor (Got unsupported "
            "ScalarType BFloat16)",
        )
    )
FAMILY = {"frequencies": "rope", "rotate": "rope", "bias": "alibi"}


@pytest.fixture(scope="module")
def cases() -> Vectors:
    return Vectors.build([FREQUENCIES, ROTATION, BIAS])


@pytest.mark.parametrize(
    ("operation", "case", "fn", "message"), [o[1:] for o in OUTPUTS], ids=[o[0] for o in OUTPUTS]
)
def test_a_bad_output_is_a_failure_in_one_line(cases, operation, case, fn, message):
    adapter = Adapter("bad", operation, FAMILY[operation], fn, dtype="float64")
    (result,) = check(adapter, cases, cases=case).results
    assert (result.status, result.case) == ("fail", case)
    assert result.detail == f"adapter 'bad' case '{case}' {message}"
    assert result.deviation is None


# --- arguments --------------------------------------------------------------------------------


def _ok() -> Adapter:
    return Adapter("ok", "table", "sinusoidal", len)


ARGUMENTS: list[tuple[str, Callable[[Path], Any], str]] = [
    ("check-no-adapter", lambda t: check([]), r"^adapter must be an Adapter or a non-empty"),
    (
        "check-a-non-adapter-in-the-list",
        lambda t: check([_ok(), 3]),
        r"^adapters\[1\] must be a posenc.conformance.Adapter, got int$",
    ),
    ("check-a-dict", lambda t: check({"ok": _ok()}), r"^adapter must be an Adapter .* got dict$"),
    ("check-cases-a-number", lambda t: check(_ok(), cases=3), r"^cases must be .*got 3$"),
    ("check-cases-bytes", lambda t: check(_ok(), cases=b"x"), r"^cases must be .*got b'x'$"),
    ("check-vectors-empty", lambda t: check(_ok(), ""), r"^vectors must .*got ''$"),
    ("load-vectors-none", lambda t: load_vectors(None), r"^directory must .*got None$"),
    ("load-vectors-a-number", lambda t: load_vectors(3), r"^directory must .*got 3$"),
    ("load-vectors-empty", lambda t: load_vectors(""), r"^directory must .*got ''$"),
    ("write-vectors-out-a-number", lambda t: write_vectors(3), r"^out must .*got 3$"),
    ("write-vectors-out-empty", lambda t: write_vectors(""), r"^out must .*got ''$"),
    (
        "write-vectors-vectors-a-string",
        lambda t: write_vectors(t / "w", "alibi.*"),
        r"^vectors must .*got 'alibi.\*'$",
    ),
    (
        "write-vectors-no-case",
        lambda t: write_vectors(t / "w", cases=[]),
        r"^cases must .*got \[\]$",
    ),
    (
        "adapter-convention-of-the-wrong-type",
        lambda t: Adapter("a", "bias", "alibi", len, convention={"causal": "yes"}),
        r"^Adapter 'a' convention\['causal'\] must be True or False .*got 'yes'$",
    ),
    (
        "adapter-convention-no-case-has",
        lambda t: Adapter("a", "table", "sinusoidal", len, convention={"layuot": "half"}),
        r"^Adapter 'a' convention key must be one the table/sinusoidal cases have .*got 'layuot'$",
    ),
    (
        "assert-conforms-expect-an-unknown-case",
        lambda t: assert_conforms(_ok(), cases=SUBSET, expect={"nope@near": None}),
        r"^expect keys must be names of the vectors' cases .*got 'nope@near'$",
    ),
    (
        "assert-conforms-expect-a-number",
        lambda t: assert_conforms(_ok(), cases=SUBSET, expect={NEAR: 3}),
        rf"^expect\['{re.escape(NEAR)}'\] must be .*got 3$",
    ),
]


@pytest.mark.parametrize(
    ("call", "message"), [a[1:] for a in ARGUMENTS], ids=[a[0] for a in ARGUMENTS]
)
def test_a_bad_argument_is_one_line_naming_it(tmp_path, monkeypatch, call, message):
    monkeypatch.chdir(tmp_path)  # an empty path is not this folder
    with pytest.raises(PosEncError) as info:
        call(tmp_path)
    assert re.search(message, _one_line(info.value)), info.value
    assert not (tmp_path / "w").exists()  # refused before anything was written


def test_adapters_are_hashable_and_their_convention_read_only():
    """A list of adapters can be deduplicated or used as dict keys (the convention is a
    frozen mapping, equal to the dict it was given)."""

    def make() -> Adapter:
        return Adapter("a", "rotate", "rope", len, convention={"layout": "half", "scaling": "yarn"})

    a, b = make(), make()
    assert hash(a) == hash(b) and a == b and len({a, b}) == 1
    assert a.convention == {"scaling": "yarn", "layout": "half"}
    with pytest.raises(TypeError):
        a.convention["layout"] = "interleaved"  # type: ignore[index]
