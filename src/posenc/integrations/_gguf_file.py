"""Reading a GGUF file's header: its metadata and where its tensors are, nothing else.

A GGUF file (llama.cpp's format, versions 2 and 3) is a header followed by the tensor data:
the magic ``b"GGUF"``, the version, the tensor and key counts, the key-value metadata, then
one entry per tensor (name, shape, type, offset into the data section). :func:`open_gguf`
reads that header from a memory map: string arrays (a tokenizer's hundreds of thousands of
tokens) are skipped, not decoded, and no tensor byte is read until :meth:`GGUFSource.tensor`
asks for one small tensor (``rope_freqs.weight``, ``rope_factors_long.weight``).

It is posenc's one GGUF reader: ``gguf.GGUFReader`` builds an object per token, seconds for
SmolLM2-135M where this reader takes milliseconds (``benchmarks/gguf_read.py``). A path needs
no ``gguf`` package; a ``gguf.GGUFReader`` the caller already holds is read by the same parser
from the reader's own memory map of its file. Every failure is a one-line
:class:`posenc.PosEncError` naming the file.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np

from posenc._errors import PosEncError

__all__ = ["GGUFSource", "Skipped", "open_gguf"]

_MAGIC = b"GGUF"
# GGUF value types: code -> (struct format, size); 8 is a string, 9 an array.
_SCALARS = {
    0: ("B", 1),
    1: ("b", 1),
    2: ("H", 2),
    3: ("h", 2),
    4: ("I", 4),
    5: ("i", 4),
    6: ("f", 4),
    7: ("?", 1),
    10: ("Q", 8),
    11: ("q", 8),
    12: ("d", 8),
}
_STRING, _ARRAY = 8, 9
_STRUCTS: dict[str, struct.Struct] = {}  # compiled formats, by byte order + format
_KEPT_ARRAY = 4096  # longer numeric arrays (tokenizer scores) are skipped, not copied
# ggml tensor types this reader turns into numbers: code -> numpy dtype.
_FLOAT_TENSORS = {0: np.float32, 1: np.float16}


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A metadata array left unread: ``count`` values of GGUF type ``kind``."""

    kind: str
    count: int

    def __repr__(self) -> str:
        return f"<{self.count} {self.kind} values, not read>"


@dataclasses.dataclass(frozen=True)
class _Tensor:
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # from the start of the file


class GGUFSource:
    """The metadata of a GGUF file and its tensors on demand.

    Attributes:
        name: the file's path (quoted), or ``"the GGUFReader"`` (for error messages).
        metadata: every key's value (strings decoded, numbers as Python numbers, short
            numeric arrays as lists, long and string arrays as :class:`Skipped`).
    """

    def __init__(
        self,
        name: str,
        metadata: dict[str, Any],
        tensor_names: set[str],
        read: Callable[[str], np.ndarray],
    ) -> None:
        self.name = name
        self.metadata = metadata
        self._tensor_names = tensor_names
        self._read = read

    def get(self, key: str) -> Any:
        return self.metadata.get(key)

    def has_tensor(self, name: str) -> bool:
        return name in self._tensor_names

    def tensor(self, name: str) -> np.ndarray | None:
        """The float64 values of tensor ``name`` (flattened), or None if the file has none."""
        if name not in self._tensor_names:
            return None
        return np.asarray(self._read(name), dtype=np.float64).reshape(-1)


def open_gguf(path_or_reader: Any) -> GGUFSource:
    """A :class:`GGUFSource` of a path (``str`` or ``os.PathLike``) or a ``gguf.GGUFReader``.

    Raises:
        PosEncError: not a path nor a reader, a missing file, a file that is not GGUF
            (its first bytes named), an unsupported version, or a header that ends early
            or does not parse (truncated or corrupt).
    """
    if isinstance(path_or_reader, (str, os.PathLike)):
        return _from_path(Path(path_or_reader))
    data = getattr(path_or_reader, "data", None)
    if (
        hasattr(path_or_reader, "fields")
        and isinstance(data, np.ndarray)
        and data.dtype == np.uint8
        and data.ndim == 1
        and data.flags.c_contiguous
    ):  # a gguf.GGUFReader: its memory map of the file (an np.memmap of bytes), read here too
        return _source("the GGUFReader", data.data)
    raise PosEncError(
        f"path_or_reader must be a path to a GGUF file or a gguf.GGUFReader, got "
        f"{type(path_or_reader).__name__}"
    )


def _from_path(path: Path) -> GGUFSource:
    label = repr(str(path))
    if not path.is_file():
        raise PosEncError(f"path_or_reader must be an existing GGUF file, got {str(path)!r}")
    try:
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < 24:
                head = handle.read(4)
                if head != _MAGIC:
                    raise _not_gguf(label, head)
                raise PosEncError(f"{label} cannot be read: it ends inside its header")
            view = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise PosEncError(f"{label} cannot be read ({e.strerror or e})") from None
    return _source(label, view)


