"""``posenc.integrations.transformers.patch``: posenc's RoPE inside tiny random transformers models.

Every supported text family is built from its own config class (2 layers, hidden 64, vocab 128,
no download) and compared with itself unpatched: whole logits, greedy generation with the
KV cache, ``unpatch`` restoring it bit for bit, and the precision near position 1e6 against
a float64 run of the same model whose cos/sin are exact (written here, in plain torch).
"""

from __future__ import annotations

import copy
import ctypes
import functools
import warnings
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc import PosEncError  # noqa: E402
from posenc.integrations import _hf_patch_applies as hf_applies  # noqa: E402
from posenc.integrations.transformers import (  # noqa: E402
    PATCHABLE_FAMILIES,
    PatchedRotaryEmbedding,
    patch,
    rope_layer_types,
    rotary_from_config,
    unpatch,
)

from . import _tiny_models as tiny  # noqa: E402

_CONFIGS = tiny.CONFIGS
FAMILIES = sorted(_CONFIGS)  # the text families (the VL ones: test_hf_patch_mrope.py)
# the families whose rotary module returns (cos, sin) of [b, s] positions, as _ExactRotary
_COS_SIN_FAMILIES = sorted(set(FAMILIES) - {"gptj", "llama4_text"})
RTOL, ATOL = 1e-5, 1e-5  # logits are ~0.6 at most: atol is ~1e-5 relative to the largest
_BASE = tiny.BASE
_config, _model, _ids, _logits = tiny.config, tiny.model, tiny.ids, tiny.logits
_tree, _instance_forwards = tiny.tree, tiny.instance_forwards


def test_supported_families_are_the_tested_ones() -> None:
    assert set(PATCHABLE_FAMILIES) == set(tiny.ALL_FAMILIES)


# --- equal logits, generation, unpatch -------------------------------------------------------


@pytest.mark.parametrize("model_type", FAMILIES)
def test_patched_logits_equal_and_unpatch_restores_exactly(model_type: str) -> None:
    model = _model(model_type)
    ids = _ids()
    offsets = torch.tensor([[0], [3]])
    cases = [  # None; one offset for the batch; per-row positions [b, s] near 4096
        None,
        torch.arange(ids.shape[1])[None] + 1000,
        torch.arange(ids.shape[1])[None] + offsets + 4096 - ids.shape[1] - 3,
    ]
    before = [_logits(model, ids, p) for p in cases]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    tree = _tree(model)

    assert patch(model) is model
    assert isinstance(tiny.text_model(model).rotary_emb, PatchedRotaryEmbedding)
    n_layers = model.config.get_text_config().num_hidden_layers
    assert len(_instance_forwards(model)) == n_layers  # every attention layer, nothing else
    assert model.state_dict().keys() == state.keys()  # posenc adds no state
    for positions, expected in zip(cases, before):
        torch.testing.assert_close(_logits(model, ids, positions), expected, rtol=RTOL, atol=ATOL)

    assert unpatch(model) is model
    assert _tree(model) == tree
    assert _instance_forwards(model) == []
    assert "_posenc_patch" not in model.__dict__
    after = model.state_dict()
    assert after.keys() == state.keys()
    assert all(torch.equal(after[k], state[k]) for k in state)
    for positions, expected in zip(cases, before):
        assert torch.equal(_logits(model, ids, positions), expected)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_greedy_generate_with_cache_gives_the_same_tokens(model_type: str) -> None:
    model = _model(model_type)
    prompt = _ids(batch=1, seq=6)
    kwargs = dict(max_new_tokens=8, do_sample=False, use_cache=True, pad_token_id=0)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = model.generate(prompt, **kwargs)
        got = patch(model).generate(prompt, **kwargs)
    assert torch.equal(got, expected)


# --- the precision promise -------------------------------------------------------------------


