"""The two channel layouts of a sin/cos pair: the one layout tuple of the package.

A sinusoidal table and a RoPE rotation both pair channels, and checkpoints disagree on
which ones, so the layout is always named:

- ``"half"``: channel ``i`` pairs with ``i + n/2`` (RoPE: GPT-NeoX, Llama as ported to
  transformers; sinusoidal: all sines, then all cosines, at the paper's rates
  ``base^(-2i/dim)``, as the TensorFlow tutorial's concatenated ``positional_encoding``);
- ``"interleaved"``: channel ``2i`` pairs with ``2i + 1`` (RoPE: RoFormer, GPT-J, Meta's
  checkpoints; sinusoidal: the paper's ``PE[p, 2i]``, ``PE[p, 2i + 1]``).

tensor2tensor, fairseq, T5X, MaxText and Flax's examples also put all sines before all
cosines, but at other rates (``base^(-i/(dim/2 - 1))``): that is a third layout, sinusoidal
only, ``"flax"``, which :mod:`posenc.sinusoidal` adds to these two.

It sits below the families, which import it (:mod:`posenc.sinusoidal`,
:mod:`posenc.rotary.layout`, which re-exports it as ``posenc.rotary.layout.LAYOUTS``); it
imports nothing.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["LAYOUTS", "Layout"]

Layout = Literal["half", "interleaved"]
LAYOUTS: tuple[Layout, ...] = ("half", "interleaved")
