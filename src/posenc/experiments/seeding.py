"""Stateless seeding: every random draw of a study comes from a generator keyed by
``(seed, stream, index)``.

A training batch is drawn from ``generator(seed, "train", step)``, so the data
of step ``t`` does not depend on how many steps ran before it in this process:
resuming at step ``t`` needs only the number ``t`` (the data iterator position),
and every rank of a distributed run draws the same global batch and keeps its
own rows.
"""

from __future__ import annotations

import hashlib

import torch

from posenc._errors import check_int

__all__ = ["derive_seed", "generator"]


def derive_seed(seed: int, stream: str, index: int = 0) -> int:
    """A 63-bit seed derived from ``(seed, stream, index)`` with BLAKE2b.

    Examples:
        >>> derive_seed(0, "train", 3) == derive_seed(0, "train", 3)
        True
        >>> derive_seed(0, "train", 3) == derive_seed(0, "train", 4)
        False
    """
    seed = check_int("seed", seed)
    index = check_int("index", index)
    digest = hashlib.blake2b(f"{seed}/{stream}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & (2**63 - 1)


def generator(seed: int, stream: str, index: int = 0) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with :func:`derive_seed`.

    Examples:
        >>> a = torch.rand(3, generator=generator(1, "eval", 64))
        >>> torch.equal(a, torch.rand(3, generator=generator(1, "eval", 64)))
        True
    """
    g = torch.Generator()
    g.manual_seed(derive_seed(seed, stream, index))
    return g
