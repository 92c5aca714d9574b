"""The pieces of :class:`~posenc.models.TinyTransformer`: its :class:`KVCache` and one
pre-norm block (attention with the layer's settings, then an MLP).

A block's attention applies the layer's settings (:mod:`posenc.models.layers`) around
:func:`posenc.attention`: QK-norm before the rotation, the query temperature after it, the
sliding window as a ``[b|1, 1, q, k]`` mask, and a gated encoding's forget gates, computed
from the layer input and cached with the keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from posenc._base import RotaryEncoding
from posenc._errors import PosEncError
from posenc.attend import attention
from posenc.models import layers as _layers

__all__ = ["Attention", "Block", "KVCache", "cat_positions"]


class KVCache:
    """Keys and values of every layer, and the positions (and padding) of the tokens so far.

    Pass one to :meth:`TinyTransformer.forward` as ``cache=``: each call appends the new
    tokens' keys (rotary keys after their rotation), values, positions and padding. A
    fresh cache is empty; use a new one per sequence batch. A cache serves one model, one
    batch, one device and one dtype: a call that does not fit it (another batch size, number
    of layers or heads, head size, device or dtype) raises
    :class:`~posenc.PosEncError` naming ``cache`` before anything is appended.

    Attributes:
        keys, values: per layer ``[b, h, t, d]``.
        gates: per layer with a gated encoding (``"fox"``), its log forget gates ``[b, h, t]``.
        positions: ``[t]`` or ``[b, t]`` positions of the cached tokens (None when empty).
        mask: ``[b, t]`` bool, True for real tokens, or None when no padding was given.
    """

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.gates: dict[int, torch.Tensor] = {}
        self.positions: torch.Tensor | None = None
        self.mask: torch.Tensor | None = None

    @property
    def length(self) -> int:
        """Number of cached tokens."""
        return 0 if self.positions is None else int(self.positions.shape[-1])

    def _check_call(
        self, batch: int, *, num_layers: int, num_heads: int, head_dim: int, device: torch.device
    ) -> None:
        """Raise unless a call of a model with ``num_layers`` layers of ``num_heads`` heads of
        ``head_dim`` channels on ``batch`` sequences on ``device`` may append to this cache
        (metadata only: no device sync)."""
        if not self.keys and self.positions is None and self.mask is None and not self.gates:
            return  # empty: any call fills it
        if self.positions is None or len(self.keys) != num_layers:
            raise PosEncError(
                f"cache holds keys of {len(self.keys)} layers and "
                f"{'no' if self.positions is None else self.length} positions; this model has "
                f"num_layers={num_layers} (a cache serves one model: use a new KVCache)"
            )
        keys = self.keys[0]
        if keys.ndim != 4 or keys.shape[2] != self.length:
            raise PosEncError(
                f"cache keys must be [b, h, t, d] with t = {self.length} cached positions, got "
                f"shape {tuple(keys.shape)} (use a new KVCache)"
            )
        b, h, _, d = keys.shape
        if b != batch:
            raise PosEncError(
                f"cache holds a batch of {b} sequences; tokens has batch size {batch} "
                f"(use a new KVCache per batch)"
            )
        if (h, d) != (num_heads, head_dim):
            raise PosEncError(
                f"cache holds keys of {h} heads of {d} channels; this model has "
                f"num_heads={num_heads}, head_dim={head_dim} (use a new KVCache)"
            )
        if keys.device != device:
            raise PosEncError(f"cache is on {keys.device}; tokens are on {device}")
        p, m = self.positions, self.mask
        if p.ndim == 2 and p.shape[0] not in (1, batch):
            raise PosEncError(
                f"cache positions have batch size {p.shape[0]}; tokens has batch size {batch}"
            )
        if m is not None and tuple(m.shape) != (batch, self.length):
            raise PosEncError(
                f"cache mask must be [b, t] = [{batch}, {self.length}], got shape "
                f"{tuple(m.shape)} (use a new KVCache per batch)"
            )

    def _update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this layer's new keys/values and return all of them."""
        if layer < len(self.keys) and self.keys[layer].dtype != k.dtype:
            raise PosEncError(
                f"cache holds keys of dtype {self.keys[layer].dtype}; this call's keys are "
                f"{k.dtype} (a cache serves one dtype: use a new KVCache)"
            )
        if layer == len(self.keys):
            self.keys.append(k)
            self.values.append(v)
        else:
            self.keys[layer] = torch.cat([self.keys[layer], k], dim=2)  # [b, h, t + s, d]
            self.values[layer] = torch.cat([self.values[layer], v], dim=2)
        return self.keys[layer], self.values[layer]

    def _update_gates(self, layer: int, gates: torch.Tensor) -> torch.Tensor:
        """Append this layer's new log forget gates ``[b, h, s]`` (gated encodings)."""
        if layer in self.gates:
            gates = torch.cat([self.gates[layer], gates], dim=-1)
        self.gates[layer] = gates
        return gates


