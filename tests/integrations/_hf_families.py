"""Every transformers family with a text rotary embedding, found in the installed
transformers itself, and one comparison of posenc against each family's own rotary module
and apply function.

Discovery walks ``transformers/models/*/modeling_*.py`` for a class named
``*RotaryEmbedding`` whose ``forward`` takes ``position_ids``, paired with each config class
it is built from: the one its ``__init__`` annotates, and the one of every model class that
builds it from its own ``config`` (``config: BltLocalEncoderConfig`` ... ``self.rotary_emb =
BltRotaryEmbedding(config=config)``: BLT's components, Qwen3-Omni's talker). Vision, audio
and DiT rotaries, which take patch grids or other arguments, are left out by name
(``Vision``, ``Audio``, ``DiT``), as are vision config classes. The apply function is the
module's own ``apply_rotary_pos_emb`` (``apply_rotary_pos_emb_interleave`` where the module
has only that, or the config sets ``rope_interleave``). :func:`position_axes` finds how many
position axes a family's rotary module reads (M-RoPE: ``position_ids [n, b, s]``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import pathlib
import re
import warnings
from typing import Any

import torch

from posenc.integrations._hf_patch import _hub_unwrapped

_SKIP_WORDS = ("Vision", "Audio", "DiT")


@dataclasses.dataclass(frozen=True)
class Family:
    case: str  # the parametrize id: the config's model_type (the class name where two share it)
    model_type: str
    module: Any
    rotary_cls: Any
    config_cls: Any

    def config(self):
        """The family's default config (the text config of a composite one)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = self.config_cls()
        text = config.get_text_config()
        return (
            text
            if hasattr(text, "rope_parameters") or not hasattr(config, "rope_parameters")
            else config
        )

    def apply_fn(self, config):
        """The apply function the family's main attention calls: DeepSeek's
        ``apply_rotary_pos_emb_interleave`` where the module calls it unconditionally (or
        under ``config.rope_interleave``), ``apply_rotary_emb`` (complex ``freqs_cis``), else
        ``apply_rotary_pos_emb``."""
        mod = self.module
        interleave = getattr(mod, "apply_rotary_pos_emb_interleave", None)
        if interleave is not None:
            conditional = "if self.config.rope_interleave" in _source(mod)
            if not conditional or getattr(config, "rope_interleave", False):
                return _hub_unwrapped(interleave)
        # transformers >= 5.25 with `kernels`: a hub wrapper around the function
        return _hub_unwrapped(getattr(mod, "apply_rotary_pos_emb", None) or mod.apply_rotary_emb)


@functools.cache
def _source(obj: Any) -> str:
    return inspect.getsource(obj)


def _config_class(rotary_cls):
    params = list(inspect.signature(rotary_cls.__init__).parameters.values())[1:]
    if not params:
        return None
    ann = params[0].annotation
    from transformers import PretrainedConfig

    if isinstance(ann, type) and issubclass(ann, PretrainedConfig):
        return ann
    return None


# A class body: its name and source (up to the next top-level class).
_CLASS = re.compile(r"^class (\w+)\(.*?\):\n(.*?)(?=^class |\Z)", re.M | re.S)
# In a model class: a rotary module built from the model's own config.
_BUILT = re.compile(r"(\w*RotaryEmbedding)\(\s*(?:config\s*=\s*)?(?:self\.)?config\s*[,)]")
_ANNOTATION = re.compile(r"^\s+config: (\w+)\s*$|def __init__\(self, config: (\w+)", re.M)


def _builders(source: str, mod: Any) -> list[tuple[str, Any]]:
    """``(rotary class name, config class)`` for every model class of a modeling module that
    builds a rotary module from its own (annotated) config."""
    found = []
    for match in _CLASS.finditer(source):
        body = match.group(2)
        annotation = _ANNOTATION.search(body)
        config_cls = (
            None if annotation is None else getattr(mod, annotation[1] or annotation[2], None)
        )
        if config_cls is None:
            continue
        found += [(name, config_cls) for name in sorted(set(_BUILT.findall(body)))]
    return found


