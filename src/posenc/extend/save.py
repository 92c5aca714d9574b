"""``posenc extend --save DIR``: the model with a scaling written into its config, loadable
by ``transformers.AutoModelForCausalLM.from_pretrained(DIR)`` without posenc.

The scaling is written in transformers' spelling (``rope_parameters``): ``linear``,
``dynamic`` and ``yarn`` as themselves; static NTK, which transformers has no type for, as
the base it amounts to (``rope_type: default`` with ``rope_theta = base * factor^(d / (d -
2))``, ``d`` the rotary dim). Models with RoPE parameters per layer type (Gemma 3) change
only the scaled layer types. ``max_position_embeddings`` becomes the target length, except
for dynamic NTK, which reads it as the trained context.

A model folder is saved as its new ``config.json`` beside links to its other files (the
weights are not copied); a ``.gguf`` model, which transformers dequantizes on loading, is
saved whole (``save_pretrained``: safetensors weights, config and tokenizer). A position map
(Self-Extend, STRING) is refused (:func:`check_savable`): no config key says it.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from posenc._errors import PosEncError
from posenc._files import atomic_write
from posenc.extend.model import Loaded, scaling_for, split_spec
from posenc.extend.settings import CONFIG, REMAPS
from posenc.integrations.spelling import to_rope_parameters
from posenc.integrations.transformers import rotary_from_config

__all__ = ["check_savable", "rope_parameters_for", "save_extended"]


def check_savable(name: str) -> None:
    """Refuse ``--save`` of a position map: a transformers config sets RoPE's frequencies,
    not the positions attention rotates each pair at."""
    if name in REMAPS:
        raise PosEncError(
            f"--save cannot write {name}: it remaps positions inside attention, which no "
            "transformers config key says; run it with posenc's patch(model, scaling=...) "
            "(transformers with posenc only)"
        )


def rope_parameters_for(loaded: Loaded, name: str, factor: float) -> dict[str, Any]:
    """The ``rope_parameters`` of one scaled layer type, in transformers' spelling
    (:func:`posenc.integrations.spelling.to_rope_parameters`: static NTK as its base);
    ``config`` is the config's own, or a GGUF file's own scaling (which transformers'
    GGUF reader drops); a position map's, the scaling it runs with (none: ``config``'s)."""
    config = loaded.model.config.get_text_config()
    layer = loaded.scaled_types[0]
    old = config.rope_parameters if layer is None else config.rope_parameters[layer]
    rope = rotary_from_config(config, layer_type=layer)
    remap, frequencies = split_spec(scaling_for(name, factor, loaded))
    if remap is not None and frequencies is None:
        name = CONFIG  # the model's own frequencies
    if name == CONFIG and not (loaded.path.is_file() and loaded.configured is not None):
        return dict(old)
    # a GGUF file's own scaling is one transformers' GGUF reader dropped: spell the one
    # measured (``Loaded.configured``), not the config's unscaled dict
    return to_rope_parameters(
        frequencies if name != CONFIG else scaling_for(name, factor, loaded),
        base=float(rope.base),
        rotary_dim=rope.rotary_dim,
        partial_rotary_factor=(old or {}).get("partial_rotary_factor"),
    )


def save_extended(
    loaded: Loaded, name: str, factor: float, target: int, out: str | os.PathLike[str]
) -> Path:
    """Write the model with scaling ``name`` at ``factor`` (for ``target`` tokens) into
    folder ``out``; returns it. Refused if ``out`` exists and is not an empty folder."""
    check_savable(name)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PosEncError(f"--save must name a new or empty folder, got {str(out)!r}")
    out.mkdir(parents=True, exist_ok=True)
    model = loaded.model
    text = model.config.get_text_config()
    params = rope_parameters_for(loaded, name, factor)
    before = (copy.deepcopy(text.rope_parameters), text.max_position_embeddings)
    new = (
        params
        if loaded.scaled_types == [None]
        else {**text.rope_parameters, **dict.fromkeys(loaded.scaled_types, params)}
    )
    try:
        text.rope_parameters = new
        if params.get("rope_type") != "dynamic":
            text.max_position_embeddings = target
        if loaded.path.is_file():
            quantization = getattr(model.config, "quantization_config", None)
            if quantization is not None:
                del model.config.quantization_config  # the weights saved are dequantized
            try:
                model.save_pretrained(out)
            finally:
                if quantization is not None:
                    model.config.quantization_config = quantization
            loaded.tokenizer.save_pretrained(out)
        else:
            config = model.config.to_json_string(use_diff=True)  # what to_json_file writes
            atomic_write(out / "config.json", config.encode("utf-8"))
            for item in loaded.path.iterdir():
                if item.name != "config.json":
                    (out / item.name).symlink_to(item.resolve())
    finally:
        text.rope_parameters, text.max_position_embeddings = before
    return out
