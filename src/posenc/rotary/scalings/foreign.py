"""The one door through which a scaling spelled by another library enters the rotary room.

The rotary room reads posenc's spelling only (:func:`posenc.rotary.frequencies.parse_scaling`).
Another library's spelling (transformers' ``rope_scaling`` / ``rope_parameters``) is known
to :mod:`posenc.integrations` alone, which installs a *reader* here with
:func:`set_foreign_reader` when it is imported (the package's import hook imports it with ``posenc.rotary``). A rotary module
hands every scaling dict to :func:`read_foreign` first: the reader answers ``None`` for a
dict that is not in its spelling, or the dict in posenc's spelling, having checked the keys
that repeat one of the module's own arguments (:class:`Given`). With no reader installed,
every dict goes to ``parse_scaling`` as it is, which refuses a foreign key by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["ForeignReader", "Given", "read_foreign", "set_foreign_reader"]


@dataclasses.dataclass(frozen=True)
class Given:
    """What a rotary module or function was given, that a foreign scaling dict may repeat
    (``None``: the caller has no such argument, so the dict may not hold it).

    Attributes:
        call: the caller's name, for the messages (``"RotaryEmbedding"``).
        base: its ``base``.
        head_dim, rotary_dim: its head dim and rotated channels.
        sections: its M-RoPE sections (``None``: none).
        section_layout: its M-RoPE section layout.
    """

    call: str
    base: float
    head_dim: int | None = None
    rotary_dim: int | None = None
    sections: Sequence[int] | None = None
    section_layout: str | None = None


#: ``(spec, given) -> spec in posenc's spelling``, or ``None`` when ``spec`` is not in the
#: reader's spelling; raises :class:`posenc.PosEncError` for a dict in its spelling that it
#: refuses.
ForeignReader = Callable[[Mapping[str, Any], Given], "dict[str, Any] | None"]

_reader: list[ForeignReader | None] = [None]


def set_foreign_reader(reader: ForeignReader | None) -> ForeignReader | None:
    """Install ``reader`` (``None``: none) as the one foreign reader; returns the previous
    one, so that a caller can put it back."""
    previous, _reader[0] = _reader[0], reader
    return previous


def read_foreign(spec: Any, given: Given) -> dict[str, Any] | None:
    """``spec`` in posenc's spelling when it is a dict in the installed reader's spelling;
    ``None`` for anything else (posenc's spelling, a dataclass, ``None``, no reader)."""
    reader = _reader[0]
    if reader is None or not isinstance(spec, Mapping):
        return None
    return reader(spec, given)
