"""The one exception type users catch, and the checks that raise it.

Every public callable validates its input with the ``check_*`` helpers below so
that messages have one shape: the parameter, the rule, and the value,
e.g. ``dim must be even for layout='half', got 7``.

Without torch (a NumPy-only install, for :mod:`posenc.reference` and :mod:`posenc.conformance`)
this module imports all the same: the checks of plain and NumPy values (``check_int``,
``check_float``, ``check_bool``, ``check_choice``, ``describe``) work as ever, and the checks of
tensors, devices and torch dtypes are never reached (the rooms that call them need torch).
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable, Sequence
from typing import Any

try:
    import torch
except ModuleNotFoundError as _missing:  # NumPy only: no value is a tensor, nothing is traced
    if _missing.name != "torch":
        raise
    torch = None  # type: ignore[assignment]

_TORCH = torch is not None

__all__ = [
    "MAX_ALLOC_BYTES",
    "PosEncError",
    "check_alloc",
    "check_bool",
    "check_choice",
    "check_device",
    "check_dtype",
    "check_embeddings",
    "check_factory",
    "check_finite",
    "check_float",
    "check_int",
    "check_last_dim",
    "check_positions",
    "check_qkv",
    "check_same_device",
    "check_scale",
    "check_tensor",
    "check_traced",
    "describe",
    "tracing",
    "transformed",
]


class PosEncError(ValueError):
    """Bad input to a posenc function: names the parameter, the rule and the value."""


# The most one tensor posenc builds may take (1 TiB), whatever the device; a device's own
# memory lowers it (:func:`check_alloc`). ``POSENC_MAX_ALLOC_BYTES`` lowers or raises it.
MAX_ALLOC_BYTES = 1 << 40

_INT64 = 1 << 63


def describe(value: Any) -> str:
    """``value`` as an error message shows it: a tensor (or an array of >= 1 dimension) by
    its shape and dtype, never its values (there may be many, on a device); anything else,
    a NumPy scalar included, by ``repr``."""
    if _TORCH and isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if isinstance(shape, tuple) and shape and dtype is not None:
        return f"an array of shape {shape} and dtype {dtype}"
    return repr(value)


def tracing() -> bool:
    """Whether this code is being traced by ``torch.compile`` or ``torch.export``: then
    sizes may be symbolic and tensor values unknown, so checks take the forms below."""
    return _TORCH and torch.compiler.is_compiling()


_FUNCTORCH = getattr(torch._C, "_functorch", None) if _TORCH else None
_WRAPPED = getattr(_FUNCTORCH, "is_functorch_wrapped_tensor", None)


def transformed(*tensors: torch.Tensor | None) -> bool:
    """Whether a tensor is a ``torch.func`` transform's wrapper (``vmap``'s batched tensors,
    ``grad``'s): it has no storage a native loop could read, so the plain torch operations,
    which the transforms see through, must compute it. False while tracing (a trace's
    tensors are fake, never wrapped)."""
    if _WRAPPED is None or torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    return any(t is not None and _WRAPPED(t) for t in tensors)


def check_traced(cond: torch.Tensor, message: str) -> None:
    """A data-dependent check in traced code: a runtime assertion in the graph that raises
    ``RuntimeError(message)`` when ``cond`` holds a False (no graph break, no host sync at
    trace time; on CUDA a device-side assertion). Eager code raises ``PosEncError`` instead."""
    torch._assert_async(cond.all(), message)


def _symbolic_int(value: Any) -> bool:
    """Whether ``value`` is a size being traced: a ``torch.SymInt`` (``torch.export``), or
    any ``int`` under ``torch.compile`` (Dynamo shows a SymInt as an ``int``; ``int()`` of
    it would specialize the graph to one length)."""
    if _TORCH and isinstance(value, torch.SymInt):
        return True
    return tracing() and isinstance(value, int) and not isinstance(value, bool)


def _not_int(value: Any) -> bool:
    """A tensor or array that ``int()`` would take but is no integer: more than one
    dimension's worth of shape (``tensor([8])``), or a bool, floating or complex dtype
    (``int(tensor([8.5]))`` is 8)."""
    if getattr(value, "ndim", 0) != 0:
        return True
    dtype = getattr(value, "dtype", None)
    if _TORCH and isinstance(dtype, torch.dtype):
        return dtype.is_floating_point or dtype.is_complex or dtype == torch.bool
    kind = getattr(dtype, "kind", "i")  # NumPy: i (signed), u (unsigned), b, f, c, ...
    return kind not in ("i", "u")


def check_int(name: str, value: Any, *, min: int | None = None, max: int | None = None) -> int:
    """Return ``value`` as an ``int`` if it is an integer within ``[min, max]``.

    A symbolic size (``torch.SymInt``, under ``torch.compile`` or ``torch.export``) is
    returned as it is, its bounds checked with ``torch._check`` (a guard or a runtime
    assertion, never a graph break)."""
    if type(value) is int and not tracing():  # the common case, first (hot paths)
        if (
            (min is None or value >= min)
            and (max is None or value <= max)
            and -_INT64 <= value < _INT64
        ):
            return value
    if _symbolic_int(value):
        if min is not None:
            low = f"{name} must be >= {min}"
            torch._check(value >= min, lambda: low)
        if max is not None:
            high = f"{name} must be <= {max}"
            torch._check(value <= max, lambda: high)
        return value
    if isinstance(value, (bool, float)) or not hasattr(value, "__index__") or _not_int(value):
        raise PosEncError(f"{name} must be an integer, got {describe(value)}")
    try:
        value = int(value.__index__())
    except (TypeError, ValueError, RuntimeError):  # e.g. a 0-d float array
        raise PosEncError(f"{name} must be an integer, got {describe(value)}") from None
    if not -_INT64 <= value < _INT64:
        raise PosEncError(f"{name} must fit in a 64-bit integer, got {value}")
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
    """Return ``value`` as a finite ``float`` within the given bounds (a Python or NumPy
    real number; never a bool, a string or a tensor)."""
    if isinstance(value, bool) or _numpy_bool(value) or not isinstance(value, numbers.Real):
        raise PosEncError(f"{name} must be a number, got {describe(value)}")
    try:
        value = float(value)
    except OverflowError as e:  # an int past the float range
        raise PosEncError(
            f"{name} must be finite, got an integer of {len(str(abs(int(value))))} digits"
        ) from e
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


def _numpy_bool(value: Any) -> bool:
    """Whether ``value`` is NumPy's bool (``numpy.bool_``; its type is named ``bool`` in
    NumPy 2)."""
    kind = type(value)
    return kind.__module__ == "numpy" and kind.__name__ in ("bool_", "bool")


def check_bool(name: str, value: Any) -> bool:
    """Return ``value`` if it is a ``bool`` (``numpy.bool_`` too), never an int or a string."""
    if not isinstance(value, bool) and not _numpy_bool(value):
        raise PosEncError(f"{name} must be True or False, got {describe(value)}")
    return bool(value)


def check_device(name: str, value: Any) -> torch.device | None:
    """Return ``value`` as a ``torch.device`` (None stays None): a device or its name that
    this build of torch can use; ``"cuda"`` without CUDA is refused here, not by torch."""
    if value is None:
        return None
    if type(value) is torch.device and value.type in ("cpu", "meta"):  # the common case
        return value
    if not isinstance(value, (str, torch.device)):
        raise PosEncError(f"{name} must be a torch.device or a device name, got {describe(value)}")
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError) as e:
        raise PosEncError(f"{name} must be a device name such as 'cpu', got {value!r}") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise PosEncError(f"{name} is {value!r}, but CUDA is not available")
    if device.type not in ("cpu", "cuda", "meta") and not _available(device):
        raise PosEncError(f"{name} is {value!r}, but that device is not available")
    return device


def _available(device: torch.device) -> bool:
    backend = getattr(torch, device.type, None)
    available = getattr(backend, "is_available", None)
    return bool(available()) if callable(available) else False


def check_factory(device: Any, dtype: Any) -> tuple[torch.device | None, torch.dtype | None]:
    """A module's ``device=`` and ``dtype=`` (its parameters'): a usable device and a
    floating dtype, or None for torch's defaults."""
    device = check_device("device", device)
    if dtype is not None:
        check_dtype("dtype", dtype)
    return device, dtype


