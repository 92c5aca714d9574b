"""Self-Extend and STRING inside a patched transformers model (``patch(model, scaling={"type":
"self_extend", ...})``), on the layers where a position map means something.

A position map (:mod:`posenc.remap`) rotates each (query, key) pair at positions chosen by
its offset, so q and k cannot be rotated before attention. Each remapped layer gets a
``forward`` rebuilt over a second copy of its modeling module's globals
(:func:`remapped_module`) where the family's apply function(s) hand q and k on unrotated
(DeepSeek-V3's interleaved one only de-interleaves) and ``ALL_ATTENTION_FUNCTIONS`` /
``eager_attention_forward`` give :func:`remapped_attention_forward`: it rotates them per
branch with the layer type's cos/sin from the patch's
:class:`~._hf_patch_rotary.PatchedRotaryEmbedding`, through
:func:`posenc.remap.remapped_attention_at`. The KV cache of such a layer holds unrotated
keys, so a ``DynamicCache`` works as it is.

Remapped layers (:func:`remapped_layers`): the RoPE-carrying attention layers of layer type
``None`` or ``"full_attention"``. Sliding-window and chunked layers keep posenc's plain
rotation, and so do NoPE layers (SmolLM3's every fourth layer: only its RoPE layers are
remapped). A model with no such layer is refused by name: Cohere 2, EXAONE 4 with its
sliding pattern and Llama 4 with chunked attention (their full-attention layers are NoPE),
Kimi Linear (MLA without RoPE). M-RoPE families are refused (a map moves one position per
token) and so are position-dependent frequency scalings (q and k would get different ones).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from posenc._base import PositionMap
from posenc._errors import PosEncError, describe
from posenc.integrations._hf_forward import forward_chain, globals_copy, rebuild_forward
from posenc.integrations._hf_patch_applies import COMPLEX, ONE_TENSOR, WITH_POSITION_IDS
from posenc.integrations._hf_patch_families import (
    INTERLEAVE_APPLY,
    NO_POSITION_IDS,
    NOPE_FULL_ATTENTION,
    NOPE_MODELS,
    TRAILING_ROTARY,
    Family,
)
from posenc.integrations._hf_patch_rotary import PatchedRotaryEmbedding
from posenc.integrations._hf_query_scale import rope_layers
from posenc.remap import MAP_TYPES, remapped_attention_at
from posenc.remap.maps import coerce
from posenc.rotary.kernels import fused_rotary
from posenc.rotary.module import RotaryEmbedding

__all__ = [
    "STATE_ATTR",
    "check_remappable",
    "remap_entries",
    "remapped_attention_forward",
    "remapped_layers",
    "remapped_module",
    "split_scaling",
]

STATE_ATTR = "_posenc_remap"  # the attention layer's LayerRemap (in its __dict__)


def split_scaling(scaling: Any) -> tuple[PositionMap | None, Any]:
    """``(the position map, the frequency scaling)`` of ``patch``'s ``scaling=``: a map (or
    its dict, ``"type"`` in :data:`~posenc.remap.MAP_TYPES`, with an optional nested
    ``"scaling"``), or ``(None, scaling)``."""
    if isinstance(scaling, PositionMap):
        return scaling, None
    if not isinstance(scaling, Mapping):
        return None, scaling
    if scaling.get("type") not in MAP_TYPES:
        nested = [
            k for k, v in scaling.items() if isinstance(v, Mapping) and v.get("type") in MAP_TYPES
        ]
        if nested:
            raise PosEncError(
                f"scaling is invalid: a position map applies to every remapped layer; give it "
                f"at the top level, not under {nested[0]!r}"
            )
        return None, scaling
    spec = {k: v for k, v in scaling.items() if k != "scaling"}
    try:
        return coerce(spec, "scaling"), scaling.get("scaling")
    except PosEncError as error:
        raise PosEncError(f"scaling is invalid: {error}") from None


def _nope_refusal(model_type: str, pmap: PositionMap) -> PosEncError:
    kind = pmap.to_config()["type"]
    return PosEncError(
        f"model_type {model_type!r}: its full-attention layers have no RoPE (NoPE); {kind} "
        f"remaps RoPE positions only"
    )


def _context_factor(nested: Any) -> float:
    """The context factor of the frequency scaling given with a map (its ``factor``, that of
    its ``full_attention`` entry in the per-layer-type form; 1 without one)."""
    if isinstance(nested, Mapping) and "factor" not in nested:
        nested = nested.get("full_attention", nested.get(None))
    factor = (
        nested.get("factor") if isinstance(nested, Mapping) else getattr(nested, "factor", None)
    )
    if isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor > 1:
        return float(factor)
    return 1.0


def check_remappable(config: Any, model_type: str, pmap: PositionMap, nested: Any = None) -> None:
    """Refuse, before the family is looked up, a model a map cannot serve by its kind. A
    map's windows must lie within the trained context, ``max_position_embeddings`` times
    the factor of the frequency scaling given with it (STRING past L with YaRN)."""
    if model_type in NOPE_MODELS:
        raise _nope_refusal(model_type, pmap)
    trained: Any = getattr(config, "max_position_embeddings", None)
    factor = _context_factor(nested)
    if isinstance(trained, int) and not isinstance(trained, bool) and factor > 1:
        trained = int(trained * factor)
    try:
        pmap.check_trained(trained)
    except PosEncError as error:
        scaled = f" x the scaling's factor {factor:g}" if factor > 1 else ""
        raise PosEncError(
            f"scaling is invalid: {error} (model_type {model_type!r}: "
            f"max_position_embeddings{scaled})"
        ) from None


def _layer_kinds(config: Any, layers: int) -> list[str | None]:
    """Each layer's attention type: ``config.layer_types``, else ``"sliding_attention"`` for
    every layer of a model with a ``sliding_window`` (Mistral's form), else ``None``."""
    kinds = getattr(config, "layer_types", None)
    if isinstance(kinds, (list, tuple)) and len(kinds) >= layers:
        return list(kinds[:layers])
    if getattr(config, "sliding_window", None):  # their attention passes it to every layer
        return ["sliding_attention"] * layers
    return [None] * layers


def remapped_layers(config: Any, model_type: str, pmap: PositionMap) -> list[bool]:
    """Per layer: whether ``pmap`` remaps it (it rotates, and its type is ``None`` or
    ``"full_attention"``); refused by name where none is."""
    layers = int(config.num_hidden_layers)
    kinds, rotates = _layer_kinds(config, layers), rope_layers(config)
    rule = NOPE_FULL_ATTENTION.get(model_type)
    if rule == "always" or (rule and getattr(config, "sliding_window", None) is not None):
        rotates = [r and kind == "sliding_attention" for r, kind in zip(rotates, kinds)]
    full = [kind in (None, "full_attention") for kind in kinds]
    remapped = [r and f for r, f in zip(rotates, full)]
    if any(remapped):
        if model_type in NO_POSITION_IDS:
            raise PosEncError(
                f"model_type {model_type!r}: its attention is not handed position_ids; a "
                f"position map needs each query's position"
            )
        return remapped
    if any(full):
        raise _nope_refusal(model_type, pmap)
    raise PosEncError(
        f"model_type {model_type!r}: every RoPE layer uses sliding-window or chunked attention "
        f"(layer types {sorted(set(map(str, kinds)))}); {pmap.to_config()['type']} remaps "
        f"full-attention layers only"
    )


def _check_ropes(model_type: str, ropes: list[RotaryEmbedding]) -> None:
    """Refuse the rotary modules of remapped layers a map cannot use."""
    for rope in ropes:
        if rope.position_coords is not None:
            raise PosEncError(
                f"model_type {model_type!r}: its RoPE is M-RoPE ({rope.position_coords}-D "
                f"positions); a position map moves one position per token"
            )
        if rope.scaling is not None and rope.scaling.position_dependent:
            raise PosEncError(
                f"scaling is invalid: a position map needs frequencies fixed for a call; "
                f"{type(rope.scaling).__name__} picks them from the largest position "
                f"(model_type {model_type!r})"
            )


# --- the second copy of the modeling module -------------------------------------------------


def _pass_through(pairing: Any, params: tuple[str, ...]) -> Callable[..., Any]:
    """An apply function of parameters ``params`` that rotates nothing (DeepSeek-V3's
    interleaved one de-interleaves q and k, as posenc's stand-in does before rotating)."""
    if params == ONE_TENSOR:
        return lambda tensor, sin, cos: tensor
    if params == COMPLEX:
        return lambda xq, xk, freqs_cis: (xq, xk)

    def order(x: torch.Tensor) -> torch.Tensor:
        if pairing != "deinterleave":
            return x
        return x.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)

    if params == WITH_POSITION_IDS:
        return lambda q, k, cos, sin, position_ids=None, unsqueeze_dim=1: (order(q), order(k))
    return lambda q, k, cos, sin, unsqueeze_dim=1: (order(q), order(k))


