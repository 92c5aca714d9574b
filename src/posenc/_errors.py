"""The one exception type users catch, and the checks that raise it.

Every public callable validates its input with the ``check_*`` helpers below so
that messages have one shape: the parameter, the rule, and the value,
e.g. ``dim must be even for layout='half', got 7``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

__all__ = [
    "PosEncError",
    "check_choice",
    "check_dtype",
    "check_embeddings",
    "check_finite",
    "check_float",
    "check_int",
    "check_last_dim",
    "check_positions",
    "check_tensor",
    "check_traced",
    "tracing",
]


class PosEncError(ValueError):
    """Bad input to a posenc function: names the parameter, the rule and the value."""


def tracing() -> bool:
    """Whether this code is being traced by ``torch.compile`` or ``torch.export``: then
    sizes may be symbolic and tensor values unknown, so checks take the forms below."""
    return torch.compiler.is_compiling()


def check_traced(cond: torch.Tensor, message: str) -> None:
    """A data-dependent check in traced code: a runtime assertion in the graph that raises
    ``RuntimeError(message)`` when ``cond`` holds a False (no graph break, no host sync at
    trace time; on CUDA a device-side assertion). Eager code raises ``PosEncError`` instead."""
    torch._assert_async(cond.all(), message)


def _symbolic_int(value: Any) -> bool:
    """Whether ``value`` is a size being traced: a ``torch.SymInt`` (``torch.export``), or
    any ``int`` under ``torch.compile`` (Dynamo shows a SymInt as an ``int``; ``int()`` of
    it would specialize the graph to one length)."""
    if isinstance(value, torch.SymInt):
        return True
    return tracing() and isinstance(value, int) and not isinstance(value, bool)


def check_int(name: str, value: Any, *, min: int | None = None, max: int | None = None) -> int:
    """Return ``value`` as an ``int`` if it is an integer within ``[min, max]``.

    A symbolic size (``torch.SymInt``, under ``torch.compile`` or ``torch.export``) is
    returned as it is, its bounds checked with ``torch._check`` (a guard or a runtime
    assertion, never a graph break)."""
    if _symbolic_int(value):
        if min is not None:
            low = f"{name} must be >= {min}"
            torch._check(value >= min, lambda: low)
        if max is not None:
            high = f"{name} must be <= {max}"
            torch._check(value <= max, lambda: high)
        return value
    if isinstance(value, (bool, float)) or not hasattr(value, "__index__"):
        raise PosEncError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if min is not None and value < min:
        raise PosEncError(f"{name} must be >= {min}, got {value}")
    if max is not None and value > max:
        raise PosEncError(f"{name} must be <= {max}, got {value}")
    return value


def check_float(
    name: str,
    value: Any,
    *,
    min: float | None = None,
    max: float | None = None,
    min_exclusive: bool = False,
) -> float:
    """Return ``value`` as a finite ``float`` within the given bounds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PosEncError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not -math.inf < value < math.inf:  # math.isfinite, in a form Dynamo traces
        raise PosEncError(f"{name} must be finite, got {value}")
    if min is not None:
        if min_exclusive and value <= min:
            raise PosEncError(f"{name} must be > {min}, got {value}")
        if not min_exclusive and value < min:
            raise PosEncError(f"{name} must be >= {min}, got {value}")
    if max is not None and value > max:
        raise PosEncError(f"{name} must be <= {max}, got {value}")
    return value


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """Return ``value`` if it is one of ``choices``; the error lists the choices."""
    choices = tuple(choices)
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise PosEncError(f"{name} must be one of {listed}, got {value!r}")
    return value


def check_tensor(name: str, value: Any, *, floating: bool | None = None) -> torch.Tensor:
    """Return ``value`` if it is a tensor (floating point when ``floating=True``)."""
    if not isinstance(value, torch.Tensor):
        raise PosEncError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if floating is True and not value.is_floating_point():
        raise PosEncError(f"{name} must have a floating-point dtype, got {value.dtype}")
    return value


def check_dtype(name: str, value: Any, *, floating: bool = True) -> torch.dtype:
    """Return ``value`` if it is a ``torch.dtype`` (a floating one when ``floating=True``)."""
    if not isinstance(value, torch.dtype):
        raise PosEncError(f"{name} must be a torch.dtype, got {value!r}")
    if floating and not value.is_floating_point:
        raise PosEncError(f"{name} must be a floating-point dtype, got {value}")
    return value


def check_last_dim(name: str, value: torch.Tensor, dim: int) -> None:
    """Raise unless the last dimension of ``value`` is ``dim``."""
    if value.ndim == 0 or value.shape[-1] != dim:
        raise PosEncError(f"{name} must have last dimension {dim}, got shape {tuple(value.shape)}")


def check_finite(name: str, value: torch.Tensor) -> None:
    """Raise if a floating tensor holds NaN or +-inf.

    This needs one host synchronisation on CUDA; callers use it for
    user-provided positions only, never for activations. Under ``torch.compile`` /
    ``torch.export`` it is a runtime assertion in the graph (:func:`check_traced`).
    """
    if tracing():
        if value.is_floating_point():
            check_traced(torch.isfinite(value), f"{name} must be finite, got NaN or inf")
        return
    if value.is_floating_point() and value.numel() and not bool(torch.isfinite(value).all()):
        raise PosEncError(f"{name} must be finite, got a tensor containing NaN or inf")


def check_positions(
    name: str,
    positions: Any,
    *,
    seq_len: int | None = None,
    batch: int | None = None,
    ndims: Sequence[int] | None = (1, 2),
) -> torch.Tensor:
    """Validate a position tensor of shape ``[s]`` or ``[b, s]`` (``ndims`` allowed ranks;
    ``None``: any shape, as for tables at arbitrary positions).

    ``seq_len`` and ``batch``, when given, must match the last and (for 2-D)
    first dimension. Integer and floating positions are accepted; floating
    ones must be finite. Returns the tensor unchanged.
    """
    if not isinstance(positions, torch.Tensor):
        raise PosEncError(f"{name} must be a torch.Tensor, got {type(positions).__name__}")
    if positions.dtype == torch.bool or positions.is_complex():
        raise PosEncError(f"{name} must be an integer or floating tensor, got {positions.dtype}")
    if ndims is not None and positions.ndim not in tuple(ndims):
        shapes = " or ".join({1: "[s]", 2: "[b, s]"}.get(n, f"{n}-D") for n in ndims)
        raise PosEncError(f"{name} must be {shapes}, got shape {tuple(positions.shape)}")
    if seq_len is not None and positions.shape[-1] != seq_len:
        raise PosEncError(
            f"{name} must have length {seq_len} (the sequence length) in its last "
            f"dimension, got shape {tuple(positions.shape)}"
        )
    if batch is not None and positions.ndim == 2 and positions.shape[0] not in (1, batch):
        raise PosEncError(
            f"{name} of shape [b, s] must have b == {batch} (the batch size) or 1, "
            f"got shape {tuple(positions.shape)}"
        )
    check_finite(name, positions)
    return positions


def check_embeddings(x: Any, dim: int) -> torch.Tensor:
    """Validate the input of an additive encoding: a floating tensor ``[b, s, dim]``."""
    check_tensor("x", x, floating=True)
    if x.ndim != 3:
        raise PosEncError(f"x must be [b, s, dim], got shape {tuple(x.shape)}")
    check_last_dim("x", x, dim)
    return x
