"""``triton.language`` for annotations only: every attribute is an inert marker."""

from __future__ import annotations

from typing import Any


class constexpr:  # triton's spelling
    pass


def __getattr__(name: str) -> Any:
    return constexpr
