"""Every transformers family with a text rotary embedding, found in the installed
transformers (``_hf_families.discover``, not a hand list): its default config, every layer
type, q/k rotated by ``rotary_from_config(config)`` (no layout given) against the family's
own rotary module and apply function, at positions 0..4095 and 64 scattered up to 1e6, in
float32 and bfloat16. Families posenc cannot express are listed in ``REFUSED`` with the
reason, and must raise ``PosEncError`` naming their ``model_type``.

Tolerances, per element, from transformers' own float32 error against a float64 evaluation
(``posenc.reference``): transformers forms the angle ``p * inv_freq`` in float32, off by up
to ``p * 3.1e-7`` rad (``TF_ANGLE_ERROR_PER_POSITION``, measured in
``tests/rotary/test_transformers_parity.py``), so its rotated value is off by that times the
norm of the element's channel pair times the attention scale. The test asserts transformers
stays within that bound of float64 (the measurement, per family), posenc within float32
rounding of float64 (``REF_ATOL``), and the two within the bound of each other. bfloat16:
both round the output to bfloat16 (relative 2^-8) and transformers also rounds cos/sin and
each product to bfloat16, so the bound gains ``3 * 2^-8`` times the pair norm; posenc is held
to one bfloat16 rounding of float64. The pair norm is taken over both pairings
(``(i, i + r/2)`` and ``(2i, 2i + 1)``) so the bound does not depend on posenc's layout; a
wrong layout is off by O(1) at small positions, where the bound is ~1e-3.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import torch
from tests.integrations import _hf_families as hf
from tests.rotary._reference import reference_qk
from tests.rotary.test_transformers_parity import REF_ATOL, TF_ANGLE_ERROR_PER_POSITION

from posenc import PosEncError, reference
from posenc.integrations.transformers import rotary_from_config

pytest.importorskip("transformers")


# The one list of families posenc refuses, each with what is missing (matched in the error).
REFUSED: dict[str, str] = {
    # composite configs whose components build the rotaries (each its own case here)
    "blt": "pass config.encoder_config or config.decoder_config",
    "nemotron3_diarization": "pass config.audio_config",
    # default configs with an odd head dim (2048 / 28 = 73) rotated whole: transformers'
    # cos/sin (74 channels) do not fit q either; valid ones: test_qwen3_omni_with_even_head_dim
    "qwen3_omni_moe": "must be even and >= 2",
    "qwen3_omni_moe_text-Qwen3OmniMoeThinkerTextRotaryEmbedding": "must be even and >= 2",
    "qwen3_omni_moe_text-Qwen3OmniMoeTalkerRotaryEmbedding": "must be even and >= 2",
    # its default config has no RoPE parameters per layer type, which its rotary module
    # indexes (a KeyError in transformers too); a valid one: test_cohere_compass_per_layer_type
    "cohere_compass_text": "for every layer type in layer_types",
    # default configs whose default sections (8, 12, 12) do not sum to rotary_dim / 2 (64, 11):
    # transformers' torch.split fails on them too; valid ones: test_glm_vision_text_families
    "glm4v_text": "mrope_section (the 'glm4v_text' default) must sum to rotary_dim / 2",
    "glm4v_moe_text": "mrope_section (the 'glm4v_moe_text' default) must sum to rotary_dim / 2",
    "glm_image_text": "mrope_section (the 'glm_image_text' default) must sum to rotary_dim / 2",
    "hunyuan_vl_text": "over the doubled (cos, cos) channels",
}

FAMILIES = {f.case: f for f in hf.discover()}
# Refusals of families only newer transformers have, kept where the installed one has them
_NEWER_REFUSED = {
    # PI0.5 (5.25): its PaliGemma VLM's text model and its action expert (a Gemma config)
    # each build a rotary; its own config has none (test_pi05_components_read_as_gemma)
    "pi05": "pass config.vlm_config or config.dit_config",
}
REFUSED.update({case: why for case, why in _NEWER_REFUSED.items() if case in FAMILIES})
BF16_ROUNDING = 3 * 2.0**-8


def test_discovery_finds_the_families() -> None:
    """The walk finds the families (not a hand list) and every refusal names a real one."""
    assert len(FAMILIES) > 150
    for name in ("llama", "gpt_neox", "cohere", "gptj", "deepseek_v3", "qwen2_vl"):
        assert any(f.model_type == name for f in FAMILIES.values()), name
    assert set(REFUSED) <= set(FAMILIES)


def _reference_qk(rope, q, k, positions, axes_last=None):
    """float64 expected output of ``rope`` (M-RoPE: at the per-axis ``axes_last``)."""
    pos = positions if axes_last is None else axes_last
    if rope.direction == "positive" and rope.section_layout != "spatial_interleaved":
        return reference_qk(rope, q, k, pos)
    return tuple(torch.from_numpy(_signed_reference(rope, x, pos.numpy())) for x in (q, k))


def _spatial_angles(p: np.ndarray, w: np.ndarray, sections) -> np.ndarray:
    """ERNIE 4.5-VL's M-RoPE angles, from its description: positions ``[..., s, n]`` (axes
    T, H, W), frequency ``j`` below ``(n - 1) * sections[1]`` takes axis ``1 + j % (n - 1)``
    (H, W, H, W, ...), the rest axis 0 (T)."""
    n = len(sections)
    axes = [1 + j % (n - 1) if j < (n - 1) * sections[1] else 0 for j in range(len(w))]
    return np.stack([p[..., a] * w[j] for j, a in enumerate(axes)], axis=-1)


def _signed_reference(rope, x: torch.Tensor, pos: np.ndarray) -> np.ndarray:
    """``rope``'s float64 rotation of ``x`` from posenc.reference's pieces, with what
    ``reference.rotary_qk`` has no keyword for: ``direction="negative"`` (the angles negated:
    NanoChat's ``cat(x2, -x1)``) and the spatial-interleaved sections."""
    spec = None if rope.scaling is None else dataclasses.asdict(rope.scaling)
    inv_freq, scale = reference.rope_frequencies(
        rope.rotary_dim, base=rope.base, scaling=spec, seq_len=float(pos.max()) + 1
    )
    w = np.asarray(inv_freq[: rope.rotary_dim // 2], dtype=np.float64)
    if rope.sections is None:
        theta = reference.rotary_angles(pos, w)
    elif rope.section_layout == "spatial_interleaved":
        theta = _spatial_angles(pos.astype(np.float64), w, rope.sections)
    else:
        theta = reference.sectioned_angles(pos, w, rope.sections, rope.section_layout)
    if rope.direction == "negative":
        theta = -theta
    return reference.apply_rotary(
        x.double().numpy(),
        theta,
        layout=rope.layout,
        scale=np.full(theta.shape, float(scale)),
        partial=rope.partial,
    )


def _pair_norm(x: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """Per element: the larger norm of its channel pair under either pairing (the rest: 0)."""
    rot = x[..., :rotary_dim].double()
    sq = rot * rot
    half = sq + sq.roll(rotary_dim // 2, dims=-1)
    inter = sq + sq.view(*sq.shape[:-1], -1, 2).flip(-1).reshape(sq.shape)
    pair = torch.maximum(half, inter).sqrt_()
    return torch.cat([pair, torch.zeros_like(x[..., rotary_dim:], dtype=torch.float64)], dim=-1)


@dataclasses.dataclass
class _Expected:
    """One family's float64 expectation and bounds for q and k (each a pair of tensors)."""

    values: tuple[torch.Tensor, ...]  # posenc.reference's rotated q, k
    angle: tuple[torch.Tensor, ...]  # transformers' float32 angle error (no REF_ATOL)
    bf16: tuple[torch.Tensor, ...]  # the angle bound plus the bfloat16 roundings
    relative: tuple[torch.Tensor, ...]  # one bfloat16 rounding of the expected values


# Small caches (the order of the cases makes neighbours share inputs): inputs per shape,
# pair norms per shape and rotary dim, expectations per everything the reference reads.
_INPUTS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
_PAIRS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
_EXPECTED: dict[tuple, _Expected] = {}


def _bounded(cache: dict, key: tuple, make, size: int = 4):
    if key not in cache:
        if len(cache) >= size:
            cache.pop(next(iter(cache)))
        cache[key] = make()
    return cache[key]


def _inputs(head_dim: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit-normal q, k ``[1, 1, n, head_dim]`` with values exact in bfloat16 (one float64
    expectation serves both dtypes)."""

    def make():
        g = torch.Generator().manual_seed(0)
        shape = (1, 1, n, head_dim)
        q, k = (torch.randn(shape, generator=g).bfloat16().float() for _ in range(2))
        return q, k

    return _bounded(_INPUTS, (head_dim, n), make)


def _expected(rope, positions: torch.Tensor, key: tuple) -> _Expected:
    q, k = _inputs(rope.head_dim, positions.shape[1])

    width = 2 * rope.inv_freq.shape[0]  # the channels cos/sin span (whole head: head_dim)

    def pairs():
        return tuple(_pair_norm(x, width) for x in (q, k))

    def make() -> _Expected:
        axes = positions if positions.ndim == 3 else None
        values = _reference_qk(rope, q.double(), k.double(), positions, axes_last=axes)
        pair = _bounded(_PAIRS, (rope.head_dim, positions.shape[1], width), pairs)
        p = (positions if positions.ndim == 2 else positions.amax(-1)).double()  # [b, s]
        per_position = TF_ANGLE_ERROR_PER_POSITION * rope.attention_scale * p[:, None, :, None]
        angle = tuple(x * per_position for x in pair)
        relative = tuple(2.0**-8 * e.abs() for e in values)
        bf16 = tuple(
            a + (BF16_ROUNDING * rope.attention_scale) * x + r
            for a, x, r in zip(angle, pair, relative)
        )
        return _Expected(values, angle, bf16, relative)

    return _bounded(_EXPECTED, key, make)


def _reference_key(rope, positions_key: tuple) -> tuple:
    """Everything ``_reference_qk`` and the bounds read of ``rope``."""
    scaling = None if rope.scaling is None else repr(rope.scaling)
    sections = None if rope.sections is None else tuple(rope.sections)
    return (
        rope.head_dim,
        rope.rotary_dim,
        float(rope.base),
        scaling,
        rope.layout,
        rope.partial,
        rope.section_layout,
        rope.direction,
        sections,
        float(rope.attention_scale),
        positions_key,
    )


def _check(ours, theirs, exp: _Expected, dtype) -> None:
    """posenc within float32 (bfloat16) rounding of float64, transformers within its own
    bound of float64, and the two within that bound of each other; differences in float64
    (a float32 or bfloat16 value minus a float64 one is exact to 1e-16)."""
    bounds = exp.angle if dtype == torch.float32 else exp.bf16
    for a, b, e, bound, rel in zip(ours, theirs, exp.values, bounds, exp.relative):
        assert a.dtype == dtype and a.shape == b.shape
        # (CodeGen returns float32 for bfloat16 inputs: compared as it is)
        ours_err, theirs_err = a - e, b - e  # float64
        worst = (ours_err - theirs_err).abs_().sub_(bound).max()
        ours_err.abs_()
        if dtype != torch.float32:
            ours_err.sub_(rel)
        assert bool(ours_err.max() <= REF_ATOL), "posenc outside float32 rounding"
        assert bool(theirs_err.abs_().sub_(bound).max() <= REF_ATOL), (
            "transformers outside its own bound"
        )
        assert bool(worst <= REF_ATOL), (
            f"posenc vs transformers beyond the bound by {float(worst - REF_ATOL):.3g}"
        )


@pytest.mark.parametrize("case", sorted(set(FAMILIES) - set(REFUSED)))
def test_family_matches_transformers(case: str) -> None:
    family = FAMILIES[case]
    _compare(family, family.config())


def _compare(family, config, read=None) -> None:
    """posenc against the family's own rotary module and apply function for ``config``:
    every layer type, float32 and bfloat16. ``read(layer_type)`` builds posenc's module
    (default: ``rotary_from_config(config, layer_type=...)``)."""
    module = hf.rotary_module(family, config)  # built once: both dtypes, every layer type
    layer_types = hf.layer_types(config)
    assert layer_types, "no layer type to compare"
    for layer_type in layer_types:
        rope = (
            rotary_from_config(config, layer_type=layer_type) if read is None else read(layer_type)
        )
        axes = hf.position_axes(module, layer_type)  # M-RoPE: the module reads [n, b, s]
        assert rope.position_coords == axes, (
            f"transformers' rotary reads {axes} position axes, posenc's {rope.position_coords}"
        )
        positions_key = (rope.position_coords, hf.position_limit(module))
        positions = hf.positions(*positions_key)
        exp = _expected(rope, positions, _reference_key(rope, positions_key))
        q, k = _inputs(rope.head_dim, positions.shape[1])
        for dtype in (torch.float32, torch.bfloat16):
            qd, kd = q.to(dtype), k.to(dtype)
            theirs = hf.transformers_qk(family, config, layer_type, qd, kd, positions, module)
            ours = rope(qd, kd, positions)
            _check(ours, theirs, exp, dtype)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_family_refused_with_its_model_type(case: str) -> None:
    family = FAMILIES[case]
    config = family.config()
    errors = []
    for layer_type in hf.layer_types(config):  # lfm3: only its full-attention layers
        try:
            rotary_from_config(config, layer_type=layer_type)
        except PosEncError as error:
            errors.append(str(error))
    assert errors, "no layer type refused"
    for message in errors:
        assert f"model_type '{config.model_type}'" in message and REFUSED[case] in message


def test_deepseek_v4_rotates_its_last_channels() -> None:
    """``deepseek_v4``'s apply function rotates the trailing ``qk_rope_head_dim`` channels of
    each head and passes the leading ones through (``[nope | rope]``): posenc's
    ``partial="trailing"`` (interleaved pairs), which ``test_family_matches_transformers``
    compares number for number."""
    family = FAMILIES["deepseek_v4"]
    config = family.config()
    module = hf.rotary_module(family, config)
    x = torch.randn(1, 1, 8, config.head_dim, generator=torch.Generator().manual_seed(0))
    r = config.qk_rope_head_dim
    assert 0 < r < config.head_dim
    for layer_type in hf.layer_types(config):
        cos, sin = module(x, torch.arange(1, 9)[None], layer_type=layer_type)
        out = family.module.apply_rotary_pos_emb(x, cos, sin)
        assert torch.equal(out[..., :-r], x[..., :-r])
        assert (out[..., -r:] - x[..., -r:]).abs().amax(-1).min() > 1e-3
        rope = rotary_from_config(config, layer_type=layer_type)
        assert (rope.head_dim, rope.rotary_dim) == (config.head_dim, r)
        assert (rope.partial, rope.layout) == ("trailing", "interleaved")
        ours, _ = rope(x, x, torch.arange(1, 9)[None])
        assert torch.equal(ours[..., :-r], x[..., :-r])


def _built(family, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return family.config_cls(**kwargs)


@pytest.mark.parametrize(
    "case",
    [
        "qwen3_omni_moe_text-Qwen3OmniMoeThinkerTextRotaryEmbedding",
        "qwen3_omni_moe_text-Qwen3OmniMoeTalkerRotaryEmbedding",
    ],
)
def test_qwen3_omni_with_even_head_dim(case: str) -> None:
    """Qwen3-Omni's thinker and talker (interleaved M-RoPE, default sections) once the head
    dim is even."""
    family = FAMILIES[case]
    config = _built(family, head_dim=128)
    assert rotary_from_config(config).section_layout == "interleaved"
    _compare(family, config)


@pytest.mark.parametrize("sections", [[24, 20, 20], [16, 24, 24]])
def test_cohere_compass_per_layer_type(sections: list[int]) -> None:
    """Cohere Compass with RoPE parameters per layer type, as its rotary module needs them
    (interleaved M-RoPE; [16, 24, 24] overflows the interleaving: axis 1 keeps 21)."""
    family = FAMILIES["cohere_compass_text"]
    rope = {"rope_type": "default", "rope_theta": 5e4, "mrope_section": sections}
    config = _built(family, rope_parameters={"full_attention": rope})
    _compare(family, config)
    assert rotary_from_config(config, layer_type="full_attention").section_layout == ("interleaved")


@pytest.mark.parametrize("case", ["glm4v_text", "glm4v_moe_text", "glm_image_text"])
def test_glm_vision_text_families(case: str) -> None:
    """GLM-4V's text models (contiguous M-RoPE, default sections (8, 12, 12); GLM-4V pairs
    (2i, 2i + 1)) with a head of 128 and half of it rotating, where the sections fit."""
    family = FAMILIES[case]
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    config = _built(family, hidden_size=1024, num_attention_heads=8, rope_parameters=rope)
    ours = rotary_from_config(config)
    assert ours.sections == (8, 12, 12) and ours.rotary_dim == 64
    _compare(family, config)


def test_pi05_components_read_as_gemma() -> None:
    """PI0.5 (transformers >= 5.25) builds its action expert's rotary from
    ``config.dit_config`` (a Gemma config): posenc reads that config and matches PI0.5's
    own rotary module and apply function; the VLM's config reads as its Gemma text model."""
    modeling = pytest.importorskip("transformers.models.pi05.modeling_pi05")
    config = _built(FAMILIES["pi05"])
    expert = config.dit_config
    family = hf.Family(
        "pi05-dit", expert.model_type, modeling, modeling.PI05RotaryEmbedding, type(expert)
    )
    _compare(family, expert)
    vlm, text = (
        rotary_from_config(config.vlm_config),
        rotary_from_config(config.vlm_config.text_config),
    )
    assert repr(vlm) == repr(text)
    assert vlm.inv_freq.equal(text.inv_freq)


@pytest.mark.parametrize(
    "release,layout",
    [((5, 24), "half"), ((5, 25), "interleaved"), ((6, 0), "interleaved"), (None, "interleaved")],
    ids=["5.24", "5.25", "6.0", "no-transformers"],
)
def test_hy_v4_pairs_as_the_installed_release(monkeypatch, release, layout) -> None:
    """HY-V4's attention paired halves in transformers 5.24 and DeepSeek's interleaved pairs
    from 5.25 on (``_hf_families.LAYOUT_BEFORE``): posenc pairs as the installed release,
    and as the newest without one. ``test_family_matches_transformers[hy_v4]`` holds it to
    the installed transformers' own numbers."""
    from posenc.integrations import _hf_families

    monkeypatch.setattr(_hf_families, "installed_release", lambda: release)
    config = {"model_type": "hy_v4", "head_dim": 64, "rope_theta": 10000.0}
    assert rotary_from_config(config).layout == layout
