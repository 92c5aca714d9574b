"""``patch(model)`` / ``unpatch(model)``: posenc's RoPE inside a loaded transformers model.

:func:`patch` replaces, in one model (never in the process), the two places where a
transformers decoder computes RoPE: its rotary module(s) (``model.model.rotary_emb``) by a
:class:`~._hf_patch_rotary.PatchedRotaryEmbedding` whose cos/sin are those of posenc's
:class:`posenc.RotaryEmbedding` from ``rotary_from_config`` (float64 angles reduced to
``[-pi, pi)`` before rounding, times YaRN's / LongRoPE's attention factor as transformers
applies it, ``[b, s, rotary_dim / 2]`` in float32 whatever the model's dtype; M-RoPE from
3-D positions), and the apply step of every attention layer: each attention instance gets a
``forward`` of its own, a copy of its class's (decorators rebuilt around the copy) whose
globals are a copy of its modeling module's with the family's apply function(s)
(``apply_rotary_pos_emb``; DeepSeek-V3's ``apply_rotary_pos_emb_interleave``; Llama 4's
``apply_rotary_emb``) replaced by posenc's fused rotation (:mod:`._hf_patch_applies`; the
families and their forms in :mod:`._hf_patch_families`). The class, the modeling module and
every other model are untouched; :func:`unpatch` puts back exactly what was there (module
tree, ``state_dict`` and outputs as before).
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import types
from collections.abc import Mapping
from typing import Any

from torch import nn

from posenc._errors import PosEncError
from posenc.integrations import _hf_families as _families
from posenc.integrations._hf_config import (
    layer_rope_parameters,
    rotary_from_config,
    rotary_from_parameters,
)
from posenc.integrations._hf_forward import forward_chain, globals_copy, rebuild_forward
from posenc.integrations._hf_patch_applies import make_apply
from posenc.integrations._hf_patch_families import (
    FAMILIES,
    PATCHABLE_FAMILIES,
    REFUSED,
    Family,
)
from posenc.integrations._hf_patch_remap import check_remappable, remap_entries, split_scaling
from posenc.integrations._hf_patch_rotary import PatchedRotaryEmbedding
from posenc.integrations._hf_reader import rope_layer_types
from posenc.integrations.spelling import GENERAL_KEYS, is_transformers_spelling, scaling_type
from posenc.rotary.frequencies import parse_scaling
from posenc.rotary.module import RotaryEmbedding

__all__ = ["PATCHABLE_FAMILIES", "PatchedRotaryEmbedding", "patch", "unpatch"]

_PATCH_ATTR = "_posenc_patch"


# --- patch / unpatch --------------------------------------------------------------------------


@dataclasses.dataclass
class _Record:
    """What :func:`patch` changed, for :func:`unpatch` to undo."""

    rotary: list[tuple[nn.Module, str, nn.Module, PatchedRotaryEmbedding]]
    # (layer, attribute, posenc's forward, the attribute's value before or None: absent)
    attention: list[tuple[nn.Module, str, Any, Any]]


def _patched_module(modeling: types.ModuleType, family: Family) -> types.ModuleType:
    """The globals of the copied forwards: a copy of ``modeling``'s dict with the family's
    apply functions replaced by posenc's, made once per modeling module (it holds nothing
    of any model) and kept in ``sys.modules`` under a name of its own, because
    ``torch.compile`` finds an inlined function's globals by their ``__name__``."""
    return globals_copy(
        modeling,
        "posenc.integrations._hf_patched",
        lambda: {name: make_apply(*how) for name, how in family.applies.items()},
    )


def _text_config(model: Any) -> Any:
    config = getattr(model, "config", None)
    if not isinstance(model, nn.Module) or config is None or not hasattr(config, "to_dict"):
        raise PosEncError(
            f"model must be a transformers model (a torch.nn.Module with a config), got "
            f"{type(model).__name__}"
        )
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _scalings_by_type(scaling: Any, layer_types: list[str | None]) -> dict[str | None, Any] | None:
    """``scaling=`` per layer type: ``None`` (the config's), one scaling for every layer type,
    or (per-layer-type models) a dict of layer type -> scaling (types left out keep theirs)."""
    if scaling is None:
        return None
    named = [t for t in layer_types if t is not None]
    if named and isinstance(scaling, Mapping) and scaling and all(key in named for key in scaling):
        return dict(scaling)
    return dict.fromkeys(layer_types, scaling)


