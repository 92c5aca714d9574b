"""Bridges to other libraries' configs, files and models (their packages imported only when
needed): :mod:`posenc.integrations.transformers` (configs in, a loaded model patched),
:mod:`posenc.integrations.gguf` (a GGUF file's RoPE, as llama.cpp rotates it) and
:mod:`posenc.integrations.spelling` (transformers' spelling of a RoPE scaling, both ways)."""

from posenc.integrations.gguf import rotary_from_gguf
from posenc.integrations.transformers import (
    patch,
    rotary_from_config,
    scaling_from_transformers,
    unpatch,
)

__all__ = [
    "patch",
    "rotary_from_config",
    "rotary_from_gguf",
    "scaling_from_transformers",
    "unpatch",
]
