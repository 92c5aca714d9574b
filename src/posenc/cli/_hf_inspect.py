"""``posenc inspect --hf-config PATH``: the encoding posenc builds for a transformers
``config.json`` (read as JSON: nothing is executed or downloaded) and, where transformers
is installed, its distance from the family's own rotary module.

The file is read only when it is a regular file of at most :data:`CONFIG_MAX_BYTES`, its
JSON at most :data:`MAX_DEPTH` levels deep; every size it sets is estimated before anything
is built (:func:`check_config_sizes`; the family's rotary module is first built on the meta
device, where it allocates nothing, and measured), and refused over the command's memory
limit in one line naming the key.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from posenc._errors import PosEncError
from posenc._files import parse_json
from posenc.cli._checks import MIB, check_bytes, read_option_file
from posenc.integrations.transformers import rope_layer_types, rotary_from_config

__all__ = [
    "CHECK_POSITIONS",
    "CONFIG_MAX_BYTES",
    "MAX_DEPTH",
    "MAX_LAYERS",
    "check_config_sizes",
    "encoding_summary",
    "hf_summary",
    "read_config",
]

#: Positions at which posenc's cos/sin are compared with the family's rotary module.
CHECK_POSITIONS = (0, 1, 4095, 1_000_000)
#: The largest ``config.json`` read (published ones are a few kB; Llama 4's is 5 kB).
CONFIG_MAX_BYTES = 4 * MIB
#: The deepest nesting of JSON arrays and objects a config may have (published: 3 or 4).
MAX_DEPTH = 64
#: The most layers a config may count (transformers' config builds a list per layer).
MAX_LAYERS = 2**16
#: Bytes per channel a rotary module of the config costs inspect, generously: posenc's and
#: transformers' frequencies, the cos/sin at CHECK_POSITIONS in float32 and float64, the
#: differences (measured: about 140).
_BYTES_PER_CHANNEL = 256
# Keys whose integer value counts channels (head_dim, qk_rope_head_dim, rotary_dim,
# hidden_size, ...) or layers (num_hidden_layers, n_layer, num_mtp_layers, ...).
_CHANNEL_KEY = re.compile(r"(^|_)dim$|^(hidden_size|n_embd|d_model)$")
_LAYER_KEY = re.compile(r"(^|_)layers?$|^n_layer$")


def read_config(path: str) -> dict[str, Any]:
    """The JSON object in ``path``; a missing or irregular file, one over
    :data:`CONFIG_MAX_BYTES`, bad JSON, JSON nested over :data:`MAX_DEPTH` levels or an
    integer too long to read is a one-line PosEncError naming ``--hf-config``."""
    raw = read_option_file("--hf-config", path, max_bytes=CONFIG_MAX_BYTES)
    data = parse_json(raw, f"--hf-config {path!r}", too_deep=f"over {MAX_DEPTH} levels deep")
    if not isinstance(data, dict):
        raise PosEncError(
            f"--hf-config must hold a JSON object (a config.json), got {type(data).__name__}"
        )
    _check_depth(path, data)
    return data


def _check_depth(path: str, data: Any) -> None:
    """Refuse JSON nested deeper than :data:`MAX_DEPTH` (the readers would recurse)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise PosEncError(
                f"--hf-config {path!r} nests JSON arrays or objects over {MAX_DEPTH} levels deep"
            )
        children = value.values() if isinstance(value, dict) else value
        if isinstance(value, (dict, list)):
            stack.extend((v, depth + 1) for v in children if isinstance(v, (dict, list)))


def _int_keys(data: Any, pattern: re.Pattern[str]) -> Iterator[tuple[str, int]]:
    """``(key, value)`` of every integer whose key matches ``pattern``, at any depth."""
    stack = [data]
    while stack:
        value = stack.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, v in items:
            if isinstance(v, (dict, list)):
                stack.append(v)
            elif isinstance(key, str) and isinstance(v, int) and not isinstance(v, bool):
                if pattern.search(key):
                    yield key, v


