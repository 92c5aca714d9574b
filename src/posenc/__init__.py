"""posenc: positional encodings for transformers.

Every major way of telling attention where a token is, behind one API:
additive tables (sinusoidal, learned), rotary (RoPE and its scalings) and
attention biases (ALiBi, T5, ...), each with a float64 reference in
:mod:`posenc.reference`.
"""

from posenc import positions, reference
from posenc._errors import PosEncError
from posenc.nope import NoPositionalEncoding
from posenc.registry import build

# --- additive ---------------------------------------------------------------
from posenc.index import IndexEmbedding
from posenc.learned import LearnedEmbedding
from posenc.sinusoidal import SinusoidalEmbedding, sinusoidal_table, sinusoidal_table_nd

# --- rotary -----------------------------------------------------------------
from posenc.rotary.apply import apply_rotary, rotary_cos_sin
from posenc.rotary.frequencies import rope_frequencies
from posenc.rotary.module import RotaryEmbedding
from posenc.rotary.nd import AxialRotaryEmbedding, MultimodalRotaryEmbedding
from posenc.rotary.xpos import XPosEmbedding

# --- bias -------------------------------------------------------------------
from posenc.bias.alibi import ALiBi, alibi_slopes
from posenc.bias.fire import FIRE
from posenc.bias.kerple import Kerple
from posenc.bias.shaw import ShawRelative
from posenc.bias.t5 import T5RelativeBias, t5_relative_bucket

# --- attention --------------------------------------------------------------
from posenc import models  # imports the posenc.attention module first
from posenc.attention import attention  # the function shadows the module name

__version__ = "0.1.0"

__all__ = [
    "IndexEmbedding",
    "LearnedEmbedding",
    "NoPositionalEncoding",
    "PosEncError",
    "SinusoidalEmbedding",
    "build",
    "positions",
    "reference",
    "sinusoidal_table",
    "sinusoidal_table_nd",
    # rotary
    "AxialRotaryEmbedding",
    "MultimodalRotaryEmbedding",
    "RotaryEmbedding",
    "XPosEmbedding",
    "apply_rotary",
    "rope_frequencies",
    "rotary_cos_sin",
    # bias
    "ALiBi",
    "FIRE",
    "Kerple",
    "ShawRelative",
    "T5RelativeBias",
    "alibi_slopes",
    "t5_relative_bucket",
    # attention
    "attention",
    "models",
]