def _rope_for(config: Any, layer_type: str | None, scalings: Any) -> RotaryEmbedding:
    """posenc's rotary module of ``layer_type``: the config's, its scaling replaced by the
    one ``scaling=`` gives that layer type (posenc's spelling), or read from the config
    with its RoPE parameters edited (transformers' spelling)."""
    rope = rotary_from_config(config, layer_type=layer_type)
    if scalings is None or layer_type not in scalings:
        return rope
    spec = scalings[layer_type]
    if is_transformers_spelling(spec):
        return _edited_rope(config, layer_type, spec, rope)
    try:
        params = parse_scaling(spec)
    except PosEncError as error:
        raise PosEncError(f"scaling is invalid: {error}") from None
    options = {k: v for k, v in rope.to_config().items() if k != "name"}
    return RotaryEmbedding(**{**options, "scaling": params})  # every other option kept


# What a rotary module rotates, which a scaling= in transformers' spelling may not change.
_KEPT = ("head_dim", "rotary_dim", "partial", "layout", "sections", "section_layout")


def _edited_rope(
    config: Any, layer_type: str | None, spec: Mapping[str, Any], rope: RotaryEmbedding
) -> RotaryEmbedding:
    """The rotary module of a config whose RoPE parameters for ``layer_type`` are ``spec``
    (transformers' spelling), with what ``spec`` leaves out that is no scaling parameter
    (``rope_theta``, ``partial_rotary_factor``, ``mrope_section``, ...) the model's; the
    rotated channels must stay the model's (``rope``)."""
    model_rope = layer_rope_parameters(config, layer_type)
    kept = {k: v for k, v in model_rope.items() if k in GENERAL_KEYS and v is not None}
    try:
        if "type" in spec or "rope_type" in spec:
            scaling_type(spec)  # transformers lets rope_type win silently: refuse a disagreement
        new = rotary_from_parameters(config, {**kept, **spec}, layer_type=layer_type)
    except PosEncError as error:
        raise PosEncError(f"scaling is invalid: {error}") from None
    for name in _KEPT:
        if getattr(new, name) != getattr(rope, name):
            raise PosEncError(
                f"scaling is invalid: {dict(spec)!r} changes the model's {name} from "
                f"{getattr(rope, name)!r} to {getattr(new, name)!r}; patch changes the "
                f"frequencies only (partial_rotary_factor and mrope_section must be the "
                f"model's: {kept})"
            )
    return new