class _ExactRotary(torch.nn.Module):
    """The family's rotary module computed in float64 throughout: transformers' own forces
    float32 angles (``position_ids.float() * inv_freq.float()``) even in a float64 model.
    Default RoPE only: ``inv_freq = base ** (-2i / r)``; cos/sin laid out as the family's
    apply takes them (``cat(f, f)``; Cohere and Cohere 2 repeat each frequency)."""

    def __init__(self, config: Any, repeat: bool) -> None:
        super().__init__()
        self.inv_freq: dict[str | None, torch.Tensor] = {}
        for layer_type in rope_layer_types(config):
            rope = rotary_from_config(config, layer_type=layer_type)
            assert rope.scaling is None
            r = rope.rotary_dim
            self.inv_freq[layer_type] = rope.base ** (
                -torch.arange(0, r, 2, dtype=torch.float64) / r
            )
        self.repeat = repeat

    def forward(self, x, position_ids, layer_type=None):
        angles = position_ids.to(torch.float64)[..., None] * self.inv_freq[layer_type]
        if self.repeat:
            emb = torch.repeat_interleave(angles, 2, dim=-1)
        else:
            emb = torch.cat([angles, angles], dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _relative(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref).norm() / ref.norm())


def precision_near(model_type: str, position: int = 10**6) -> dict[str, float]:
    """Relative (Frobenius) errors of the logits at positions ``position - 32 ..`` against
    the exact float64 run: the unpatched float32 model, the unpatched model in float64 (as
    transformers runs it: float32 angles) and the patched float32 model."""
    model = _model(model_type, float64=True)
    ids = _ids(seq=32)
    positions = torch.arange(32)[None] + position - 32
    exact = copy.deepcopy(model).double()
    exact.base_model.rotary_emb = _ExactRotary(
        model.config, repeat=model_type in ("cohere", "cohere2")
    )
    reference = _logits(exact, ids, positions)
    unpatched = _logits(model, ids, positions)
    unpatched64 = _logits(copy.deepcopy(model).double(), ids, positions)
    patched = _logits(patch(model), ids, positions)
    return {
        "unpatched_fp32": _relative(unpatched, reference),
        "unpatched_fp64": _relative(unpatched64, reference),
        "patched_fp32": _relative(patched, reference),
    }


@pytest.mark.parametrize("model_type", _COS_SIN_FAMILIES)
def test_patched_fp32_is_closer_to_exact_near_1e6(model_type: str) -> None:
    errors = precision_near(model_type)
    assert errors["patched_fp32"] < 1e-6, errors  # float32 rounding of the model itself
    # transformers' float32 angles at 1e6 are off by up to ~0.03 rad, in fp32 and fp64 runs
    assert errors["patched_fp32"] * 3 < errors["unpatched_fp32"], errors
    assert errors["patched_fp32"] * 3 < errors["unpatched_fp64"], errors


# --- per model, scaling=, compile, training ---------------------------------------------------


def test_another_model_of_the_family_is_unaffected() -> None:
    from transformers.models.llama import modeling_llama

    apply_before = modeling_llama.apply_rotary_pos_emb
    forward_before = modeling_llama.LlamaAttention.forward
    patched, other = _model("llama"), _model("llama", seed=1)
    ids, positions = _ids(), torch.arange(24)[None] + 100_000
    expected = _logits(other, ids, positions)
    patch(patched)
    assert torch.equal(_logits(other, ids, positions), expected)
    assert _instance_forwards(other) == []
    assert modeling_llama.apply_rotary_pos_emb is apply_before
    assert modeling_llama.LlamaAttention.forward is forward_before
    fresh = _model("llama", seed=1)  # built after the patch: unpatched too
    assert torch.equal(_logits(fresh, ids, positions), expected)


def test_patched_model_under_torch_compile() -> None:
    model = patch(_model("llama"))
    ids, positions = _ids(), torch.arange(24)[None] + 50_000
    expected = _logits(model, ids, positions)
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(_logits(compiled, ids, positions), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("model_type", ["llama", "cohere", "deepseek_v3", "gpt_neox"])
def test_training_gradients_equal_unpatched(model_type: str) -> None:
    model, reference = _model(model_type).train(), _model(model_type).train()
    ids = _ids()
    patch(model)
    losses = []
    for m in (model, reference):
        loss = m(ids, labels=ids).loss
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1], rtol=RTOL, atol=ATOL)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_bfloat16_model_keeps_float32_cos_sin() -> None:
    model = _model("llama").to(torch.bfloat16)
    ids, positions = _ids(), torch.arange(24)[None] + 500
    expected = _logits(model, ids, positions)
    patch(model)
    cos, sin = model.base_model.rotary_emb(torch.zeros(1, dtype=torch.bfloat16), positions)
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape == (1, 24, 8)
    got = _logits(model, ids, positions)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected, rtol=0.05, atol=0.05)  # bf16 rounding


