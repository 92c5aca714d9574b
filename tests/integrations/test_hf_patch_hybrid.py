"""Position maps on hybrid models: only the RoPE-carrying full-attention layers are remapped.

Gemma 3 (sliding and full layers) and SmolLM3 (every fourth layer NoPE) are compared layer
by layer: each attention layer of the mapped model is run again, on the inputs it was given,
as the plain patched layer (sliding and NoPE layers: the same output) or with this suite's
restatement of the reference (remapped layers: test_hf_patch_remap.reference). Models whose
long-range layers have no RoPE are refused by name: Cohere 2, EXAONE 4 with its sliding
pattern, Llama 4 with chunked RoPE layers, Kimi Linear.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc import PosEncError  # noqa: E402
from posenc.integrations import _hf_patch_remap as hf_remap  # noqa: E402
from posenc.integrations.transformers import patch  # noqa: E402

from . import _tiny_models as tiny  # noqa: E402
from .test_hf_patch_remap import ACTIVE, SEQ, reference  # noqa: E402

_GEMMA3_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
HYBRIDS: dict[str, tuple[dict[str, Any], list[bool]]] = {
    # model_type -> (its tiny config's overrides, which layers a map remaps)
    "gemma3_text": (dict(num_hidden_layers=4, layer_types=_GEMMA3_TYPES), [0, 1, 0, 1]),
    "smollm3": (dict(num_hidden_layers=4), [1, 1, 1, 0]),  # no_rope_layers: every 4th NoPE
}


def _attention_layers(model: Any) -> list[Any]:
    return [block.self_attn for block in model.model.layers]


def _globals_of(layer: Any) -> str:
    """The module name of the globals the layer's innermost forward reads."""
    fn = layer.forward.__func__
    while hasattr(fn, "__wrapped__"):  # decorators (deprecate_kwarg, the kernels hub)
        fn = fn.__wrapped__
    return fn.__globals__["__name__"]


def _captured(model: Any, ids: torch.Tensor) -> list[tuple[tuple, dict, torch.Tensor]]:
    """Each attention layer's ``(args, kwargs, output)`` in one forward of ``model``."""
    seen: list[tuple[tuple, dict, torch.Tensor]] = []
    hooks = [
        layer.register_forward_hook(
            lambda m, args, kwargs, out: seen.append((args, kwargs, out[0])), with_kwargs=True
        )
        for layer in _attention_layers(model)
    ]
    try:
        with torch.no_grad():
            model(ids, use_cache=False)  # no cache in the captured inputs: they run again
    finally:
        for hook in hooks:
            hook.remove()
    return seen


@pytest.mark.parametrize("kind", list(ACTIVE))
@pytest.mark.parametrize("model_type", sorted(HYBRIDS))
def test_only_full_attention_rope_layers_are_remapped(
    model_type: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    extra, remapped = HYBRIDS[model_type]
    plain = patch(tiny.model(model_type, **extra))
    mapped = patch(tiny.model(model_type, **extra), scaling=ACTIVE[kind])  # the same weights
    layers, plain_layers = _attention_layers(mapped), _attention_layers(plain)
    assert [hf_remap.STATE_ATTR in layer.__dict__ for layer in layers] == [
        bool(r) for r in remapped
    ]
    for layer, plain_layer, is_remapped in zip(layers, plain_layers, remapped):
        assert ("_hf_remapped." in _globals_of(layer)) == bool(is_remapped)
        assert _globals_of(plain_layer).startswith("posenc.integrations._hf_patched.")

    ids = tiny.ids(seq=SEQ)
    captured = _captured(mapped, ids)
    monkeypatch.setattr(hf_remap, "remapped_attention_at", reference)
    with torch.no_grad():
        for i, (args, kwargs, out) in enumerate(captured):
            if remapped[i]:  # the reference restated, on the same inputs
                expected = layers[i](*args, **kwargs)[0]
                as_plain = plain_layers[i](*args, **kwargs)[0]
                assert not torch.allclose(as_plain, out, rtol=0, atol=1e-4), f"layer {i}"
                torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5, msg=f"layer {i}")
            else:  # sliding-window or NoPE: the plain patched layer, bit for bit
                expected = plain_layers[i](*args, **kwargs)[0]
                torch.testing.assert_close(out, expected, rtol=0, atol=0, msg=f"layer {i}")