def _source(label: str, view: mmap.mmap | memoryview) -> GGUFSource:
    """The :class:`GGUFSource` of the bytes of a whole GGUF file (a memory map of it)."""
    header = _Header(view, label)
    try:
        metadata, tensors = header.parse()
    except PosEncError:
        raise
    except (struct.error, IndexError, ValueError, OverflowError):
        raise PosEncError(
            f"{label} cannot be read: its header ends early or does not parse "
            f"(truncated or corrupt at byte {header.pos})"
        ) from None

    def read(name: str) -> np.ndarray:
        info = tensors[name]
        if info.ggml_type not in _FLOAT_TENSORS:
            raise PosEncError(
                f"{label}: tensor {name!r} has ggml type {info.ggml_type}; posenc reads "
                f"F32 or F16 RoPE tensors only (llama.cpp's converter writes F32)"
            )
        dtype = np.dtype(_FLOAT_TENSORS[info.ggml_type]).newbyteorder(header.order)
        count = int(np.prod(info.shape)) if info.shape else 1
        if info.offset + count * dtype.itemsize > len(view):
            raise PosEncError(f"{label} cannot be read: tensor {name!r} ends past the file")
        return np.frombuffer(view, dtype=dtype, count=count, offset=info.offset).copy()

    return GGUFSource(label, metadata, set(tensors), read)


def _not_gguf(label: str, head: bytes) -> PosEncError:
    return PosEncError(
        f"{label} is not a GGUF file: it starts with {head[:4]!r}, a GGUF file with {_MAGIC!r}"
    )


class _Header:
    """The sequential parse of a GGUF header from a memory map (little- or big-endian)."""

    def __init__(self, view: mmap.mmap | memoryview, name: str) -> None:
        self.view, self.name, self.pos = view, name, 0
        self.order: Literal["<", ">"] = "<"

    def parse(self) -> tuple[dict[str, Any], dict[str, _Tensor]]:
        magic = bytes(self.view[:4])
        if magic != _MAGIC:
            raise _not_gguf(self.name, magic)
        self.pos = 4
        version = self._scalar("I")
        if version > 0xFFFF:  # written big-endian: the bytes of a small number, swapped
            self.order, self.pos = ">", 4
            version = self._scalar("I")
        if version not in (2, 3):
            raise PosEncError(
                f"{self.name} is GGUF version {version}; posenc reads versions 2 and 3"
            )
        n_tensors, n_keys = self._scalar("Q"), self._scalar("Q")
        if max(n_tensors, n_keys) > len(self.view):
            raise ValueError("counts larger than the file")
        metadata = {}
        for _ in range(n_keys):
            key = self._string()
            metadata[key] = self._value(self._scalar("I"))
        infos = [self._tensor_info() for _ in range(n_tensors)]
        alignment = metadata.get("general.alignment", 32)
        if not isinstance(alignment, int) or alignment < 1:
            raise ValueError("bad alignment")
        start = -(-self.pos // alignment) * alignment
        tensors = {
            name: _Tensor(shape, kind, start + offset) for name, shape, kind, offset in infos
        }
        return metadata, tensors

    def _scalar(self, fmt: str) -> Any:
        packed = _STRUCTS.get(self.order + fmt) or _STRUCTS.setdefault(
            self.order + fmt, struct.Struct(self.order + fmt)
        )
        (value,) = packed.unpack_from(self.view, self.pos)
        self.pos += packed.size
        return value

    def _string(self) -> str:
        length = self._scalar("Q")
        end = self.pos + length
        if end > len(self.view):
            raise ValueError("string past the end")
        text = bytes(self.view[self.pos : end]).decode("utf-8", errors="replace")
        self.pos = end
        return text

    def _value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self._scalar(_SCALARS[kind][0])
        if kind == _STRING:
            return self._string()
        if kind != _ARRAY:
            raise ValueError(f"unknown value type {kind}")
        item, count = self._scalar("I"), self._scalar("Q")
        if item == _STRING:
            for _ in range(count):  # skipped: a tokenizer's vocabulary is never needed
                self.pos += 8 + self._scalar("Q")
            return Skipped("string", count)
        if item not in _SCALARS:
            raise ValueError(f"unknown array type {item}")
        fmt, size = _SCALARS[item]
        if self.pos + count * size > len(self.view):
            raise ValueError("array past the end")
        if count > _KEPT_ARRAY:
            self.pos += count * size
            return Skipped(np.dtype(self.order + fmt).name, count)
        values = list(struct.unpack_from(f"{self.order}{count}{fmt}", self.view, self.pos))
        self.pos += count * size
        return values

    def _tensor_info(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self._string()
        n_dims = self._scalar("I")
        if n_dims > 8:
            raise ValueError("too many dimensions")
        shape = tuple(self._scalar("Q") for _ in range(n_dims))
        return name, shape, self._scalar("I"), self._scalar("Q")