def test_apply_takes_the_sequence_second_layout() -> None:
    apply = hf_applies.make_apply("half", hf_applies.STANDARD)
    q, k = torch.randn(2, 3, 5, 8), torch.randn(2, 1, 5, 8)  # [b, h, s, d], GQA
    rope = rotary_from_config({"head_dim": 8, "rope_theta": 100.0})
    cos, sin = rope.cos_sin(torch.arange(5)[None])
    q1, k1 = apply(q, k, cos, sin)
    q2, k2 = apply(q.transpose(1, 2), k.transpose(1, 2), cos, sin, unsqueeze_dim=2)
    assert torch.equal(q2.transpose(1, 2), q1) and torch.equal(k2.transpose(1, 2), k1)
    with pytest.raises(PosEncError, match="unsqueeze_dim must be 1 or 2, got 3"):
        apply(q, k, cos, sin, unsqueeze_dim=3)


def test_deepcopy_of_a_patched_model_unpatches_on_its_own() -> None:
    model = patch(_model("llama"))
    ids = _ids()
    expected = _logits(model, ids)
    twin = copy.deepcopy(model)
    torch.testing.assert_close(_logits(twin, ids), expected, rtol=0, atol=0)
    unpatch(twin)
    assert _instance_forwards(twin) == [] and _instance_forwards(model) != []
    assert isinstance(model.base_model.rotary_emb, PatchedRotaryEmbedding)
    assert torch.equal(_logits(model, ids), expected)


# --- refusals leave the model unchanged -------------------------------------------------------


def _unchanged(model: Any, tree: list, ids: torch.Tensor, expected: torch.Tensor) -> None:
    assert _tree(model) == tree
    assert _instance_forwards(model) == []
    assert "_posenc_patch" not in model.__dict__
    assert torch.equal(_logits(model, ids), expected)


@pytest.mark.parametrize(
    ("scaling", "match"),
    [
        ({"type": "nope", "factor": 2.0}, "nope"),
        ({"type": "yarn"}, "factor"),
        ({"type": "linear", "factor": 0.5}, "factor"),
        ({"type": "linear", "factor": 2.0, "bogus": 1}, "bogus"),
        ("yarn", "scaling"),
    ],
)
def test_bad_scaling_refused_before_any_change(scaling: Any, match: str) -> None:
    model = _model("llama")
    ids = _ids()
    expected, tree = _logits(model, ids), _tree(model)
    with pytest.raises(PosEncError, match=match):
        patch(model, scaling=scaling)
    _unchanged(model, tree, ids, expected)


def test_unsupported_family_refused_by_name() -> None:
    config = transformers.GPT2Config(vocab_size=128, n_embd=32, n_layer=1, n_head=2)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = _ids()
    expected, tree = _logits(model, ids), _tree(model)
    with pytest.raises(PosEncError, match=r"model_type 'gpt2'.*no rotary embedding"):
        patch(model)
    _unchanged(model, tree, ids, expected)


def _bloom() -> Any:
    config = transformers.BloomConfig(vocab_size=128, hidden_size=32, n_layer=1, n_head=2)
    return transformers.BloomForCausalLM(config).eval()


def _llama4_vision() -> Any:
    config = transformers.Llama4VisionConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        vision_output_dim=64,
        projector_input_dim=64,
        projector_output_dim=64,
        image_size=28,
        patch_size=14,
    )
    return transformers.Llama4VisionModel(config).eval()


