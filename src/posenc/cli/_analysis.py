"""Options shared by ``posenc plot``, ``posenc inspect`` and ``posenc report``."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Annotated, Any

import torch
import typer

from posenc._errors import PosEncError
from posenc.cli._checks import check_bytes, check_out_dir, check_out_file, integer, text
from posenc.cli.table import parse_positions

__all__ = [
    "MAX_POSITIONS",
    "Params",
    "analysis_bytes",
    "check_analysis_size",
    "check_out_dir",
    "check_out_file",
    "count_option",
    "encoding_config",
    "positions_arg",
]

PARAM_HELP = (
    "Constructor argument of the encoding as KEY=VALUE (repeatable), e.g. --param dim=128 "
    "--param base=500000; VALUE is read as JSON when it parses (numbers, true, [1, 2]), "
    "else as a string."
)

#: The ``--param KEY=VALUE`` option (repeatable) of ``posenc plot`` and ``posenc inspect``.
Params = Annotated[
    list[str] | None, typer.Option("--param", help=PARAM_HELP, callback=text("--param"))
]

#: The most positions (or distances) an analysis command takes.
MAX_POSITIONS = 2**20


def count_option(option: str, help: str, *, min: int) -> Any:
    """A typer option taking a count of positions or distances, ``min`` to
    :data:`MAX_POSITIONS`, checked when it is parsed."""
    return typer.Option(help=help, callback=integer(option, min=min, max=MAX_POSITIONS))


#: --param keys that size a tensor the encoding builds (rows, channels, heads, buckets).
_SIZES = (
    "dim",
    "head_dim",
    "num_heads",
    "max_len",
    "max_distance",
    "num_buckets",
    "max_position_embeddings",
    "original_max_position_embeddings",
)


def _check_value(item: str, value: Any) -> None:
    """JSON numbers must be finite (``NaN``, ``Infinity``, ``1e400``) and fit in int64."""
    if isinstance(value, float) and not math.isfinite(value):
        raise PosEncError(f"--param values must be finite numbers, got {item!r}")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
        raise PosEncError(f"--param integers must fit in 64 bits, got {item!r}")
    if isinstance(value, list):
        for v in value:
            _check_value(item, v)
    if isinstance(value, dict):
        for v in value.values():
            _check_value(item, v)


def encoding_config(name: str, params: Sequence[str] | None) -> dict[str, Any]:
    """``{"name": name, **params}`` from ``KEY=VALUE`` strings."""
    if not isinstance(name, str) or not name.strip():
        raise PosEncError(f"--encoding must name a registered encoding, got {name!r}")
    config: dict[str, Any] = {"name": name}
    for item in params or ():
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key.isidentifier():
            raise PosEncError(f"--param must be KEY=VALUE with a Python name as KEY, got {item!r}")
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            value = text
        _check_value(item, value)
        config[key] = value
    return config


def _size(config: dict[str, Any], keys: Sequence[str], default: int) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


def analysis_bytes(config: dict[str, Any], positions: int, *, max_distance: int = 0) -> int:
    """A generous estimate of what measuring or drawing ``config`` at ``positions``
    positions (and distances up to ``max_distance``) allocates: tables ``[n, d]``, pairwise
    ``[heads, n, n]`` maps and the decay's ``[d, n, d]`` basis, in float64."""
    d = _size(config, ("dim", "head_dim"), 64)
    h = _size(config, ("num_heads",), 8)
    tables = sum(
        _size(config, (k,), 0) for k in _SIZES if k not in ("dim", "head_dim", "num_heads")
    )
    n, k = positions, max_distance
    return 8 * (n * n * (2 + h) + 64 * n * d + 2 * d * d * (k + 1) + tables * max(d, h))


def check_analysis_size(what: str, config: dict[str, Any], positions: int, **kw: int) -> None:
    """Refuse ``what`` when :func:`analysis_bytes` is over the command's limit."""
    check_bytes(what, analysis_bytes(config, positions, **kw))


def positions_arg(spec: str | None) -> torch.Tensor | None:
    """A position tensor from the ``--positions`` syntax of ``posenc table`` (None: default)."""
    if spec is None:
        return None
    values = parse_positions(spec, name="--positions")
    dtype = torch.float64 if any(isinstance(v, float) for v in values) else torch.long
    return torch.tensor(values, dtype=dtype)