def test_sliding_layers_keep_their_rope_and_the_full_ones_take_the_nested_scaling() -> None:
    """A nested scaling reaches the layer types ``scaling=`` alone would: here, in the
    per-layer-type form, the full-attention layers only."""
    extra, _ = HYBRIDS["gemma3_text"]
    nested = {"full_attention": {"type": "linear", "factor": 4.0}}
    model = patch(
        tiny.model("gemma3_text", **extra), scaling={**ACTIVE["string"], "scaling": nested}
    )
    ropes = tiny.text_model(model).rotary_emb.ropes
    assert ropes["sliding_attention"].scaling is None
    assert ropes["full_attention"].scaling is not None
    assert ropes["full_attention"].scaling.factor == 4.0


# --- models whose long-range layers are NoPE ---------------------------------------------------


def _kimi_linear() -> Any:
    config = transformers.KimiLinearConfig(
        **tiny.SIZES,
        num_attention_heads=4,
        num_key_value_heads=2,
        q_lora_rank=None,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        num_experts=4,
        num_experts_per_token=2,
        moe_intermediate_size=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        linear_attn_config={
            "full_attn_layers": [2],
            "kda_layers": [1],
            "head_dim": 16,
            "num_heads": 4,
            "short_conv_kernel_size": 4,
        },
    )
    assert config.layer_types == ["linear_attention", "full_attention"]
    return transformers.AutoModelForCausalLM.from_config(config).eval()


_NOPE = r"model_type '{}': its full-attention layers have no RoPE \(NoPE\); {} remaps RoPE"
REFUSED: dict[str, tuple[Any, str]] = {
    # Cohere 2 and EXAONE 4: LLLG (three sliding RoPE layers, one full NoPE layer)
    "cohere2": (lambda: tiny.model("cohere2", num_hidden_layers=4), _NOPE),
    "exaone4": (lambda: tiny.model("exaone4", num_hidden_layers=4), _NOPE),
    # Llama 4: chunked RoPE layers, NoPE full-attention layers (its default)
    "llama4_text": (lambda: tiny.model("llama4_text"), _NOPE),
    "llama4_text_unchunked": (
        lambda: tiny.model("llama4_text", attention_chunk_size=None),
        r"model_type '{}': its attention is not handed position_ids",
    ),
    "kimi_linear": (_kimi_linear, _NOPE),
}


@pytest.mark.parametrize("kind", ["self_extend", "string"])
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_models_without_rope_in_long_range_layers_refused_by_name(case: str, kind: str) -> None:
    make, pattern = REFUSED[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = make()
    model_type = model.config.get_text_config().model_type
    ids = tiny.ids(seq=SEQ)
    expected, tree = tiny.logits(model, ids), tiny.tree(model)
    with pytest.raises(PosEncError, match=pattern.format(model_type, kind)) as info:
        patch(model, scaling=ACTIVE[kind])
    assert "\n" not in str(info.value)
    assert tiny.tree(model) == tree and tiny.instance_forwards(model) == []
    assert torch.equal(tiny.logits(model, ids), expected)


def test_exaone4_without_a_sliding_window_rotates_and_is_remapped_everywhere() -> None:
    model = tiny.model(
        "exaone4", num_hidden_layers=4, sliding_window=None, layer_types=["full_attention"] * 4
    )
    patch(model, scaling=ACTIVE["self_extend"])
    assert all(hf_remap.STATE_ATTR in layer.__dict__ for layer in _attention_layers(model))