def patch(model: Any, *, scaling: Any = None) -> Any:
    """Put posenc's RoPE inside a loaded transformers model (in place; returns it).

    The model's rotary module(s) become a :class:`PatchedRotaryEmbedding` (posenc's cos/sin)
    and each attention layer's apply step posenc's fused rotation; nothing else changes, and
    :func:`unpatch` undoes it exactly (per family: ``docs/porting.md``).

    Args:
        model: a transformers model (``LlamaForCausalLM``, ``LlamaModel``, a multimodal
            model with a supported text decoder, ...) of a :data:`PATCHABLE_FAMILIES` family.
        scaling: ``None`` (the config's), or a scaling that replaces it for every layer
            type (or ``{layer_type: scaling}``), in posenc's spelling
            (:func:`posenc.rotary.frequencies.parse_scaling`) or transformers'
            (``rope_scaling`` or ``rope_parameters``); or a position map, ``{"type":
            "self_extend" | "string", ...}`` with an optional such ``"scaling"``, on the
            RoPE full-attention layers only (SmolLM3: not its NoPE layers; the rules in
            :mod:`posenc.integrations._hf_patch_remap`). The config is not changed.

    Returns:
        ``model``, patched.

    Raises:
        PosEncError: (before anything is changed) ``model`` is not a transformers model, its
            family is not supported (naming its ``model_type`` and why), it is already
            patched, an attention layer already has a ``forward`` of its own, its config
            cannot be read by ``rotary_from_config``, or ``scaling`` is invalid.
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
    position_map, scaling = split_scaling(scaling)
    if position_map is not None:
        check_remappable(config, model_type, position_map, scaling)
    target = _Target(model_type, *_family_module(model, model_type))
    target.check_applies()
    record = target.plan(model, _ropes(config, model_type, scaling))
    if position_map is not None:
        rotary = [new for *_, new in record.rotary]
        record.attention = remap_entries(target, config, rotary, record.attention, position_map)
    for parent, child_name, _, new in record.rotary:
        parent._modules[child_name] = new
    for layer, attr, forward, _ in record.attention:
        layer.__dict__[attr] = forward
    model.__dict__[_PATCH_ATTR] = record
    return model


def _family_module(model: nn.Module, model_type: str) -> tuple[Family, types.ModuleType]:
    """The family of ``model_type`` and its loaded modeling module; refused by name."""
    family = FAMILIES.get(model_type)
    if family is None:
        why = REFUSED.get(model_type) or _why_not(model, model_type)
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


def _why_not(model: nn.Module, model_type: str) -> str:
    """Why patch refuses a family it has no entry for: what rotary_from_config cannot
    express, that the model has no rotary module, or that it has not been checked."""
    reason = _families.unsupported(model_type) or _families.components(model_type)
    if reason is not None:
        return f"posenc cannot read its RoPE ({reason})"
    if not any(type(m).__name__.endswith("RotaryEmbedding") for m in model.modules()):
        return "it has no rotary embedding module (its positions are not RoPE)"
    return "its attention has not been checked against posenc's"


def _ropes(config: Any, model_type: str, scaling: Any) -> dict[str | None, RotaryEmbedding]:
    """posenc's rotary module of each layer type, from the config and ``scaling=``."""
    layer_types = rope_layer_types(config)
    scalings = _scalings_by_type(scaling, layer_types)
    try:
        return {t: _rope_for(config, t, scalings) for t in layer_types}
    except PosEncError as error:
        if str(error).startswith(("model_type", "scaling is invalid")):
            raise
        raise PosEncError(f"model_type {model_type!r}: {error}") from None


def _hub_unwrapped(apply: Any) -> Any:
    """The function a kernels-hub wrapper calls, or ``apply`` itself. With the ``kernels``
    package installed (a requirement of transformers from 5.25), a modeling module's
    ``@use_kernel_forward_from_hub`` apply function is an ``nn.Module`` whose ``forward(*args,
    **kwargs)`` calls the original, held in its closure as ``func``: its parameters are the
    original's. patch rebuilds the attention forwards with posenc's functions in their
    place, so the wrapper is never called."""
    if not (isinstance(apply, nn.Module) and hasattr(type(apply), "kernel_layer_name")):
        return apply
    forward = type(apply).forward
    code, cells = getattr(forward, "__code__", None), getattr(forward, "__closure__", None)
    if code is None or cells is None or "func" not in code.co_freevars:
        return apply
    inner = cells[code.co_freevars.index("func")].cell_contents
    return inner if inspect.isfunction(inner) else apply


@dataclasses.dataclass
class _Target:
    """One model's family and modeling module, and the forwards rebuilt for its classes."""

    model_type: str
    family: Family
    modeling: types.ModuleType
    forwards: dict[type, Any] = dataclasses.field(default_factory=dict)

    def check_applies(self) -> None:
        """Refuse a transformers version whose apply functions take other parameters."""
        for name, (_, params) in self.family.applies.items():
            original = vars(self.modeling).get(name)
            if original is None:
                continue
            got = tuple(inspect.signature(_hub_unwrapped(original)).parameters)
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
                        new = PatchedRotaryEmbedding(ropes, child, self.family.output)
                        record.rotary.append((parent, child_name, child, new))
                    continue
                forward = self.forward_of(cls, globals_)
                if forward is not None:
                    record.attention.append(self.attention_entry(child_name, child, forward))
        if not record.rotary or not record.attention:
            calling = " or ".join(self.family.applies)
            found = "rotary module" if not record.rotary else f"attention layer calling {calling}"
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
