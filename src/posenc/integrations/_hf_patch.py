"""``patch(model)`` / ``unpatch(model)``: posenc's RoPE inside a loaded transformers model.

:func:`patch` replaces, in one model (never in the process), the two places where a
transformers decoder computes RoPE: its rotary module(s) (``model.model.rotary_emb``) by a
:class:`PatchedRotaryEmbedding` whose ``(cos, sin)`` are those of posenc's
:class:`posenc.RotaryEmbedding` from ``rotary_from_config`` (float64 angles reduced to
``[-pi, pi)`` before rounding, times YaRN's / LongRoPE's attention factor as transformers
applies it, ``[b, s, rotary_dim / 2]`` in float32 whatever the model's dtype), and the apply
step of every attention layer: each attention instance gets a ``forward`` of its own, a copy
of its class's (decorators rebuilt around the copy) whose globals are a copy of its modeling
module's with ``apply_rotary_pos_emb`` (DeepSeek-V3: ``apply_rotary_pos_emb_interleave``
too) replaced by posenc's fused rotation (:func:`posenc.rotary.kernels.fused_rotary`).
The class, the modeling module and every other model are untouched; :func:`unpatch` puts
back exactly what was there (module tree, ``state_dict`` and outputs as before).
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any, Literal, cast

import torch
from torch import nn

from posenc._errors import PosEncError
from posenc.integrations import _hf_families as _families
from posenc.integrations._hf_config import rotary_from_config
from posenc.integrations._hf_forward import forward_chain, rebuild_forward
from posenc.integrations._hf_reader import rope_layer_types
from posenc.rotary.frequencies import Scaling, parse_scaling
from posenc.rotary.kernels import fused_rotary
from posenc.rotary.layout import Layout
from posenc.rotary.module import RotaryEmbedding

__all__ = ["PATCHABLE_FAMILIES", "PatchedRotaryEmbedding", "patch", "unpatch"]

# The pairing of an apply function: a layout, or DeepSeek-V3's de-interleaving (interleaved
# pairs rotated in the half layout, the output left de-interleaved).
_Pairing = Layout | Literal["deinterleave"]
_STANDARD = ("q", "k", "cos", "sin", "unsqueeze_dim")
_WITH_POSITION_IDS = ("q", "k", "cos", "sin", "position_ids", "unsqueeze_dim")
# The apply function the attention of a rope_interleave family (DeepSeek-V3) calls when
# config.rope_interleave is true, instead of apply_rotary_pos_emb.
_INTERLEAVE_APPLY = "apply_rotary_pos_emb_interleave"


@dataclasses.dataclass(frozen=True)
class _Family:
    """A family's modeling module (``transformers.models.<module>``) and, per apply function
    its attention calls, that function's pairing and parameters (checked when patching)."""

    module: str
    applies: Mapping[str, tuple[_Pairing, tuple[str, ...]]]


def _family(model_type: str, module: str | None = None) -> _Family:
    """The apply functions of a family (whose modeling module is ``module``, default its
    ``model_type``): ``apply_rotary_pos_emb`` pairs as the family's attention does without
    ``rope_interleave`` (:func:`~._hf_families.layout_of`: Cohere and GLM interleaved, ...),
    and a ``rope_interleave`` family also has :data:`_INTERLEAVE_APPLY`."""
    applies: dict[str, tuple[_Pairing, tuple[str, ...]]] = {
        "apply_rotary_pos_emb": (_families.layout_of(model_type, False), _STANDARD)
    }
    if model_type in _families.ROPE_INTERLEAVE_DEFAULT:
        applies[_INTERLEAVE_APPLY] = ("deinterleave", _WITH_POSITION_IDS)
    return _Family(module or model_type, applies)


# The families whose attention and apply functions have been checked against posenc's
# (tests/integrations/test_hf_patch.py builds a tiny model of each), by model_type.
_PATCHABLE = (
    "llama mistral ministral mixtral qwen2 qwen2_moe qwen3 qwen3_moe gemma gemma2 phi phi3 "
    "gpt_neox olmo olmo2 olmo3 olmoe granite granitemoe stablelm starcoder2 smollm3 arcee "
    "exaone4 seed_oss cohere cohere2 glm glm4 deepseek_v3"
).split()
_FAMILIES: dict[str, _Family] = {
    **{t: _family(t) for t in _PATCHABLE},
    "gemma3_text": _family("gemma3_text", "gemma3"),
}

