"""Golden vectors on disk: ``manifest.json`` (what each case is) and ``vectors.npz`` (its
arrays), with a ``README.md`` saying so; written byte-identically on every run, read back
only from regular files under a cap, every field checked.

The format (version 1):

- ``manifest.json``: ``{"format": "posenc-vectors", "version": 1, "posenc": "0.1.0",
  "doc": ..., "tolerance_model": ..., "dtypes": [...], "cases": [...]}``; each case
  ``{"name", "family", "operation", "convention", "parameters", "far", "doc", "inputs",
  "expected", "magnitude", "angle_bound", "tolerance"}``, where each array field maps a
  key to ``{"array": "<npz member>", "shape": [...], "dtype": "float64" | "int64"}`` and
  ``tolerance`` maps each dtype to ``{"output", "arithmetic", "angle", "smallest_normal"}``.
- ``vectors.npz``: one ``.npy`` member per array, named ``<case>/<field>/<key>``, stored
  deflated with fixed timestamps (no pickles: ``np.load(..., allow_pickle=False)``).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posenc._errors import PosEncError
from posenc._fields import At, fail, mapping, number, sequence, string
from posenc._files import MIB, atomic_write, make_out_dir, parse_json, read_regular
from posenc._version import __version__
from posenc.conformance._api import DTYPES, FAMILIES, OPERATIONS
from posenc.conformance.cases import INPUTS, OUTPUTS, Case, build_cases, catalogue, select

__all__ = [
    "FORMAT",
    "MANIFEST",
    "MANIFEST_MAX_BYTES",
    "NPZ",
    "NPZ_MAX_BYTES",
    "VERSION",
    "Vectors",
    "as_vectors",
    "known_names",
    "load_vectors",
    "write_vectors",
]

FORMAT = "posenc-vectors"
VERSION = 1
MANIFEST = "manifest.json"
NPZ = "vectors.npz"
#: The most the two files may hold (the full set is about 1 MB and 2 MB).
MANIFEST_MAX_BYTES = 16 * MIB
NPZ_MAX_BYTES = 64 * MIB
_FIELDS = ("inputs", "expected", "magnitude", "angle_bound")
_CASE_KEYS = (
    *("name", "family", "operation", "convention", "parameters", "far", "doc"),
    *_FIELDS,
    "tolerance",
)
_COEFFICIENTS = ("output", "arithmetic", "angle", "smallest_normal")
_DATE = (1980, 1, 1, 0, 0, 0)  # every zip member's timestamp: files identical on every run

TOLERANCE_MODEL = (
    "per element: output * max(|expected|, smallest_normal) + arithmetic * magnitude + angle "
    "* angle_bound. output: the unit roundoff of the adapter's dtype (its result rounded "
    "once; smallest_normal: its smallest normal number, below which the step is fixed). "
    "arithmetic: "
    "8 units of the precision it computes in (float64 for a float64 adapter, float32 for "
    "every other: bfloat16 and float16 implementations must compute in float32 or better), "
    "times magnitude, the size of the terms the computation carries. angle: 16 units of "
    "the precision of the angles times angle_bound (|angle| times the amplitude it "
    "multiplies); near cases (positions up to 4095) allow float32 angles for every dtype but "
    "float64, far cases (@far: positions 1e5, 1e5+1, 1e6, 1e6+1) only float64 angles or "
    "angles reduced before rounding, so float32 angles fail there."
)
DOC = (
    "Golden vectors of posenc's float64 reference (posenc.reference): tables, RoPE "
    "frequencies, queries and keys after rotation, and attention biases, at near and far "
    "positions. Give each case's inputs to an implementation and compare its outputs with "
    "'expected', element by element, within the tolerance of its dtype (tolerance_model)."
)


@dataclasses.dataclass(frozen=True)
class Vectors:
    """A set of golden cases (built in memory or loaded from a directory).

    ``vectors[name]`` is a case, ``len(vectors)`` their number, iteration in order.
    ``posenc`` is the version that wrote them, ``path`` their directory (None in memory).
    """

    cases: tuple[Case, ...]
    version: int = VERSION
    posenc: str = __version__
    path: Path | None = None

    def __iter__(self) -> Iterator[Case]:
        return iter(self.cases)

    def __len__(self) -> int:
        return len(self.cases)

    def __getitem__(self, name: str) -> Case:
        for case in self.cases:
            if case.name == name:
                return case
        raise KeyError(name)

    def names(self) -> list[str]:
        """The case names, in order."""
        return [c.name for c in self.cases]

    def select(self, cases: str | Sequence[str] | None) -> Vectors:
        """The cases whose name matches one of the ``fnmatch`` globs ``cases`` (all when
        None).

        Raises:
            PosEncError: ``cases`` is not None, a glob string or a non-empty sequence of
                them, or matches no case.
        """
        return dataclasses.replace(self, cases=tuple(select(self.cases, cases)))

    @classmethod
    def build(cls, cases: str | Sequence[str] | None = None) -> Vectors:
        """The catalogue in memory (:func:`~posenc.conformance.build_cases`), optionally only
        the cases matching the ``fnmatch`` globs ``cases``.

        Raises:
            PosEncError: ``cases`` is not None, a glob string or a non-empty sequence of
                them, or matches no case.
        """
        return cls(tuple(build_cases(cases)))


# --- writing ----------------------------------------------------------------------------------


def _member(case: str, field: str, key: str) -> str:
    return f"{case}/{field}/{key}"


def _spec(member: str, array: np.ndarray) -> dict[str, Any]:
    return {"array": member, "shape": list(array.shape), "dtype": str(array.dtype)}


def _manifest_case(case: Case) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": case.name,
        "family": case.family,
        "operation": case.operation,
        "convention": dict(case.convention),
        "parameters": dict(case.parameters),
        "far": case.far,
        "doc": case.doc,
    }
    for field in _FIELDS:
        arrays: Mapping[str, np.ndarray] = getattr(case, field)
        entry[field] = {k: _spec(_member(case.name, field, k), a) for k, a in arrays.items()}
    entry["tolerance"] = {d: dict(case.tolerances[d]) for d in DTYPES}
    return entry


def _npz_bytes(cases: Sequence[Case]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for case in cases:
            for field in _FIELDS:
                for key, array in getattr(case, field).items():
                    data = io.BytesIO()
                    np.lib.format.write_array(data, np.array(array, order="C"), allow_pickle=False)
                    info = zipfile.ZipInfo(_member(case.name, field, key) + ".npy", _DATE)
                    info.compress_type = zipfile.ZIP_DEFLATED
                    info.external_attr = 0o644 << 16
                    zf.writestr(info, data.getvalue())
    return buffer.getvalue()


def _readme(vectors: Vectors) -> str:
    lines = [
        "# posenc golden vectors",
        "",
        f"Written by posenc {vectors.posenc}; format {FORMAT!r} version {vectors.version}; "
        f"{len(vectors)} cases.",
        "",
        DOC,
        "",
        "## Files",
        "",
        f"- `{MANIFEST}`: each case's name, family, operation (table, frequencies, rotate, "
        "bias), convention, parameters, a one-line doc, its arrays (npz member, shape, "
        "dtype) and its tolerance per dtype.",
        f"- `{NPZ}`: the arrays, one `.npy` member each, named `<case>/<field>/<key>`; "
        "load with `numpy.load(path, allow_pickle=False)`.",
        "",
        "## Calling an implementation",
        "",
        "- table: `fn(positions, dim, **parameters) -> [n, dim]`",
        "- frequencies: `fn(dim, *, base, scaling, seq_len) -> inv_freq [dim // 2]` "
        "(or with the attention scale)",
        "- rotate: `fn(q [seq, heads, dim], k, positions, *, base, scaling, rotary_dim) -> "
        "(q, k)`; cos and sin times the attention scale",
        "- bias: `fn(query_positions [m], key_positions [n], *, heads, **parameters) -> "
        "[heads, m, n]`",
        "",
        "Input arrays beyond the positional ones are keyword arguments.",
        "",
        "## Tolerance",
        "",
        TOLERANCE_MODEL,
        "",
        "## Cases",
        "",
    ]
    lines += [f"- `{c.name}`: {c.doc}" for c in vectors.cases]
    return "\n".join(lines) + "\n"


def write_vectors(
    out: str | Path, vectors: Vectors | None = None, *, cases: str | Sequence[str] | None = None
) -> Path:
    """Write golden vectors into the directory ``out`` (made when missing):
    ``manifest.json``, ``vectors.npz`` and ``README.md``, each written whole (a temporary
    file renamed over it). The same cases give byte-identical files on every run.

    Args:
        out: the directory.
        vectors: what to write (default: the catalogue, :meth:`Vectors.build`).
        cases: ``fnmatch`` globs picking cases by name.

    Returns: ``out`` as a Path.

    Raises:
        PosEncError: ``out`` is not a non-empty path or is a file, ``vectors`` is not None or
            a :class:`Vectors`, or ``cases`` is malformed or matches nothing (each before
            anything is written).
    """
    _check_path("out", out)
    if vectors is not None and not isinstance(vectors, Vectors):
        raise PosEncError(
            "vectors must be None (the catalogue) or a posenc.conformance.Vectors "
            f"(cases= picks cases by name), got {_show(vectors)}"
        )
    vectors = Vectors.build(cases) if vectors is None else vectors.select(cases)
    try:
        folder = make_out_dir(out)
    except PosEncError as e:  # its messages call the folder out_dir; here it is out
        message = str(e)
        raise PosEncError(
            "out" + message[len("out_dir") :] if message.startswith("out_dir") else message
        ) from None
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "posenc": vectors.posenc,
        "doc": DOC,
        "tolerance_model": TOLERANCE_MODEL,
        "dtypes": list(DTYPES),
        "cases": [_manifest_case(c) for c in vectors.cases],
    }
    atomic_write(folder / NPZ, _npz_bytes(vectors.cases))
    text = json.dumps(manifest, indent=1, allow_nan=False) + "\n"
    atomic_write(folder / MANIFEST, text.encode("utf-8"))
    atomic_write(folder / "README.md", _readme(vectors).encode("utf-8"))
    return folder


def _show(value: Any) -> str:
    """``repr(value)``, cut to one short line."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 80 else text[:77] + "..."