def cat_positions(old: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """``old [t] | [b, t]`` followed by ``new [s] | [b, s]`` (1-D stays 1-D)."""
    if old is None:
        return new
    dtype = torch.promote_types(old.dtype, new.dtype)
    if old.ndim == new.ndim == 1:
        return torch.cat([old.to(dtype), new.to(dtype)])
    b = max(p.shape[0] if p.ndim == 2 else 1 for p in (old, new))
    return torch.cat([old.to(dtype).expand(b, -1), new.to(dtype).expand(b, -1)], dim=-1)


class Attention(nn.Module):
    def __init__(
        self,
        dim: int,
        num_heads: int,
        dropout: float,
        *,
        gated: bool = False,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.dropout = num_heads, dim // num_heads, dropout
        settings = settings or {}
        self.window: int | None = settings.get("window")
        self.temperature: dict[str, Any] | None = settings.get("temperature")
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        # A gated encoding's per-token gates (FoX: the forget gate logits, one per head).
        self.forget = nn.Linear(dim, num_heads) if gated else None
        qk_norm = settings.get("qk_norm", False)
        self.q_norm = nn.RMSNorm(self.head_dim) if qk_norm else None
        self.k_norm = nn.RMSNorm(self.head_dim) if qk_norm else None
        t = self.temperature
        ssmax = t is not None and t["type"] == "ssmax"
        init = t["init"] if t is not None and ssmax else 0.0
        self.ssmax = nn.Parameter(torch.full((num_heads,), init)) if ssmax else None

    def _keep(self, mask, b: int, s: int, k_len: int, causal: bool, device):
        """The key padding ``mask [b, k]`` with this layer's window: ``[b|1, 1, s, k]``."""
        if self.window is None:
            return mask
        near = _layers.window_keep(s, k_len, self.window, causal=causal, device=device)
        keep = near[None, None]  # [1, 1, s, k]
        return keep if mask is None else keep & mask[:, None, None, :]

    def _temper(self, q, q_pos, keep, causal: bool, k_len: int):
        """``q`` times this layer's temperature (Llama 4's, or SSMax's ``s log n``)."""
        t = self.temperature
        if t is None:
            return q
        if t["type"] == "llama4":
            scale = _layers.llama4_temperature_at(
                q_pos, floor_scale=t["floor_scale"], attn_scale=t["attn_scale"]
            )  # [s] or [b, s]
            scale = scale[None, None, :, None] if scale.ndim == 1 else scale[:, None, :, None]
            return q * scale.to(q.dtype)
        keep4 = keep if keep is None or keep.ndim == 4 else keep[:, None, None, :]
        counts = _layers.allowed_counts(keep4, causal, q.shape[2], k_len)
        s = cast(torch.Tensor, self.ssmax)  # set for "ssmax"
        return q * _layers.ssmax_factor(s, counts.to(q.device)).to(q.dtype)

    def forward(self, x, encoding, *, causal, mask, cache, layer, q_pos=None):
        """``encoding``: this layer's PreparedEncoding (rotary: the new tokens' positions;
        bias: the queries' and all keys'), or None. ``mask``: ``[b, t + s]`` key padding;
        ``q_pos``: the new tokens' positions (Llama 4's temperature reads them)."""
        b, s, dim = x.shape
        qkv = self.qkv(x).split(dim, dim=-1)  # views; unbind's backward would copy twice
        q, k, v = (t.view(b, s, self.num_heads, self.head_dim).transpose(1, 2) for t in qkv)
        if self.q_norm is not None and self.k_norm is not None:  # per head, before rotating
            q, k = self.q_norm(q), self.k_norm(k)
        bias, gates = None, None
        if encoding is not None and isinstance(encoding.encoding, RotaryEncoding):
            q, k = encoding.rotate(q, k)  # keys cached after rotation
        else:
            bias = encoding
        if self.forget is not None:
            # log sigmoid in float32 (as the FoX paper); padding forgets nothing
            gates = F.logsigmoid(self.forget(x).float()).transpose(1, 2)  # [b, h, s]
            if mask is not None:
                gates = gates.masked_fill(~mask[:, None, -s:], 0.0)
        if cache is not None:
            k, v = cache._update(layer, k, v)  # [b, h, t + s, d]
            if gates is not None:
                gates = cache._update_gates(layer, gates)  # [b, h, t + s]
        keep = self._keep(mask, b, s, k.shape[2], causal, x.device)
        q = self._temper(q, q_pos, keep, causal, k.shape[2])
        out = attention(
            q,
            k,
            v,
            encoding=bias,
            causal=causal,
            attn_mask=keep,
            dropout_p=self.dropout if self.training else 0.0,
            gates=gates,
        )
        return self.proj(out.transpose(1, 2).reshape(b, s, dim))  # [b, s, dim]


class Block(nn.Module):
    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: int,
        dropout: float,
        *,
        gated: bool = False,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads, dropout, gated=gated, settings=settings)
        self.norm2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, mlp_ratio * dim)
        self.out = nn.Linear(mlp_ratio * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, encoding, **kw):
        x = x + self.drop(self.attn(self.norm1(x), encoding, **kw))
        return x + self.drop(self.out(F.gelu(self.fc(self.norm2(x)))))
