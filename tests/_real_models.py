"""The real pretrained checkpoints, for tests that need one: found under ``.cache/models``
(``scripts/fetch_models.py`` puts them there; ``POSENC_MODEL_CACHE`` names another cache
root), or the test skips with the command that fetches them. Loaded once per process
through transformers' own GGUF reader (never mocked).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("POSENC_MODEL_CACHE", ROOT / ".cache"))
FILES = {
    "smollm2": "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma3/gemma-3-270m-q4_k_m.gguf",
}


def path_of(name: str) -> Path | None:
    """The GGUF file of model ``name`` (``smollm2`` or ``gemma3``), or None if not fetched."""
    path = CACHE / "models" / FILES[name]
    return path if path.is_file() else None


def require(name: str) -> Path:
    """The GGUF file of ``name``; skips the test (naming the fetch command) when absent, or
    when transformers, gguf or accelerate is not installed."""
    path = path_of(name)
    if path is None:
        pytest.skip(f"{name} not fetched: python scripts/fetch_models.py {name}")
    for module in ("transformers", "gguf", "accelerate"):
        pytest.importorskip(module)
    return path


@functools.lru_cache(maxsize=2)
def load(name: str, dtype: str = "float32") -> tuple[Any, Any]:
    """``(model, tokenizer)`` of ``name`` in ``dtype``, eval mode, loaded once per process.
    Tests must not patch the cached model without unpatching it (use try/finally)."""
    import torch
    import transformers

    path = require(name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=getattr(torch, dtype)
    ).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model, tokenizer