def check_config_sizes(data: Mapping[str, Any]) -> None:
    """Refuse a config whose sizes ask for more than the command may allocate, before
    anything is built, naming the key: a layer count over :data:`MAX_LAYERS`
    (``num_hidden_layers``: transformers' config builds a list per layer), or channels
    (``head_dim``, ``hidden_size``, ``rotary_dim``, ...) whose rotary modules and
    comparison are over the memory limit. The family's own tables (GPT-J's positions) are
    measured on the meta device later (:func:`_family_rotary`)."""
    for key, layers in _int_keys(data, _LAYER_KEY):
        if layers > MAX_LAYERS:
            raise PosEncError(
                f"--hf-config {key} must be at most {MAX_LAYERS} (the layers of a model), "
                f"got {layers}"
            )
    channels = sorted(_int_keys(data, _CHANNEL_KEY), key=lambda kv: kv[1])
    if channels:
        key, count = channels[-1]
        check_bytes(
            f"--hf-config {key}={count}: its rotary frequencies and cos/sin",
            _BYTES_PER_CHANNEL * max(count, 0),
            hint=f"no model has a {key} that large",
        )


def _text(data: Mapping[str, Any]) -> Mapping[str, Any]:
    text = data.get("text_config")
    return text if isinstance(text, Mapping) else data


def encoding_summary(rope: Any) -> dict[str, Any]:
    """The summary of one rotary module: type, dims, layout, base, scaling, frequencies."""
    inv = rope.inv_freq.double()
    wavelengths = 2 * torch.pi / inv
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
        "scaling_parameters": _parameters(rope.scaling),
        "attention_scale": rope.attention_scale,
        "inv_freq_first": float(inv[0]),
        "inv_freq_last": float(inv[-1]),
        "wavelength_min": float(wavelengths.min()),
        "wavelength_max": float(wavelengths.max()),
    }


def _parameters(scaling: Any) -> dict[str, Any] | None:
    """A scaling's fields as JSON values (tuples as lists: LongRoPE's factor lists whole)."""
    if scaling is None or not dataclasses.is_dataclass(scaling):
        return None
    out = {}
    for f in dataclasses.fields(scaling):
        value = getattr(scaling, f.name)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


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
                    with torch.device("meta"):  # allocates nothing: measured first
                        probe = cls(config)
                except Exception:  # another rotary class of the module
                    continue
                _check_module_size(probe, text)
                return config, cls(config)
    raise LookupError(f"no text rotary module found in {name}")


def _check_module_size(probe: Any, text: Mapping[str, Any]) -> None:
    """Refuse the family's rotary module when building it for real would take more than
    the command may allocate: ``probe`` is it built on the meta device, its tensors (GPT-J's
    ``[n_positions, rotary_dim]`` table) counted four times over (the temporaries that build
    them); the message names the config's keys that size its largest tensor."""
    tensors = [*probe.buffers(), *probe.parameters()]
    tensors += [v for v in vars(probe).values() if isinstance(v, torch.Tensor)]
    if not tensors:
        return
    largest = max(tensors, key=lambda t: t.numel())
    keys = [
        f"{k}={v}"
        for k, v in text.items()
        if isinstance(v, int) and not isinstance(v, bool) and v > 1 and v in largest.shape
    ]
    check_bytes(
        f"--hf-config {', '.join(keys) or 'sizes'}: transformers' {type(probe).__name__} "
        f"and its {list(largest.shape)} table",
        4 * sum(t.numel() * t.element_size() for t in tensors),
        hint="no model needs a table that large",
    )


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
    except PosEncError:  # a size over the limit: refused, naming the key
        raise
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
        PosEncError: a missing or irregular file, bad JSON, a size over the command's
            memory limit (naming the key), or a config posenc cannot express (one line,
            naming the ``model_type``).
    """
    data = read_config(path)
    check_config_sizes(data)
    text = _text(data)
    layer_types = rope_layer_types(data)
    ropes = {lt: rotary_from_config(data, layer_type=lt) for lt in layer_types}
    return {
        "model_type": text.get("model_type"),
        "layers": {str(lt or "all"): encoding_summary(r) for lt, r in ropes.items()},
        "transformers": _compare(data, ropes),
    }