def check_same_device(names: Sequence[str], *tensors: torch.Tensor | None) -> None:
    """Raise unless the given tensors (None skipped) are on one device and none is on the
    meta device, where tensors hold no values (a metadata check: no device sync)."""
    given = [(n, t) for n, t in zip(names, tensors) if t is not None]
    for n, t in given:
        if t.device.type == "meta":
            raise PosEncError(f"{n} must hold values, got a tensor on the meta device")
    if given:
        first_name, first = given[0]
        for n, t in given[1:]:
            if t.device != first.device:
                raise PosEncError(
                    f"{n} must be on the device of {first_name} ({first.device}), got {t.device}"
                )


def _memory(device: torch.device) -> int:
    """The memory of ``device`` in bytes (its total, not what is free right now)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    if device.type == "cpu":
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):  # not POSIX: the cap alone
            return MAX_ALLOC_BYTES
    return MAX_ALLOC_BYTES


def _cap() -> int:
    raw = os.environ.get("POSENC_MAX_ALLOC_BYTES")
    if raw is None:
        return MAX_ALLOC_BYTES
    try:
        return max(int(raw), 0)
    except ValueError as e:
        raise PosEncError(f"POSENC_MAX_ALLOC_BYTES must be an integer, got {raw!r}") from e


def check_alloc(
    name: str,
    value: Any,
    shape: Sequence[int],
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> None:
    """Raise before allocating a ``shape`` tensor of ``dtype`` on ``device`` that needs more
    bytes than :data:`MAX_ALLOC_BYTES` (``POSENC_MAX_ALLOC_BYTES``) or the device's memory;
    the message names the argument ``name=value`` that asks for it and the estimated bytes.

    ``dtype`` None is ``torch.float32``. Symbolic sizes (under ``torch.compile``) are not
    checked: the graph's own runtime checks hold them. Sizes that are not plain ints are left
    to the caller's other checks.
    """
    dtype = torch.float32 if dtype is None else dtype
    numel = 1
    for n in shape:
        if _symbolic_int(n) and tracing():
            return
        if isinstance(n, torch.SymInt):
            return
        numel *= max(int(n), 0)
    itemsize = dtype.itemsize if isinstance(dtype, torch.dtype) else 4
    estimate = numel * itemsize
    where = torch.device("cpu") if device is None else torch.device(device)
    limit = min(_cap(), MAX_ALLOC_BYTES if where.type == "meta" else _memory(where))
    if estimate > limit:
        raise PosEncError(
            f"{name}={value!r} would allocate a {list(shape)} {dtype} tensor, about "
            f"{estimate:.3g} bytes, more than the {limit:.3g} bytes allowed on {where} "
            f"(MAX_ALLOC_BYTES or the device's memory)"
        )


def _kind(value: Any) -> type:
    """What a choice is, for :func:`check_choice`: a bool (NumPy's too), an integer (not a
    bool), a string, else its type; ``==`` alone would take ``-2.0`` or ``-2 + 0j`` for
    ``-2``, and ``1`` for ``True``."""
    if isinstance(value, bool) or _numpy_bool(value):
        return bool
    if isinstance(value, numbers.Integral):
        return int
    return str if isinstance(value, str) else type(value)


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """Return ``value`` if it is one of ``choices`` (equal to one, and of its kind: a float or
    a complex number is no integer choice, an integer no bool); the error lists the choices."""
    choices = tuple(choices)
    exact = type(value)
    if exact is str and value in choices:  # a string equals strings alone
        return value
    for c in choices:  # the common case first, no ABC checks (hot paths): the same type
        if type(c) is exact and c == value:
            return value
    kind = _kind(value)
    if not any(_kind(c) is kind and c == value for c in choices):
        listed = ", ".join(repr(c) for c in choices)
        raise PosEncError(f"{name} must be one of {listed}, got {describe(value)}")
    return value


def check_tensor(name: str, value: Any, *, floating: bool | None = None) -> torch.Tensor:
    """Return ``value`` if it is a tensor (floating point when ``floating=True``)."""
    if not isinstance(value, torch.Tensor):
        raise PosEncError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if floating is True and not value.is_floating_point():
        raise PosEncError(f"{name} must have a floating-point dtype, got {value.dtype}")
    return value


def check_qkv(q: Any, k: Any, v: Any) -> None:
    """Raise unless ``q``, ``k`` and ``v`` are floating tensors ``[b, h, s, d]`` of one dtype
    on one device (how their sizes must agree is the caller's rule)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, floating=True)
        if t.ndim != 4:
            raise PosEncError(f"{name} must be [b, h, s, d], got shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise PosEncError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise PosEncError(
            f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}"
        )


