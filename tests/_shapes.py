"""A recorder of every tensor shape the aten ops of a block take or give, for the tests that
prove a path never builds an ``[s, s]`` tensor (remapped attention, extend's probes)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class Shapes(TorchDispatchMode):
    """Every tensor shape an aten op takes or gives, with the first op seen with it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[tuple[int, ...], str] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves((args, kwargs, out)):
            if isinstance(t, torch.Tensor):
                self.seen.setdefault(tuple(t.shape), str(func))
        return out

    def square(self, s: int) -> dict[tuple[int, ...], str]:
        """The shapes seen with two or more dimensions of at least ``s``, with their op."""
        return {k: v for k, v in self.seen.items() if sum(d >= s for d in k) >= 2}
