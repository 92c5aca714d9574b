"""What every registered bias encoding shares: the BiasEncoding contract, configs, positions."""

from __future__ import annotations

import importlib

import pytest
import torch

import posenc
from posenc import PosEncError
from posenc._base import BiasEncoding

# Registry name -> constructor arguments (4 heads everywhere).
BIASES = {
    "alibi": {"num_heads": 4},
    "t5": {"num_heads": 4, "num_buckets": 8, "max_distance": 16},
    "shaw": {"num_heads": 4, "head_dim": 8, "max_distance": 3, "values": True},
    "fire": {"num_heads": 4, "mlp_width": 8, "init_threshold": 4.0},
    "kerple": {"num_heads": 4},
}


def call_bias(enc, q_len, k_len=None, **positions):
    if enc.query_dependent:
        q = torch.randn(2, enc.num_heads, q_len, 8, generator=torch.Generator().manual_seed(3))
        return enc.bias(q_len, k_len, q=q, **positions)
    return enc.bias(q_len, k_len, **positions)


def test_every_bias_is_registered():
    assert {"alibi", "t5", "shaw", "fire", "kerple"} <= set(posenc.registry.names())
    for name in BIASES:
        assert name in posenc.__all__ or posenc.registry.get(name).__name__ in posenc.__all__


@pytest.mark.parametrize("name", list(BIASES))
def test_contract(name):
    enc = posenc.build(name, **BIASES[name])
    assert isinstance(enc, BiasEncoding) and enc.kind == "bias" and enc.name == name
    assert enc.num_heads == 4
    full = call_bias(enc, 6)
    lead = (2,) if enc.query_dependent else ()
    assert full.shape == (*lead, 4, 6, 6) and full.dtype == torch.float32
    assert bool(torch.isfinite(full).all())
    # Decoding: the queries are the last positions; explicit positions give the same.
    step = call_bias(enc, 2, 6)
    assert step.shape == (*lead, 4, 2, 6)
    explicit = call_bias(enc, 2, 6, q_positions=torch.arange(4, 6), k_positions=torch.arange(6))
    assert torch.equal(step, explicit)
    # More queries than keys and no positions: queries at arange(q_len) (cross-attention),
    # the rule of posenc.positions.resolve_pair (also RotaryEmbedding's and attention's).
    cross = call_bias(enc, 5, 3)
    assert torch.equal(cross, call_bias(enc, 5, 3, q_positions=torch.arange(5)))


@pytest.mark.parametrize("name", list(BIASES))
def test_config_round_trip_and_state_dict(name):
    enc = posenc.build(name, **BIASES[name])
    config = enc.to_config()
    rebuilt = posenc.build(config)
    assert rebuilt.to_config() == config
    rebuilt.load_state_dict(enc.state_dict(), strict=True)
    assert torch.equal(call_bias(rebuilt, 5), call_bias(enc, 5))


@pytest.mark.parametrize("name", list(BIASES))
def test_bfloat16_module_gives_float32_bias(name):
    enc = posenc.build(name, **BIASES[name])
    assert call_bias(enc.to(torch.bfloat16), 4).dtype == torch.float32


@pytest.mark.parametrize("name", [n for n in BIASES if n != "shaw"])
def test_score_mod_exists_for_query_independent_biases(name):
    enc = posenc.build(name, **BIASES[name])
    assert callable(enc.score_mod(torch.arange(3), torch.arange(3)))


@pytest.mark.parametrize("name", list(BIASES))
def test_num_heads_must_be_positive(name):
    with pytest.raises(PosEncError, match="num_heads must be >= 1, got 0"):
        posenc.build(name, **{**BIASES[name], "num_heads": 0})
    with pytest.raises(PosEncError, match="num_heads must be an integer"):
        posenc.build(name, **{**BIASES[name], "num_heads": "4"})


def test_unknown_argument_is_rejected():
    with pytest.raises(PosEncError, match="cannot build 'alibi'"):
        posenc.build("alibi", num_heads=4, slope=0.5)


# --- the protocol attention relies on: bias_at / value_bias_at / score_mod_at ---------