def check_scale(scale: Any, d: int, dtype: torch.dtype, *, why: str = "") -> float:
    """Return ``scale`` (attention's logit multiplier) if ``scale > 0`` and ``scale * d`` is
    finite in ``dtype`` (q's, of head dim ``d``); ``why`` follows that rule in the message."""
    scale = check_float("scale", scale, min=0.0, min_exclusive=True)
    top = float(torch.finfo(dtype).max) / d
    if scale > top:
        raise PosEncError(
            f"scale must be <= {top:.4g} (scale * head_dim finite in {dtype}, q's dtype{why}), "
            f"got {scale:g}"
        )
    return scale


def check_dtype(name: str, value: Any, *, floating: bool = True) -> torch.dtype:
    """Return ``value`` if it is a ``torch.dtype`` (a floating one when ``floating=True``)."""
    if not isinstance(value, torch.dtype):
        raise PosEncError(f"{name} must be a torch.dtype, got {describe(value)}")
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
    length: str | None = None,
) -> torch.Tensor:
    """Validate a position tensor of shape ``[s]`` or ``[b, s]`` (``ndims`` allowed ranks;
    ``None``: any shape, as for tables at arbitrary positions).

    ``seq_len`` and ``batch``, when given, must match the last and (for 2-D)
    first dimension. Integer and floating positions are accepted; floating
    ones must be finite; meta tensors (no values) are refused. ``length`` names the argument
    ``seq_len`` comes from, for the message. Returns the tensor unchanged.
    """
    if not isinstance(positions, torch.Tensor):
        raise PosEncError(f"{name} must be a torch.Tensor, got {type(positions).__name__}")
    if positions.dtype == torch.bool or positions.is_complex():
        raise PosEncError(f"{name} must be an integer or floating tensor, got {positions.dtype}")
    if positions.device.type == "meta":
        raise PosEncError(f"{name} must hold values, got a tensor on the meta device")
    if batch is not None:
        batch = check_int("batch", batch, min=0)
    if ndims is not None and positions.ndim not in tuple(ndims):
        shapes = " or ".join({1: "[s]", 2: "[b, s]"}.get(n, f"{n}-D") for n in ndims)
        raise PosEncError(f"{name} must be {shapes}, got shape {tuple(positions.shape)}")
    if seq_len is not None and positions.shape[-1] != seq_len:
        raise PosEncError(
            f"{name} must have length {seq_len} (the sequence length) in its last "
            f"dimension, got shape {tuple(positions.shape)}"
            + ("" if length is None else f" (the length is {length}={seq_len})")
        )
    if batch is not None and positions.ndim == 2 and positions.shape[0] not in (1, batch):
        raise PosEncError(
            f"{name} of shape [b, s] must have b == {batch} (the batch size) or 1, "
            f"got shape {tuple(positions.shape)}"
        )
    check_finite(name, positions)
    return positions


def check_embeddings(x: Any, dim: int) -> torch.Tensor:
    """Validate the input of an additive encoding: a floating tensor ``[b, s, dim]`` of at
    least one sequence."""
    check_tensor("x", x, floating=True)
    if x.ndim != 3:
        raise PosEncError(f"x must be [b, s, dim], got shape {tuple(x.shape)}")
    check_last_dim("x", x, dim)
    if x.shape[0] < 1:
        raise PosEncError(
            f"x must hold a batch of >= 1 sequences [b, s, {dim}], got shape {tuple(x.shape)}"
        )
    return x
