"""``posenc inspect --hf-config PATH``: the encoding posenc builds for a transformers
``config.json`` (read as JSON: nothing is executed or downloaded) and, where transformers
is installed, its distance from the family's own rotary module."""

from __future__ import annotations

import importlib
import json
import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from posenc._errors import PosEncError
from posenc.integrations.transformers import rope_layer_types, rotary_from_config

__all__ = ["CHECK_POSITIONS", "encoding_summary", "hf_summary"]

#: Positions at which posenc's cos/sin are compared with the family's rotary module.
CHECK_POSITIONS = (0, 1, 4095, 1_000_000)


def read_config(path: str) -> dict[str, Any]:
    """The JSON object in ``path``; a missing file or bad JSON is a one-line PosEncError."""
    file = Path(path)
    if not file.is_file():
        raise PosEncError(f"--hf-config must be an existing file, got {path!r}")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PosEncError(f"--hf-config {path!r} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise PosEncError(
            f"--hf-config must hold a JSON object (a config.json), got {type(data).__name__}"
        )
    return data


def _text(data: Mapping[str, Any]) -> Mapping[str, Any]:
    text = data.get("text_config")
    return text if isinstance(text, Mapping) else data


def encoding_summary(rope: Any) -> dict[str, Any]:
    """The summary of one rotary module: type, dims, layout, base, scaling, frequencies."""
    inv = rope.inv_freq.double()
    wavelengths = (2 * math.pi / inv).tolist()
    partial = rope.rotary_dim < rope.head_dim
    return {
        "type": "rope" if rope.sections is None else "m-rope",
        "head_dim": rope.head_dim,
        "rotary_dim": rope.rotary_dim,
        "partial": (
            f"first {rope.rotary_dim} of {rope.head_dim} channels rotate, the rest pass through"
            if partial
            else "every channel rotates"
        ),
        "layout": rope.layout,
        "base": rope.base,
        "sections": None if rope.sections is None else list(rope.sections),
        "scaling": None if rope.scaling is None else repr(rope.scaling),
        "attention_scale": rope.attention_scale,
        "inv_freq_first": float(inv[0]),
        "inv_freq_last": float(inv[-1]),
        "wavelength_min": min(wavelengths),
        "wavelength_max": max(wavelengths),
    }


def _family_rotary(text: Mapping[str, Any]) -> tuple[Any, Any]:
    """The family's config object and rotary module (ImportError / LookupError if none)."""
    from transformers import AutoConfig

    fields = {k: v for k, v in text.items() if k != "model_type"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = AutoConfig.for_model(str(text.get("model_type")), **fields)
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        name = type(config).__module__.replace(".configuration_", ".modeling_")
        module = importlib.import_module(name)
        for attr, cls in vars(module).items():
            if attr.endswith("RotaryEmbedding") and not any(
                w in attr for w in ("Vision", "Audio", "DiT")
            ):
                try:
                    return config, cls(config)
                except Exception:  # another rotary class of the module
                    continue
    raise LookupError(f"no text rotary module found in {name}")


def _tf_cos_sin(module: Any, rope: Any, layer_type: str | None, pos: torch.Tensor) -> Any:
    kwargs = {} if layer_type is None else {"layer_type": layer_type}
    x = torch.zeros(1, 1, pos.shape[-1], rope.head_dim)
    ids = pos if pos.ndim == 2 else pos.permute(2, 0, 1)
    out = module(x, ids, **kwargs)
    if torch.is_tensor(out) and out.is_complex():
        return out.real.reshape(-1, out.shape[-1]), out.imag.reshape(-1, out.shape[-1])
    cos, sin = (t.reshape(-1, t.shape[-1]).double() for t in out)
    if bool(cos[0].abs().max() == 0) and pos.flatten()[0] == 0:  # GPT-J, CodeGen: (sin, cos)
        cos, sin = sin, cos
    half = rope.rotary_dim // 2
    if cos.shape[-1] == 2 * half:
        if torch.equal(cos[:, :half], cos[:, half:]):
            return cos[:, :half], sin[:, :half]
        return cos[:, ::2], sin[:, ::2]
    if cos.shape[-1] == half:
        return cos, sin
    raise LookupError(f"its cos/sin have {cos.shape[-1]} channels, posenc rotates {2 * half}")


def _compare(data: Mapping[str, Any], ropes: dict[str | None, Any]) -> dict[str, Any]:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return {"status": "transformers is not installed"}
    try:
        _, module = _family_rotary(_text(data))
    except Exception as e:  # reported, not raised: the summary still prints
        return {"status": f"the family's rotary could not be built ({type(e).__name__}: {e})"}
    limit = getattr(module, "embed_positions", None)
    positions = [p for p in CHECK_POSITIONS if limit is None or p < limit.shape[0]]
    errors: dict[str, float] = {}
    for layer_type, rope in ropes.items():
        pos = torch.tensor(positions)[None]
        if rope.position_coords is not None:
            pos = pos[..., None].expand(1, len(positions), rope.position_coords)
        try:
            cos, sin = _tf_cos_sin(module, rope, layer_type, pos)
        except Exception as e:
            return {"status": f"the family's cos/sin could not be compared ({e})"}
        ours = rope.cos_sin(pos, dtype=torch.float64)
        ours_cos, ours_sin = (t.reshape(-1, t.shape[-1]) for t in ours)
        worst = max(float((cos - ours_cos).abs().max()), float((sin - ours_sin).abs().max()))
        errors[str(layer_type or "all")] = worst
    return {"status": "compared", "positions": positions, "max_error": errors}


def hf_summary(path: str) -> dict[str, Any]:
    """What ``posenc inspect --hf-config PATH`` prints, as a dict.

    Raises:
        PosEncError: a missing file, bad JSON, or a config posenc cannot express (one line,
            naming the ``model_type``).
    """
    data = read_config(path)
    text = _text(data)
    layer_types = rope_layer_types(data)
    ropes = {lt: rotary_from_config(data, layer_type=lt) for lt in layer_types}
    return {
        "model_type": text.get("model_type"),
        "layers": {str(lt or "all"): encoding_summary(r) for lt, r in ropes.items()},
        "transformers": _compare(data, ropes),
    }
