"""A copy of a GGUF file with some metadata keys set: the file llama.cpp runs scaled.

gguf-py's ``gguf_set_metadata`` edits existing scalar keys in place only, so a file without
``{arch}.rope.scaling.*`` keys (SmolLM2's) cannot be switched to YaRN where it lies: it is
copied. :func:`write_scaled_gguf` reads the input with ``gguf.GGUFReader`` and writes a new
file with ``gguf.GGUFWriter`` (the way gguf-py's ``gguf_new_metadata.py`` copies one):
every key with its value type (arrays with their element type), the input's alignment and
byte order, then every tensor with its type, shape and raw bytes, in the input's order
(``tensors=`` replaces, adds or removes small float32 ones: LongRoPE's factors,
:mod:`posenc.integrations.gguf_longrope`).

Safety: the input is never the output (the same path, a link or a hard link of it are
refused); an existing output is replaced only when asked; the free space of the output's
folder is checked first (a 7B file is several GB); the file is written as a temporary file
beside the output and renamed over it once whole (:func:`posenc._files.write_atomically`),
so a failure leaves no half file; the SHA-256 of every tensor's bytes, in order, is compared
between what was meant (the input's, with ``tensors`` applied) and the written file before
the rename.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from posenc._errors import PosEncError, describe
from posenc._files import MIB, write_atomically

__all__ = ["FREE_MARGIN", "write_scaled_gguf"]

#: Free space asked beyond the input's size: the new keys, and room left on the disk.
FREE_MARGIN = 64 * MIB
_ENVIRONMENT = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT}


def _gguf() -> Any:
    try:
        import gguf
    except ImportError as error:
        raise ImportError("writing a GGUF file needs gguf: pip install 'posenc[gguf]'") from error
    return gguf


def _paths(src: Any, dst: Any, overwrite: bool) -> tuple[Path, Path]:
    """``src`` and ``dst`` checked: an existing regular input, an output that is not it."""
    for name, value in (("src", src), ("dst", dst)):
        if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
            raise PosEncError(f"{name} must be the path of a GGUF file, got {value!r}")
    source, target = Path(src), Path(dst)
    if target.suffix.lower() != ".gguf":  # a typo or a folder's name is not a model's copy
        raise PosEncError(f"dst must be a file name ending in .gguf, got {str(dst)!r}")
    if not source.is_file():
        what = "a directory" if source.is_dir() else "no such file"
        raise PosEncError(f"src must be an existing GGUF file, got {str(source)!r} ({what})")
    same = source.resolve() == target.resolve()
    if not same and target.exists():
        same = os.path.samefile(source, target)
    if same:
        raise PosEncError(
            f"dst must not be the input GGUF file (a copy never overwrites its input), got "
            f"{str(target)!r} for src {str(source)!r}"
        )
    if target.is_dir():
        raise PosEncError(f"dst must be a file path, got the directory {str(target)!r}")
    if (target.exists() or target.is_symlink()) and not overwrite:
        raise PosEncError(
            f"dst {str(target)!r} exists; choose a new path or pass overwrite=True to replace it"
        )
    if not target.parent.is_dir():
        raise PosEncError(f"dst folder does not exist: {str(target.parent)!r}")
    return source, target


def _check_room(source: Path, target: Path) -> int:
    """The input's size, after checking the output's folder can take a file that large."""
    folder = target.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OSError(errno.EACCES, "the GGUF copy's folder cannot be written", str(folder))
    size = source.stat().st_size
    need = size + FREE_MARGIN
    free = shutil.disk_usage(folder).free
    if free < need:
        raise OSError(
            errno.ENOSPC,
            f"not enough free space for the GGUF copy: it needs {need} bytes (the input's "
            f"{size} and {FREE_MARGIN} to spare), {free} are free",
            str(folder),
        )
    return size


_INTS: dict[int, Any] = {  # GGUF value type code -> the NumPy type of its values
    0: np.uint8,
    1: np.int8,
    2: np.uint16,
    3: np.int16,
    4: np.uint32,
    5: np.int32,
    10: np.uint64,
    11: np.int64,
}
_FLOATS: dict[int, Any] = {6: np.float32, 12: np.float64}
_BOOL, _STRING, _ARRAY = 7, 8, 9
_NAMES = {  # the scalar GGUF value types by code, as gguf.GGUFValueType names them
    0: "UINT8",
    1: "INT8",
    2: "UINT16",
    3: "INT16",
    4: "UINT32",
    5: "INT32",
    6: "FLOAT32",
    7: "BOOL",
    8: "STRING",
    10: "UINT64",
    11: "INT64",
    12: "FLOAT64",
}


def _value_type(key: str, value: Any, existing: int | None, given: int | None) -> tuple[Any, int]:
    """``value`` and the GGUF value type code it is written as: the type ``given`` for the
    key, else a NumPy scalar's own type, else the type the input gives the key, else
    llama.cpp's for a Python value (``bool``, ``str``, ``float``: float32, ``int``: uint32,
    or int32 when negative)."""
    if isinstance(value, np.generic) and given is None:
        code = next(
            (c for c, t in {**_INTS, **_FLOATS}.items() if value.dtype == t),
            _BOOL if value.dtype == np.bool_ else None,
        )
        if code is None:
            raise PosEncError(f"metadata[{key!r}] has a NumPy type GGUF cannot hold: {value!r}")
        return value.item(), code
    if hasattr(value, "value") and isinstance(value.value, str):  # an enum (RopeScalingType)
        value = value.value
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        kind = _BOOL
    elif isinstance(value, str):
        kind = _STRING
    elif isinstance(value, int):
        kind = 4 if value >= 0 else 5
    elif isinstance(value, float):
        kind = 6
    else:
        raise PosEncError(
            f"metadata[{key!r}] must be a bool, int, float or str, got {type(value).__name__}"
        )
    wanted = given if given is not None else existing
    if wanted is not None and wanted != kind:
        numbers = {*_INTS, *_FLOATS}
        if given is not None and not ({wanted, kind} <= numbers or kind == wanted):
            raise PosEncError(
                f"metadata[{key!r}] must be a {_NAMES[given]} value, got {type(value).__name__} "
                f"{value!r}"
            )
        if {wanted, kind} <= numbers:
            kind = wanted  # the type asked, or the input's (a uint64 length stays one)
    if kind in _INTS:
        if isinstance(value, float) and not value.is_integer():
            raise PosEncError(f"metadata[{key!r}] must be a whole number, got {value!r}")
        info = np.iinfo(_INTS[kind])
        if not info.min <= value <= info.max:
            raise PosEncError(
                f"metadata[{key!r}] must lie in [{info.min}, {info.max}] (its GGUF type), got "
                f"{value!r}"
            )
        value = int(value)
    elif kind in _FLOATS:
        value = float(value)
    return value, kind


def _check_keys(metadata: Mapping[str, Any]) -> None:
    for key in metadata:
        if not isinstance(key, str) or not key.strip() or key.startswith("GGUF."):
            raise PosEncError(f"metadata keys must be GGUF key names, got {key!r}")
        if key == "general.architecture":
            raise PosEncError(
                "metadata must not set general.architecture (a copy keeps its architecture)"
            )


#: The key namespaces of every GGUF file besides its architecture's (gguf-py constants.py
#: ``Keys``): llama.cpp reads a model's keys under these and ``{general.architecture}.``.
_NAMESPACES = ("general", "tokenizer", "split")


def _check_namespaces(metadata: Mapping[str, Any], reader: Any, arch: str) -> None:
    """Refuse a key llama.cpp would never read in this file: one not of the form
    ``namespace.name``, or whose namespace is neither the file's architecture, nor
    :data:`_NAMESPACES`, nor one the file's own keys use (``lama.context_length`` in a
    ``llama`` file would be written, and ignored without a word)."""
    known = {arch, *_NAMESPACES, *(k.split(".", 1)[0] for k in reader.fields)}
    for key in metadata:
        parts = key.split(".")
        if len(parts) < 2 or not all(parts) or parts[0] not in known:
            raise PosEncError(
                f"metadata key {key!r} is not a key of this GGUF file: it must be "
                f"'namespace.name' in the namespace of its architecture {arch!r}, of "
                f"{', '.join(repr(n) for n in _NAMESPACES)}, or of one of the file's own keys"
            )


def _type_codes(types: Mapping[str, str], gguf: Any) -> dict[str, int]:
    """``types`` as GGUF value type codes (scalars only)."""
    if not isinstance(types, Mapping):
        raise PosEncError(f"types must be a mapping of GGUF keys, got {type(types).__name__}")
    codes = {}
    for key, name in types.items():
        code = getattr(gguf.GGUFValueType, str(name), None)
        if code is None or int(code) in (_ARRAY,):
            raise PosEncError(
                f"types[{key!r}] must name a scalar GGUF value type ({', '.join(_NAMES.values())})"
                f", got {name!r}"
            )
        codes[key] = int(code)
    return codes


def _copy_fields(
    reader: Any, writer: Any, metadata: Mapping[str, Any], types: Mapping[str, int], gguf: Any
) -> dict:
    """Every key of ``reader`` into ``writer``, in order, with ``metadata``'s set in place
    (new keys last; ``None`` removes one); returns the keys of ``metadata`` as written."""
    kinds = gguf.GGUFValueType
    done: dict[str, Any] = {}

    def put(key: str, old: int | None) -> None:
        if metadata[key] is None:
            done[key] = None
            return
        value, kind = _value_type(key, metadata[key], old, types.get(key))
        writer.add_key_value(key, value, kinds(kind))
        done[key] = value

    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the reader's header fields; the writer writes the architecture
        kind = int(field.types[0])
        if name in metadata:
            put(name, kind)
            continue
        if kind == _ARRAY and len(field.types) > 2:
            raise PosEncError(f"GGUF key {name!r} is an array of arrays, which a copy cannot write")
        value = field.contents()
        if kind == _ARRAY and len(value) == 0:
            raise PosEncError(f"GGUF key {name!r} is an empty array, which gguf's writer refuses")
        sub = kinds(int(field.types[-1])) if kind == _ARRAY else None
        writer.add_key_value(name, value, kinds(kind), sub_type=sub)
    for key in metadata:
        if key not in done:
            put(key, None)
    return done


#: A tensor of the copy: its name, data (raw bytes or values), GGML type and GGUF shape.
_Tensor = tuple[str, Any, int, tuple[int, ...]]
_F32 = 0  # GGMLQuantizationType.F32


def _digest(items: list[_Tensor]) -> tuple[str, list[tuple[str, int, tuple[int, ...]]]]:
    """The SHA-256 of every tensor's raw bytes in order, and each tensor's name, type, shape."""
    digest = hashlib.sha256()
    infos = []
    for name, data, kind, shape in items:
        digest.update(np.ascontiguousarray(data).reshape(-1).view(np.uint8).data)
        infos.append((name, kind, shape))
    return digest.hexdigest(), infos


def _stored(reader: Any) -> list[_Tensor]:
    return [
        (t.name, t.data, int(t.tensor_type), tuple(int(n) for n in t.shape)) for t in reader.tensors
    ]


def _tensor_digest(reader: Any) -> tuple[str, list[tuple[str, int, tuple[int, ...]]]]:
    """:func:`_digest` of every tensor a file holds."""
    return _digest(_stored(reader))


def _new_tensors(tensors: Any) -> dict[str, np.ndarray | None]:
    """``tensors`` checked: name -> a non-empty 1-D little-endian float32 array (every value
    finite in float32), or None (the tensor removed)."""
    if tensors is None:
        return {}
    if not isinstance(tensors, Mapping):
        raise PosEncError(
            f"tensors must be a mapping of tensor names, got {type(tensors).__name__}"
        )
    out: dict[str, np.ndarray | None] = {}
    for name, values in tensors.items():
        if not isinstance(name, str) or not name.strip() or len(name.encode()) >= 64:
            raise PosEncError(
                f"tensors keys must be GGUF tensor names (under 64 bytes), got {name!r}"
            )
        if values is None:
            out[name] = None
            continue
        try:
            array = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):
            raise PosEncError(
                f"tensors[{name!r}] must be a list of numbers, got {describe(values)}"
            ) from None
        if array.ndim != 1 or array.size == 0:
            raise PosEncError(
                f"tensors[{name!r}] must be a non-empty 1-D list of numbers, got shape "
                f"{tuple(array.shape)}"
            )
        with np.errstate(over="ignore", invalid="ignore"):
            stored = array.astype("<f4")
        finite = np.isfinite(stored)
        if not finite.all():
            at = int(np.argmax(~finite))
            raise PosEncError(
                f"tensors[{name!r}] must hold numbers finite in float32 (the tensor's type), "
                f"got {float(array[at])!r} at index {at}"
            )
        out[name] = stored
    return out


def _planned(reader: Any, new: Mapping[str, np.ndarray | None]) -> list[_Tensor]:
    """Every tensor the copy holds, in order: the input's, each of ``new`` replacing (or,
    as None, removing) the one of its name, then the new names (float32)."""
    out: list[_Tensor] = []
    for name, data, kind, shape in _stored(reader):
        if name not in new:
            out.append((name, data, kind, shape))
        elif (replaced := new[name]) is not None:
            out.append((name, replaced, _F32, (int(replaced.size),)))
    held = {t.name for t in reader.tensors}
    out += [(n, d, _F32, (int(d.size),)) for n, d in new.items() if d is not None and n not in held]
    return out


def _open(gguf: Any, path: Path, what: str) -> Any:
    try:
        return gguf.GGUFReader(path)
    except (ValueError, IndexError, KeyError, struct.error) as error:
        message = " ".join(str(error).split())[:200]
        raise PosEncError(
            f"{what} {str(path)!r} is not a GGUF file gguf can read: {message}"
        ) from None


def write_scaled_gguf(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    metadata: Mapping[str, Any],
    *,
    types: Mapping[str, str] | None = None,
    overwrite: bool = False,
    check: Callable[[Path], object] | None = None,
    tensors: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``dst``, a copy of the GGUF file ``src`` with the keys of ``metadata`` set.

    Args:
        src: the GGUF file copied (only read).
        dst: the new file; its folder must exist. Refused when it is ``src`` (or a link or
            hard link of it), and when it exists unless ``overwrite``.
        metadata: GGUF key -> value (added, or replacing the input's; ``None`` removes the
            key). A NumPy scalar keeps its type; a Python value takes the input's type of
            the key, else llama.cpp's (``int``: uint32, ``float``: float32, ``str``, ``bool``);
            what :func:`posenc.integrations.engines.gguf_metadata` returns.
        types: GGUF key -> the ``gguf.GGUFValueType`` name its value is written as
            (``"UINT32"``, ``"FLOAT32"``, ``"STRING"``, ...; the engines' ``GGUF_VALUE_TYPES``,
            llama.cpp's loader checks them), over every rule above.
        overwrite: replace an existing ``dst`` (never ``src``).
        check: called with the written temporary file before it is renamed to ``dst``;
            whatever it raises aborts the copy (nothing is left behind).
        tensors: tensor name -> a 1-D list of numbers, written as float32 (replacing the
            input's tensor of that name in its place, or added last), or ``None``
            (the input's tensor removed).

    Returns:
        ``{"src", "dst"}`` (paths as given), ``"bytes"`` (``dst``'s size), ``"tensors"``
        (their count), ``"tensor_sha256"`` (of every tensor's raw bytes in order: the
        input's, with ``tensors`` applied) and ``"set"`` (each key of ``metadata`` as
        written; ``None``: removed).

    Raises:
        PosEncError: a path as above, ``src`` not a GGUF file gguf reads, a key or value
            GGUF cannot hold, the written tensors differing from the input's.
        OSError: the environment refuses: ``dst``'s folder cannot be written, too little free
            space for a copy of ``src`` (checked before writing), a write fails.
    """
    gguf = _gguf()
    if not isinstance(metadata, Mapping):
        raise PosEncError(f"metadata must be a mapping of GGUF keys, got {type(metadata).__name__}")
    _check_keys(metadata)
    codes = _type_codes(types or {}, gguf)
    new = _new_tensors(tensors)
    source, target = _paths(src, dst, overwrite)
    _check_room(source, target)
    reader = _open(gguf, source, "src")
    arch = reader.fields.get("general.architecture")
    if arch is None:
        raise PosEncError(f"src {str(source)!r} has no general.architecture key")
    _check_namespaces(metadata, reader, str(arch.contents()))
    if reader.endianess == gguf.GGUFEndian.BIG:  # the new tensors in the file's byte order
        new = {k: None if v is None else v.astype(">f4") for k, v in new.items()}
    planned = _planned(reader, new)
    digest, infos = _digest(planned)
    result: dict[str, Any] = {"src": str(src), "dst": str(dst), "tensors": len(infos)}

    def write(file: Any) -> None:
        writer = gguf.GGUFWriter(file.name, arch.contents(), endianess=reader.endianess)
        writer.data_alignment = reader.alignment
        try:
            result["set"] = _copy_fields(reader, writer, metadata, codes, gguf)
            for name, data, kind, _ in planned:
                raw = gguf.GGMLQuantizationType(kind)
                writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, raw)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for _, data, _, _ in planned:  # the raw bytes, never byte-swapped
                writer.write_tensor_data(data, tensor_endianess=reader.endianess)
        finally:
            writer.close()
        written = _open(gguf, Path(file.name), "the written copy of src")
        if _tensor_digest(written) != (digest, infos):
            raise PosEncError(
                f"the GGUF copy of {str(source)!r} does not hold the input's tensor bytes"
            )
        del written
        if check is not None:
            check(Path(file.name))

    try:
        write_atomically(target, write)
    except OSError as error:
        if error.errno in _ENVIRONMENT:
            raise OSError(
                error.errno, f"the GGUF copy cannot be written ({error.strerror})", str(target)
            ) from None
        raise
    result["bytes"] = target.stat().st_size
    result["tensor_sha256"] = digest
    return result
