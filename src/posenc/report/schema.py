"""The schema of ``report.json`` and a small validator for it.

``report.json`` holds every number of the report (version :data:`SCHEMA_VERSION`)::

    {
      "schema_version": 2,
      "posenc_version": "0.1.0",
      "created": "2026-01-01T12:00:00+00:00",          # UTC, ISO 8601
      "settings": {"quick", "positions", "shift_positions", "max_distance", "dtype",
                   "analysis_defaults", "dpi"},
      "encodings": [                                    # one per registered encoding,
        {"name", "kind", "config",                      #   registry order
         "summary": {encoding, kind, bounded, max_ratio, first_swamping, unique,
                     min_distance, collisions, shift_residual, offset_only,
                     decay_mid, decay_far},             #   the property-table row
         "properties": {"encoding", "kind", "config",   #   posenc.analysis.Properties
                        "boundedness", "uniqueness", "shift", "decay"},
         "figures": ["table_rope.png", ...],
         "error": null}                                 #   or the message if it failed
      ],
      "demonstrations": {...},                          # posenc.analysis.OrderSensitivity
      "lengthgen": {"status": "ok" | "absent" | "error" | "skipped", "reason",
                    "settings",                         # the study's (with seeds, jobs)
                    "results",                          # run_study's (runs, summary, comparisons)
                    "figure", "headline",               # lengthgen.png, headline.png
                    "ratios": {enc: {len: {mean, min, max}}},   # ppl(n) / ppl(L) per seed
                    "checks": [{"claim", "holds", "detail"}],   # the literature, tested
                    "comparison": {"source", "url", "columns", "rows",
                                   "verdicts", "status",        # Press et al.'s order, over
                                   "sentence"}},                # the seeds; its sentence
      "figures": [{"file", "title", "section", "encoding", "width", "height"}],
      "seconds": {"analysis", "figures", "demonstrations", "lengthgen", "total"}
    }

Numbers that would be infinite or NaN are written as ``null``. :func:`validate_report`
checks a loaded report against :data:`REPORT_SCHEMA` (a JSON Schema subset: ``type``,
``required``, ``properties``, ``additionalProperties``, ``items``, ``enum``, ``minimum``),
each keyword a field rule of ``posenc._fields``, the vocabulary every record's checks use.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from posenc._fields import At, boolean, choice, integer, mapping, number, sequence, string
from posenc.analysis.demonstrations import OrderSensitivity
from posenc.analysis.properties import Boundedness, Uniqueness
from posenc.analysis.relative import Decay, ShiftStructure
from posenc.analysis.summary import SUMMARY_COLUMNS, Properties

__all__ = ["REPORT_SCHEMA", "SCHEMA_VERSION", "validate_report"]

SCHEMA_VERSION = 3  # 2: seeds, a summary, ratios, checks and the comparison; 3: its verdicts

_STR = {"type": "string"}
_NUM = {"type": "number"}
_NUM_NULL = {"type": ["number", "null"]}
_BOOL = {"type": "boolean"}
_OBJ = {"type": "object"}
_NUMBERS = {"type": "array", "items": _NUM_NULL}


def _fields(cls: type, **types: dict[str, Any]) -> dict[str, Any]:
    """An object schema requiring every field of the dataclass ``cls``."""
    names = [f.name for f in dataclasses.fields(cls)]
    return {"type": "object", "required": names, "properties": types}


_SUMMARY = {
    "type": "object",
    "required": [key for key, _, _ in SUMMARY_COLUMNS],
    "additionalProperties": False,
    "properties": {
        "encoding": _STR,
        "kind": {"enum": ["additive", "rotary", "bias", "none"]},
        "bounded": _BOOL,
        "max_ratio": _NUM,
        "first_swamping": _NUM_NULL,
        "unique": _BOOL,
        "min_distance": _NUM,
        "collisions": {"type": "integer", "minimum": 0},
        "shift_residual": _NUM_NULL,
        "offset_only": _BOOL,
        "decay_mid": _NUM,
        "decay_far": _NUM,
    },
}

_PROPERTIES = _fields(
    Properties,
    encoding=_STR,
    kind=_STR,
    config=_OBJ,
    boundedness=_fields(Boundedness, norms=_NUMBERS, positions=_NUMBERS, bounded=_BOOL),
    uniqueness=_fields(
        Uniqueness,
        min_distance=_NUM,
        num_collisions={"type": "integer", "minimum": 0},
        collisions={
            "type": "array",
            "items": {"type": "object", "required": ["a", "b", "distance"]},
        },
        unique=_BOOL,
    ),
    shift=_fields(
        ShiftStructure,
        offsets={"type": "array", "items": {"type": "integer"}},
        dot_spreads=_NUMBERS,
        dot_depends_only_on_offset=_BOOL,
    ),
    decay=_fields(Decay, distances=_NUMBERS, similarity=_NUMBERS),
)

_ENCODING = {
    "type": "object",
    "required": ["name", "kind", "config", "summary", "properties", "figures", "error"],
    "additionalProperties": False,
    "properties": {
        "name": _STR,
        "kind": {"enum": ["additive", "rotary", "bias", "none", None]},
        "config": {"type": ["object", "null"]},
        "summary": {
            "type": ["object", "null"],
            **{k: v for k, v in _SUMMARY.items() if k != "type"},
        },
        "properties": {
            "type": ["object", "null"],
            **{k: v for k, v in _PROPERTIES.items() if k != "type"},
        },
        "figures": {"type": "array", "items": _STR},
        "error": {"type": ["string", "null"]},
    },
}

_FIGURE = {
    "type": "object",
    "required": ["file", "title", "section", "encoding", "width", "height"],
    "properties": {
        "file": _STR,
        "title": _STR,
        "section": {"enum": ["answer", "encodings", "decay", "lengthgen"]},
        "encoding": {"type": ["string", "null"]},
        "width": {"type": "integer", "minimum": 1},
        "height": {"type": "integer", "minimum": 1},
    },
}

_CHECK = {
    "type": "object",
    "required": ["claim", "holds", "detail"],
    "additionalProperties": False,
    "properties": {"claim": _STR, "holds": _BOOL, "detail": _STR},
}

REPORT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [
        "schema_version",
        "posenc_version",
        "created",
        "settings",
        "encodings",
        "demonstrations",
        "lengthgen",
        "figures",
        "seconds",
    ],
    "additionalProperties": False,
    "properties": {
        "schema_version": {"enum": [SCHEMA_VERSION]},
        "posenc_version": _STR,
        "created": _STR,
        "settings": {
            "type": "object",
            "required": [
                "quick",
                "positions",
                "shift_positions",
                "max_distance",
                "dtype",
                "analysis_defaults",
                "dpi",
            ],
            "properties": {
                "quick": _BOOL,
                "positions": {"type": "integer", "minimum": 2},
                "shift_positions": {"type": "integer", "minimum": 2},
                "max_distance": {"type": "integer", "minimum": 1},
                "dtype": _STR,
                "analysis_defaults": _OBJ,
                "dpi": {"type": "integer", "minimum": 10},
            },
        },
        "encodings": {"type": "array", "items": _ENCODING},
        "demonstrations": _fields(OrderSensitivity, sentences={"type": "array", "items": _STR}),
        "lengthgen": {
            "type": "object",
            "required": [
                "status",
                "reason",
                "settings",
                "results",
                "figure",
                "headline",
                "ratios",
                "checks",
                "comparison",
            ],
            "additionalProperties": False,
            "properties": {
                "status": {"enum": ["ok", "absent", "error", "skipped"]},
                "reason": {"type": ["string", "null"]},
                "settings": {"type": ["object", "null"]},
                "results": {"type": ["object", "null"]},
                "figure": {"type": ["string", "null"]},
                "headline": {"type": ["string", "null"]},
                "ratios": {"type": ["object", "null"]},
                "checks": {"type": ["array", "null"], "items": _CHECK},
                "comparison": {"type": ["object", "null"]},
            },
        },
        "figures": {"type": "array", "items": _FIGURE},
        "seconds": {
            "type": "object",
            "required": ["analysis", "figures", "demonstrations", "lengthgen", "total"],
            "properties": {
                k: _NUM for k in ("analysis", "figures", "demonstrations", "lengthgen", "total")
            },
        },
    },
}


def _object(at: At, value: Any, schema: dict[str, Any]) -> None:
    props = schema.get("properties", {})
    closed = schema.get("additionalProperties") is False
    mapping(at, value, required=schema.get("required", ()), allowed=props if closed else None)
    for key, sub in props.items():
        if key in value:
            _check(value[key], sub, at[key])


def _array(at: At, value: Any, schema: dict[str, Any]) -> None:
    sequence(at, value)
    if "items" in schema:
        for i, item in enumerate(value):
            _check(item, schema["items"], at[i])


# Each JSON type of the schema as a rule of posenc._fields (with its ``minimum``).
_RULES: dict[str, Callable[[At, Any, dict[str, Any]], Any]] = {
    "object": _object,
    "array": _array,
    "string": lambda at, value, schema: string(at, value),
    "integer": lambda at, value, schema: integer(at, value, schema.get("minimum")),
    "number": lambda at, value, schema: number(
        at, value, schema.get("minimum", -math.inf), finite=False
    ),
    "boolean": lambda at, value, schema: boolean(at, value),
}


def _check(value: Any, schema: dict[str, Any], at: At) -> None:
    """``value`` held to ``schema``: its ``type`` (one JSON type, or one and ``"null"``)
    through :data:`_RULES`, its ``enum`` through :func:`posenc._fields.choice`."""
    types = schema.get("type", ())
    names = [types] if isinstance(types, str) else list(types)
    if value is None and "null" in names:
        return
    if "enum" in schema:
        choice(at, value, schema["enum"])
    for name in names:
        if name != "null":
            _RULES[name](at, value, schema)


def validate_report(data: Any) -> None:
    """Raise :class:`PosEncError` naming the first place ``data`` breaks :data:`REPORT_SCHEMA`.

    Examples:
        >>> from posenc.report import validate_report
        >>> validate_report({"schema_version": 1})
        Traceback (most recent call last):
        ...
        posenc._errors.PosEncError: report field posenc_version must be present (a key of report), got 'absent'
    """
    _check(data, REPORT_SCHEMA, At("report"))
