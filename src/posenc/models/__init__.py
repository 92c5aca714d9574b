"""Models that take any encoding: :class:`TinyTransformer` and its :class:`KVCache`."""

from posenc.models.transformer import KVCache, TinyTransformer

__all__ = ["KVCache", "TinyTransformer"]