@functools.cache
def discover() -> tuple[Family, ...]:
    import transformers.models
    from transformers import PretrainedConfig

    root = pathlib.Path(transformers.models.__file__).parent
    found: list[Family] = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        path = folder / f"modeling_{folder.name}.py"
        if not path.exists():
            continue
        source = path.read_text()
        names = re.findall(r"^class (\w*RotaryEmbedding)\(", source, re.M)
        names = [n for n in names if not any(w in n for w in _SKIP_WORDS)]
        if not names:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = importlib.import_module(f"transformers.models.{folder.name}.{path.stem}")
        pairs = [(name, _config_class(getattr(mod, name))) for name in names]
        pairs += [(name, c) for name, c in _builders(source, mod) if name in names]
        seen = set()
        for name, config_cls in pairs:
            cls = getattr(mod, name)
            if "position_ids" not in inspect.signature(cls.forward).parameters:
                continue
            if not (isinstance(config_cls, type) and issubclass(config_cls, PretrainedConfig)):
                continue
            if config_cls is PretrainedConfig:  # a model annotated with the base class (PI0.5's
                continue  # action expert, built from a component's config): no family's own
            if (
                any(w in config_cls.__name__ for w in ("Vision", "ViT"))
                or (cls, config_cls) in seen
            ):
                continue
            seen.add((cls, config_cls))
            model_type = str(config_cls.model_type) or config_cls.__name__  # Code2Wav: ""
            found.append(Family("", model_type, mod, cls, config_cls))
    counts: dict[str, int] = {}
    for f in found:
        counts[f.model_type] = counts.get(f.model_type, 0) + 1
    return tuple(
        dataclasses.replace(
            f,
            case=f.model_type
            if counts[f.model_type] == 1
            else f"{f.model_type}-{f.rotary_cls.__name__}",
        )
        for f in found
    )


def layer_types(config) -> list[str | None]:
    """The layer types with their own RoPE parameters that the config's layers use
    (``[None]``: one set for all layers)."""
    rope = getattr(config, "rope_parameters", None)
    if not (
        isinstance(rope, dict)
        and rope
        and all(isinstance(v, dict) or v is None for v in rope.values())
    ):
        return [None]
    used = getattr(config, "layer_types", None) or list(rope)
    chosen = [k for k, v in rope.items() if v is not None and k in used]
    # DeepSeek-V4 keys its rope parameters by rope labels ("main", "compress"), not by the
    # architecture's layer types: every label is then used by some layer
    return chosen or [k for k, v in rope.items() if v is not None]


def mrope_sections(config, layer_type):
    rope = getattr(config, "rope_parameters", None) or {}
    if layer_type is not None:
        rope = rope.get(layer_type) or {}
    return rope.get("mrope_section") or getattr(config, "mrope_section", None)


@functools.cache
def positions(n_axes: int | None = None, limit: int | None = None) -> torch.Tensor:
    """``[1, s]``: 0..4095 then 64 scattered positions up to 1e6 (``[1, s, n]`` with distinct
    per-axis coordinates for M-RoPE); only those below ``limit`` when given. One tensor per
    argument pair, shared by the callers: not to be modified."""
    g = torch.Generator().manual_seed(11)
    scattered = torch.randint(4096, 1_000_000, (63,), generator=g).sort().values
    pos = torch.cat([torch.arange(4096), scattered, torch.tensor([999_999])])[None]
    if limit is not None:
        pos = pos[pos < limit][None]
    if n_axes is None:
        return pos
    offsets = torch.randint(-2000, 2000, (n_axes, pos.shape[-1]), generator=g)
    offsets[0] = 0
    return (pos[..., None] + offsets.T[None]).clamp(min=0)  # [1, s, n]