PATCHABLE_FAMILIES: tuple[str, ...] = tuple(sorted(_FAMILIES))
"""The ``model_type`` values :func:`patch` accepts (those of the text config)."""

# Families refused with a reason more specific than "not supported" (facts of transformers).
_REFUSED = {
    **dict.fromkeys(
        ("qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text"),
        "its M-RoPE sections are applied inside its own apply function",
    ),
    "deepseek_v2": "its attention rotates with complex freqs_cis (apply_rotary_emb)",
    "llama4": "its attention rotates with complex freqs_cis (apply_rotary_emb)",
    **dict.fromkeys(("gpt2", "bert"), "it has no rotary embedding (learned positions)"),
}

_PATCH_ATTR = "_posenc_patch"
_SEQ_DIMS = {1: -2, 2: -3}  # transformers' unsqueeze_dim -> posenc's seq_dim


# --- the replacements -------------------------------------------------------------------------


class PatchedRotaryEmbedding(nn.Module):
    """The rotary module :func:`patch` puts in a transformers model: ``forward(x,
    position_ids, layer_type=None)`` returns posenc's ``(cos, sin)``.

    Shape: ``x`` any (only its dtype is read: float64 gives float64 cos/sin, anything else
    float32), ``position_ids [b, s]`` -> ``cos, sin [b, s, rotary_dim / 2]`` (one value per
    frequency, what posenc's apply takes; not transformers' ``[b, s, head_dim]``).

    Attributes:
        ropes: the :class:`posenc.RotaryEmbedding` of each layer type (``None``: the one of
            a model with one set of RoPE parameters).
        original: the module it replaced (put back by :func:`unpatch`); a submodule, so
            ``model.to(...)`` moves it too. Neither enters ``state_dict`` (no parameters,
            transformers' rotary buffers are not persistent).
    """

    def __init__(self, ropes: Mapping[str | None, RotaryEmbedding], original: nn.Module) -> None:
        super().__init__()
        self.original = original
        self._names = {key: f"rope_{i}" for i, key in enumerate(ropes)}
        for key, rope in ropes.items():
            self.add_module(self._names[key], rope)

    @property
    def ropes(self) -> dict[str | None, RotaryEmbedding]:
        return {key: getattr(self, name) for key, name in self._names.items()}

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        name = self._names.get(layer_type)
        if name is None:
            raise PosEncError(
                f"layer_type must be one of {list(self._names)} for this model, got {layer_type!r}"
            )
        rope: RotaryEmbedding = getattr(self, name)
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        return rope.cos_sin(position_ids, dtype=dtype)