def _check_path(name: str, value: Any) -> None:
    """Refuse ``value`` unless it is a non-empty ``str`` or ``os.PathLike`` (``""`` would be
    the working directory, ``None`` or a number no path at all)."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise PosEncError(
            f"{name} must be a path to a folder (a non-empty str or Path), got {_show(value)}"
        )


# --- reading ----------------------------------------------------------------------------------


def _open_npz(path: Path) -> Mapping[str, np.ndarray]:
    """The arrays of ``path``: a regular file under the cap, a zip whose members unpack
    under the cap, each a ``.npy`` without pickles."""
    where = f"vectors {str(path)!r}"
    raw = read_regular(path, what="vectors", max_bytes=NPZ_MAX_BYTES)
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as zf:
            infos = zf.infolist()
            total = sum(i.file_size for i in infos)
            if total > NPZ_MAX_BYTES:
                raise PosEncError(
                    f"{where} unpacks to {total} bytes, more than the {NPZ_MAX_BYTES} it can be"
                )
            arrays: dict[str, np.ndarray] = {}
            for info in infos:
                if not info.filename.endswith(".npy"):
                    raise PosEncError(f"{where} member {info.filename!r} must be a .npy array")
                member = info.filename[: -len(".npy")]
                if member in arrays:
                    raise PosEncError(
                        f"{where} member {member!r} is stored twice (each array once)"
                    )
                arrays[member] = _read_member(where, member, zf.read(info))
    except PosEncError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError) as e:
        message = " ".join(str(e).split())[:200]
        raise PosEncError(f"{where} is not a readable npz file ({message})") from None
    return arrays


def _read_member(where: str, member: str, data: bytes) -> np.ndarray:
    """The array in one member's ``.npy`` bytes (no pickles), refused naming the member."""
    try:
        return np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        message = " ".join(str(e).split())[:200]
        raise PosEncError(
            f"{where} is not a readable npz file (member {member!r}: {message})"
        ) from None


