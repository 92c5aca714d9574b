"""What the factor search (:mod:`posenc.extend.search`) keeps on disk and scores on: its
state in ``OUT/search.json`` and the validation document.

The state is written through :func:`posenc._files.atomic_write` after every evaluation:
the settings it was made with (:func:`fingerprint`), the generation being evaluated, its
candidates not yet scored (in order), every candidate scored (its factors, its mean
negative log-likelihood, where it came from, its generation and seconds) and the seconds
spent. A candidate is fixed once drawn, so a resumed search scores exactly what an
uninterrupted one would. Read back, every field is checked (:mod:`posenc._fields`); a
state of other settings, or one that does not read, is refused in one line (never
silently dropped: it may hold hours of scoring).

The validation document is one the evaluation never sees: the largest Python
standard-library source not among the evaluation documents (by SHA-256) with at least the
scoring length in tokens.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posenc import _fields as F
from posenc._errors import PosEncError
from posenc._files import MIB, atomic_write, read_regular
from posenc.extend.data import Document, documents, stdlib_sources
from posenc.extend.model import Loaded

__all__ = [
    "ORIGINS",
    "STATE_FILE",
    "fingerprint",
    "read_state",
    "validation_document",
    "write_state",
]

STATE_FILE = "search.json"
#: Where a candidate came from: the three seeds, or a child.
ORIGINS = ("pi", "ntk", "yarn", "mutation", "crossover")
_MAX_BYTES = 64 * MIB  # thousands of candidates of a few hundred factors each
_SCANNED = 16  # standard-library sources looked at past the evaluation's


def validation_document(tokenizer: Any, evaluation: Sequence[Document], length: int) -> Document:
    """The largest standard-library source that is none of ``evaluation`` (compared by
    SHA-256) and has at least ``length`` tokens.

    Raises:
        PosEncError: none of the largest sources has ``length`` tokens (naming
            ``--search-length``).
    """
    held = {d.sha256 for d in evaluation}
    for path in stdlib_sources(len(evaluation) + _SCANNED):
        doc = documents(tokenizer, [str(path)], 1)[0]
        if doc.sha256 not in held and len(doc.ids) >= length:
            return doc
    raise PosEncError(
        f"--search-length: no standard-library source outside the evaluation documents has "
        f"{length} tokens; ask for a shorter search length"
    )


def fingerprint(
    loaded: Loaded,
    validation: Document,
    *,
    seed: int,
    target: int,
    length: int,
    population: int,
) -> dict[str, Any]:
    """What a saved state must match to be continued: the model's files, where it runs,
    the validation document, the lengths, the seed and the population size (as JSON gives
    it back)."""
    weight = next(loaded.model.parameters())
    record = {
        "files": loaded.identity["files"],
        "dtype": str(weight.dtype).removeprefix("torch."),
        "device": str(weight.device),
        "trained": loaded.trained,
        "rotary_dim": loaded.head_dim,
        "validation": {"name": validation.name, "sha256": validation.sha256},
        "target": target,
        "length": length,
        "seed": seed,
        "population": population,
    }
    return json.loads(json.dumps(record))


def write_state(path: Path, state: dict[str, Any]) -> None:
    """``state`` to ``path`` (JSON, through a temporary file)."""
    atomic_write(path, (json.dumps(state, allow_nan=False) + "\n").encode())


def read_state(path: Path, wanted: dict[str, Any], cap: float) -> dict[str, Any] | None:
    """The state saved at ``path`` (None: there is none), every field checked.

    Raises:
        PosEncError: a file that does not read as a search state, or one of other
            settings (naming the settings that differ), in one line.
    """
    if not path.exists() and not path.is_symlink():
        return None
    where = f"search state {str(path)!r}"
    try:
        state = json.loads(read_regular(path, what="search state", max_bytes=_MAX_BYTES))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        if isinstance(error, PosEncError):
            raise
        raise PosEncError(
            f"{where} is not JSON ({type(error).__name__}); remove it to start the search over"
        ) from None
    at = F.At(where)
    F.mapping(at, state, required=_KEYS, allowed=_KEYS)
    saved = F.mapping(at["fingerprint"], state["fingerprint"])
    if saved != wanted:
        differ = sorted(k for k in {*saved, *wanted} if saved.get(k) != wanted.get(k))
        raise PosEncError(
            f"{where} was made with other settings ({', '.join(differ)} differ); pass the "
            f"same ones, or remove it (or drop --resume) to start the search over"
        )
    _check_body(at, state, wanted["rotary_dim"] // 2, cap)
    return state


_KEYS = ("fingerprint", "generation", "pending", "scored", "seconds")
_SCORED = ("factors", "nll", "origin", "generation", "seconds")


def _check_body(at: F.At, state: dict[str, Any], n: int, cap: float) -> None:
    """Every field but the fingerprint: counts, factors in ``[1, cap]`` and non-decreasing."""
    generation = F.integer(at["generation"], state["generation"], 0)
    F.number(at["seconds"], state["seconds"], 0.0)
    pending = F.sequence(at["pending"], state["pending"])
    scored = F.sequence(at["scored"], state["scored"])
    for i, item in enumerate(pending):
        F.mapping(
            at["pending"][i], item, required=("factors", "origin"), allowed=("factors", "origin")
        )
        _check_candidate(at["pending"][i], item, n, cap)
    for i, item in enumerate(scored):
        here = at["scored"][i]
        F.mapping(here, item, required=_SCORED, allowed=_SCORED)
        _check_candidate(here, item, n, cap)
        F.number(here["nll"], item["nll"], null=True)
        F.integer(here["generation"], item["generation"], 0, generation)
        F.number(here["seconds"], item["seconds"], 0.0)


def _check_candidate(at: F.At, item: dict[str, Any], n: int, cap: float) -> None:
    F.choice(at["origin"], item["origin"], ORIGINS)
    factors = F.sequence(at["factors"], item["factors"], f"a list of {n} factors", low=n, high=n)
    for i, value in enumerate(factors):
        F.number(at["factors"][i], value, 1.0, cap)
    if any(b < a for a, b in itertools.pairwise(factors)):
        raise F.fail(at["factors"], "non-decreasing (from the highest frequency down)", factors)
    if any(float(np.float32(value)) != value for value in factors):
        raise F.fail(at["factors"], "float32 numbers (what transformers and GGUF hold)", factors)
