"""The RoPE values a transformers config gives, checked under the config's own names.

A config is data (a ``config.json`` from anywhere), and an error about one of its values
names the key as the config spells it and where it sits (GPT-J's ``n_positions``, not
``max_position_embeddings``; ``rope_scaling.original_max_position_embeddings`` where the dict
calls its RoPE parameters ``rope_scaling``; ``mrope_section``, not posenc's ``sections``),
before the value reaches posenc's own checks, which name posenc's arguments. ``src`` is that
place of the RoPE parameters (:meth:`~._hf_reader.ConfigReader.rope_key`).
:mod:`._hf_config` reads a config through these: :func:`rope_type`, :func:`check_contexts`
and :func:`sections`.
"""

from __future__ import annotations

from typing import Any

from posenc._errors import PosEncError, check_choice, check_int
from posenc.integrations import _hf_families as _families
from posenc.integrations._hf_reader import ConfigReader, first
from posenc.integrations._hf_sizes import CONTEXT_KEYS, check_context
from posenc.integrations.spelling import TYPE_ALIASES
from posenc.rotary.apply import SectionLayout
from posenc.rotary.scalings._registry import SCALINGS

__all__ = ["check_contexts", "rope_type", "sections"]

_REQUIRED = {"yarn": ("factor",)}  # keys transformers' rope functions index (a KeyError there)


def rope_type(rope: dict[str, Any], src: str) -> str:
    """The rope type of RoPE parameters ``rope`` (kept at ``src``): ``rope_type`` wins over
    ``type``, ``"default"`` when neither; Qwen2-VL's legacy ``"mrope"`` is ``"default"`` (with
    sections) and ``"su"`` LongRoPE. A type no scaling has, or no string, is refused naming
    the key as ``rope`` spells it; so is a missing key transformers' function for the type
    indexes (yarn's ``factor``)."""
    key = "rope_type" if rope.get("rope_type") is not None else "type"
    kind = first(rope.get("rope_type"), rope.get("type"), "default")
    if not isinstance(kind, str):
        raise PosEncError(f"{src}.{key} must be a string (a rope type), got {kind!r}")
    if kind == "mrope":  # Qwen2-VL's legacy spelling of default RoPE with sections
        kind = "default"
    check_choice(f"{src}.{key}", TYPE_ALIASES.get(kind, kind), ("default", *SCALINGS))
    missing = [k for k in _REQUIRED.get(kind, ()) if k not in rope]
    if missing:
        raise PosEncError(
            f"rope type {kind!r} requires the key(s) {missing} in {src} (transformers raises "
            f"KeyError), got keys {sorted(rope)}"
        )
    return kind


def check_contexts(cfg: ConfigReader, rope: dict[str, Any], src: str, rotary_dim: int) -> None:
    """Every context length the config sets (``max_position_embeddings`` or its alias,
    ``original_max_position_embeddings``, at the top level and in ``rope``): an integer >= 1
    and within :data:`._hf_sizes.MAX_CONTEXT` (:func:`._hf_sizes.check_context`)."""
    for key in CONTEXT_KEYS:
        check_context(cfg.where(key), cfg.get_or_default(key), rotary_dim)
        check_context(f"{src}.{key}", rope.get(key), rotary_dim)


def sections(
    cfg: ConfigReader, rope: dict[str, Any], src: str, model_type: str, rotary_dim: int
) -> tuple[list[int] | None, SectionLayout]:
    """M-RoPE's ``(sections, section_layout)`` (``(None, "contiguous")``: none), in posenc's
    spelling: sections in the positions' axis order. The config's ``mrope_section`` (in
    ``rope``, else at the top level; else the family's default) must be a list of integers
    >= 1 summing to ``rotary_dim / 2`` (interleaved M-RoPE: two or more of them)."""
    equal = _families.MROPE_EQUAL_SECTIONS.get(model_type)
    if equal is not None:  # NeoMME: the frequencies split equally among its axes
        half = rotary_dim // 2
        if half % equal:
            raise PosEncError(
                f"the rotary dim {rotary_dim} must be a multiple of {2 * equal} (its "
                f"{half} frequencies split equally among {equal} axes)"
            )
        return [half // equal] * equal, "interleaved"
    default = _families.MROPE_DEFAULT_SECTIONS.get(model_type)
    if rope.get("mrope_section") is not None:
        where, given = f"{src}.mrope_section", rope["mrope_section"]
    elif cfg.get("mrope_section") is not None:
        where, given = cfg.where("mrope_section"), cfg.get("mrope_section")
    elif default is not None:
        where, given = f"mrope_section (the {model_type!r} default)", default
    else:
        return None, "contiguous"
    interleaved = model_type in _families.MROPE_INTERLEAVED
    values = _checked(where, given, rotary_dim // 2, interleaved)
    if model_type in _families.MROPE_SPATIAL_INTERLEAVED:
        if len(values) != 3:
            raise PosEncError(f"{where} must be 3 sizes (H, W, T), got {values!r}")
        return [values[2], values[0], values[1]], "spatial_interleaved"  # (T, H, W)
    return values, "interleaved" if interleaved else "contiguous"


def _checked(where: str, given: Any, half: int, interleaved: bool) -> list[int]:
    """``given`` as M-RoPE's sizes per axis: a list (or tuple) of integers >= 1, summing to
    ``half`` (interleaved: two or more, any sum)."""
    if not isinstance(given, (list, tuple)):
        raise PosEncError(
            f"{where} must be a list of integers (the rotary frequencies of each position "
            f"axis), got {type(given).__name__} {given!r}"
        )
    values = [check_int(f"{where}[{i}]", n, min=1) for i, n in enumerate(given)]
    if interleaved:
        if len(values) < 2:
            raise PosEncError(f"{where} must hold two or more axes, got {values}")
    elif sum(values) != half:
        raise PosEncError(
            f"{where} must sum to rotary_dim / 2 = {half} (the rotary frequencies), got "
            f"{values} (sum {sum(values)})"
        )
    return values