def _make_apply(pairing: _Pairing, params: tuple[str, ...]) -> Callable[..., Any]:
    """posenc's stand-in for one of transformers' apply functions: ``(q, k, cos, sin)`` with
    ``q: [b, hq, s, d]``, ``k: [b, hk, s, d]`` (``unsqueeze_dim=2``: ``[b, s, h, d]``) and
    cos/sin from :class:`PatchedRotaryEmbedding`; the first ``2 * cos.shape[-1]`` channels
    rotate, the rest pass through (GPT-NeoX, Phi-3, GLM-4 partial rotary)."""
    layout: Layout = "half" if pairing == "deinterleave" else pairing

    def rotate(
        q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        seq_dim = _SEQ_DIMS.get(unsqueeze_dim)
        if seq_dim is None:
            raise PosEncError(f"unsqueeze_dim must be 1 or 2, got {unsqueeze_dim!r}")
        if pairing == "deinterleave":  # (x0, x1), (x2, x3), ... -> x0, x2, ..., x1, x3, ...
            q = q.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)
            k = k.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)
        if q.dtype != k.dtype:  # one pass each (the fused pass takes one dtype)
            q_out = fused_rotary(q, None, cos, sin, layout=layout, seq_dim=seq_dim)[0]
            k_out = fused_rotary(k, None, cos, sin, layout=layout, seq_dim=seq_dim)[0]
            return q_out, k_out
        q_out, k_both = fused_rotary(q, k, cos, sin, layout=layout, seq_dim=seq_dim)
        return q_out, cast(torch.Tensor, k_both)  # k was given, so k_both is a tensor

    if params == _WITH_POSITION_IDS:

        def apply_with_position_ids(
            q: torch.Tensor,
            k: torch.Tensor,
            cos: torch.Tensor,
            sin: torch.Tensor,
            position_ids: Any = None,
            unsqueeze_dim: int = 1,
        ) -> tuple[torch.Tensor, torch.Tensor]:
            return rotate(q, k, cos, sin, unsqueeze_dim)

        return apply_with_position_ids

    def apply(
        q: torch.Tensor,
        k: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        unsqueeze_dim: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return rotate(q, k, cos, sin, unsqueeze_dim)

    return apply


# --- patch / unpatch --------------------------------------------------------------------------


@dataclasses.dataclass
class _Record:
    """What :func:`patch` changed, for :func:`unpatch` to undo."""

    rotary: list[tuple[nn.Module, str, nn.Module, PatchedRotaryEmbedding]]
    # (layer, attribute, posenc's forward, the attribute's value before or None: absent)
    attention: list[tuple[nn.Module, str, Any, Any]]


def _patched_module(modeling: types.ModuleType, family: _Family) -> types.ModuleType:
    """The globals of the copied forwards: a copy of ``modeling``'s dict with the family's
    apply functions replaced by posenc's, made once per modeling module (it holds nothing
    of any model) and kept in ``sys.modules`` under a name of its own, because
    ``torch.compile`` finds an inlined function's globals by their ``__name__``."""
    short = modeling.__name__.rsplit(".", 1)[-1]
    name = f"posenc.integrations._hf_patched.{short}"
    cached = sys.modules.get(name)
    if cached is not None and getattr(cached, "__posenc_source__", None) is modeling:
        return cached
    copy = types.ModuleType(name, modeling.__doc__)
    skip = ("__name__", "__spec__", "__loader__")
    vars(copy).update({k: v for k, v in vars(modeling).items() if k not in skip})
    for apply_name, (pairing, params) in family.applies.items():
        vars(copy)[apply_name] = _make_apply(pairing, params)
    vars(copy)["__posenc_source__"] = modeling  # a reloaded transformers gets a new copy
    sys.modules[name] = copy
    return copy


def _text_config(model: Any) -> Any:
    config = getattr(model, "config", None)
    if not isinstance(model, nn.Module) or config is None or not hasattr(config, "to_dict"):
        raise PosEncError(
            f"model must be a transformers model (a torch.nn.Module with a config), got "
            f"{type(model).__name__}"
        )
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _parse_scalings(
    scaling: Any, layer_types: list[str | None]
) -> dict[str | None, Scaling | None] | None:
    """``scaling=`` per layer type: ``None`` (the config's), one scaling for every layer type,
    or (per-layer-type models) a dict of layer type -> scaling (types left out keep theirs)."""
    if scaling is None:
        return None
    named = [t for t in layer_types if t is not None]
    if named and isinstance(scaling, Mapping) and scaling and all(key in named for key in scaling):
        return {t: parse_scaling(s) for t, s in scaling.items()}
    return dict.fromkeys(layer_types, parse_scaling(scaling))


def _rope_for(config: Any, layer_type: str | None, scalings: Any) -> RotaryEmbedding:
    rope = rotary_from_config(config, layer_type=layer_type)
    if scalings is None or layer_type not in scalings:
        return rope
    config = {k: v for k, v in rope.to_config().items() if k != "name"}
    return RotaryEmbedding(**{**config, "scaling": scalings[layer_type]})  # every other option kept


def patch(model: Any, *, scaling: Any = None) -> Any:
    """Put posenc's RoPE inside a loaded transformers model (in place; returns it).

    The model's rotary module(s) are replaced by a :class:`PatchedRotaryEmbedding` (posenc's
    cos/sin: float64 angles reduced before rounding, used in float32) and each attention
    layer's apply step by posenc's fused rotation; nothing outside this model changes
    (another model of the same family in the process is unaffected). In float32 the logits
    equal the unpatched model's within float32 rounding at ordinary positions; at long ones
    (past ~1e5) they are closer to exact arithmetic than transformers' float32 angles.
    Works under ``torch.compile``. :func:`unpatch` undoes it exactly.

    Args:
        model: a transformers model (``LlamaForCausalLM``, its base ``LlamaModel``, a
            multimodal model whose text decoder is supported, ...) of a family in
            :data:`PATCHABLE_FAMILIES`.
        scaling: ``None`` (the config's RoPE scaling, read by
            :func:`posenc.integrations.transformers.rotary_from_config`), or a scaling in
            posenc's spelling (see :func:`posenc.rotary.frequencies.parse_scaling`, e.g.
            ``{"type": "yarn", "factor": 4.0, "original_max_position": 4096}``) that
            replaces it, for every layer type; models with RoPE parameters per layer type
            (Gemma 3) also take ``{layer_type: scaling}`` for some of them. The model's
            config is not changed.

    Returns:
        ``model``, patched.

    Raises:
        PosEncError: (before anything is changed) ``model`` is not a transformers model, its
            family is not supported (naming its ``model_type`` and why), it is already
            patched, an attention layer already has a ``forward`` of its own (other than
            accelerate's hook: then its ``_old_forward`` is the one replaced), its
            config cannot be read by ``rotary_from_config``, or ``scaling`` is invalid.
        ImportError: transformers is not installed (``pip install 'posenc[hf]'``).

    Examples:
        >>> import torch, transformers
        >>> from posenc.integrations.transformers import patch, unpatch
        >>> config = transformers.LlamaConfig(
        ...     vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        ...     num_attention_heads=2, num_key_value_heads=1)
        >>> model = transformers.LlamaForCausalLM(config).eval()
        >>> ids = torch.arange(8)[None]
        >>> before = model(ids).logits
        >>> torch.testing.assert_close(patch(model)(ids).logits, before, rtol=1e-5, atol=1e-6)
        >>> torch.equal(unpatch(model)(ids).logits, before)
        True
    """
    try:
        import transformers  # noqa: F401  (the modeling modules below are its)
    except ImportError as error:  # pragma: no cover - exercised without the extra
        raise ImportError("patch needs transformers: pip install 'posenc[hf]'") from error
    config = _text_config(model)
    if _PATCH_ATTR in model.__dict__:
        raise PosEncError(f"model is already patched ({type(model).__name__}); unpatch it first")
    model_type = str(getattr(config, "model_type", None))
    # validate and build everything first, then change the model (nothing there can fail)
    target = _Target(model_type, *_family_module(model, model_type))
    target.check_applies()
    record = target.plan(model, _ropes(config, model_type, scaling))
    for parent, child_name, _, new in record.rotary:
        parent._modules[child_name] = new
    for layer, attr, forward, _ in record.attention:
        layer.__dict__[attr] = forward
    model.__dict__[_PATCH_ATTR] = record
    return model


def _family_module(model: nn.Module, model_type: str) -> tuple[_Family, types.ModuleType]:
    """The family of ``model_type`` and its loaded modeling module; refused by name."""
    family = _FAMILIES.get(model_type)
    if family is None:
        why = _REFUSED.get(model_type, "its attention has not been checked against posenc's")
        raise PosEncError(
            f"patch does not support model_type {model_type!r}: {why}; supported: "
            f"{', '.join(PATCHABLE_FAMILIES)}"
        )
    modeling = sys.modules.get(f"transformers.models.{family.module}.modeling_{family.module}")
    if modeling is None:
        raise PosEncError(
            f"model_type {model_type!r}: transformers.models.{family.module} is not loaded; "
            f"is {type(model).__name__} a transformers model?"
        )
    return family, modeling


def _ropes(config: Any, model_type: str, scaling: Any) -> dict[str | None, RotaryEmbedding]:
    """posenc's rotary module of each layer type, from the config and ``scaling=``."""
    layer_types = rope_layer_types(config)
    try:
        scalings = _parse_scalings(scaling, layer_types)
    except PosEncError as error:
        raise PosEncError(f"scaling is invalid: {error}") from None
    try:
        ropes = {t: _rope_for(config, t, scalings) for t in layer_types}
    except PosEncError as error:
        if str(error).startswith("model_type"):
            raise
        raise PosEncError(f"model_type {model_type!r}: {error}") from None
    for rope in ropes.values():
        if rope.sections is not None:
            raise PosEncError(f"model_type {model_type!r}: M-RoPE sections are not supported")
    return ropes


@dataclasses.dataclass
class _Target:
    """One model's family and modeling module, and the forwards rebuilt for its classes."""

    model_type: str
    family: _Family
    modeling: types.ModuleType
    forwards: dict[type, Any] = dataclasses.field(default_factory=dict)

    def check_applies(self) -> None:
        """Refuse a transformers version whose apply functions take other parameters."""
        for name, (_, params) in self.family.applies.items():
            original = vars(self.modeling).get(name)
            if original is None:
                continue
            got = tuple(inspect.signature(original).parameters)
            if got != params:
                raise PosEncError(
                    f"model_type {self.model_type!r}: {self.modeling.__name__}.{name} takes "
                    f"{got}, patch expects {params} (a transformers version patch does not know)"
                )

    def plan(self, model: nn.Module, ropes: dict[str | None, RotaryEmbedding]) -> _Record:
        """What patching changes (nothing is changed yet): each text rotary module of the
        modeling module with its replacement, each attention layer calling an apply
        function with its own forward."""
        record = _Record([], [])
        globals_ = vars(_patched_module(self.modeling, self.family))
        for parent in model.modules():
            for child_name, child in parent.named_children():
                cls = type(child)
                if isinstance(child, PatchedRotaryEmbedding):
                    raise PosEncError(f"model is already patched ({child_name} is posenc's)")
                if cls.__module__ != self.modeling.__name__:
                    continue
                if cls.__name__.endswith("RotaryEmbedding"):
                    if not any(word in cls.__name__ for word in ("Vision", "Audio")):
                        new = PatchedRotaryEmbedding(ropes, child)
                        record.rotary.append((parent, child_name, child, new))
                    continue
                forward = self.forward_of(cls, globals_)
                if forward is not None:
                    record.attention.append(self.attention_entry(child_name, child, forward))
        if not record.rotary or not record.attention:
            found = "rotary module" if not record.rotary else _NO_ATTENTION
            raise PosEncError(
                f"model_type {self.model_type!r}: found no {found} in {type(model).__name__}; "
                f"patch cannot replace its RoPE"
            )
        return record

    def forward_of(self, cls: type, globals_: dict[str, Any]) -> Any:
        """``cls.forward`` rebuilt to read ``globals_`` (posenc's apply functions; once per
        class), or None where it calls none of them."""
        if cls not in self.forwards:
            module_dict = vars(self.modeling)
            chain = forward_chain(cls, module_dict)
            if chain is None and cls.__name__.endswith("Attention"):
                raise PosEncError(
                    f"model_type {self.model_type!r}: {cls.__name__}.forward is not a function "
                    f"of {self.modeling.__name__} (or a decorator naming it); patch cannot copy it"
                )
            uses = chain is not None and set(self.family.applies) & set(chain[-1].__code__.co_names)
            self.forwards[cls] = (
                rebuild_forward(chain, globals_, self.model_type) if chain and uses else None
            )
        return self.forwards[cls]

    def attention_entry(
        self, child_name: str, child: nn.Module, forward: Any
    ) -> tuple[nn.Module, str, Any, Any]:
        """``(layer, attribute, its new forward, the value before)`` of one attention layer:
        ``forward``, or the ``_old_forward`` accelerate's hook (``device_map=...``) calls."""
        attr = "forward"
        if "forward" in child.__dict__:
            hooked = hasattr(child, "_hf_hook") and "_old_forward" in child.__dict__
            if not hooked:
                raise PosEncError(
                    f"model_type {self.model_type!r}: the attention layer {child_name!r} already "
                    f"has a forward of its own (not accelerate's hook); patch refuses it"
                )
            attr = "_old_forward"
        return (child, attr, types.MethodType(forward, child), child.__dict__.get(attr))


_NO_ATTENTION = "attention layer calling apply_rotary_pos_emb"


def unpatch(model: Any) -> Any:
    """Undo :func:`patch` (in place; returns the model): the original rotary modules go back
    and the attention layers' own ``forward`` attributes are deleted, so the module tree,
    ``state_dict`` and outputs are those of before :func:`patch`.

    Raises:
        PosEncError: ``model`` was not patched, or what :func:`patch` put in it was replaced
            since (nothing is changed then).
    """
    if not isinstance(model, nn.Module):
        raise PosEncError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    record = model.__dict__.get(_PATCH_ATTR)
    if not isinstance(record, _Record):
        raise PosEncError(f"model is not patched ({type(model).__name__}); nothing to unpatch")
    for parent, child_name, _, new in record.rotary:
        if parent._modules.get(child_name) is not new:
            raise PosEncError(
                f"{child_name} is no longer the module patch put there; unpatch refuses"
            )
    for layer, attr, forward, _ in record.attention:
        if layer.__dict__.get(attr) is not forward:
            raise PosEncError(
                f"{type(layer).__name__}.{attr} was replaced since patch; unpatch refuses"
            )
    for parent, child_name, original, _ in record.rotary:
        parent._modules[child_name] = original
    for layer, attr, _, before in record.attention:
        if before is None:
            del layer.__dict__[attr]
        else:
            layer.__dict__[attr] = before
    del model.__dict__[_PATCH_ATTR]
    return model
