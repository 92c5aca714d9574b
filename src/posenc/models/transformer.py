"""A small pre-norm transformer that takes any encoding, for experiments and tests.

The encoding's kind decides where it plugs in: additive encodings are added to the
(scaled) token embeddings, rotary encodings rotate each layer's queries and keys, bias
encodings add their term to each layer's logits, and ``none`` adds nothing (NoPE). One
encoding module serves every layer, and each forward pass prepares it once
(:class:`posenc.attend.PreparedEncoding`): positions, rotary cos/sin and the bias (or
FlexAttention score_mod) are computed once and shared by the layers.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch
from torch import nn

from posenc import registry
from posenc._base import LOGIT_PROTOCOLS, Encoding, GatedEncoding, RotaryEncoding
from posenc._errors import (
    PosEncError,
    check_alloc,
    check_bool,
    check_float,
    check_int,
    check_positions,
)
from posenc.attend import PreparedEncoding
from posenc.models import layers as _layers
from posenc.models._blocks import Block, KVCache, cat_positions
from posenc.models._encodings import ModelDims, layer_encodings, make_encoding
from posenc.models._inputs import check_tokens, padding_mask

__all__ = ["MAX_LAYERS", "MAX_NEW_TOKENS", "KVCache", "TinyTransformer"]

# Bounds of the two Python loops over a user's size: layers built, tokens generated.
MAX_LAYERS = 1 << 12
MAX_NEW_TOKENS = 1 << 20


class TinyTransformer(nn.Module):
    """A pre-norm transformer language model (``causal=True``) or encoder (``causal=False``).

    How an encoding is built and shared across layers, the gates of a gated encoding, and
    the initialisation: ``docs/attention.md``.

    Args:
        vocab_size: number of token ids.
        dim: model width; must be divisible by ``num_heads``.
        num_layers, num_heads, mlp_ratio: depth, heads per layer, MLP width / ``dim``.
        encoding: a registry name, a config dict or an :class:`~posenc._base.Encoding`;
            names and configs are built by :func:`posenc.build` with the sizes the model
            knows (``dim``, ``head_dim``, ``num_heads``, ``max_len``, ``causal``).
        causal: causal self-attention (a decoder LM) or full (an encoder).
        dropout: dropout on embeddings, attention probabilities and residual branches.
        max_len: table length for encodings that need one (``"learned"``; CoPE's
            ``npos_max`` defaults to ``max_len + 1``, its paper's choice).
        tie_embeddings: the output projection shares the token embedding matrix.
        layers: per-layer settings, one dict per layer (or None: every layer alike): its
            ``"encoding"`` (a rotary, bias or ``"none"`` spec), ``"window"``, ``"qk_norm"``
            and ``"temperature"``; see :mod:`posenc.models.layers`, and
            :mod:`posenc.models.schedules` for the published schedules.

    Raises:
        PosEncError: a bad argument, naming it (sizes estimated before allocation).

    Shape:
        ``tokens [b, s]`` (int64), ``positions [s]`` or ``[b, s]`` -> logits ``[b, s, vocab]``.

    Examples:
        >>> import torch, posenc
        >>> model = posenc.models.TinyTransformer(11, dim=16, num_heads=2, encoding="sinusoidal")
        >>> model(torch.randint(0, 11, (2, 5))).shape
        torch.Size([2, 5, 11])
        >>> model.generate(torch.tensor([[1, 2, 3]]), 4).shape
        torch.Size([1, 7])
        >>> posenc.models.TinyTransformer.from_config(model.to_config()).to_config() == model.to_config()
        True
    """

    def __init__(
        self,
        vocab_size: int,
        *,
        dim: int = 128,
        num_layers: int = 2,
        num_heads: int = 4,
        encoding: str | Mapping[str, Any] | Encoding = "sinusoidal",
        causal: bool = True,
        mlp_ratio: int = 4,
        dropout: float = 0.0,
        max_len: int | None = None,
        tie_embeddings: bool = True,
        layers: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        self.vocab_size = check_int("vocab_size", vocab_size, min=1)
        self.dim = check_int("dim", dim, min=1)
        self.num_layers = check_int("num_layers", num_layers, min=1, max=MAX_LAYERS)
        self.num_heads = check_int("num_heads", num_heads, min=1)
        if self.dim % self.num_heads:
            raise PosEncError(f"dim must be divisible by num_heads ({num_heads}), got {dim}")
        self.mlp_ratio = check_int("mlp_ratio", mlp_ratio, min=1)
        self.dropout = check_float("dropout", dropout, min=0.0, max=1.0)
        if self.dropout == 1.0:
            raise PosEncError("dropout must be < 1, got 1.0")
        self.max_len = None if max_len is None else check_int("max_len", max_len, min=1)
        self._check_size()
        for name, flag in (("causal", causal), ("tie_embeddings", tie_embeddings)):
            if not isinstance(flag, bool):
                raise PosEncError(f"{name} must be a bool, got {flag!r}")
        self.causal, self.tie_embeddings = causal, tie_embeddings
        self.head_dim = self.dim // self.num_heads
        self._dims = ModelDims(self.dim, self.num_heads, self.max_len, self.causal)
        self.encoding = self._make_encoding(encoding)
        self.layers = self._check_layers(layers)
        per_layer = layer_encodings(self.encoding, self.layers, self.num_layers, self._dims)
        # Modules of the layers that do not use self.encoding (None when every layer does).
        self.layer_encodings = (
            nn.ModuleDict({str(i): m for i, m in enumerate(per_layer) if m is not self.encoding})
            or None
        )

        self.embed = nn.Embedding(self.vocab_size, self.dim)
        self.drop = nn.Dropout(self.dropout)
        self.blocks = nn.ModuleList(
            Block(
                self.dim,
                self.num_heads,
                self.mlp_ratio,
                self.dropout,
                gated=isinstance(enc, GatedEncoding),
                settings=None if self.layers is None else self.layers[i],
            )
            for i, enc in enumerate(per_layer)
        )
        self.norm = nn.LayerNorm(self.dim)
        self.head = None if tie_embeddings else nn.Linear(self.dim, self.vocab_size, bias=False)
        self._init_weights()

    def _check_layers(self, layers: Any) -> list[dict[str, Any]] | None:
        """``layers`` as a list of ``num_layers`` dicts with known keys (or None)."""
        if layers is None:
            return None
        if isinstance(layers, (str, bytes, Mapping)) or not isinstance(layers, Sequence):
            raise PosEncError(
                f"layers must be a list of one dict per layer (or None), got {layers!r}"
            )
        if len(layers) != self.num_layers:
            raise PosEncError(
                f"layers must hold one dict per layer ({self.num_layers}), got {len(layers)}"
            )
        return [_layers.check_layer(i, layer) for i, layer in enumerate(layers)]

    def drop_rotary(self) -> bool:
        """Replace every rotary encoding of the model (its own and the layers') by NoPE, in
        place: DroPE's drop (Gelberg et al., 2025), after which the model is trained on
        briefly. Returns whether there was one to drop; ``to_config`` says ``"none"`` after."""
        dropped = False
        if isinstance(self.encoding, RotaryEncoding):
            self.encoding, dropped = registry.build("none"), True
        if self.layer_encodings is not None:
            for key, enc in list(self.layer_encodings.items()):
                if isinstance(enc, RotaryEncoding):
                    self.layer_encodings[key] = registry.build("none")
                    dropped = True
        if self.layers is not None:
            for i, layer in enumerate(self.layers):
                if "encoding" in layer and self.layer_encoding(i).kind == "none":
                    layer["encoding"] = {"name": "none"}
        return dropped

    def layer_encoding(self, layer: int) -> Encoding:
        """The encoding module of layer ``layer``."""
        layer = check_int("layer", layer, min=0, max=self.num_layers - 1)
        if self.layer_encodings is not None and str(layer) in self.layer_encodings:
            return cast(Encoding, self.layer_encodings[str(layer)])
        return self.encoding

    def _make_encoding(self, spec: Any) -> Encoding:
        """Build (or check) an encoding module of this model."""
        return make_encoding(spec, self._dims)

    def _init_weights(self) -> None:
        nn.init.normal_(self.embed.weight, std=self.dim**-0.5)
        residual_std = 0.02 / math.sqrt(2 * self.num_layers)
        blocks = [cast(Block, block) for block in self.blocks]
        for block in blocks:
            if block.attn.forget is not None:  # as the FoX paper: std 0.02, zero bias
                nn.init.normal_(block.attn.forget.weight, std=0.02)
                nn.init.zeros_(block.attn.forget.bias)
            nn.init.normal_(block.attn.qkv.weight, std=0.02)
            nn.init.normal_(block.attn.proj.weight, std=residual_std)
            nn.init.normal_(block.fc.weight, std=0.02)
            nn.init.zeros_(block.fc.bias)
            nn.init.normal_(block.out.weight, std=residual_std)
            nn.init.zeros_(block.out.bias)
        if self.head is not None:
            nn.init.normal_(self.head.weight, std=0.02)

    # --- forward --------------------------------------------------------------

    def _check_size(self) -> None:
        """The parameters' bytes, estimated before any is allocated (one message per cause)."""
        d, per_layer = self.dim, (4 + 2 * self.mlp_ratio) * self.dim  # [per_layer, d] a layer
        check_alloc("dim", d, (6, d, d))
        check_alloc("mlp_ratio", self.mlp_ratio, (per_layer, d))
        check_alloc("vocab_size", self.vocab_size, (self.vocab_size, d))
        check_alloc("num_layers", self.num_layers, (self.num_layers, per_layer, d))

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        *,
        attn_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """Logits of every token.

        Args:
            tokens: token ids ``[b, s]``.
            positions: ``[s]`` or ``[b, s]``; None continues from the cache
                (``arange(s)`` without one, else the last cached position + 1 onwards).
                For left-padded batches pass ``posenc.positions.from_attention_mask(mask)``.
            attn_mask: ``[b, s]`` key padding of these tokens, bool or 0/1 (True / 1 = real
                token); kept in the cache for later calls.
            cache: a :class:`KVCache` (causal models only); the new keys, values,
                positions and padding are appended to it.

        Shape:
            ``tokens [b, s]`` -> ``[b, s, vocab_size]``.
        """
        tokens = check_tokens(tokens, self.vocab_size, self.embed.weight)
        b, s = tokens.shape
        device = tokens.device
        if cache is not None:
            if not isinstance(cache, KVCache):
                raise PosEncError(
                    f"cache must be a posenc.models.KVCache, got {type(cache).__name__}"
                )
            if not self.causal:
                raise PosEncError(
                    "cache needs a causal model (causal=True); this one is an encoder"
                )
            cache._check_call(
                b,
                num_layers=self.num_layers,
                num_heads=self.num_heads,
                head_dim=self.head_dim,
                device=device,
            )
        past = cache.positions if cache is not None else None
        if positions is None:
            start = (
                torch.zeros((), dtype=torch.long, device=device)
                if past is None
                else past[..., -1:] + 1
            )
            q_pos = start + torch.arange(s, device=device)  # [s] or [b, s]
        elif self.encoding.kind == "additive":  # validated (once) by the encoding, below
            q_pos = positions
        else:
            q_pos = check_positions("positions", positions, seq_len=s, batch=b).to(device)
        x = self.embed(tokens) * math.sqrt(self.dim)  # [b, s, dim]
        if self.encoding.kind == "additive":
            x = self.encoding(x, q_pos)
            q_pos = q_pos.to(device)
        k_pos = cat_positions(past, q_pos)
        mask = padding_mask(attn_mask, b, s, device)
        if cache is not None and cache.mask is not None:
            new = mask if mask is not None else torch.ones(b, s, dtype=torch.bool, device=device)
            mask = torch.cat([cache.mask, new], dim=1)  # [b, t + s]
        elif cache is not None and cache.length and mask is not None:
            mask = torch.cat(
                [torch.ones(b, cache.length, dtype=torch.bool, device=device), mask], dim=1
            )

        x = self.drop(x)
        # Positions (validated once, above), rotary cos/sin and the bias are computed once
        # here for every layer: the new tokens' queries against every key.
        prepared: dict[int, PreparedEncoding | None] = {}
        for i, block in enumerate(self.blocks):
            enc = self.layer_encoding(i)
            if id(enc) not in prepared:  # once per module, shared by its layers
                prepared[id(enc)] = self._prepare(enc, q_pos, k_pos)
            x = block(
                x,
                prepared[id(enc)],
                causal=self.causal,
                mask=mask,
                cache=cache,
                layer=i,
                q_pos=q_pos,
            )
        x = self.norm(x)
        if self.head is None:  # tied: rescaled as in T5, so init logits are near uniform
            logits = (x * self.dim**-0.5) @ self.embed.weight.T  # [b, s, vocab]
        else:
            logits = self.head(x)
        if cache is not None:
            cache.positions = k_pos
            cache.mask = mask
        return logits

    @staticmethod
    def _prepare(
        enc: Encoding, q_pos: torch.Tensor, k_pos: torch.Tensor
    ) -> PreparedEncoding | None:
        if isinstance(enc, RotaryEncoding):  # the new tokens, queries and keys alike
            return PreparedEncoding(enc, q_pos, q_pos)
        if isinstance(enc, LOGIT_PROTOCOLS):  # the new queries against every key
            return PreparedEncoding(enc, q_pos, k_pos)
        return None

    @torch.no_grad()
    def generate(
        self,
        tokens: torch.Tensor,
        max_new_tokens: int,
        *,
        attn_mask: torch.Tensor | None = None,
        use_cache: bool = True,
    ) -> torch.Tensor:
        """Greedy continuation of ``tokens`` by ``max_new_tokens`` tokens (causal models).

        With ``attn_mask`` (``[b, s]``, True / 1 = real token, for left-padded prompts)
        positions come from :func:`posenc.positions.from_attention_mask`. ``use_cache=False``
        recomputes the full sequence at every step (the reference the cache must equal).
        Dropout follows the module's mode: call ``model.eval()`` first.

        Shape:
            ``tokens [b, s]`` -> ``[b, s + max_new_tokens]``.
        """
        from posenc.positions import from_attention_mask

        if not self.causal:
            raise PosEncError("generate needs a causal model (causal=True); this one is an encoder")
        n = check_int("max_new_tokens", max_new_tokens, min=0, max=MAX_NEW_TOKENS)
        use_cache = check_bool("use_cache", use_cache)
        tokens = check_tokens(tokens, self.vocab_size, self.embed.weight)
        b, s = tokens.shape
        # the keys and values of every layer for every token, before the first step
        kv = (2 * self.num_layers * b * (s + n), self.dim)
        check_alloc("max_new_tokens", n, kv, self.embed.weight.dtype, tokens.device)
        mask = padding_mask(attn_mask, b, s, tokens.device)
        positions = None if mask is None else from_attention_mask(mask)
        out = tokens
        cache = KVCache() if use_cache else None
        logits = self(tokens, positions, attn_mask=mask, cache=cache)
        for step in range(n):
            nxt = logits[:, -1].argmax(dim=-1, keepdim=True)  # [b, 1]
            out = torch.cat([out, nxt], dim=1)
            if step == n - 1:
                break
            if use_cache:
                logits = self(nxt, cache=cache)
            else:
                if mask is not None:
                    mask = torch.cat([mask, torch.ones_like(nxt, dtype=torch.bool)], dim=1)
                    positions = from_attention_mask(mask)
                logits = self(out, positions, attn_mask=mask)
        return out

    # --- config ---------------------------------------------------------------

    def to_config(self) -> dict[str, Any]:
        """A JSON-serialisable dict; ``config["encoding"]`` is the encoding's config."""
        return {
            "vocab_size": self.vocab_size,
            "dim": self.dim,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "encoding": self.encoding.to_config(),
            "causal": self.causal,
            "mlp_ratio": self.mlp_ratio,
            "dropout": self.dropout,
            "max_len": self.max_len,
            "tie_embeddings": self.tie_embeddings,
            "layers": None if self.layers is None else [dict(layer) for layer in self.layers],
        }

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TinyTransformer:
        """A new model (fresh weights) from :meth:`to_config`'s dict."""
        if not isinstance(config, Mapping):
            raise PosEncError(f"config must be a dict, got {type(config).__name__}")
        allowed = set(inspect.signature(cls.__init__).parameters) - {"self"}
        unknown = sorted(set(config) - allowed)
        if unknown:
            raise PosEncError(f"config has unknown keys {unknown}; allowed: {sorted(allowed)}")
        if "vocab_size" not in config:
            raise PosEncError("config must hold 'vocab_size'")
        args = dict(config)
        return cls(args.pop("vocab_size"), **args)