def position_axes(module, layer_type) -> int | None:
    """How many position axes the family's rotary module reads (M-RoPE: 3 for
    ``position_ids [3, b, s]``, NeoMME's 2), ``None`` for ``[b, s]`` alone: the module is
    given distinct coordinates per axis, and reads them if it returns the shape it returns
    for ``[b, s]`` but other numbers."""
    x = torch.zeros(1, 1, 1)
    kwargs = {}
    if "layer_type" in inspect.signature(module.forward).parameters:
        kwargs["layer_type"] = layer_type
    with torch.no_grad():
        flat = module(x, torch.arange(1, 9)[None], **kwargs)
        for n in (3, 2):
            pos = torch.arange(1, 9)[None, None] * torch.arange(1, n + 1)[:, None, None]
            try:
                out = module(x, pos, **kwargs)
            except (RuntimeError, IndexError, ValueError):
                continue
            flat_t, out_t = (o if torch.is_tensor(o) else o[0] for o in (flat, out))
            if out_t.shape == flat_t.shape and not torch.equal(out_t, flat_t):
                return n
    return None


def rotary_module(family: Family, config):
    """The family's own rotary module, built from ``config``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return family.rotary_cls(config)


def transformers_qk(family: Family, config, layer_type, q, k, pos, module=None):
    """q, k rotated by the family's own rotary module (``module``, else one built from
    ``config``) and apply function. ``pos``: posenc's positions (``[b, s]`` or ``[b, s, n]``,
    moved to transformers' ``[n, b, s]``)."""
    if module is None:
        module = rotary_module(family, config)
    tf_pos = pos if pos.ndim == 2 else pos.permute(2, 0, 1)
    kwargs = {}
    if "layer_type" in inspect.signature(module.forward).parameters:
        kwargs["layer_type"] = layer_type
    out = module(q, tf_pos, **kwargs)
    apply = family.apply_fn(config)
    if torch.is_tensor(out) and out.is_complex():  # freqs_cis (Llama 4, DeepSeek-V2)
        if "unsqueeze(1)" in _source(apply):  # DeepSeek-V2: [b, h, s, d]
            return apply(q, k, out)
        qr, kr = apply(q.transpose(1, 2), k.transpose(1, 2), out)  # Llama 4: [b, s, h, d]
        return qr.transpose(1, 2), kr.transpose(1, 2)
    cos, sin = out
    params = list(inspect.signature(apply).parameters)
    r = cos.shape[-1]
    if params[1] in ("cos", "sin"):  # apply(x, cos, sin), one tensor at a time
        if "[:, :, None, :]" in _source(apply):  # GPT-J, CodeGen: [b, s, h, d]
            # their module returns (sin, cos) of half width; attention slices config.rotary_dim
            r = config.rotary_dim
            one = lambda x: apply(x.transpose(1, 2), cos, sin).transpose(1, 2)  # noqa: E731
        else:
            one = lambda x: apply(x, cos, sin)  # noqa: E731
        pair = lambda a, b: (one(a), one(b))  # noqa: E731
    else:
        pair = lambda a, b: apply(a, b, cos, sin)  # noqa: E731
    try:  # the apply function rotates the first cos.shape[-1] channels itself (GPT-NeoX)
        out = pair(q, k)
    except RuntimeError:  # else the family's attention slices them off first (Phi, GPT-J)
        if r >= q.shape[-1]:
            raise
        qr, kr = pair(q[..., :r], k[..., :r])
        out = torch.cat([qr, q[..., r:]], -1), torch.cat([kr, k[..., r:]], -1)
    if apply.__name__ == "apply_rotary_pos_emb_interleave":
        # DeepSeek's interleaved apply returns its output in half order ([x0, x2, ..., x1,
        # x3, ...]); put it back in q's channel order (q . k is the same in both orders)
        out = tuple(_reinterleave(x) for x in out)
    return out


def _reinterleave(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1]
    return x.reshape(*x.shape[:-1], 2, d // 2).transpose(-1, -2).reshape(x.shape)


def position_limit(module) -> int | None:
    """The largest position + 1 a family's rotary module serves (GPT-J / CodeGen keep a
    table of ``max_position_embeddings`` rows), else ``None``."""
    table = getattr(module, "embed_positions", None)
    return None if table is None else int(table.shape[0])
