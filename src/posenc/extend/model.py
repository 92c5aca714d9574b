"""The model ``posenc extend`` measures: loaded through transformers (a model folder, or a
``.gguf`` file through its GGUF reader), identified by hash, and its RoPE scaled by
:func:`posenc.integrations.transformers.patch`.

A scaling ``name`` at ``factor`` is posenc's scaling dataclass for that name
(:func:`scaling_for`); models whose RoPE parameters differ per layer type (Gemma 3: local
layers at base 1e4 with a sliding window, global layers at 1e6) scale only the layer type
that sees the whole sequence (``full_attention``), since a sliding window never sees a
distance past its width. Self-Extend and STRING are position maps (:mod:`posenc.remap`),
given to ``patch`` as ``{"type": "self_extend" | "string", ...}`` and remapping its
RoPE-carrying full-attention layers.

Hybrid models (:func:`rope_flags`): where every long-range layer has no RoPE (Cohere 2,
EXAONE 4: RoPE on their sliding-window layers only) nothing applies to the long range, so
only ``none`` and ``config`` run, each with the config's own RoPE; SmolLM3's NoPE layers
(``no_rope_layers``) are left as they are and its RoPE layers scaled or remapped. Either is
told in ``Loaded.note``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import torch

from posenc._errors import PosEncError
from posenc._files import open_regular
from posenc.extend.settings import (
    CONFIG,
    FACTOR_SCALINGS,
    MAP_TYPE,
    NONE,
    REMAPS,
    SCALING_NAMES,
    SELF_EXTEND,
    check_model,
    trained_fields,
)
from posenc.integrations.transformers import (
    PatchedRotaryEmbedding,
    patch,
    rope_layer_types,
    rope_layers,
    rotary_from_config,
    unpatch,
)

__all__ = [
    "Loaded",
    "active_map",
    "check_maps",
    "check_scalable",
    "file_sha256",
    "load_model",
    "map_changes",
    "map_for",
    "prefix_equal",
    "rope_flags",
    "rotary_tables",
    "scaled",
    "scaling_for",
    "split_spec",
]

_WEIGHTS = (".safetensors", ".bin", ".pt", ".gguf", ".json", ".model", ".txt")


@dataclasses.dataclass
class Loaded:
    """A loaded model and what ``posenc extend`` needs to know of it."""

    model: Any
    tokenizer: Any
    path: Path  # the folder or .gguf file given
    identity: dict[str, Any]  # name, model_type, files and their SHA-256
    trained: int  # the trained context L
    layer_types: list[str | None]  # the RoPE layer types (None: one set of parameters)
    scaled_types: list[str | None]  # the layer types a scaling applies to
    configured: Any  # the config's own scaling dataclass (None: none)
    head_dim: int
    rope_layers: list[bool] = dataclasses.field(default_factory=list)  # per layer: rotates
    scalable: bool = True  # False: every long-range layer is NoPE (only none and config run)
    note: str | None = None  # what of a hybrid model is scaled, as the CLI and page say it


def file_sha256(path: Path) -> str:
    """The SHA-256 of the regular file ``path`` (its size as ``fstat`` gives it, read in
    blocks; a FIFO or a device is refused, not read for ever)."""
    digest = hashlib.sha256()
    fd = open_regular(path, what="model file")
    with os.fdopen(fd, "rb") as file:
        left = os.fstat(fd).st_size
        while left > 0:
            block = file.read(min(left, 1 << 22))
            if not block:
                break
            digest.update(block)
            left -= len(block)
    return digest.hexdigest()


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.iterdir() if p.is_file() and p.suffix in _WEIGHTS)


@contextlib.contextmanager
def _quiet(transformers: Any) -> Iterator[None]:
    """transformers' loading progress bars and warnings off (posenc extend draws its own
    progress, and an error must be the one line on stderr), restored after."""
    logging = transformers.utils.logging
    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def _from_pretrained(path: Path, dtype: str, device: str) -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as error:
        raise ImportError(
            "posenc extend needs transformers: pip install 'posenc[extend]'"
        ) from error
    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)}
    if device == "auto":
        kwargs["device_map"] = "auto"
    folder, gguf = (path.parent, {"gguf_file": path.name}) if path.is_file() else (path, {})
    if gguf:
        try:
            import gguf as _gguf  # noqa: F401  (transformers' GGUF reader needs it)
        except ImportError as error:
            raise ImportError(
                "reading a .gguf file needs gguf: pip install 'posenc[gguf]'"
            ) from error
    try:
        with _quiet(transformers):
            model = transformers.AutoModelForCausalLM.from_pretrained(folder, **gguf, **kwargs)
            tokenizer = transformers.AutoTokenizer.from_pretrained(folder, **gguf)
    except (OSError, ValueError, KeyError, TypeError) as error:
        what = "GGUF file" if gguf else "model folder"
        message = " ".join(str(error).split())[:300]
        raise PosEncError(
            f"model {str(path)!r}: transformers cannot read this {what}: {message}"
        ) from None
    if device not in ("cpu", "auto"):
        cast(Any, model).to(torch.device(device))  # in place (transformers types .to oddly)
    return model.eval(), tokenizer


def load_model(
    model: str | os.PathLike[str], *, dtype: str, device: str, context: int | None
) -> Loaded:
    """Load ``model`` (a folder with a transformers config, or a ``.gguf`` file) and read
    its RoPE; refused (``PosEncError``, one line) if it is neither, cannot be read, or has
    no rotary embedding."""
    path = Path(check_model(model))
    if path.is_dir() and not (path / "config.json").is_file():
        raise PosEncError(f"model folder {str(path)!r} has no config.json")
    loaded, tokenizer = _from_pretrained(path, dtype, device)
    config = loaded.config.get_text_config()
    model_type = str(getattr(config, "model_type", "?"))
    if model_type in _NO_ROPE:
        raise PosEncError(
            f"model {str(path)!r} ({model_type}): no RoPE to scale or remap: {_NO_ROPE[model_type]}"
        )
    layer_types = rope_layer_types(config)
    try:
        unpatch(patch(loaded))  # the family, its rotary modules and attention: patchable
        ropes = {t: rotary_from_config(config, layer_type=t) for t in layer_types}
    except PosEncError as error:
        raise PosEncError(
            f"model {str(path)!r} ({model_type}): no RoPE to scale: {error}"
        ) from None
    trained = context or getattr(config, "max_position_embeddings", None)
    if not isinstance(trained, int) or trained < 16:
        raise PosEncError(f"model {str(path)!r}: no trained context in its config; pass --context")
    scaled = [t for t in layer_types if t in (None, "full_attention")] or list(layer_types)
    first = ropes[scaled[0]].scaling
    if path.is_file() and first is None:
        first = _gguf_scaling(path, scaled[0])
    flags = rope_flags(config)
    scalable, note = _hybrid(config, model_type, flags)
    identity = {
        "path": str(path),
        # a .gguf file's name (transformers' _name_or_path is then only its folder)
        "name": path.stem
        if path.is_file()
        else str(getattr(loaded.config, "_name_or_path", "") or path.name),
        "model_type": model_type,
        "parameters": sum(p.numel() for p in loaded.parameters()),
        "files": {p.name: file_sha256(p) for p in _files(path)},
    }
    return Loaded(
        model=loaded,
        tokenizer=tokenizer,
        path=path,
        identity=identity,
        trained=int(trained),
        layer_types=layer_types,
        scaled_types=scaled,
        configured=first,
        head_dim=ropes[scaled[0]].rotary_dim,
        rope_layers=flags,
        scalable=scalable,
        note=note,
    )


#: Families transformers runs with no RoPE in any layer (transformers 5.25 modeling files).
_NO_ROPE = {
    "kimi_linear": "its full-attention (MLA) layers have no RoPE and its other layers are "
    "linear attention (KDA); no scaling or position map applies",
}
#: Families whose attention rotates on its sliding-window layers only (transformers 5.25:
#: Cohere 2 ``if self.sliding_window is not None``, EXAONE 4 and EXAONE MoE ``if
#: self.sliding_window is None or self.is_sliding``; Cohere 2 MoE also its dense-MLP layers
#: where ``prefix_dense_sliding_window_pattern`` is 1, its ``force_rope``).
_SLIDING_ROPE = frozenset({"cohere2", "cohere2_moe", "exaone4", "exaone_moe"})


def rope_flags(config: Any) -> list[bool]:
    """Per layer of the text ``config``: whether its attention applies RoPE
    (:func:`posenc.integrations.transformers.rope_layers`, and the families of
    ``_SLIDING_ROPE``, whose full-attention layers are NoPE)."""
    flags = rope_layers(config)
    model_type = str(getattr(config, "model_type", ""))
    kinds = list(getattr(config, "layer_types", None) or ())
    if model_type not in _SLIDING_ROPE or len(kinds) < len(flags):
        return flags
    if model_type.startswith("exaone") and getattr(config, "sliding_window", None) is None:
        return flags  # no sliding window: every layer rotates
    forced = [False] * len(flags)
    if getattr(config, "prefix_dense_sliding_window_pattern", None) == 1:
        mlp = list(getattr(config, "mlp_layer_types", None) or ())
        forced = [i < len(mlp) and mlp[i] == "dense" for i in range(len(flags))]
    return [
        f and (kind == "sliding_attention" or force) for f, kind, force in zip(flags, kinds, forced)
    ]


#: Layer types that never see past a window (Llama 4's chunks too).
_LOCAL = ("sliding_attention", "chunked_attention")


def _hybrid(config: Any, model_type: str, flags: list[bool]) -> tuple[bool, str | None]:
    """Whether any long-range (not sliding-window) layer rotates, and the note telling what
    of a model with NoPE layers is scaled (None: every layer rotates)."""
    kinds = list(getattr(config, "layer_types", None) or ())
    if len(kinds) < len(flags):
        kinds = [None] * len(flags)
    far = [i for i, kind in enumerate(kinds[: len(flags)]) if kind not in _LOCAL]
    if far and not any(flags[i] for i in far):
        return False, (
            f"{model_type}: its full-attention layers have no RoPE; sliding-window RoPE "
            "layers are left as the config says, so no scaling or position map reaches the "
            "long range: only none (and config) are measured"
        )
    nope = [str(i) for i, f in enumerate(flags) if not f]
    if nope:
        rope = len(flags) - len(nope)
        these = (
            f"layers {', '.join(nope)} have no RoPE and are"
            if len(nope) > 1
            else f"layer {nope[0]} has no RoPE and is"
        )
        return True, (
            f"{model_type}: {these} left as the config says; scalings and position maps "
            f"apply to its {rope} RoPE layer{'s' if rope != 1 else ''} only"
        )
    return True, None


def _gguf_scaling(path: Path, layer_type: str | None) -> Any:
    """The scaling the GGUF file itself carries (llama.cpp's ``rope.scaling.*`` keys or its
    ``rope_freqs`` tensor), which transformers' GGUF reader drops: a Llama 3.1 file loads
    unscaled, and ``config`` puts its own scaling back. None where it has none or its
    metadata cannot be read by :func:`posenc.integrations.gguf.rotary_from_gguf`."""
    from posenc.integrations.gguf import rotary_from_gguf

    try:
        return rotary_from_gguf(path, layer=layer_type, layout_for="transformers").scaling
    except PosEncError:
        return None


def scaling_for(name: str, factor: float, loaded: Loaded) -> Any:
    """Scaling ``name`` at ``factor`` (the target length over ``L``) for ``loaded``, in
    posenc's spelling (what :func:`~posenc.integrations.transformers.patch` takes):
    ``None`` for ``none`` and for any scaling at factor 1; ``config`` is the model's own
    (its scaling dataclass, or None); a registered scaling of
    :data:`~posenc.extend.settings.FACTOR_SCALINGS` gets ``factor``, and ``L`` in the
    fields that take it. ``self-extend`` is the map of
    :func:`posenc.remap.self_extend_for` for ``L`` and the target (the model's own
    frequencies), ``string`` that of :func:`posenc.remap.string_for`, past ``L`` with
    ``"scaling"``: YaRN at ``factor`` (:func:`split_spec` parts them)."""
    if name == CONFIG:
        return loaded.configured
    if name in REMAPS:
        return _remap(name, factor, loaded)
    if name not in FACTOR_SCALINGS and name != NONE:
        raise PosEncError(f"scaling must be one of {', '.join(SCALING_NAMES)}, got {name!r}")
    if name == NONE or factor <= 1.0:
        return None
    return {
        "type": name,
        "factor": factor,
        **dict.fromkeys(trained_fields(name), loaded.trained),
    }


def map_for(name: str, trained: int, target: int) -> dict[str, Any]:
    """The config of position map ``name`` (``self-extend`` or ``string``) with its paper's
    parameters for a model trained on ``trained`` tokens run at ``target``
    (:func:`posenc.remap.self_extend_for`, :func:`posenc.remap.string_for`)."""
    from posenc.remap import self_extend_for, string_for

    rule = self_extend_for if name == SELF_EXTEND else string_for
    return rule(trained, target).to_config()


def _remap(name: str, factor: float, loaded: Loaded) -> dict[str, Any]:
    spec = map_for(name, loaded.trained, round(factor * loaded.trained))
    if name != SELF_EXTEND and factor > 1.0:  # past L: STRING with YaRN at the factor
        spec["scaling"] = scaling_for("yarn", factor, loaded)
    return spec


def split_spec(spec: Any) -> tuple[dict[str, Any] | None, Any]:
    """``(map, scaling)``: a position map's config (``{"type": "self_extend", ...}``, its
    ``"scaling"`` left out) and the frequency scaling it runs with (None: the model's
    own); ``(None, spec)`` for a plain scaling."""
    if isinstance(spec, Mapping) and spec.get("type") in MAP_TYPE.values():
        return {k: v for k, v in spec.items() if k != "scaling"}, spec.get("scaling")
    return None, spec


def map_changes(spec: Any, length: int) -> bool:
    """Whether the position map of ``spec`` moves any pair of a sequence of ``length``
    tokens (False for a plain scaling; Self-Extend with ``group_size`` 1 moves none)."""
    from posenc.remap import SelfExtend, position_map

    config = split_spec(spec)[0]
    if config is None:
        return False
    remap = position_map(config)
    if isinstance(remap, SelfExtend) and remap.group_size == 1:
        return False  # i // 1 + W - W and j // 1: the plain positions
    return bool(remap.branch_at(torch.arange(max(length, 1))).any())


def active_map(loaded: Loaded, scaling: Any, length: int) -> dict[str, Any] | None:
    """The position map of ``scaling`` where it moves some pair at ``length`` (None: it
    moves none, or there is none, so the unit is its rotary tables alone). Two units share
    numbers only where their tables and this agree: a remapped unit's tables are those of
    the scaling it runs with."""
    if not loaded.scalable or not map_changes(scaling, length):
        return None
    return split_spec(scaling)[0]


def check_scalable(loaded: Loaded, scaling: str | None) -> None:
    """Refuse ``--scaling`` naming a scaling or map (not ``none`` or ``config``) for a model
    whose long-range layers are all NoPE: nothing it would write reaches them."""
    if not loaded.scalable and scaling not in (None, NONE, CONFIG):
        raise PosEncError(
            f"--scaling {scaling} cannot run on model {loaded.identity.get('name')!r}: "
            f"{loaded.note}"
        )


def rotary_tables(model: Any, length: int) -> list[torch.Tensor]:
    """The cos/sin of every patched rotary module of ``model`` over positions
    ``0..length-1`` (float64)."""
    positions = torch.arange(length)[None]
    out: list[torch.Tensor] = []
    for module in model.modules():
        if isinstance(module, PatchedRotaryEmbedding):
            for rope in module.ropes.values():
                out.extend(rope.cos_sin(positions, dtype=torch.float64))
    return out


def prefix_equal(long: list[torch.Tensor], short: list[torch.Tensor]) -> bool:
    """Whether the tables of a longer pass, cut to the shorter's positions, are the
    shorter's bit for bit (so are the logits below it: a causal model's position ``i``
    sees only positions ``<= i``)."""
    return len(long) == len(short) and all(
        torch.equal(a.narrow(-2, 0, b.shape[-2]), b) for a, b in zip(long, short)
    )


def check_maps(loaded: Loaded, units: Any) -> None:
    """Patch (and unpatch) ``loaded`` once with each position map of ``units`` (``(scaling,
    length, factor)``), so that one ``patch`` refuses stops the run before any unit runs.

    Raises:
        PosEncError: naming the map, its factor and ``patch``'s reason.
    """
    for name, factor in dict.fromkeys((n, f) for n, _, f in units if n in REMAPS):
        try:
            unpatch(scaled(loaded, scaling_for(name, factor, loaded)))
        except PosEncError as error:
            raise PosEncError(
                f"{name} at factor {factor:g} cannot run on model "
                f"{loaded.identity.get('name')!r}: {error}"
            ) from None


def scaled(loaded: Loaded, scaling: Any) -> Any:
    """``loaded.model`` patched with ``scaling`` on its scaled layer types (the other layer
    types keep the config's; a position map on the RoPE-carrying full-attention layers, as
    ``patch`` remaps them); a model whose long-range layers are all NoPE keeps the config's
    own RoPE whatever ``scaling`` says. :func:`posenc.integrations.transformers.unpatch`
    undoes it."""
    if not loaded.scalable:
        return patch(loaded.model)
    if split_spec(scaling)[0] is not None:
        nested = scaling.get("scaling") if isinstance(scaling, dict) else None
        if nested is not None and loaded.scaled_types != [None]:  # not the sliding layers
            scaling = {**scaling, "scaling": dict.fromkeys(loaded.scaled_types, nested)}
        return patch(loaded.model, scaling=scaling)
    if loaded.scaled_types == [None]:
        return patch(loaded.model, scaling=scaling if scaling is not None else {"type": "default"})
    spec = {t: scaling if scaling is not None else {"type": "default"} for t in loaded.scaled_types}
    return patch(loaded.model, scaling=spec)