# Position cases as (q_len, k_len, q_positions, k_positions): defaults, a decoding step,
# batched (left-padded) positions, and shared keys with batched queries.
PADDED = posenc.positions.from_attention_mask(torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]))
CASES = {
    "full": (5, None, None, None),
    "decoding": (2, 6, None, None),
    "batched": (5, None, PADDED, PADDED),
    "batched-queries": (1, 5, torch.tensor([[4], [9]]), torch.arange(5)),
}
# The families that take floating positions (the others index a table with integers).
FLOATING = [n for n in BIASES if n not in ("t5", "shaw")]


def queries(enc, q_len):
    return torch.randn(2, enc.num_heads, q_len, 8, generator=torch.Generator().manual_seed(3))


def bias_at(enc, qpos, kpos, q):
    return enc.bias_at(qpos, kpos, q=q) if enc.query_dependent else enc.bias_at(qpos, kpos)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", list(BIASES))
def test_bias_at_equals_bias_on_resolved_positions(name, case):
    enc = posenc.build(name, **BIASES[name])
    q_len, k_len, q_positions, k_positions = CASES[case]
    given = {"q_positions": q_positions, "k_positions": k_positions}
    qpos, kpos = posenc.positions.resolve_pair(q_len, k_len, q_positions, k_positions)
    if enc.query_dependent:
        q = queries(enc, q_len)
        expected = enc.bias(q_len, k_len, q=q, **given)
    else:
        q, expected = None, enc.bias(q_len, k_len, **given)
    assert torch.equal(bias_at(enc, qpos, kpos, q), expected)


@pytest.mark.parametrize("name", FLOATING)
def test_bias_at_equals_bias_for_floating_positions(name):
    enc = posenc.build(name, **BIASES[name])
    q, k = torch.tensor([0.5, 2.25], dtype=torch.float32), torch.tensor([0.0, 1.0, 2.5])
    assert torch.equal(enc.bias_at(q, k), enc.bias(2, 3, q_positions=q, k_positions=k))


@pytest.mark.parametrize("case", list(CASES))
def test_value_bias_at_equals_value_bias(case):
    shaw = posenc.build("shaw", **BIASES["shaw"])
    q_len, k_len, q_positions, k_positions = CASES[case]
    qpos, kpos = posenc.positions.resolve_pair(q_len, k_len, q_positions, k_positions)
    probs = torch.rand(2, 4, q_len, kpos.shape[-1]).softmax(-1)
    expected = shaw.value_bias(probs, q_positions=q_positions, k_positions=k_positions)
    assert torch.equal(shaw.value_bias_at(probs, qpos, kpos), expected)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", [n for n in BIASES if n != "shaw"])
def test_score_mod_at_equals_score_mod(name, case, grid_score_mod):
    enc = posenc.build(name, **BIASES[name])
    q_len, k_len, q_positions, k_positions = CASES[case]
    qpos, kpos = posenc.positions.resolve_pair(q_len, k_len, q_positions, k_positions)
    grid = (2, 4, q_len, kpos.shape[-1])
    with torch.no_grad():
        expected = grid_score_mod(enc.score_mod(qpos, kpos), *grid)
        assert torch.equal(grid_score_mod(enc.score_mod_at(qpos, kpos), *grid), expected)


def refuse(*args, **kwargs):
    raise AssertionError("positions validated again")


def forbid_validation(monkeypatch):
    """Make every position check raise (the function and each module's imported name)."""
    for module in (posenc._errors, posenc.positions, posenc.bias._common):
        monkeypatch.setattr(module, "check_positions", refuse)
    monkeypatch.setattr(posenc._errors, "check_finite", refuse)


