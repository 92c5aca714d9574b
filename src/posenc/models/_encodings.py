"""The encodings of a :class:`~posenc.models.TinyTransformer`: built from specs with what
the model knows, and one module per layer where a layer or a class asks for it.

Every module is built by :func:`posenc.registry.build`, filled by kind: additive encodings
get ``dim`` (and ``max_len``), rotary ones ``head_dim``, those of kind ``bias`` (biases of
positions, contextual and gated encodings alike) ``num_heads`` and ``head_dim``, with the
model's direction (``causal``) and CoPE's table length (``max_len + 1``) as defaults a
config may override. Nothing here knows a concrete encoding class.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from posenc import registry
from posenc._base import Encoding
from posenc._errors import PosEncError

__all__ = ["ModelDims", "layer_encodings", "make_encoding"]


@dataclasses.dataclass(frozen=True)
class ModelDims:
    """What a model tells the encodings it builds (validated by the model)."""

    dim: int
    num_heads: int
    max_len: int | None
    causal: bool

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    def fill(self, kind: str) -> dict[str, Any] | None:
        """The arguments a spec of ``kind`` must take as the model sets them."""
        fills: dict[str, dict[str, Any]] = {
            "additive": {"dim": self.dim, "max_len": self.max_len},
            "rotary": {"head_dim": self.head_dim},
            "bias": {"num_heads": self.num_heads, "head_dim": self.head_dim},
        }
        return fills.get(kind)

    def defaults(self, kind: str) -> dict[str, Any] | None:
        """Arguments a spec of ``kind`` may set otherwise: the direction follows the model
        (ALiBi's symmetric ``-m|i - j|`` and T5's two-way buckets for an encoder), a table
        of contextual positions covers ``max_len + 1`` (CoPE's paper)."""
        if kind != "bias":
            return None
        defaults: dict[str, Any] = {"causal": self.causal}
        if self.max_len is not None:
            defaults["npos_max"] = self.max_len + 1
        return defaults

    def check(self, enc: Encoding) -> Encoding:
        """``enc`` if its size fits this model (``dim``, ``head_dim`` or ``num_heads``)."""
        attr, want = {
            "additive": ("dim", self.dim),
            "rotary": ("head_dim", self.head_dim),
            "bias": ("num_heads", self.num_heads),
        }.get(enc.kind, ("", None))
        have = getattr(enc, attr, want)
        if want is not None and have is not None and have != want:
            raise PosEncError(
                f"encoding {enc.name!r} has {attr}={have}; this model needs {attr}={want}"
            )
        return enc


def make_encoding(spec: Any, dims: ModelDims) -> Encoding:
    """Build (or check) an encoding module of a model with ``dims``."""
    if not isinstance(spec, (str, Mapping, Encoding)):
        raise PosEncError(
            "encoding must be a registry name, a config dict or an Encoding "
            f"(use 'none' for NoPE), got {spec!r}"
        )
    cls = registry.class_of(spec)
    if isinstance(spec, Encoding):
        return dims.check(spec)
    _, required = registry.parameters(cls)
    given = isinstance(spec, Mapping) and "max_len" in spec
    if cls.kind == "additive" and "max_len" in required and dims.max_len is None and not given:
        raise PosEncError(
            f"max_len is needed by encoding {cls.name!r} (its table length), got None"
        )
    enc = registry.build(spec, fill=dims.fill(cls.kind), defaults=dims.defaults(cls.kind))
    return dims.check(enc)


def _layer_spec_encoding(i: int, spec: Any, dims: ModelDims) -> Encoding:
    """Layer ``i``'s own encoding from its spec (a name or config; never additive)."""
    if isinstance(spec, Encoding):
        raise PosEncError(
            f"layers[{i}]['encoding'] must be a registry name or a config dict (the "
            f"model builds it), got a module {type(spec).__name__}"
        )
    cls = registry.class_of(spec)
    if cls.kind == "additive":
        raise PosEncError(
            f"layers[{i}]['encoding'] must be rotary, bias or 'none' (additive "
            f"encodings act once, at the embeddings), got {cls.name!r}"
        )
    return make_encoding(spec, dims)


def layer_encodings(
    encoding: Encoding, layers: list[dict[str, Any]] | None, num_layers: int, dims: ModelDims
) -> list[Encoding]:
    """Each layer's encoding module: ``encoding``, a layer's own spec (one module per
    distinct spec; the layer's dict then holds its config), or a module per layer for
    ``per_layer`` classes."""
    built: dict[str, Encoding] = {}
    out: list[Encoding] = []
    for i in range(num_layers):
        layer = None if layers is None else layers[i]
        spec = None if layer is None else layer.get("encoding")
        if layer is None or spec is None:
            enc = encoding
            if enc.per_layer and i > 0:  # its own module, the same config
                enc = make_encoding(encoding.to_config(), dims)
            out.append(enc)
            continue
        enc = _layer_spec_encoding(i, spec, dims)
        if not enc.per_layer:
            enc = built.setdefault(json.dumps(enc.to_config(), sort_keys=True), enc)
        layer["encoding"] = enc.to_config()
        out.append(enc)
    return out
