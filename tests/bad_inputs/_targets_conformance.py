"""Valid calls of the conformance check (issue 42) for the bad-input matrix (appended to
``_targets.TARGETS``): ``Adapter``, ``check``, ``build_cases``, ``Vectors.build`` /
``select``, ``write_vectors``, ``load_vectors``, ``assert_conforms``, the adapter factories
of installed frameworks, and the sinusoidal tables in the ``"flax"`` layout.

The implementations under test here are posenc's own float64 reference (``_reference``)
and the tutorial's ``[sin | cos]`` table claimed as interleaved (``_concatenated``, a known
defect the check names), run for real. Arguments that are paths the matrix cannot mutate
without writing into the working directory (``write_vectors``' ``out``) are fixed here and
refused by ``tests/conformance/test_bad_input.py`` instead.
"""

from __future__ import annotations

import functools
import importlib.util
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

import posenc
from posenc import reference
from posenc.conformance import (
    Adapter,
    Vectors,
    build_cases,
    check,
    load_vectors,
    write_vectors,
)
from posenc.conformance import adapters as factories
from posenc.conformance.pytest_plugin import assert_conforms

from ._targets import fn, target

SINE_CASES = "sinusoidal.interleaved.*"  # the interleaved sinusoidal tables, near and far
NEAR, FAR = "sinusoidal.interleaved.d64@near", "sinusoidal.interleaved.d64@far"
CONCATENATED = "[sin | cos] concatenated where the convention interleaves"


def _reference(positions: np.ndarray, dim: int, *, base: float) -> np.ndarray:
    """posenc's own reference table rounded to float32: passes every interleaved case."""
    return reference.sinusoidal_table(positions, dim, base=base).astype(np.float32)


def _concatenated(positions: np.ndarray, dim: int, *, base: float) -> np.ndarray:
    """The tutorial's ``[sin | cos]`` halves: fails the interleaved cases, by name."""
    return reference.sinusoidal_table(positions, dim, base=base, layout="half")


def _adapter() -> Adapter:
    return Adapter(
        "reference",
        "table",
        "sinusoidal",
        _reference,
        convention={"layout": "interleaved"},
        dtype="float32",
    )


@functools.cache
def _vectors() -> Vectors:
    """The sinusoidal cases in memory (built once: cases are read-only)."""
    return Vectors.build("sinusoidal.*")


@functools.cache
def _vectors_dir() -> str:
    """A directory ``write_vectors`` wrote the sinusoidal cases into (once)."""
    folder = Path(tempfile.mkdtemp(prefix="posenc-bad-inputs-vectors-"))
    return str(write_vectors(folder, cases="sinusoidal.*"))


# --- the vocabulary and the check -------------------------------------------------------------
fn(
    "conformance.Adapter",
    Adapter,
    lambda: {
        "name": "reference",
        "operation": "table",
        "family": "sinusoidal",
        "fn": _reference,
        "convention": {"layout": "interleaved"},
        "dtype": "float32",
        "source": "posenc.reference",
    },
)
fn(
    "conformance.Adapter[bias]",
    Adapter,
    lambda: {
        "name": "alibi",
        "operation": "bias",
        "family": "alibi",
        "fn": lambda q, k, *, heads, **parameters: reference.alibi_bias(
            q, k, reference.alibi_slopes(heads)
        ),
        "convention": {"causal": True},
        "dtype": "float64",
    },
)
fn(
    "conformance.check",
    check,
    lambda: {"adapter_or_adapters": _adapter(), "vectors": _vectors(), "cases": SINE_CASES},
    positional=("adapter_or_adapters",),
)
fn(
    "conformance.check[directory]",
    check,
    lambda: {"adapter_or_adapters": _adapter(), "vectors": _vectors_dir(), "cases": NEAR},
    positional=("adapter_or_adapters",),
)
fn("conformance.build_cases", build_cases, lambda: {"cases": "alibi.*"})
fn("conformance.Vectors.build", Vectors.build, lambda: {"cases": "alibi.*"})
target("conformance.Vectors.select")(
    lambda: (_vectors().select, {"cases": SINE_CASES}),
)
fn(
    "conformance.write_vectors",
    write_vectors,
    lambda: {
        "out": tempfile.mkdtemp(prefix="posenc-bad-inputs-out-"),
        "vectors": _vectors(),
        "cases": NEAR,
    },
    fixed=("out",),  # any string is a folder it may make (tests/conformance/test_bad_input.py)
)
fn("conformance.load_vectors", load_vectors, lambda: {"directory": _vectors_dir()})
fn(
    "conformance.assert_conforms",
    assert_conforms,
    lambda: {
        "adapter": Adapter(
            "concatenated",
            "table",
            "sinusoidal",
            _concatenated,
            convention={"layout": "interleaved"},
        ),
        "vectors": _vectors(),
        "cases": "sinusoidal.interleaved.d64@*",
        "expect": {NEAR: CONCATENATED, FAR: CONCATENATED},
    },
)

# --- the adapter factories (each framework's only where it is installed) ----------------------
_INSTALLED = {
    m: importlib.util.find_spec(m) is not None
    for m in ("keras_hub", "rotary_embedding_torch", "x_transformers")
}
_FACTORIES: list[tuple[str, str, dict[str, Any]]] = [
    ("keras_hub", "keras_hub_sine_position_encoding", {"dtype": "float32"}),
    ("keras_hub", "keras_hub_rotary_embedding", {"dtype": "float32"}),
    (
        "rotary_embedding_torch",
        "rotary_embedding_torch_rope",
        {"dtype": "float32", "layout": "interleaved"},
    ),
    ("rotary_embedding_torch", "rotary_embedding_torch_xpos", {"dtype": "bfloat16"}),
    ("x_transformers", "x_transformers_rope", {"dtype": "float16", "layout": "interleaved"}),
    ("x_transformers", "x_transformers_xpos", {"dtype": "float32"}),
    ("x_transformers", "x_transformers_sinusoidal", {}),
    ("x_transformers", "x_transformers_alibi", {}),
    ("x_transformers", "x_transformers_t5", {}),
]
for _module, _name, _args in _FACTORIES:
    if _INSTALLED[_module]:
        fn(f"conformance.adapters.{_name}", getattr(factories, _name), lambda a=_args: dict(a))

# --- the sinusoidal tables in the "flax" layout -----------------------------------------------
fn(
    "sinusoidal_table[flax]",
    posenc.sinusoidal_table,
    lambda: {
        "positions": torch.arange(4),
        "dim": 8,
        "base": 10000.0,
        "layout": "flax",
        "order": "cos_sin",
        "dtype": torch.float32,
        "device": "cpu",
    },
)
fn(
    "sinusoidal_table_nd[flax]",
    posenc.sinusoidal_table_nd,
    lambda: {"grid": (2, 3), "dim": 8, "base": 10000.0, "layout": "flax", "dtype": torch.float32},
)
fn(
    "SinusoidalEmbedding[flax]",
    posenc.SinusoidalEmbedding,
    lambda: {
        "dim": 8,
        "base": 10000.0,
        "layout": "flax",
        "order": "sin_cos",
        "dropout": 0.0,
        "scale": 1.0,
        "learnable_scale": True,
    },
)
target("SinusoidalEmbedding[flax].forward")(
    lambda: (
        posenc.SinusoidalEmbedding(8, layout="flax"),
        {"x": torch.randn(1, 4, 8), "positions": torch.arange(4), "offset": 1},
    )
)
target("SinusoidalEmbedding[flax].table")(
    lambda: (posenc.SinusoidalEmbedding(9, layout="flax").table, {"positions": torch.arange(4)})
)
