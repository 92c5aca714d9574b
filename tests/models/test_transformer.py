"""TinyTransformer: every encoding kind, KV cache == full pass, generation, config, training."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from tests.models import _lm_checks as lm

import posenc
from posenc import PosEncError
from posenc._base import Encoding
from posenc.models import KVCache, TinyTransformer
from posenc.registry import names

VOCAB, DIM, HEADS = 13, 16, 2


def _available() -> list[str]:
    """Every registered encoding a token LM takes (mrope / axial_rope take N-D positions)."""
    return [n for n in names() if n not in ("mrope", "axial_rope")]


ENCODINGS = _available()


def make(name: str, **kw) -> TinyTransformer:
    return TinyTransformer(VOCAB, dim=DIM, num_heads=HEADS, encoding=name, max_len=64, **kw).eval()


def sharpen(model: TinyTransformer) -> TinyTransformer:
    """Larger q/k weights than at init, so attention (and position) visibly matter."""
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.mul_(30)
    return model


def tokens(b=2, s=9, seed=0):
    return torch.randint(0, VOCAB, (b, s), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", ENCODINGS)
def test_kinds_plug_in_where_they_belong(name):
    model = make(name)
    kind = model.encoding.kind
    assert model.to_config()["encoding"]["name"] == name
    if kind == "additive":
        assert model.encoding.dim == DIM
    elif kind == "rotary":
        assert model.encoding.head_dim == DIM // HEADS
    elif kind == "bias" and model.encoding.num_heads is not None:  # CoPE: any heads
        assert model.encoding.num_heads == HEADS
    # one encoding module, shared by every layer (a module per layer: CoPE, as its paper)
    modules = {id(m) for m in model.modules() if isinstance(m, Encoding)}
    assert len(modules) == (model.num_layers if model.encoding.per_layer else 1)
    assert [model.layer_encoding(i).to_config() for i in range(model.num_layers)] == [
        model.encoding.to_config()
    ] * model.num_layers


@pytest.mark.parametrize("name", ENCODINGS)
def test_cache_equals_full_pass(name):
    model = make(name)
    _, cache = lm.cache_equals_full_pass(model, tokens(), cuts=(4, 5, 6, 9))
    assert cache.length == 9 and len(cache.keys) == model.num_layers
    assert cache.keys[0].shape == (2, HEADS, 9, DIM // HEADS)
    torch.testing.assert_close(cache.positions, torch.arange(9))


@pytest.mark.parametrize("name", ENCODINGS)
def test_cache_equals_full_pass_left_padded(name):
    """Left padding: positions from the mask, padding in the cache, positions continued per row."""
    pos, cache = lm.left_padded_cache_equals_full_pass(make(name), tokens(s=8))
    torch.testing.assert_close(cache.positions, pos)


@pytest.mark.parametrize("name", ["none", "sinusoidal", "rope", "alibi", "t5"])
def test_generate_cache_equals_recompute(name):
    lm.generate_cache_equals_recompute(make(name), tokens(s=4))


def test_generate_continues_greedily():
    """Each generated token is the argmax of the full pass over what precedes it."""
    model = make("rope")
    out = model.generate(tokens(s=3), 4)
    with torch.no_grad():
        logits = model(out)
    torch.testing.assert_close(out[:, 3:], logits[:, 2:-1].argmax(-1), atol=0, rtol=0)


@pytest.mark.parametrize("name", ENCODINGS)
def test_config_round_trip(name):
    lm.config_round_trip(make(name), tokens())


def test_swap_encoding_for_evaluation():
    """A trained model's rotary scaling can be changed for evaluation via its config."""
    model = sharpen(make("rope"))
    config = model.to_config()
    config["encoding"] = {**config["encoding"], "scaling": {"type": "linear", "factor": 2.0}}
    scaled = TinyTransformer.from_config(config).eval()
    scaled.load_state_dict(model.state_dict(), strict=True)
    t = tokens(s=12)
    with torch.no_grad():  # linear scaling by 2: position 2p acts as p did
        torch.testing.assert_close(scaled(t, torch.arange(12) * 2), model(t, torch.arange(12)))
        assert (scaled(t) - model(t)).abs().max() > 1e-2


def test_causal_and_encoder():
    t = tokens()
    t2 = t.clone()
    t2[:, -1] = (t2[:, -1] + 1) % VOCAB
    for causal in (True, False):
        model = make("rope", causal=causal)
        with torch.no_grad():
            a, b = model(t), model(t2)
        same_prefix = torch.equal(a[:, :-1], b[:, :-1])
        assert same_prefix == causal  # only an encoder lets the last token change earlier ones


@pytest.mark.parametrize("name", ["none", "sinusoidal", "alibi"])
def test_encoder_order(name):
    """Without an encoding an encoder is permutation-equivariant; with one it is not."""
    model, t = sharpen(make(name, causal=False)), tokens()
    perm = torch.tensor([4, 0, 8, 2, 6, 1, 3, 7, 5])
    with torch.no_grad():
        out, permuted = model(t), model(t[:, perm])
    if name == "none":
        torch.testing.assert_close(permuted, out[:, perm], atol=1e-5, rtol=1e-5)
    else:
        assert (permuted - out[:, perm]).abs().max() > 1e-3  # none: equal within 1e-5