def _nanochat() -> Any:
    config = transformers.NanoChatConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    return transformers.AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (_bloom, r"model_type 'bloom': it has no rotary embedding \(ALiBi"),
        (_llama4_vision, r"model_type 'llama4_vision_model': its vision encoder's rotary is 2-D"),
        (_nanochat, r"model_type 'nanochat': its attention has not been checked"),
    ],
    ids=["bloom", "llama4_vision", "nanochat"],
)
def test_unpatched_families_get_their_reason(make: Any, match: str) -> None:
    """A family patch does not cover is refused with its own reason, before any change
    (Llama 4's text model, ``llama4_text``, is covered: test_hf_patch_gptj_llama4)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = make()
    tree = _tree(model)
    with pytest.raises(PosEncError, match=match):
        patch(model)
    assert _tree(model) == tree


@pytest.mark.parametrize("value", ["a model", torch.nn.Linear(2, 2), None])
def test_not_a_model_refused(value: Any) -> None:
    with pytest.raises(PosEncError, match="model must be a transformers model"):
        patch(value)


def test_double_patch_and_unpatch_of_an_unpatched_model_refused() -> None:
    model = _model("llama")
    ids = _ids()
    expected, tree = _logits(model, ids), _tree(model)
    with pytest.raises(PosEncError, match="not patched"):
        unpatch(model)
    patch(model)
    patched_tree = _tree(model)
    with pytest.raises(PosEncError, match="already patched"):
        patch(model)
    with pytest.raises(PosEncError, match="already patched"):
        patch(model.model)  # the base model inside the patched one
    assert _tree(model) == patched_tree
    unpatch(model)
    _unchanged(model, tree, ids, expected)


def test_instance_forward_refused_before_any_change() -> None:
    model = _model("llama")
    layer = model.model.layers[1].self_attn
    layer.forward = layer.forward  # a forward of the instance, not accelerate's hook
    ids = _ids()
    expected, tree = _logits(model, ids), _tree(model)
    with pytest.raises(PosEncError, match="'self_attn' already has a forward of its own"):
        patch(model)
    assert _tree(model) == tree and _instance_forwards(model) == ["model.layers.1.self_attn"]
    assert "_posenc_patch" not in model.__dict__
    assert torch.equal(_logits(model, ids), expected)


def _hook(module: Any) -> None:
    """accelerate's ``add_hook_to_module`` pattern: the class forward kept as
    ``_old_forward``, the instance ``forward`` a wrapper calling it (here with a counter)."""
    module._hf_hook = object()
    module._old_forward = module.forward
    module.calls = 0

    def new_forward(module: Any, *args: Any, **kwargs: Any) -> Any:
        module.calls += 1
        return module._old_forward(*args, **kwargs)

    module.forward = functools.update_wrapper(
        functools.partial(new_forward, module), module._old_forward
    )


def test_accelerate_hooked_attention_is_patched_inside_the_hook() -> None:
    model = _model("llama")
    layers = [block.self_attn for block in model.model.layers]
    for layer in layers:
        _hook(layer)
    ids, positions = _ids(), torch.arange(24)[None] + 100_000
    expected = _logits(model, ids, positions)
    hooks = [(layer.forward, layer._old_forward) for layer in layers]
    patch(model)
    assert [layer.forward for layer in layers] == [h for h, _ in hooks]  # the hooks stay
    got = _logits(model, ids, positions)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)  # positions ~1e5
    assert _logits(unpatch(model), ids, positions).equal(expected)
    assert [(layer.forward, layer._old_forward) for layer in layers] == hooks
    assert all(layer.calls == 3 for layer in layers)


def test_patched_model_rotates_through_the_fused_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from posenc.rotary import kernels
    from posenc.rotary.kernels import cpu

    if not kernels.cpu_fast_path_enabled():
        pytest.skip("the fused CPU path is not built here (no C compiler)")
    launched: list[int] = []
    entry = cpu.packed_entry()

    def spy(address: int) -> int:  # the tensors rotated: the template's SLOT_TENSORS
        launched.append(ctypes.c_int64.from_address(address + 8 * cpu.SLOT_TENSORS).value)
        return entry(address)

    monkeypatch.setattr(cpu, "packed_entry", lambda: spy)  # the fused loop, planned or not
    model = patch(_model("glm4"))  # partial rotary, interleaved pairs
    for _ in range(2):  # the second pass: every layer's call shape is planned
        launched.clear()
        _logits(model, _ids())
        assert launched == [2] * model.config.num_hidden_layers  # q and k in one launch


def test_multimodal_gemma3_patches_its_text_decoder_only() -> None:
    text = {**_BASE, **_CONFIGS["gemma3_text"][1], "vocab_size": 300}
    layers = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    vision = {**layers, "image_size": 28, "patch_size": 14}  # 2 x 2 patches of 14 pixels
    config = transformers.Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=4,
        image_token_index=299,
        boi_token_index=297,
        eoi_token_index=298,
    )
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    ids, positions = torch.randint(3, 290, (1, 20)), torch.arange(20)[None] + 2000
    expected = _logits(model, ids, positions)
    patch(model)
    assert isinstance(model.model.language_model.rotary_emb, PatchedRotaryEmbedding)
    assert all(name.startswith("model.language_model.") for name in _instance_forwards(model))
    torch.testing.assert_close(_logits(model, ids, positions), expected, rtol=RTOL, atol=ATOL)
    assert torch.equal(_logits(unpatch(model), ids, positions), expected)