@pytest.mark.parametrize("name", list(BIASES))
def test_bias_at_does_not_validate(name, monkeypatch, grid_score_mod):
    enc = posenc.build(name, **BIASES[name])
    floating = name in FLOATING
    pos = PADDED.to(torch.float32) if floating else PADDED  # floats: validation syncs on GPU
    qpos, kpos = posenc.positions.resolve_pair(5, 5, pos, pos)
    q = queries(enc, 5) if enc.query_dependent else None
    expected = bias_at(enc, qpos, kpos, q)
    probs = torch.rand(2, 4, 5, 5).softmax(-1)
    values = enc.value_bias_at(probs, qpos, kpos) if enc.value_dependent else None
    mod = None if enc.query_dependent else grid_score_mod(enc.score_mod_at(qpos, kpos), 2, 4, 5, 5)
    forbid_validation(monkeypatch)
    assert torch.equal(bias_at(enc, qpos, kpos, q), expected)
    if values is not None:
        assert torch.equal(enc.value_bias_at(probs, qpos, kpos), values)
    if mod is not None:
        assert torch.equal(grid_score_mod(enc.score_mod_at(qpos, kpos), 2, 4, 5, 5), mod)
    with pytest.raises(AssertionError, match="validated again"):  # the public path does
        call_bias(enc, 5, q_positions=pos, k_positions=pos)


@pytest.mark.parametrize("name", list(BIASES))
def test_public_entry_points_validate_each_position_tensor_once(name, monkeypatch):
    enc = posenc.build(name, **BIASES[name])
    seen = []

    def spy(name, positions, **kwargs):
        seen.append(name)
        return positions

    for module in (posenc.positions, posenc.bias._common):
        monkeypatch.setattr(module, "check_positions", spy)
    q_positions, k_positions = torch.arange(3, 5), torch.arange(5)
    call_bias(enc, 2, 5, q_positions=q_positions, k_positions=k_positions)
    assert seen == ["k_positions", "q_positions"]
    seen.clear()
    if enc.value_dependent:
        probs = torch.rand(1, 4, 2, 5)
        enc.value_bias(probs, q_positions=q_positions, k_positions=k_positions)
        assert seen == ["k_positions", "q_positions"]
        seen.clear()
    if not enc.query_dependent:
        enc.score_mod(q_positions, k_positions)
        assert seen == ["q_positions", "k_positions"]


@pytest.mark.parametrize("name", ["t5", "shaw"])
def test_integer_positions_are_checked_once_on_every_path(name, monkeypatch):
    enc = posenc.build(name, **BIASES[name])
    module = importlib.import_module(type(enc).__module__)
    check, calls = module.check_integer_positions, []

    def spy(*args):
        calls.append(args[0])
        return check(*args)

    monkeypatch.setattr(module, "check_integer_positions", spy)
    qpos, kpos = posenc.positions.resolve_pair(2, 5)
    paths = [lambda: call_bias(enc, 2, 5), lambda: bias_at(enc, qpos, kpos, queries(enc, 2))]
    if enc.value_dependent:
        probs = torch.rand(2, 4, 2, 5)
        paths += [lambda: enc.value_bias(probs), lambda: enc.value_bias_at(probs, qpos, kpos)]
    if not enc.query_dependent:
        paths += [lambda: enc.score_mod(qpos, kpos), lambda: enc.score_mod_at(qpos, kpos)]
    for path in paths:
        calls.clear()
        path()
        assert len(calls) == 1
    with pytest.raises(PosEncError, match="must be an integer tensor"):
        bias_at(enc, qpos.double(), kpos.double(), queries(enc, 2))


# --- renamed classes: the 0.1.0 names are deprecated aliases --------------------------

RENAMED = [
    ("alibi", "ALiBi", "ALiBiBias"),
    ("fire", "FIRE", "FIREBias"),
    ("kerple", "Kerple", "KerpleBias"),
    ("shaw", "ShawRelative", "ShawRelativeBias"),
]


@pytest.mark.parametrize(("module", "old", "new"), RENAMED, ids=[r[1] for r in RENAMED])
def test_old_class_names_warn_and_are_the_new_classes(module, old, new):
    family = importlib.import_module(f"posenc.bias.{module}")
    cls = getattr(family, new)
    assert cls.__name__ == new and posenc.registry.get(module) is cls
    for where in (family, posenc.bias):
        message = rf"{where.__name__}\.{old} is deprecated, use {new}"
        with pytest.warns(DeprecationWarning, match=message):
            assert getattr(where, old) is cls
        assert old not in where.__all__ and new in where.__all__
    namespace: dict = {}
    with pytest.warns(DeprecationWarning, match=new):
        exec(f"from posenc.bias.{module} import {old} as alias", namespace)
    assert namespace["alias"] is cls