def test_initial_loss_is_uniform():
    """Sane init: the untrained model predicts close to uniformly."""
    for tie in (True, False):
        model = TinyTransformer(97, dim=32, num_heads=4, tie_embeddings=tie)
        t, targets = torch.randint(0, 97, (2, 8, 16)).unbind(0)
        with torch.no_grad():
            loss = F.cross_entropy(model(t).flatten(0, 1), targets.flatten())
        assert abs(loss.item() - math.log(97)) < 0.5


@pytest.mark.parametrize("name", ["sinusoidal", "rope", "alibi"])
def test_trains_on_copy_task(name):
    """Loss on a tiny copy task (second half repeats the first) falls within 25 steps."""
    torch.manual_seed(0)
    model = TinyTransformer(8, dim=32, num_layers=2, num_heads=4, encoding=name, max_len=16)
    model.train()
    lm.trains(lm.copy_loss(model), torch.optim.Adam(model.parameters(), lr=1e-2), 25)


def test_dropout_trains():
    model = TinyTransformer(VOCAB, dim=DIM, num_heads=HEADS, encoding="rope", dropout=0.1).train()
    t = tokens()
    F.cross_entropy(model(t).flatten(0, 1), t.flatten()).backward()
    assert model.embed.weight.grad is not None
    with torch.no_grad():
        model.eval()
        torch.testing.assert_close(model(t), model(t), atol=0, rtol=0)


def test_parameters_shared_once():
    model = make("t5")
    enc_params = {id(p) for p in model.encoding.parameters()}
    assert enc_params and enc_params <= {id(p) for p in model.parameters()}
    assert len(list(model.parameters())) == len({id(p) for p in model.parameters()})


# --- bad input ------------------------------------------------------------------------


BAD_BUILD = {
    "heads": ({"dim": 10, "num_heads": 4}, "dim must be divisible by num_heads"),
    "vocab": ({"vocab_size": 0}, "vocab_size must be >= 1"),
    "layers": ({"num_layers": 0}, "num_layers must be >= 1"),
    "dropout": ({"dropout": 1.0}, "dropout must be < 1"),
    "causal": ({"causal": "yes"}, "causal must be a bool"),
    "learned-len": ({"encoding": "learned", "max_len": None}, "max_len is needed"),
    "enc-none": ({"encoding": None}, "use 'none' for NoPE"),
    "enc-name": ({"encoding": "alibo"}, "name must be one of"),
    "enc-dim": ({"encoding": {"name": "sinusoidal", "dim": 8}}, "dim must be 16 here"),
    "enc-instance-dim": ({"encoding": posenc.SinusoidalEmbedding(8)}, "needs dim=16"),
    "rope-head-dim": ({"encoding": posenc.build("rope", head_dim=4)}, "needs head_dim=8"),
}


@pytest.mark.parametrize("case", list(BAD_BUILD))
def test_bad_construction(case):
    kw, match = BAD_BUILD[case]
    args = {"vocab_size": VOCAB, "dim": DIM, "num_heads": HEADS, "max_len": 64, **kw}
    with pytest.raises(PosEncError, match=match):
        TinyTransformer(args.pop("vocab_size"), **args)


BAD_CALL = {
    "float-tokens": (lambda: (torch.zeros(2, 3),), {}, "tokens must be an int64 tensor"),
    "1d-tokens": (lambda: (torch.zeros(3, dtype=torch.long),), {}, r"\[b, s\]"),
    "range": (lambda: (torch.full((2, 3), VOCAB),), {}, r"tokens must lie in \[0, vocab_size=13\)"),
    "positions": (lambda: (tokens(), torch.arange(4)), {}, "positions must have length 9"),
    "mask-shape": (
        lambda: (tokens(),),
        {"attn_mask": torch.ones(2, 4)},
        r"attn_mask must be \[b, s\]",
    ),
    "mask-values": (
        lambda: (tokens(),),
        {"attn_mask": torch.full((2, 9), 2)},
        "only integers 0 and 1",
    ),
    "cache-type": (lambda: (tokens(),), {"cache": {}}, "cache must be a posenc.models.KVCache"),
}


@pytest.mark.parametrize("case", list(BAD_CALL))
def test_bad_call(case):
    make_args, kw, match = BAD_CALL[case]
    with pytest.raises(PosEncError, match=match):
        make("rope")(*make_args(), **kw)


def test_bad_cache_use_and_config():
    encoder = make("rope", causal=False)
    with pytest.raises(PosEncError, match="cache needs a causal model"):
        encoder(tokens(), cache=KVCache())
    with pytest.raises(PosEncError, match="generate needs a causal model"):
        encoder.generate(tokens(), 2)
    with pytest.raises(PosEncError, match="max_new_tokens must be >= 0"):
        make("rope").generate(tokens(), -1)
    with pytest.raises(PosEncError, match="unknown keys"):
        TinyTransformer.from_config({**make("rope").to_config(), "width": 3})
    with pytest.raises(PosEncError, match="vocab_size"):
        TinyTransformer.from_config({"dim": 16})
