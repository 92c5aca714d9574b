"""The RoPE scalings, one module per scaling (or small related group), each holding its
frozen parameter dataclass beside its function.

:mod:`._registry` holds the registry and what the entries share; every scaling module
registers itself there when imported. :mod:`posenc.rotary.frequencies` imports them all
and is the public face (``rope_frequencies``, ``parse_scaling``, ``SCALINGS`` and the
dataclasses). This ``__init__`` imports nothing, so no submodule depends on it.
"""
