"""posenc: positional encodings for transformers.

Every major way of telling attention where a token is, behind one API:
additive tables (sinusoidal, learned), rotary (RoPE and its scalings) and
attention biases (ALiBi, T5, ...), each with a float64 reference in
:mod:`posenc.reference`.

What is top level (``__all__``), by one rule (see ARCHITECTURE.md):

1. the entry points: :func:`build`, :func:`attention`, :class:`PosEncError`, and the
   position maps attention takes (:class:`SelfExtend`, :class:`String`, :func:`position_map`);
2. every registered encoding's class (``*Embedding``, ``*Bias``, ``NoPositionalEncoding``);
3. each family's pure functions, those its module is one call into (tables, frequencies,
   cos/sin, apply, biases) and the published constants checked against the paper
   (``alibi_slopes``, ``t5_relative_bucket``);
4. the subpackages reached by name: :mod:`positions`, :mod:`reference`, :mod:`models`.

Everything else (scalings, kernels, porting, integrations, analysis, plots, experiments)
is imported from its package.

``import posenc`` imports no torch and no room: each name above is imported from its module
the first time it is used (PEP 562; :data:`_FROM` says where), and so is a subpackage used as
an attribute (``posenc.rotary``). Where torch is not installed, :mod:`posenc.reference` and
:mod:`posenc.conformance` work with NumPy alone, and a name or a module that needs torch
says so in one line (``ModuleNotFoundError: posenc.RotaryEmbedding needs torch, which is not
installed: pip install torch``; :mod:`posenc._lazy`).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from posenc import _lazy
from posenc._version import __version__ as __version__

if TYPE_CHECKING:  # what each name is, for type checkers and the API pages (at run time: _FROM)
    from posenc import models, positions, reference
    from posenc._errors import PosEncError
    from posenc.nope import NoPositionalEncoding
    from posenc.registry import build

    # --- additive -----------------------------------------------------------------------
    from posenc.index import IndexEmbedding, index_table
    from posenc.learned import LearnedEmbedding, resample_table
    from posenc.sinusoidal import SinusoidalEmbedding, sinusoidal_table, sinusoidal_table_nd

    # --- rotary -------------------------------------------------------------------------
    from posenc.rotary.apply import apply_rotary, rotary_cos_sin
    from posenc.rotary.frequencies import rope_frequencies
    from posenc.rotary.module import RotaryEmbedding
    from posenc.rotary.nd import AxialRotaryEmbedding, MultimodalRotaryEmbedding, axial_frequencies
    from posenc.rotary.xpos import XPosEmbedding, xpos_scale

    # --- bias ---------------------------------------------------------------------------
    from posenc.bias.alibi import ALiBiBias, alibi_bias, alibi_slopes
    from posenc.bias.fire import FIREBias, fire_bias
    from posenc.bias.kerple import KerpleBias, kerple_bias
    from posenc.bias.shaw import ShawRelativeBias, shaw_relative_logits, shaw_relative_values
    from posenc.bias.t5 import T5RelativeBias, t5_relative_bias, t5_relative_bucket

    # --- contextual and gated -----------------------------------------------------------
    from posenc.contextual import CoPEBias, cope_bias
    from posenc.gated import FoXBias, fox_bias

    # --- attention ----------------------------------------------------------------------
    from posenc.attend import attention
    from posenc.remap import SelfExtend, String, position_map

#: Each module -> the top-level names imported from it on first use (the subpackages
#: ``models``, ``positions`` and ``reference`` are imported as themselves).
_FROM: dict[str, tuple[str, ...]] = {
    "posenc._errors": ("PosEncError",),
    "posenc.nope": ("NoPositionalEncoding",),
    "posenc.registry": ("build",),
    # --- additive
    "posenc.index": ("IndexEmbedding", "index_table"),
    "posenc.learned": ("LearnedEmbedding", "resample_table"),
    "posenc.sinusoidal": ("SinusoidalEmbedding", "sinusoidal_table", "sinusoidal_table_nd"),
    # --- rotary
    "posenc.rotary.apply": ("apply_rotary", "rotary_cos_sin"),
    "posenc.rotary.frequencies": ("rope_frequencies",),
    "posenc.rotary.module": ("RotaryEmbedding",),
    "posenc.rotary.nd": ("AxialRotaryEmbedding", "MultimodalRotaryEmbedding", "axial_frequencies"),
    "posenc.rotary.xpos": ("XPosEmbedding", "xpos_scale"),
    # --- bias
    "posenc.bias.alibi": ("ALiBiBias", "alibi_bias", "alibi_slopes"),
    "posenc.bias.fire": ("FIREBias", "fire_bias"),
    "posenc.bias.kerple": ("KerpleBias", "kerple_bias"),
    "posenc.bias.shaw": ("ShawRelativeBias", "shaw_relative_logits", "shaw_relative_values"),
    "posenc.bias.t5": ("T5RelativeBias", "t5_relative_bias", "t5_relative_bucket"),
    # --- contextual and gated
    "posenc.contextual": ("CoPEBias", "cope_bias"),
    "posenc.gated": ("FoXBias", "fox_bias"),
    # --- attention
    "posenc.attend": ("attention",),
    "posenc.remap": ("SelfExtend", "String", "position_map"),
}
_HOME = {name: module for module, names in _FROM.items() for name in names}


def _read_transformers_spelling() -> None:
    """Install transformers' spelling of a RoPE scaling in the rotary room (importing
    :mod:`posenc.integrations.spelling` installs its reader): run each time ``posenc.rotary``
    is imported, however it is reached, so ``RotaryEmbedding(scaling=...)`` always takes it.
    The rotary room cannot import the integrations above it; the package, above all, can."""
    from posenc.integrations import spelling  # noqa: F401


if _lazy.TORCH_MISSING:
    _lazy.install_needs_torch()
else:
    _lazy.after_import("posenc.rotary", _read_transformers_spelling)

__all__ = [
    # entry points
    "PosEncError",
    "attention",
    "build",
    # position maps (posenc.attention(position_map=))
    "SelfExtend",
    "String",
    "position_map",
    # subpackages
    "models",
    "positions",
    "reference",
    # additive
    "IndexEmbedding",
    "LearnedEmbedding",
    "NoPositionalEncoding",
    "SinusoidalEmbedding",
    "index_table",
    "resample_table",
    "sinusoidal_table",
    "sinusoidal_table_nd",
    # rotary
    "AxialRotaryEmbedding",
    "MultimodalRotaryEmbedding",
    "RotaryEmbedding",
    "XPosEmbedding",
    "apply_rotary",
    "axial_frequencies",
    "rope_frequencies",
    "rotary_cos_sin",
    "xpos_scale",
    # bias
    "ALiBiBias",
    "CoPEBias",
    "FIREBias",
    "FoXBias",
    "KerpleBias",
    "ShawRelativeBias",
    "T5RelativeBias",
    "alibi_bias",
    "alibi_slopes",
    "cope_bias",
    "fire_bias",
    "fox_bias",
    "kerple_bias",
    "shaw_relative_logits",
    "shaw_relative_values",
    "t5_relative_bias",
    "t5_relative_bucket",
]


def __getattr__(name: str) -> Any:
    """A top-level name, or a subpackage, imported on first use (then kept); the deprecated
    class names (``posenc.ALiBi``, ...), for one more release. Where torch is missing, a
    name that needs it raises ``ModuleNotFoundError`` in one line."""
    home = _HOME.get(name)
    if home is not None:
        if _lazy.TORCH_MISSING and not _lazy.torch_free(home):
            raise _lazy.needs_torch(f"{__name__}.{name}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value
        return value
    if name.isidentifier() and not name.startswith("__"):
        if importlib.util.find_spec(f"{__name__}.{name}") is not None:
            return importlib.import_module(f"{__name__}.{name}")
        if not name.startswith("_") and not _lazy.TORCH_MISSING:  # old names: posenc.bias
            from posenc import bias
            from posenc.bias._common import renamed

            return renamed(__name__, name, bias._RENAMED)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The names of the module and every top-level name, imported or not."""
    return sorted({*globals(), *__all__})