def test_unknown_names_still_raise_attribute_error():
    for where in (posenc.bias, posenc.bias.alibi):
        with pytest.raises(AttributeError, match="has no attribute 'Alibi'"):
            where.Alibi  # noqa: B018


# --- issue 24: positions whose distances overflow ------------------------------------------

_WRAP = (torch.tensor([-(2**63), 2**63 - 1]), torch.tensor([2**63 - 1, -(2**63)]))  # int64 wraps
_HUGE = (
    torch.tensor([0.0, 1e300], dtype=torch.float64),
    torch.tensor([-1e300, 1.0], dtype=torch.float64),
)
_APART = r"q_positions and k_positions must be less than 2\*\*63 apart"


def _pure(name: str, qpos, kpos):
    """The family's pure function at these positions."""
    if name == "alibi":
        return posenc.alibi_bias(qpos, kpos, posenc.alibi_slopes(4))
    if name == "t5":
        return posenc.bias.t5_relative_bias(qpos, kpos, torch.zeros(8, 4), max_distance=16)
    if name == "kerple":
        return posenc.bias.kerple_bias(qpos, kpos, torch.ones(4), torch.ones(4))
    if name == "fire":
        return posenc.bias.fire_bias(qpos, kpos, torch.nn.Linear(1, 4))
    q = torch.zeros(1, 4, qpos.shape[-1], 8)
    return posenc.bias.shaw_relative_logits(q, torch.zeros(7, 8), qpos, kpos)


@pytest.mark.parametrize(
    ("name", "entry", "positions"),
    [
        (name, entry, positions)
        for name in BIASES
        for entry in ("bias", "pure", "score_mod", "attention")
        # T5 and Shaw index tables by integer distances (float positions are refused), and
        # Shaw's keys have no score_mod
        for positions in ("int64-wraps", *(() if name in ("t5", "shaw") else ("float64-huge",)))
        if not (name == "shaw" and entry == "score_mod")
    ],
)
def test_distances_that_overflow_are_refused_by_name(name, entry, positions):
    """int64 positions whose k - q wraps gave wrong biases silently; float64 ones 1e300
    apart gave +-inf (ALiBi, Kerple) or NaN (FIRE) biases."""
    qpos, kpos = _WRAP if positions == "int64-wraps" else _HUGE
    enc = posenc.build(name, **BIASES[name])
    calls = {
        "bias": lambda: call_bias(enc, 2, q_positions=qpos, k_positions=kpos),
        "pure": lambda: _pure(name, qpos, kpos),
        "score_mod": lambda: enc.score_mod(qpos, kpos),
        "attention": lambda: posenc.attention(
            *torch.randn(3, 1, 4, 2, 8).unbind(0), encoding=enc, q_positions=qpos, k_positions=kpos
        ),
    }
    with pytest.raises(PosEncError, match=_APART):
        calls[entry]()


def test_distances_just_under_the_bound_give_the_exact_bias():
    """Positions near 2**62 whose distances are small: the bias of those distances."""
    base = 2**62
    qpos, kpos = torch.tensor([base + 1, base + 2]), torch.tensor([base - 3, base, base + 2])
    got = posenc.ALiBiBias(4).bias(2, 3, q_positions=qpos, k_positions=kpos)
    want = posenc.ALiBiBias(4).bias(
        2, 3, q_positions=qpos - base, k_positions=kpos - base
    )  # the same distances near 0
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # the largest span allowed: 2**63 - 1 apart
    far_q, far_k = torch.tensor([2**62 - 1]), torch.tensor([-(2**62)])
    got = posenc.ALiBiBias(1, slopes=[1.0]).bias(1, 1, q_positions=far_q, k_positions=far_k)
    torch.testing.assert_close(got, torch.tensor([[[-float(2**63 - 1)]]]), rtol=0, atol=0)


def test_same_huge_positions_are_fine_when_close():
    """float64 positions of 1e300 whose distances are small are taken (distance 0, 1)."""
    p = torch.tensor([1e300, 1e300], dtype=torch.float64)
    got = posenc.ALiBiBias(4).bias(2, q_positions=p, k_positions=p)
    torch.testing.assert_close(got, torch.zeros(4, 2, 2), rtol=0, atol=0)
