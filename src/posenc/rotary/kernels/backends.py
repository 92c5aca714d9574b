"""Which fused path a rotation takes: the switches and the one decision per process.

- ``"triton"`` for CUDA tensors when ``triton`` is installed (off with :func:`enable_triton`
  or ``POSENC_TRITON=0``);
- ``"cpu"`` for CPU tensors once the C loop is built (:func:`cpu_fast_path_enabled`; off
  with :func:`enable_cpu_fast_path` or ``POSENC_CPU_FAST_PATH=0``);
- ``"torch"``, the plain twin, for everything else.

The state lives here, below :mod:`posenc.rotary.kernels.dispatch` and the package's
``__init__`` (which only re-exports): whoever reads or sets a switch imports this module.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import warnings
from typing import Any

import torch

from posenc._errors import transformed
from posenc.rotary.kernels.ops import KERNEL_DTYPES

__all__ = [
    "BACKENDS",
    "cpu_fast_path_enabled",
    "cpu_fast_path_ready",
    "enable_cpu_fast_path",
    "enable_triton",
    "select_backend",
    "tracing",
]

BACKENDS = ("auto", "triton", "cpu", "torch")

_triton_on = importlib.util.find_spec("triton") is not None and (
    os.environ.get("POSENC_TRITON", "1") != "0"
)
# None: not decided yet (POSENC_CPU_FAST_PATH is read, and the library built, on the
# first CPU call outside tracing).
_cpu_on: bool | None = None
_OFF = ("0", "false", "off", "no")


def enable_triton(enabled: bool = True) -> None:
    """Use (or stop using) the Triton kernel for CUDA tensors.

    Args:
        enabled: ``True`` (the default when ``triton`` is installed) or ``False``.

    Raises:
        ImportError: ``enabled=True`` without triton installed.
    """
    global _triton_on
    if enabled and importlib.util.find_spec("triton") is None:
        raise ImportError("the Triton fast path needs triton: pip install 'posenc[triton]'")
    _triton_on = bool(enabled)


def enable_cpu_fast_path(enabled: bool = True) -> None:
    """Turn the fused CPU path on (compiling it now if it is not cached) or off.

    It is on by default where it can be built (see :func:`cpu_fast_path_enabled`); this
    switch overrides that for the rest of the process. The first build in a fresh cache
    compiles ``rope_cpu.c`` with the system C compiler (``$CC``, default ``cc``; a second
    or two); the library is cached (see :func:`posenc.rotary.kernels.cpu.cache_dir`) and
    only loaded, after its owner, mode and hash are checked, afterwards.

    Args:
        enabled: ``True`` to use the fused loop for CPU tensors, ``False`` for the plain
            torch path.

    Raises:
        RuntimeError: ``enabled=True`` and the library could not be compiled (no C
            compiler, ...); the plain path stays in use.
    """
    global _cpu_on
    if enabled:
        from posenc.rotary.kernels.cpu import load  # the C toolchain only when asked for

        load()
    _cpu_on = bool(enabled)


def tracing() -> bool:
    """Under ``torch.compile`` / ``torch.export`` or ``torch.jit.trace``: launch through the
    torch custom ops (which the trace records), never through a direct library call."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def _assume_constant_result(fn: Any) -> Any:
    """What ``torch.compiler.assume_constant_result`` does (it marks the function for
    dynamo), without importing ``torch._dynamo`` as it does: that import would slow every
    ``import posenc`` (the CLI, each study worker) by seconds (``benchmarks/RESULTS.md``).
    A test checks that the marker is still torch's own."""
    fn._dynamo_marked_constant = True
    return fn


@_assume_constant_result
def _cpu_decided() -> bool:
    """The one decision (see :func:`cpu_fast_path_enabled`). Traced code reads it as a
    constant (computed outside the trace), so graphs never guard on the module's state and
    a graph compiled before the first eager call does not recompile after it."""
    global _cpu_on
    if _cpu_on is None:
        setting = os.environ.get("POSENC_CPU_FAST_PATH", "").strip().lower()
        _cpu_on = False
        if setting in _OFF:
            return False
        try:
            enable_cpu_fast_path(True)
        except RuntimeError as err:
            if setting:  # asked for explicitly
                warnings.warn(f"{err}; using the plain torch path", RuntimeWarning, stacklevel=3)
            else:
                logging.getLogger("posenc").warning(
                    "%s; using the plain torch path (the same results, slower). "
                    "POSENC_CPU_FAST_PATH=0 chooses it without this message.",
                    err,
                )
    return _cpu_on


def cpu_fast_path_enabled() -> bool:
    """Whether CPU tensors go through the fused CPU path (see :func:`enable_cpu_fast_path`).

    Decided once per process, on the first call (under ``torch.compile`` too, outside the
    trace, as a constant of the graph: compiled graphs keep the choice they were made with):
    on unless
    ``POSENC_CPU_FAST_PATH=0``, and only if the library builds and loads. If it cannot
    (no C compiler, a failed build), the plain torch path is used and one line is logged
    (logger ``"posenc"``, level WARNING); with ``POSENC_CPU_FAST_PATH=1`` that failure is a
    :class:`RuntimeWarning` instead.
    """
    return _cpu_decided()


def cpu_fast_path_ready() -> bool:
    """Whether the fused CPU path is decided and on, without deciding it (no build, no
    environment read): what :func:`posenc.rotary.kernels.planned.fast_forward` asks before it serves a
    call; until the first CPU call has decided, every call takes the general path."""
    return _cpu_on is True


def cpu_fast_path_off() -> bool:
    """Whether the fused CPU path is decided and off (``POSENC_CPU_FAST_PATH=0``, no
    compiler, or switched off), without deciding it: where
    :func:`posenc.rotary.kernels.planned.fast_forward` serves the module's common call on
    the torch engine."""
    return _cpu_on is False


def select_backend(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> str:
    """The backend ``fused_rotary(..., backend="auto")`` uses for these tensors:
    ``"triton"`` (CUDA, triton installed), ``"cpu"`` (CPU with the fast path enabled) or
    ``"torch"`` (anything else, whenever cos/sin need gradients, and under ``torch.func``
    transforms)."""
    if x.dtype not in KERNEL_DTYPES:
        return "torch"
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        return "torch"  # the kernels do not differentiate through cos/sin
    if transformed(x, cos, sin):
        return "torch"  # vmap / grad: no storage to launch on
    if x.device.type == "cuda" and _triton_on:
        return "triton"
    if x.device.type == "cpu" and cpu_fast_path_enabled():
        return "cpu"
    return "torch"
