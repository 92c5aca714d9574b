"""Base of the analysis results: small frozen dataclasses that turn into JSON."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

__all__ = ["Result", "jsonable"]


def jsonable(value: Any) -> Any:
    """``value`` with tuples, dataclasses, tensors and dtypes turned into JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, torch.Tensor):
        return jsonable(value.tolist())
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no inf / NaN
    return value


@dataclasses.dataclass(frozen=True)
class Result:
    """A frozen dataclass with :meth:`to_dict` (JSON-serialisable, nested)."""

    def to_dict(self) -> dict[str, Any]:
        return jsonable(self)
