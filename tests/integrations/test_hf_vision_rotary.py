"""Every transformers vision rotary whose config defaults to rope type ``"axial"``, found in
the installed transformers itself (not a hand list): its default config, q/k at a 64 x 64
patch grid and 64 patches scattered up to 1e4, rotated by ``rotary_from_config(config)``
against the family's own rotary module and vision apply function, in float32. Families
posenc cannot express are listed in ``REFUSED`` with the reason, matched in the
``PosEncError`` that names their ``model_type``.

Discovery imports every ``configuration_*.py`` that mentions ``"axial"`` and keeps the config
classes whose ``default_rope_type`` is ``"axial"``; the rotary is the ``*RotaryEmbedding`` of
the family's ``modeling_*.py`` whose ``__init__`` takes that config class, its apply the
module's ``apply_rotary_pos_emb_vision`` (``[s, h, d]`` q/k), else SAM's
``apply_rotary_pos_emb_2d`` / EdgeTAM's ``apply_rotary_pos_emb_2d_self_attn`` (``[..., s, d]``).

Tolerances as in ``test_hf_families``: transformers forms ``p * inv_freq`` in float32, off by
up to ``p * TF_ANGLE_ERROR_PER_POSITION`` rad, so each rotated value is off by that times its
channel pair's norm (at most sqrt(2) here: entries in [-1, 1]); posenc is held to float32
rounding of the float64 reference (``REF_ATOL``). The grid (positions < 64) and the
scattered patches are compared separately, so at small positions a wrong layout or frequency
(off by O(1)) cannot hide under the large positions' bound.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pathlib
import warnings
from typing import Any

import pytest
import torch
from tests.rotary.test_nd import _reference as nd_reference
from tests.rotary.test_transformers_parity import REF_ATOL, TF_ANGLE_ERROR_PER_POSITION

from posenc import AxialRotaryEmbedding, PosEncError, reference
from posenc.integrations import _hf_vision
from posenc.integrations.transformers import rotary_from_config

pytest.importorskip("transformers")

# The families posenc refuses, each with what is missing (matched in the error).
REFUSED: dict[str, str] = {
    "gemma4_vision": "half-paired block of their own",
    "pixtral": "odd frequencies of one head_dim-wide vector",
    "kimi_k25_vision": "interleave the W and H frequencies",
    "step3p5_vision": "in the order W, H",
    "inkling2_vision": "in the order W, H",
    "glm_image_vision": "has no rotary embedding",
}
_APPLY_NAMES = (
    "apply_rotary_pos_emb_vision",
    "apply_rotary_pos_emb_2d",
    "apply_rotary_pos_emb_2d_self_attn",
)
_PAIR_NORM = 2.0**0.5


def _quiet(fn: Any, *args: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args)


@functools.cache
def discover() -> dict[str, tuple[Any, Any, Any]]:
    """model_type -> (config class, rotary class or None, modeling module or None)."""
    import transformers.models

    root = pathlib.Path(transformers.models.__file__).parent
    found: dict[str, tuple[Any, Any, Any]] = {}
    for path in sorted(root.glob("*/configuration_*.py")):
        if '"axial"' not in path.read_text():
            continue
        name = f"transformers.models.{path.parent.name}"
        configs = _quiet(importlib.import_module, f"{name}.{path.stem}")
        classes = [
            c
            for c in vars(configs).values()
            if isinstance(c, type)
            and c.__module__ == configs.__name__
            and getattr(c, "default_rope_type", None) == "axial"
        ]
        modeling_path = path.parent / f"modeling_{path.parent.name}.py"
        modeling = (
            _quiet(importlib.import_module, f"{name}.{modeling_path.stem}")
            if modeling_path.exists()
            else None
        )
        rotaries = [
            c
            for n, c in vars(modeling or object()).items()
            if n.endswith("RotaryEmbedding") and isinstance(c, type)
        ]
        for config_cls in classes:
            taken = [r for r in rotaries if _takes(r, config_cls)]
            if config_cls.model_type in found and not taken:
                continue  # a deprecated alias of a class already found (ERNIE 4.5 VL)
            found[config_cls.model_type] = (config_cls, taken[0] if taken else None, modeling)
    return found


def _takes(rotary_cls: Any, config_cls: Any) -> bool:
    params = list(inspect.signature(rotary_cls.__init__).parameters.values())[1:]
    return bool(params) and params[0].annotation is config_cls


FAMILIES = discover()


def test_discovery_finds_the_families() -> None:
    """The walk finds the axial vision families, every one is known to posenc's table of
    class defaults, and every refusal names a real family."""
    assert len(FAMILIES) >= 30
    for name in ("qwen2_vl_vision", "qwen3_vl_vision", "glm4v_vision", "paddleocr_vl_vision"):
        assert name in FAMILIES, name
    # the table holds every family found; the ones it holds beyond them are a newer
    # transformers' (5.25's LLaVA-OneVision 1.5, Ovis 2.5), unknown to the installed one
    assert set(FAMILIES) <= _hf_vision.AXIAL_DEFAULT
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformers import CONFIG_MAPPING
    assert not (_hf_vision.AXIAL_DEFAULT - set(FAMILIES)) & set(CONFIG_MAPPING.keys())
    assert set(REFUSED) <= set(FAMILIES)
    assert set(REFUSED) == set(_hf_vision.AXIAL_UNSUPPORTED)
    # every family posenc reproduces has a rotary module to compare with
    assert all(FAMILIES[m][1] is not None for m in set(FAMILIES) - set(REFUSED))


def _positions(n_axes: int) -> torch.Tensor:
    """``[4160, n_axes]``: a 64 x 64 grid (row, column; MiniMax's time axis 0..3 cycling),
    then 64 patches scattered up to 1e4 on every axis."""
    grid = torch.stack(torch.meshgrid(torch.arange(64), torch.arange(64), indexing="ij"), -1)
    grid = grid.reshape(-1, 2)
    if n_axes == 3:
        grid = torch.cat([(torch.arange(4096) % 4)[:, None], grid], -1)
    g = torch.Generator().manual_seed(7)
    scattered = torch.randint(0, 10_000, (64, n_axes), generator=g)
    scattered[-1] = 9_999
    return torch.cat([grid, scattered])


def _transformers_qk(model_type: str, config: Any, q, k, pos):
    """q, k (``[1, h, s, d]``) rotated by the family's own rotary module and apply."""
    _, rotary_cls, modeling = FAMILIES[model_type]
    module = _quiet(rotary_cls, config)
    cos, sin = module(q, pos)
    apply = next(getattr(modeling, n) for n in _APPLY_NAMES if hasattr(modeling, n))
    if apply.__name__ == "apply_rotary_pos_emb_vision":  # [s, h, d], cos [s, r]
        qr, kr = apply(q[0].transpose(0, 1), k[0].transpose(0, 1), cos, sin)
        return qr.transpose(0, 1)[None], kr.transpose(0, 1)[None]
    return apply(q, k, cos, sin)  # SAM: [..., s, d], cos [1, s, d]


def _reference_qk(rope: AxialRotaryEmbedding, q, k, pos):
    inv_freq = reference.axial_frequencies(rope.axis_dims, base=rope.base)
    return nd_reference(q, k, pos, pos, inv_freq, rope.sections, rope.layout)


@pytest.mark.parametrize("model_type", sorted(set(FAMILIES) - set(REFUSED)))
def test_vision_rotary_matches_transformers(model_type: str) -> None:
    config = _quiet(FAMILIES[model_type][0])
    rope = rotary_from_config(config)
    assert isinstance(rope, AxialRotaryEmbedding)
    assert rope.to_config() == rotary_from_config(config.to_dict()).to_config()
    pos = _positions(rope.position_coords)
    g = torch.Generator().manual_seed(3)
    q = torch.rand(1, 2, pos.shape[0], rope.head_dim, generator=g) * 2 - 1
    k = torch.rand(1, 2, pos.shape[0], rope.head_dim, generator=g) * 2 - 1

    ours = rope(q, k, pos)
    with torch.no_grad():
        theirs = _transformers_qk(model_type, config, q, k, pos)
    expected = _reference_qk(rope, q, k, pos)
    for name, a, b, e in zip("qk", ours, theirs, expected, strict=True):
        assert a.shape == b.shape == q.shape, name
        for part, p_max in ((slice(0, 4096), 64), (slice(4096, None), 10_000)):
            bound = REF_ATOL + TF_ANGLE_ERROR_PER_POSITION * p_max * _PAIR_NORM
            mine, tf, ref = a[:, :, part], b[:, :, part], e[:, :, part].float()
            torch.testing.assert_close(mine, ref, atol=REF_ATOL, rtol=0, msg=f"posenc {name}")
            torch.testing.assert_close(tf, ref, atol=bound, rtol=0, msg=f"transformers {name}")
            torch.testing.assert_close(mine, tf, atol=bound, rtol=0, msg=f"{model_type} {name}")


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_refused_families_name_the_model_type(model_type: str) -> None:
    config = _quiet(FAMILIES[model_type][0])
    for spec in (config, config.to_dict()):
        with pytest.raises(PosEncError, match=REFUSED[model_type]) as error:
            rotary_from_config(spec)
        assert repr(model_type) in str(error.value)


def test_dict_without_rope_type_uses_the_class_default() -> None:
    """A vision ``config.json`` without ``rope_parameters``: the family's class default
    (axial, theta 10000) is read from its ``model_type``."""
    rope = rotary_from_config(
        {"model_type": "qwen3_vl_vision", "hidden_size": 1152, "num_attention_heads": 16}
    )
    assert isinstance(rope, AxialRotaryEmbedding)
    assert (rope.head_dim, rope.axis_dims, rope.base, rope.layout) == (72, (36, 36), 1e4, "half")


def test_axial_refuses_scaling_keys_and_bad_head_dims() -> None:
    base = {"model_type": "qwen3_vl_vision", "hidden_size": 1152, "num_attention_heads": 16}
    with pytest.raises(PosEncError, match=r"'qwen3_vl_vision'.*takes only rope_theta"):
        rotary_from_config({**base, "rope_parameters": {"rope_type": "axial", "factor": 2.0}})
    with pytest.raises(PosEncError, match=r"per-axis rotary dim 35 .* must be even"):
        rotary_from_config({**base, "head_dim": 70})
    with pytest.raises(PosEncError, match="memory_attention_hidden_size"):
        rotary_from_config({"model_type": "sam2_video"})