class _Interface:
    """``ALL_ATTENTION_FUNCTIONS`` of a remapped layer: every name gives posenc's function."""

    def get_interface(self, name: Any, default: Any = None) -> Any:
        return remapped_attention_forward

    def __getitem__(self, name: Any) -> Any:
        return remapped_attention_forward


def remapped_module(modeling: types.ModuleType, family: Family) -> types.ModuleType:
    """The globals of remapped layers' forwards: a copy of ``modeling``'s dict with the apply
    functions passing q and k through and attention by :func:`remapped_attention_forward`;
    made once per modeling module, kept in ``sys.modules`` (apart from patch's own copy)."""

    def replaced() -> dict[str, Any]:
        out: dict[str, Any] = {name: _pass_through(*how) for name, how in family.applies.items()}
        out["ALL_ATTENTION_FUNCTIONS"] = _Interface()
        out["eager_attention_forward"] = remapped_attention_forward
        return out

    return globals_copy(modeling, "posenc.integrations._hf_remapped", replaced)


# --- one layer's rotation ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LayerRemap:
    """What a remapped layer's attention needs: the patch's rotary module and the key of its
    layer type there, the pairing of the channels and where they sit, and the map."""

    rotary: PatchedRotaryEmbedding
    rope_key: str | None
    layout: str
    trailing: bool
    position_map: PositionMap

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``x [b, heads, s, d]`` rotated at ``positions [s]`` (int64 or float64), with the
        cos/sin the patched rotary module returns (float64 for a float64 ``x``)."""
        out = self.rotary(x, positions[None], self.rope_key)
        if self.rotary.output == "complex":
            cos, sin = out.real.contiguous(), out.imag.contiguous()
        else:
            cos, sin = out if self.rotary.output == "cos_sin" else out[::-1]
        if not self.trailing:
            return fused_rotary(x, None, cos, sin, layout=self.layout, seq_dim=-2)[0]
        r = 2 * cos.shape[-1]
        rotated = fused_rotary(x[..., -r:], None, cos, sin, layout=self.layout, seq_dim=-2)[0]
        return torch.cat((x[..., :-r], rotated), dim=-1)


def _layout(config: Any, family: Family) -> str:
    """The pairing a layer's attention rotates in: that of the apply function it calls
    (DeepSeek-V3's interleaved one: half pairs after its de-interleave)."""
    if INTERLEAVE_APPLY in family.applies and getattr(config, "rope_interleave", False):
        return "half"
    pairing = family.applies[next(n for n in family.applies if n != INTERLEAVE_APPLY)][0]
    return str(pairing)


def remap_entries(
    target: Any,
    config: Any,
    rotary: list[PatchedRotaryEmbedding],
    attention: list[tuple[nn.Module, str, Any, Any]],
    pmap: PositionMap,
) -> list[tuple[nn.Module, str, Any, Any]]:
    """``attention`` (patch's ``(layer, attribute, forward, before)`` entries) with each
    remapped layer's forward rebuilt over :func:`remapped_module` and its
    :class:`LayerRemap` as one more entry; nothing is changed yet. ``target``: patch's
    ``model_type``, ``family`` and ``modeling`` module of the model."""
    model_type, family, modeling = target.model_type, target.family, target.modeling
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in (None, "eager", "sdpa"):
        raise PosEncError(
            f"model_type {model_type!r}: attn_implementation must be 'eager' or 'sdpa' for a "
            f"position map (the masks it reads), got {implementation!r}"
        )
    ropes = rotary[0].ropes if len(rotary) == 1 else None
    if ropes is None:
        raise PosEncError(
            f"model_type {model_type!r}: found {len(rotary)} text rotary modules; a position "
            f"map needs one"
        )
    remapped = remapped_layers(config, model_type, pmap)
    kinds = _layer_kinds(config, len(remapped))
    keys = [kind if kind in ropes else None for kind in kinds]
    _check_ropes(model_type, [ropes[key] for key, r in zip(keys, remapped) if r])
    globals_ = vars(remapped_module(modeling, family))
    forwards: dict[type, Any] = {}
    out: list[tuple[nn.Module, str, Any, Any]] = []
    for layer, attr, forward, before in attention:
        index = getattr(layer, "layer_idx", None)
        if not isinstance(index, int) or not 0 <= index < len(remapped):
            raise PosEncError(
                f"model_type {model_type!r}: {type(layer).__name__} has no layer_idx in "
                f"[0, {len(remapped)}) (got {index!r}); a position map needs it"
            )
        if not remapped[index]:
            out.append((layer, attr, forward, before))
            continue
        cls = type(layer)
        if cls not in forwards:
            chain = forward_chain(cls, vars(modeling))
            forwards[cls] = rebuild_forward(chain or [], globals_, model_type)
        state = LayerRemap(
            rotary[0], keys[index], _layout(config, family), model_type in TRAILING_ROTARY, pmap
        )
        out.append((layer, attr, types.MethodType(forwards[cls], layer), before))
        out.append((layer, STATE_ATTR, state, layer.__dict__.get(STATE_ATTR)))
    return out


# --- the attention function -----------------------------------------------------------------


def _query_positions(position_ids: Any, sq: int, sk: int, device: torch.device) -> torch.Tensor:
    """``arange(sk - sq, sk)``, checked against the model's ``position_ids``."""
    expected = torch.arange(sk - sq, sk, device=device)
    ids = position_ids
    if isinstance(ids, torch.Tensor) and ids.ndim == 1:
        ids = ids[None]
    if not isinstance(ids, torch.Tensor) or ids.ndim != 2 or ids.shape[-1] != sq:
        raise PosEncError(
            f"position_ids must be [b, {sq}] on a remapped layer, got {describe(position_ids)}"
        )
    if not torch.equal(ids.to(device), expected.expand_as(ids)):
        first = int(ids[:, 0].min()) if ids.shape[0] else 0
        raise PosEncError(
            f"position_ids must be arange({sk - sq}, {sk}) in every row on a remapped layer "
            f"(no left padding or packing, a KV cache holding every position from 0), got a "
            f"row starting at {first}"
        )
    return expected


def _keep(mask: Any, sq: int, sk: int) -> torch.Tensor | None:
    """transformers' 4-D mask (bool, or additive 0 / -inf / finfo.min) as posenc's keep."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.ndim != 4 or tuple(mask.shape[2:]) != (sq, sk):
        raise PosEncError(
            f"attention_mask must be None or a 4-D mask [b, 1, {sq}, {sk}] (attn_implementation "
            f"'eager' or 'sdpa') on a remapped layer, got {describe(mask)}"
        )
    if mask.dtype == torch.bool:
        return mask
    if not mask.is_floating_point():
        raise PosEncError(f"attention_mask must be bool or floating, got {mask.dtype}")
    other = (mask != 0) & (mask > torch.finfo(mask.dtype).min)
    if bool(other.any()):
        raise PosEncError(
            f"attention_mask must hold 0 (attend) and -inf or finfo.min (hidden) only on a "
            f"remapped layer, got {float(mask[other][0])}"
        )
    return mask == 0


def remapped_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function call on a remapped layer: ``query [b, h, sq, d]``,
    ``key``, ``value [b, h_kv, sk, d]`` unrotated (keys from position 0) -> ``([b, sq, h,
    d_v]`` contiguous, ``None)``. Queries sit at ``arange(sk - sq, sk)`` (checked against
    ``position_ids``), keys at ``arange(sk)``.

    Raises:
        PosEncError: the layer is not remapped, a sliding window, attention sinks, dropout
            in training, other positions, or a mask that is not 4-D (bool or 0 / -inf).
    """
    state = module.__dict__.get(STATE_ATTR)
    if not isinstance(state, LayerRemap):
        raise PosEncError(f"{type(module).__name__} is not remapped by patch (no position map)")
    if sliding_window is not None:
        raise PosEncError(
            f"sliding_window must be None on a remapped layer, got {sliding_window!r}"
        )
    if getattr(module, "sinks", None) is not None or kwargs.get("s_aux") is not None:
        raise PosEncError("sinks: attention sinks are not supported on a remapped layer")
    if dropout and module.training:
        raise PosEncError(f"dropout must be 0 in training on a remapped layer, got {dropout!r}")
    sq, sk = query.shape[-2], key.shape[-2]
    q_positions = _query_positions(kwargs.get("position_ids"), sq, sk, query.device)
    out = remapped_attention_at(
        query,
        key,
        value,
        rotate=state.rotate,
        position_map=state.position_map,
        q_positions=q_positions,
        k_positions=torch.arange(sk, device=query.device),
        scale=scaling,
        softcap=softcap,
        keep=_keep(attention_mask, sq, sk),
    )
    return out.transpose(1, 2).contiguous(), None
