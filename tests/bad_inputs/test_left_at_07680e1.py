"""The bad inputs issue 39 found left at 07680e1, one case each: every call raises one
:class:`posenc.PosEncError` whose message names the argument the user passed (as a word of its
own), says the rule and the value, and never prints a tensor. Beside them, the valid calls
next to each rule still work."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import posenc
from posenc._errors import check_bool, check_choice, check_float, check_int, describe

Q = torch.randn(1, 4, 3, 8)  # [b, h, s, d]
X = torch.randn(1, 4, 8)  # [b, s, dim]
HUGE64 = torch.full((4,), 1e300, dtype=torch.float64)
DYNAMIC = {"type": "dynamic", "factor": 2.0, "max_position": 16}


def _mrope_config() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return posenc.build({"name": "mrope", "head_dim": 8, "sections": None})


# (id, call, the argument the message must name, other words it must hold)
CASES: list[tuple[str, Callable[[], Any], str, tuple[str, ...]]] = [
    # 1. positions whose value overflows the dtype of the encoding
    ("index-forward-1e300", lambda: posenc.IndexEmbedding(8)(X, HUGE64), "positions",
     ("torch.float32", "1e+300")),
    ("index-table-1e300", lambda: posenc.IndexEmbedding(8).table(HUGE64), "positions",
     ("torch.float32", "1e+300")),
    ("index-forward-half", lambda: posenc.IndexEmbedding(8)(X.half(), torch.full((4,), 65520)),
     "positions", ("torch.float16", "65520")),
    ("index-table-half-normalized",
     lambda: posenc.IndexEmbedding(8, normalize="length").table(
         torch.full((4,), 10**7), length=2, dtype=torch.float16),
     "positions", ("length", "5e+06")),
    # 2. a bias module called like attention, with q
    ("alibi-call-q", lambda: posenc.ALiBiBias(4)(Q), "q_len",
     ("(1, 4, 3, 8)", "torch.float32", "posenc.attention")),
    ("t5-call-q", lambda: posenc.T5RelativeBias(4)(Q), "q_len", ("(1, 4, 3, 8)",)),
    ("shaw-call-q", lambda: posenc.ShawRelativeBias(4, 8)(Q), "q_len", ("q=q * scale",)),
    ("alibi-bias-q", lambda: posenc.ALiBiBias(4).bias(Q), "q_len", ("(1, 4, 3, 8)",)),
    ("rope-rotation-tensor", lambda: posenc.RotaryEmbedding(8).rotation(torch.ones(3)),
     "q_len", ("(3,)",)),
    # 3. a complex (or float) number where an integer belongs
    ("axial-rotary_dim-complex",
     lambda: posenc.AxialRotaryEmbedding(8, 2, rotary_dim=8 + 0j, axis_dims=[4, 4]),
     "rotary_dim", ("(8+0j)",)),
    ("axial-rotary_dim-float",
     lambda: posenc.AxialRotaryEmbedding(8, 2, rotary_dim=8.0, axis_dims=[4, 4]),
     "rotary_dim", ("8.0",)),
    ("axial-rotary_dim-odd",
     lambda: posenc.AxialRotaryEmbedding(8, 2, rotary_dim=7, axis_dims=[4, 4]),
     "rotary_dim", ("even", "7")),
    ("check_int-complex", lambda: check_int("size", 8 + 0j), "size", ("(8+0j)",)),
    ("check_int-numpy-complex", lambda: check_int("size", np.complex128(8)), "size", ("8",)),
    ("check_int-complex-tensor", lambda: check_int("size", torch.tensor(8 + 0j)), "size",
     ("torch.complex64",)),
    ("check_float-complex", lambda: check_float("base", 8 + 0j), "base", ("(8+0j)",)),
    ("check_int-bool", lambda: check_int("size", True), "size", ("True",)),
    ("check_choice-complex", lambda: check_choice("seq_dim", -2 + 0j, (-2, -3)), "seq_dim",
     ("(-2+0j)",)),
    ("check_choice-float", lambda: check_choice("seq_dim", -2.0, (-2, -3)), "seq_dim",
     ("-2.0",)),
    ("check_choice-int-for-bool", lambda: check_choice("causal", 1, (True, False)), "causal",
     ("True, False", "got 1")),
    ("build-fill-head_dim-complex",
     lambda: posenc.build({"name": "rope", "head_dim": 8 + 0j}, fill={"head_dim": 8}),
     "head_dim", ("(8+0j)",)),
    ("build-fill-num_heads-float",
     lambda: posenc.build({"name": "alibi", "num_heads": 4.0}, fill={"num_heads": 4}),
     "num_heads", ("4.0",)),
    # 4. NoPE takes no arguments
    ("nope-positional", lambda: posenc.NoPositionalEncoding(3), "NoPositionalEncoding",
     ("no arguments", "positional argument 3")),
    ("nope-keyword", lambda: posenc.NoPositionalEncoding(dim=8), "dim", ("dim=8",)),
    ("nope-build", lambda: posenc.build("none", dim=8), "dim", ("dim=8",)),
    # 5. silently accepted before
    ("resolve_pair-coords-0", lambda: posenc.positions.resolve_pair(2, coords=0), "coords",
     (">= 1", "0")),
    ("resolve_pair-coords-bool", lambda: posenc.positions.resolve_pair(2, coords=True),
     "coords", ("True",)),
    ("build-mrope-sections-none", _mrope_config, "sections", ("None",)),
    # 6. the argument passed, not an internal name
    ("t5-bias-huge", lambda: posenc.T5RelativeBias(4).bias(10**12), "q_len",
     ("1000000000000",)),
    ("fire-bias-huge", lambda: posenc.FIREBias(4).bias(10**12), "q_len", ("1000000000000",)),
    ("kerple-bias-huge", lambda: posenc.KerpleBias(4).bias(10**12), "q_len",
     ("1000000000000",)),
    ("t5-bias-huge-k_len", lambda: posenc.T5RelativeBias(4).bias(1, 10**12), "k_len",
     ("1000000000000",)),
    ("dynamic-forward-1e300",
     lambda: posenc.RotaryEmbedding(8, scaling=DYNAMIC)(Q, Q, HUGE64[:3]), "q_positions",
     ("dynamic", "1e+300")),
    ("dynamic-rotation-1e300",
     lambda: posenc.RotaryEmbedding(8, scaling=DYNAMIC).rotation(3, k_positions=HUGE64[:3]),
     "k_positions", ("1e+300",)),
    ("dynamic-attention-1e300",
     lambda: posenc.attention(Q, Q, Q, encoding=posenc.RotaryEmbedding(8, scaling=DYNAMIC),
                              q_positions=HUGE64[:3]),
     "q_positions", ("1e+300",)),
    ("attention-q-0-heads",
     lambda: posenc.attention(torch.randn(1, 0, 3, 8), Q[:, :2], Q[:, :2]), "q",
     ("heads", "(1, 0, 3, 8)")),
    ("attention-k-0-heads",
     lambda: posenc.attention(Q, torch.randn(1, 0, 3, 8), torch.randn(1, 0, 3, 8)), "k",
     ("heads", "(1, 0, 3, 8)")),
    ("shaw-bias-q-last-dim",
     lambda: posenc.ShawRelativeBias(4, 8, max_distance=2).bias(4, q=torch.randn(1, 4, 4, 9)),
     "q", ("head_dim", "(1, 4, 4, 9)")),
]  # fmt: skip


def _names(message: str, name: str) -> bool:
    """``name`` as a word of its own (``dim`` is not named by ``head_dim``)."""
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", message) is not None


@pytest.mark.parametrize(("call", "name", "words"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_refused_by_name(call: Callable[[], Any], name: str, words: tuple[str, ...]) -> None:
    with pytest.raises(posenc.PosEncError) as info:
        call()
    assert type(info.value) is posenc.PosEncError
    message = str(info.value)
    assert _names(message, name), message
    assert "tensor(" not in message and "array(" not in message, message
    missing = [w for w in words if w not in message]
    assert missing == [], message


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (torch.ones(2, 3), "a tensor of shape (2, 3) and dtype torch.float32"),
        (torch.tensor(8.5), "a tensor of shape () and dtype torch.float32"),
        (torch.ones(2, device="meta"), "a tensor of shape (2,) and dtype torch.float32"),
        (np.ones((4,), dtype=np.int32), "an array of shape (4,) and dtype int32"),
        (np.float64(8.5), repr(np.float64(8.5))),
        (8 + 0j, "(8+0j)"),
        ("eight", "'eight'"),
    ],
    ids=["tensor", "tensor-0d", "tensor-meta", "array", "numpy-scalar", "complex", "str"],
)
def test_describe(value: Any, expected: str) -> None:
    assert describe(value) == expected


@pytest.mark.parametrize(
    "check",
    [
        lambda: check_int("n", torch.ones(64, 64)),
        lambda: check_float("x", torch.ones(64, 64)),
        lambda: check_bool("flag", torch.ones(64, 64)),
        lambda: check_choice("layout", torch.ones(64, 64), ("half", "interleaved")),
    ],
    ids=["check_int", "check_float", "check_bool", "check_choice"],
)
def test_shared_checks_describe_tensors(check: Callable[[], Any]) -> None:
    with pytest.raises(posenc.PosEncError, match=r"got a tensor of shape \(64, 64\)") as info:
        check()
    assert "tensor(" not in str(info.value)


# --- the valid calls beside each rule ----------------------------------------------------


@pytest.mark.parametrize(
    ("positions", "dtype", "value"),
    [
        (torch.full((2,), 65504), torch.float16, 65504.0),
        (torch.full((2,), 65519), torch.float16, 65504.0),  # rounds to the largest finite
        (torch.full((2,), 2**62), torch.float32, float(2**62)),
        (torch.full((2,), 3e38, dtype=torch.float64), torch.float32, 3e38),
        (HUGE64[:2], torch.float64, 1e300),
    ],
    ids=["half-max", "half-rounds-down", "int64-float32", "float64-float32", "float64-float64"],
)
def test_index_positions_that_fit(
    positions: torch.Tensor, dtype: torch.dtype, value: float
) -> None:
    expected = torch.full((2, 3), value, dtype=torch.float64).to(dtype)
    torch.testing.assert_close(
        posenc.IndexEmbedding(3).table(positions, dtype=dtype), expected, rtol=0, atol=0
    )
    x = torch.zeros(1, 2, 3, dtype=dtype)
    torch.testing.assert_close(
        posenc.IndexEmbedding(3)(x, positions), expected[None], rtol=0, atol=0
    )


@pytest.mark.parametrize(
    ("value", "choices"),
    [
        ("half", ("half", "interleaved")),
        (np.int64(-3), (-2, -3)),
        (np.True_, (True, False)),
        (None, (None, "length")),
        (torch.float32, (torch.float32, torch.float64)),
    ],
    ids=["str", "numpy-int", "numpy-bool", "none", "dtype"],
)
def test_check_choice_takes_each_kind(value: Any, choices: tuple[Any, ...]) -> None:
    assert check_choice("option", value, choices) is value


def test_check_bool_takes_numpy_bool() -> None:
    assert check_bool("flag", np.True_) is True


def test_axial_rotary_dim_kept_as_int() -> None:
    config = posenc.AxialRotaryEmbedding(8, 2, rotary_dim=np.int64(8), axis_dims=[4, 4]).to_config()
    assert config == {
        "name": "axial_rope",
        "head_dim": 8,
        "n_axes": 2,
        "base": 10000.0,
        "rotary_dim": 8,
        "layout": "half",
        "axis_dims": [4, 4],
    }
    assert type(config["rotary_dim"]) is int


def test_mrope_config_with_sections_still_upgrades() -> None:
    built = posenc.build({"name": "mrope", "head_dim": 8, "sections": [1, 1, 2]})
    assert built.to_config() == posenc.RotaryEmbedding(8, sections=[1, 1, 2]).to_config()


def test_nope_without_arguments() -> None:
    nope = posenc.NoPositionalEncoding()
    assert nope(X) is X
    assert posenc.build("none").to_config() == {"name": "none"}


def test_resolve_pair_coords_1() -> None:
    q, k = posenc.positions.resolve_pair(2, 3, coords=1)
    torch.testing.assert_close(q, torch.tensor([[1], [2]]), rtol=0, atol=0)
    torch.testing.assert_close(k, torch.tensor([[0], [1], [2]]), rtol=0, atol=0)


def test_dynamic_scaling_at_the_int64_limit() -> None:
    """The largest int64 position is still one dynamic scaling takes: its frequencies are
    those of ``seq_len = 2**63`` (rows 0 and 1 compared with the reference)."""
    rotation = posenc.RotaryEmbedding(8, scaling=DYNAMIC).rotation(
        3, q_positions=torch.tensor([0, 1, 2**63 - 1]), dtype=torch.float64
    )
    inv_freq, _ = posenc.reference.rope_frequencies(8, scaling=DYNAMIC, seq_len=2.0**63)
    angles = torch.from_numpy(posenc.reference.rotary_angles(np.array([0.0, 1.0]), inv_freq))
    torch.testing.assert_close(rotation.cos_q[:2], angles.cos())
    torch.testing.assert_close(rotation.sin_q[:2], angles.sin())
    assert bool(torch.isfinite(rotation.cos_q).all() & torch.isfinite(rotation.sin_q).all())