def _array(at: At, spec: Any, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """The array ``spec`` names, checked against its shape and dtype."""
    mapping(at, spec, required=("array", "shape", "dtype"), allowed=("array", "shape", "dtype"))
    member = string(at["array"], spec["array"], empty=False)
    shape = sequence(at["shape"], spec["shape"], "a list of sizes", high=8)
    for i, n in enumerate(shape):
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise fail(at["shape"][i], "a size (an integer >= 0)", n)
    dtype = spec["dtype"]
    if dtype not in ("float64", "int64"):
        raise fail(at["dtype"], "'float64' or 'int64'", dtype)
    if member not in arrays:
        raise fail(at, f"an array of vectors.npz (member {member!r})", "absent")
    array = arrays[member]
    if str(array.dtype) != dtype or list(array.shape) != list(shape):
        raise fail(at, f"{dtype} of shape {list(shape)} as the manifest says", array)
    array = np.array(array)
    array.flags.writeable = False
    return array


def _tolerances(at: At, value: Any) -> dict[str, dict[str, float]]:
    mapping(at, value, required=DTYPES, allowed=DTYPES)
    out: dict[str, dict[str, float]] = {}
    for d in DTYPES:
        mapping(at[d], value[d], required=_COEFFICIENTS, allowed=_COEFFICIENTS)
        out[d] = {c: float(number(at[d][c], value[d][c], 0.0, 1.0)) for c in _COEFFICIENTS}
    return out


def _load_case(at: At, entry: Any, arrays: Mapping[str, np.ndarray], known: set[str]) -> Case:
    mapping(at, entry, required=_CASE_KEYS, allowed=_CASE_KEYS)
    name = string(at["name"], entry["name"], empty=False)
    at = At(f"{at.where} case {name!r}")
    if name not in known:
        raise fail(at["name"], "a case posenc knows (posenc vectors lists them)", name)
    operation = entry["operation"]
    if operation not in OPERATIONS:
        raise fail(at["operation"], f"one of {', '.join(map(repr, OPERATIONS))}", operation)
    family = entry["family"]
    if family not in FAMILIES[operation]:
        raise fail(at["family"], f"one of {', '.join(map(repr, FAMILIES[operation]))}", family)
    convention = mapping(at["convention"], entry["convention"])
    parameters = mapping(at["parameters"], entry["parameters"])
    if not isinstance(entry["far"], bool):
        raise fail(at["far"], "True or False", entry["far"])
    doc = string(at["doc"], entry["doc"])
    fields: dict[str, dict[str, np.ndarray]] = {}
    for field in _FIELDS:
        specs = mapping(at[field], entry[field])
        fields[field] = {str(k): _array(at[field][k], v, arrays) for k, v in specs.items()}
    for key in INPUTS[operation]:
        if key not in fields["inputs"]:
            raise fail(at["inputs"][key], f"present (an input of {operation})", "absent")
    wanted = set(OUTPUTS[operation])
    for field in ("expected", "magnitude", "angle_bound"):
        if set(fields[field]) != wanted:
            raise fail(at[field], f"the outputs {sorted(wanted)}", sorted(fields[field]))
    for key, expected in fields["expected"].items():
        for field in ("magnitude", "angle_bound"):
            try:
                np.broadcast_shapes(fields[field][key].shape, expected.shape)
            except ValueError:
                raise fail(
                    at[field][key], f"broadcastable to {list(expected.shape)}", fields[field][key]
                ) from None
    return Case(
        name=name,
        family=family,
        operation=operation,
        convention=convention,
        parameters=parameters,
        inputs=fields["inputs"],
        expected=fields["expected"],
        magnitude=fields["magnitude"],
        angle_bound=fields["angle_bound"],
        far=entry["far"],
        doc=doc,
        tolerances=_tolerances(at["tolerance"], entry["tolerance"]),
    )


def known_names() -> set[str]:
    """The names of every case of the catalogue (built once per process)."""
    return {c.name for c in catalogue()}


def as_vectors(value: Any, name: str = "vectors") -> Vectors:
    """The cases ``value`` names: None builds the catalogue in memory, a :class:`Vectors`
    is itself, a directory (a non-empty ``str`` or ``Path``) is loaded
    (:func:`load_vectors`); messages call it ``name``.

    Raises:
        PosEncError: anything else, or a directory :func:`load_vectors` refuses.
    """
    if value is None:
        return Vectors.build()
    if isinstance(value, Vectors):
        return value
    if isinstance(value, (str, os.PathLike)):
        _check_path(name, value)
        return _load(Path(value), name)
    raise PosEncError(
        f"{name} must be None, a Vectors or a directory (str or Path), got {_show(value)}"
    )


def load_vectors(directory: str | Path) -> Vectors:
    """Read golden vectors written by :func:`write_vectors` (or ``posenc vectors``).

    Both files are read only when they are regular files under their caps
    (:data:`MANIFEST_MAX_BYTES`, :data:`NPZ_MAX_BYTES`); the npz without pickles.

    Returns: the :class:`Vectors`.

    Raises:
        PosEncError: ``directory`` not a non-empty path to a folder, a missing or irregular
            file, one over its cap, a malformed manifest or npz (a member unreadable or
            stored twice: named), a case posenc does not know, an array missing or of the
            wrong shape or dtype: one line naming the case and the field.
    """
    _check_path("directory", directory)
    return _load(Path(directory), "directory")


def _load(folder: Path, name: str) -> Vectors:
    """:func:`load_vectors` of a checked path; ``name`` is the caller's parameter."""
    if not folder.is_dir():
        state = "a file" if folder.exists() else "no such folder"
        raise PosEncError(
            f"{name} must be a directory holding {MANIFEST} and {NPZ}, got {str(folder)!r} "
            f"({state})"
        )
    manifest_path = folder / MANIFEST
    where = f"manifest {str(manifest_path)!r}"
    raw = read_regular(manifest_path, what="manifest", max_bytes=MANIFEST_MAX_BYTES)
    manifest = parse_json(raw, where)
    at = At(where)
    keys = ("format", "version", "posenc", "doc", "tolerance_model", "dtypes", "cases")
    mapping(at, manifest, required=keys, allowed=keys)
    if manifest["format"] != FORMAT:
        raise fail(at["format"], repr(FORMAT), manifest["format"])
    if manifest["version"] != VERSION or isinstance(manifest["version"], bool):
        raise fail(at["version"], f"{VERSION} (the version this posenc reads)", manifest["version"])
    posenc = string(at["posenc"], manifest["posenc"], empty=False)
    if manifest["dtypes"] != list(DTYPES):
        raise fail(at["dtypes"], f"{list(DTYPES)}", manifest["dtypes"])
    entries = sequence(at["cases"], manifest["cases"], "a non-empty list of cases", low=1)
    arrays = _open_npz(folder / NPZ)
    known = known_names()
    cases = [_load_case(at["cases"][i], e, arrays, known) for i, e in enumerate(entries)]
    names = [c.name for c in cases]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise fail(at["cases"][i]["name"], "unique (each case once)", name)
    return Vectors(tuple(cases), version=VERSION, posenc=posenc, path=folder)
