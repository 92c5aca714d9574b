"""``patch(model, scaling={"type": "self_extend" | "string", ...})``: Self-Extend and STRING
inside tiny random transformers models of every family ``patch`` covers.

A map that never triggers at the test length gives the logits of the plain patched model;
an active one gives those of the same model whose remapped attention is this file's
restatement of each reference (LongLM's ``self_extend_forward``: neighbour and group logits
merged by its masks with ``torch.where``; STRING's window and shifted attention merged by
their log-sum-exp, each pair once), written here from the papers, never from
``posenc.remap``. Then: generation with a ``DynamicCache``, nested frequency scalings,
``unpatch``, refusals. Hybrid models (Gemma 3, SmolLM3, Cohere 2, ...): test_hf_patch_hybrid.py.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc import PosEncError  # noqa: E402
from posenc.integrations import _hf_patch_remap as hf_remap  # noqa: E402
from posenc.integrations.transformers import patch, unpatch  # noqa: E402

from . import _tiny_models as tiny  # noqa: E402

SEQ = 24
# What each tiny model needs so that it has a layer a map remaps (a full-attention RoPE
# layer): no model-wide sliding window, one full-attention layer in a hybrid pattern.
_HYBRID = ["sliding_attention", "full_attention"]
REMAPPABLE: dict[str, dict[str, Any]] = {
    "mistral": dict(sliding_window=None),
    "ministral": dict(layer_types=_HYBRID),
    "gemma3_text": dict(layer_types=_HYBRID),
    "olmo3": dict(layer_types=_HYBRID),
    "exaone4": dict(sliding_window=None, layer_types=["full_attention"] * 2),
}
# Families refused whatever their tiny config (test_hf_patch_hybrid.py: why).
REFUSED = ("cohere2", "llama4_text")
FAMILIES = sorted(set(tiny.CONFIGS) - set(REFUSED))
DTYPES = {"float32": (torch.float32, 1e-5), "float64": (torch.float64, 1e-10)}
# Gemma 2 runs transformers' eager attention, whose softmax is float32 in a float64 model
# too: its plain patched logits are that close to a float64 softmax's.
EAGER_FLOAT32_SOFTMAX = {"gemma2": 1e-6}

NEVER = {  # no pair at SEQ tokens reaches the second branch
    "self_extend": {"type": "self_extend", "group_size": 4, "neighbor_window": SEQ},
    "string": {"type": "string", "shift": SEQ, "local_window": 4},
}
ACTIVE = {
    "self_extend": {"type": "self_extend", "group_size": 2, "neighbor_window": 8},
    "self_extend_fraction": {"type": "self_extend", "group_size": 4, "neighbor_window": 6},
    "string": {"type": "string", "shift": 10, "local_window": 3},
}


def _model(model_type: str, dtype: torch.dtype = torch.float32, **extra: Any) -> Any:
    model = tiny.model(
        model_type, float64=dtype == torch.float64, **{**REMAPPABLE.get(model_type, {}), **extra}
    )
    return model.to(dtype)


def _remapped(model: Any) -> list[str]:
    return [name for name, m in model.named_modules() if hf_remap.STATE_ATTR in m.__dict__]


# --- the restatements of the references --------------------------------------------------


def _visible(q_positions, k_positions, keep) -> torch.Tensor:
    allowed = k_positions[None, :] <= q_positions[:, None]
    return allowed if keep is None else allowed & keep


def _repeat(k: torch.Tensor, v: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    rep = heads // k.shape[1]
    return k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)


def _capped(logits: torch.Tensor, softcap: float | None) -> torch.Tensor:
    return logits if softcap is None else softcap * torch.tanh(logits / softcap)


def longlm(q, k, v, *, rotate, position_map, q_positions, k_positions, scale, softcap, keep, **_):
    """LongLM's ``self_extend_forward``: neighbour q/k at their positions, group q at
    ``i // G + W - W / G`` and group k at ``j // G``; its neighbour mask (prefill: the lower
    triangle less ``tril`` of the ``[W:, :-W]`` corner; one decoded query: the last ``W``
    keys) picks the neighbour logits, ``torch.where`` the group ones elsewhere."""
    g, w = position_map.group_size, position_map.neighbor_window
    compute = torch.promote_types(q.dtype, torch.float32)
    k, v = _repeat(k, v, q.shape[1])
    group_q = torch.div(q_positions, g, rounding_mode="floor").double() + w - w / g
    group_k = torch.div(k_positions, g, rounding_mode="floor")
    nq, nk = rotate(q, q_positions).to(compute), rotate(k, k_positions).to(compute)
    gq, gk = rotate(q, group_q).to(compute), rotate(k, group_k).to(compute)
    neighbour_logits = _capped(nq @ nk.transpose(-1, -2) * scale, softcap)
    group_logits = _capped(gq @ gk.transpose(-1, -2) * scale, softcap)
    sq, sk = q.shape[-2], k.shape[-2]
    if sq == 1:
        neighbour = torch.zeros(sq, sk)
        neighbour[:, -w:] = 1
    else:
        assert sq == sk, "LongLM: q_len should be 1 or seq_len"
        neighbour = torch.tril(torch.ones(sq, sk))
        if sq - w > 0:
            neighbour[w:, :-w] -= torch.tril(torch.ones(sq - w, sk - w))
    logits = torch.where(neighbour.bool(), neighbour_logits, group_logits)
    logits = logits.masked_fill(~_visible(q_positions, k_positions, keep), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return (probs @ v.to(compute)).to(q.dtype)


def _part(logits: torch.Tensor, v: torch.Tensor, pairs: torch.Tensor):
    """Attention over ``pairs`` only: its output and log-sum-exp (``-inf``, output 0, for a
    row with no pair)."""
    logits = logits.masked_fill(~pairs, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    probs = torch.exp(logits - lse).nan_to_num(0.0)
    return probs @ v, lse


def string(q, k, v, *, rotate, position_map, q_positions, k_positions, scale, softcap, keep, **_):
    """STRING: the window attention (offsets ``d < S``, q at ``i``, k at ``j``) and the
    shifted one (``d >= S``, q at ``i - S + W``), merged by their log-sum-exp as
    ``string_flash_forward`` does; each pair in one of the two."""
    s, w = position_map.shift, position_map.local_window
    compute = torch.promote_types(q.dtype, torch.float32)
    k, v = _repeat(k, v, q.shape[1])
    wq, wk = rotate(q, q_positions).to(compute), rotate(k, k_positions).to(compute)
    shifted_q = rotate(q, q_positions - s + w).to(compute)
    offsets = q_positions[:, None] - k_positions[None, :]
    visible = _visible(q_positions, k_positions, keep)
    vf = v.to(compute)
    window_out, window_lse = _part(
        _capped(wq @ wk.transpose(-1, -2) * scale, softcap), vf, visible & (offsets < s)
    )
    shifted_out, shifted_lse = _part(
        _capped(shifted_q @ wk.transpose(-1, -2) * scale, softcap), vf, visible & (offsets >= s)
    )
    to_shifted = 1 / (1 + torch.exp(window_lse - shifted_lse))
    to_window = 1 / (1 + torch.exp(shifted_lse - window_lse))
    return (window_out * to_window + shifted_out * to_shifted).to(q.dtype)


def reference(q, k, v, *, position_map, scale=None, **kwargs):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    kind = position_map.to_config()["type"]
    restated = longlm if kind == "self_extend" else string
    reference.calls = getattr(reference, "calls", 0) + 1  # type: ignore[attr-defined]
    return restated(q, k, v, position_map=position_map, scale=scale, **kwargs)


# --- every family ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kind", list(NEVER))
@pytest.mark.parametrize("model_type", FAMILIES)
def test_map_that_never_triggers_equals_plain_patch(model_type: str, kind: str, dtype: str):
    torch_dtype, atol = DTYPES[dtype]
    atol = max(atol, EAGER_FLOAT32_SOFTMAX.get(model_type, 0.0))
    model = _model(model_type, torch_dtype)
    ids = tiny.ids(seq=SEQ)
    expected = tiny.logits(patch(model), ids)
    unpatch(model)
    patch(model, scaling=NEVER[kind])
    assert _remapped(model)
    torch.testing.assert_close(tiny.logits(model, ids), expected, rtol=atol, atol=atol)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kind", list(ACTIVE))
@pytest.mark.parametrize("model_type", FAMILIES)
def test_active_map_equals_the_reference_restated(
    model_type: str, kind: str, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch_dtype, atol = DTYPES[dtype]
    model = patch(_model(model_type, torch_dtype), scaling=ACTIVE[kind])
    ids = tiny.ids(seq=SEQ)
    got = tiny.logits(model, ids)
    monkeypatch.setattr(hf_remap, "remapped_attention_at", reference)
    reference.calls = 0  # type: ignore[attr-defined]
    expected = tiny.logits(model, ids)
    assert reference.calls == len(_remapped(model)) > 0  # type: ignore[attr-defined]
    torch.testing.assert_close(got, expected, rtol=atol, atol=atol)
    plain = tiny.logits(unpatch(model), ids)
    assert not torch.allclose(plain, got, rtol=0, atol=10 * atol)  # the map moved something


# --- generation with a cache ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["self_extend", "string"])
@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
def test_prefill_and_decode_with_a_cache_equal_the_whole_forward(model_type: str, kind: str):
    """Keys of remapped layers are cached unrotated; Gemma 3's sliding layers keep the plain
    path (and their rotated keys). Three decode steps after a prefill of 20 tokens."""
    model = patch(_model(model_type), scaling=ACTIVE[kind])
    ids = tiny.ids(batch=1, seq=SEQ)
    whole = tiny.logits(model, ids)
    cache = transformers.DynamicCache(config=model.config)
    steps = [model(ids[:, :20], cache=cache, use_cache=True).logits]
    with torch.no_grad():
        for i in range(20, 23):
            steps.append(model(ids[:, i : i + 1], cache=cache, use_cache=True).logits)
    got = torch.cat(steps, dim=1)
    torch.testing.assert_close(got, whole[:, :23], rtol=1e-5, atol=1e-5)


def test_generate_runs_and_greedy_tokens_follow_the_whole_forward() -> None:
    model = patch(_model("llama"), scaling=ACTIVE["string"])
    prompt = tiny.ids(batch=1, seq=12)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)
    argmax = tiny.logits(model, out[:, :-1])[:, 11:].argmax(-1)
    assert torch.equal(argmax, out[:, 12:])


# --- nested frequency scalings, unpatch, gradients -------------------------------------------


@pytest.mark.parametrize(
    "scaling",
    [
        {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 2048},
        {"rope_type": "linear", "factor": 2.0},
    ],
    ids=["posenc", "transformers"],
)
def test_nested_scaling_is_applied_with_the_map(scaling: dict[str, Any]) -> None:
    model = _model("llama")
    ids = tiny.ids(seq=SEQ)
    expected = tiny.logits(patch(model, scaling=scaling), ids)
    unpatch(model)
    patch(model, scaling={**NEVER["string"], "scaling": scaling})
    torch.testing.assert_close(tiny.logits(model, ids), expected, rtol=1e-5, atol=1e-5)


def test_nested_per_layer_type_scaling() -> None:
    model = _model("gemma3_text")
    ids = tiny.ids(seq=SEQ)
    scaling = {"full_attention": {"type": "linear", "factor": 2.0}}
    expected = tiny.logits(patch(model, scaling=scaling), ids)
    unpatch(model)
    patch(model, scaling={**NEVER["self_extend"], "scaling": scaling})
    torch.testing.assert_close(tiny.logits(model, ids), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_type", ["llama", "deepseek_v3", "gptj"])
def test_unpatch_restores_exactly(model_type: str) -> None:
    model = _model(model_type)
    ids = tiny.ids(seq=SEQ)
    expected, tree = tiny.logits(model, ids), tiny.tree(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    patch(model, scaling=ACTIVE["self_extend"])
    assert model.state_dict().keys() == state.keys()
    unpatch(model)
    assert tiny.tree(model) == tree
    assert tiny.instance_forwards(model) == [] and _remapped(model) == []
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    assert torch.equal(tiny.logits(model, ids), expected)


def test_deepcopy_of_a_mapped_model_holds_its_own_rotary() -> None:
    model = patch(_model("llama"), scaling=ACTIVE["string"])
    ids = tiny.ids(seq=SEQ)
    twin = copy.deepcopy(model)
    state = twin.model.layers[0].self_attn.__dict__[hf_remap.STATE_ATTR]
    assert state.rotary is twin.model.rotary_emb
    assert torch.equal(tiny.logits(twin, ids), tiny.logits(model, ids))
    unpatch(twin)
    assert _remapped(twin) == [] and len(_remapped(model)) == 2


def test_training_gradients_equal_plain_patch_when_the_map_never_triggers() -> None:
    model = patch(_model("llama").train(), scaling=NEVER["self_extend"])
    plain = patch(_model("llama").train())
    ids = tiny.ids(seq=SEQ)
    for m in (model, plain):
        m(ids, labels=ids).loss.backward()
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


# --- refusals -----------------------------------------------------------------------------


def _refused(model: Any, scaling: Any, match: str) -> None:
    ids = tiny.ids(seq=SEQ)
    expected, tree = tiny.logits(model, ids), tiny.tree(model)
    with pytest.raises(PosEncError, match=match) as info:
        patch(model, scaling=scaling)
    assert "\n" not in str(info.value)
    assert tiny.tree(model) == tree and tiny.instance_forwards(model) == []
    assert "_posenc_patch" not in model.__dict__
    assert torch.equal(tiny.logits(model, ids), expected)


_SE = {"type": "self_extend", "group_size": 2, "neighbor_window": 8}


@pytest.mark.parametrize(
    ("scaling", "match"),
    [
        ({**_SE, "group_size": 0}, r"group_size must be .*got 0"),
        ({**_SE, "group_size": True}, "group_size"),
        ({**_SE, "neighbor_window": 5000}, r"neighbor_window must be <= .*4096.*got 5000"),
        ({"type": "string", "shift": 5000, "local_window": 8}, r"shift must be <= .*got 5000"),
        ({"type": "string", "shift": 8, "local_window": 8}, r"local_window must be < shift"),
        ({**_SE, "bogus": 1}, r"unknown keys \['bogus'\]"),
        ({"type": "self_extend", "group_size": 2}, r"missing \['neighbor_window'\]"),
        (
            {**_SE, "scaling": {"type": "dynamic", "factor": 2.0, "max_position": 4096}},
            "picks them from the largest",
        ),
        ({**_SE, "scaling": {"type": "linear", "factor": 0.5}}, "factor"),
        ({"full_attention": _SE}, "give it at the top level"),
    ],
    ids=[
        "group_size_0",
        "group_size_bool",
        "window_past_L",
        "shift_past_L",
        "window_not_below_shift",
        "unknown_key",
        "missing_key",
        "position_dependent_scaling",
        "bad_nested_scaling",
        "map_per_layer_type",
    ],
)
def test_bad_spec_refused_in_one_line_before_any_change(scaling: Any, match: str) -> None:
    _refused(_model("llama"), scaling, match)


@pytest.mark.parametrize("model_type", sorted(tiny.VL_CONFIGS))
def test_mrope_families_refused(model_type: str) -> None:
    model = tiny.model(model_type)
    with pytest.raises(PosEncError, match=rf"model_type '{model_type}': its RoPE is M-RoPE"):
        patch(model, scaling=_SE)
    assert tiny.instance_forwards(model) == []


def test_family_without_rope_refused_by_name() -> None:
    config = transformers.GPT2Config(vocab_size=128, n_embd=32, n_layer=1, n_head=2)
    _refused(transformers.GPT2LMHeadModel(config).eval(), _SE, r"model_type 'gpt2'.*no rotary")


def test_model_wide_sliding_window_refused() -> None:
    _refused(
        _model("mistral", sliding_window=16), _SE, r"model_type 'mistral': every RoPE layer uses"
    )


# --- refusals inside the attention function ----------------------------------------------------


def test_left_padding_or_an_offset_refused_in_one_line() -> None:
    model = patch(_model("llama"), scaling=_SE)
    ids = tiny.ids(seq=SEQ)
    positions = torch.arange(SEQ)[None] + torch.tensor([[0], [3]])
    for bad in (positions, torch.arange(SEQ)[None] + 1000):
        with pytest.raises(PosEncError, match=r"position_ids must be arange\(0, 24\)"):
            tiny.logits(model, ids, bad)


def test_dropout_in_training_refused() -> None:
    model = patch(_model("llama", attention_dropout=0.1).train(), scaling=_SE)
    with pytest.raises(PosEncError, match=r"dropout must be 0 in training.*got 0\.1"):
        model(tiny.ids(seq=SEQ))


def _call(model: Any, **kwargs: Any) -> Any:
    layer = model.model.layers[0].self_attn
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, 6, 16, generator=gen), torch.randn(1, 2, 6, 16, generator=gen)
    args = dict(position_ids=torch.arange(6)[None], attention_mask=None)
    return hf_remap.remapped_attention_forward(layer, q, k, k, **{**args, **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sliding_window": 4}, "sliding_window must be None on a remapped layer, got 4"),
        ({"attention_mask": torch.ones(1, 6, dtype=torch.bool)}, "attention_mask must be None"),
        ({"attention_mask": torch.full((1, 1, 6, 6), 0.5)}, "0 .attend. and -inf.*got 0.5"),
        ({"s_aux": torch.zeros(4)}, "sinks"),
        ({"position_ids": None}, r"position_ids must be \[b, 6\]"),
    ],
    ids=["sliding_window", "mask_2d", "mask_bias", "sinks", "no_position_ids"],
)
def test_attention_function_refusals(kwargs: dict[str, Any], match: str) -> None:
    model = patch(_model("llama"), scaling=_SE)
    with pytest.raises(PosEncError, match=match):
        _call(model, **kwargs)
    plain = copy.deepcopy(model.model.layers[1].self_attn)
    plain.__dict__.pop(hf_remap.STATE_ATTR)
    with pytest.raises(PosEncError, match="not remapped by patch"):
        hf_remap.remapped_attention_forward(plain, *([torch.zeros(1, 1, 1, 16)] * 3), None)


def test_attention_function_output_shape_and_bool_mask() -> None:
    model = patch(_model("llama"), scaling=_SE)
    keep = torch.ones(1, 1, 6, 6, dtype=torch.bool).tril()
    additive = torch.zeros(1, 1, 6, 6).masked_fill(~keep, float("-inf"))
    out, weights = _call(model, attention_mask=keep)
    assert out.shape == (1, 6, 4, 16) and out.is_contiguous() and weights is None
    torch.testing.assert_close(_call(model, attention_mask=additive)[0], out, rtol=0, atol=0)
    torch.testing.assert_close(_call(model)[0], out, rtol=0, atol=0)


def test_attention_implementation_without_4d_masks_refused() -> None:
    model = _model("llama", attn_implementation="flex_attention")
    _refused(model, _SE, r"attn_implementation must be 'eager' or 'sdpa'.*'flex_attention'")
