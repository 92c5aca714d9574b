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
"""

from typing import Any

from posenc import positions, reference
from posenc._errors import PosEncError
from posenc.nope import NoPositionalEncoding
from posenc.registry import build

# --- additive ---------------------------------------------------------------
from posenc.index import IndexEmbedding, index_table
from posenc.learned import LearnedEmbedding, resample_table
from posenc.sinusoidal import SinusoidalEmbedding, sinusoidal_table, sinusoidal_table_nd

# --- rotary -----------------------------------------------------------------
from posenc.rotary.apply import apply_rotary, rotary_cos_sin
from posenc.rotary.frequencies import rope_frequencies
from posenc.rotary.module import RotaryEmbedding
from posenc.rotary.nd import AxialRotaryEmbedding, MultimodalRotaryEmbedding, axial_frequencies
from posenc.rotary.xpos import XPosEmbedding, xpos_scale

# --- bias -------------------------------------------------------------------
from posenc import bias as _bias
from posenc.bias._common import renamed as _renamed
from posenc.bias.alibi import ALiBiBias, alibi_bias, alibi_slopes
from posenc.bias.fire import FIREBias, fire_bias
from posenc.bias.kerple import KerpleBias, kerple_bias
from posenc.bias.shaw import ShawRelativeBias, shaw_relative_logits, shaw_relative_values
from posenc.bias.t5 import T5RelativeBias, t5_relative_bias, t5_relative_bucket

# --- contextual and gated ---------------------------------------------------
from posenc.contextual import CoPEBias, cope_bias
from posenc.gated import FoXBias, fox_bias

# --- attention and models -----------------------------------------------------
from posenc.attend import attention
from posenc.remap import SelfExtend, String, position_map
from posenc import models

# --- another library's spelling of a scaling: its reader, installed on import -----------------
from posenc.integrations import spelling as _spelling  # noqa: F401  (RotaryEmbedding(scaling=))

from posenc._version import __version__ as __version__

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
    """The deprecated class names (``posenc.ALiBi``, ...), for one more release."""
    return _renamed(__name__, name, _bias._RENAMED)
