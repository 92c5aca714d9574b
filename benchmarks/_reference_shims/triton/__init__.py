"""Import-only stand-in for ``triton`` (LongLM's package imports its Triton kernels at
module level; its eager ``self_extend_forward`` is what runs). A decorated kernel raises
when launched."""

from __future__ import annotations

from typing import Any

from . import language

__version__ = "0.0.0+posenc.shim"
__all__ = ["Config", "autotune", "cdiv", "heuristics", "jit", "language", "next_power_of_2"]


class _Kernel:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __getitem__(self, grid: Any) -> Any:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"triton shim: {self.fn!r} cannot run on the CPU")


def jit(fn: Any = None, **kwargs: Any) -> Any:
    return _Kernel(fn) if fn is not None else _Kernel


def heuristics(values: Any) -> Any:
    return lambda fn: fn if isinstance(fn, _Kernel) else _Kernel(fn)


def autotune(*args: Any, **kwargs: Any) -> Any:
    return heuristics(None)


class Config:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()
