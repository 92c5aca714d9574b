"""remapped_attention (eager, chunked, Flex) against the float64 reference, its properties,
its memory, and posenc.attention(position_map=)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tests._shapes import Shapes

import posenc
from posenc.remap import SelfExtend, String, remapped_attention
from posenc.remap import flex as remap_flex
from posenc.remap import fused as remap_fused

from ._cases import D, map_params, qkv, reference, rope_rotate

# SE-G3W4: a fraction (G does not divide W)
MAPS = map_params(SelfExtend(2, 4), SelfExtend(3, 4), SelfExtend(4, 2))
MAPS += map_params(String(4, 1), String(6, 5), String(3, 0))
SHAPES = [pytest.param(11, 11, id="prefill"), pytest.param(3, 11, id="decode")]
PATHS = [pytest.param("eager", None, id="eager"), pytest.param("chunked", 3, id="chunked3")]
# "auto" on the CPU without gradients: the fused path (torch's CPU flash kernel per branch)
FUSED = [pytest.param("auto", None, id="fused"), pytest.param("auto", 4, id="fused4")]
TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def _run(q, k, v, pmap, q_pos, k_pos, backend="chunked", block=None, layout="half", **kw):
    return remapped_attention(
        q,
        k,
        v,
        rotate=rope_rotate(layout),
        position_map=pmap,
        q_positions=q_pos,
        k_positions=k_pos,
        backend=backend,
        block=block,
        **kw,
    )


def _positions(sq: int, sk: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(sk - sq, sk), torch.arange(sk)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize(("backend", "block"), PATHS + FUSED)
@pytest.mark.parametrize(("sq", "sk"), SHAPES)
@pytest.mark.parametrize("pmap", MAPS)
def test_equals_reference(pmap, sq: int, sk: int, backend: str, block, dtype) -> None:
    q, k, v = qkv(sq, sk, dtype=dtype)
    q_pos, k_pos = _positions(sq, sk)
    got = _run(q, k, v, pmap, q_pos, k_pos, backend, block)
    want = reference(q, k, v, pmap, q_pos, k_pos).to(dtype)
    torch.testing.assert_close(got, want, atol=TOL[dtype], rtol=0)


@pytest.mark.parametrize(("backend", "block"), PATHS)
@pytest.mark.parametrize("pmap", MAPS[1::2])
def test_keep_softcap_scale_layout(pmap, backend: str, block) -> None:
    q, k, v = qkv(9, 9)
    q_pos, k_pos = _positions(9, 9)
    keep = torch.rand(2, 4, 9, 9) > 0.3
    keep[0, 1, 4] = False  # a row that sees no key: zeros
    kw: dict[str, Any] = {"keep": keep, "softcap": 1.5, "scale": 0.4}
    got = _run(q, k, v, pmap, q_pos, k_pos, backend, block, layout="interleaved", **kw)
    want = reference(q, k, v, pmap, q_pos, k_pos, layout="interleaved", **kw)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
    assert torch.equal(got[0, 1, 4], torch.zeros(D, dtype=got.dtype))


@pytest.mark.parametrize("backend", ["chunked", "auto"], ids=["chunked", "fused"])
@pytest.mark.parametrize("keep_shape", [(1, 1, 1, 9), (2, 1, 9, 9), (9, 9), (1, 4, 1, 1)])
def test_keep_broadcasts(keep_shape, backend: str) -> None:
    q, k, v = qkv(9, 9)
    q_pos, k_pos = _positions(9, 9)
    keep = torch.rand(keep_shape) > 0.2
    if keep.shape[-2] > 1:
        keep[..., 5, :] = False  # a row that sees no key: zeros
    got = _run(q, k, v, SelfExtend(2, 3), q_pos, k_pos, backend, 4, keep=keep)
    want = reference(q, k, v, SelfExtend(2, 3), q_pos, k_pos, keep=keep)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


@pytest.mark.parametrize("backend", ["chunked", "auto"], ids=["chunked", "fused"])
@pytest.mark.parametrize("order", ["unsorted", "sorted"])
def test_irregular_positions_and_hidden_rows(order: str, backend: str) -> None:
    # keys out of order (a block's key range cannot be cut), gaps, queries before every key
    q, k, v = qkv(5, 8)
    q_pos = torch.tensor([0, 9, 3, 12, 7])
    k_pos = torch.tensor([5, 1, 7, 2, 0, 11, 4, 3])
    if order == "sorted":
        q_pos, k_pos = q_pos.sort().values, k_pos.sort().values * 2 + 1
    got = _run(q, k, v, String(3, 1), q_pos, k_pos, backend, 2)
    want = reference(q, k, v, String(3, 1), q_pos, k_pos)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


# --- properties ---------------------------------------------------------------------------


def _plain(q, k, v, sq: int, sk: int) -> torch.Tensor:
    enc = posenc.RotaryEmbedding(D)
    return posenc.attention(q, k, v, encoding=enc, causal=True, backend="eager")


@given(
    sq=st.integers(1, 12),
    extra=st.integers(0, 6),
    group=st.integers(1, 5),
    over=st.integers(0, 5),
    string=st.booleans(),
)
def test_a_map_that_never_triggers_is_plain_rope(sq, extra, group, over, string) -> None:
    sk = sq + extra
    q, k, v = qkv(sq, sk)
    q_pos, k_pos = _positions(sq, sk)
    shift = sk + over
    pmap = String(shift, min(group, shift) - 1) if string else SelfExtend(group, shift)
    torch.testing.assert_close(
        _run(q, k, v, pmap, q_pos, k_pos), _plain(q, k, v, sq, sk), atol=1e-10, rtol=0
    )


@given(sk=st.integers(1, 14), window=st.integers(1, 16))
def test_self_extend_with_groups_of_one_is_plain_rope(sk: int, window: int) -> None:
    q, k, v = qkv(sk, sk)
    q_pos, k_pos = _positions(sk, sk)
    got = _run(q, k, v, SelfExtend(1, window), q_pos, k_pos)
    torch.testing.assert_close(got, _plain(q, k, v, sk, sk), atol=1e-10, rtol=0)


@given(shift=st.integers(1, 8), window=st.integers(0, 7), start=st.integers(0, 10_000))
def test_string_depends_on_offsets_only(shift: int, window: int, start: int) -> None:
    # (The map's W = S would be plain RoPE, but the rule is W < S.) STRING rotates each pair
    # at a function of its offset, so moving every position by the same amount changes nothing.
    window = min(window, shift - 1)
    q, k, v = qkv(10, 10)
    q_pos, k_pos = _positions(10, 10)
    a = _run(q, k, v, String(shift, window), q_pos, k_pos)
    b = _run(q, k, v, String(shift, window), q_pos + start, k_pos + start)
    torch.testing.assert_close(a, b, atol=1e-9, rtol=0)


@given(
    block=st.integers(1, 14),
    sq=st.integers(1, 13),
    pick=st.sampled_from([SelfExtend(2, 3), SelfExtend(3, 5), String(4, 2), String(2, 0)]),
)
def test_chunked_and_fused_equal_eager_for_any_block(block: int, sq: int, pick) -> None:
    q, k, v = qkv(sq, 13, dtype=torch.float32)
    q_pos, k_pos = _positions(sq, 13)
    eager = _run(q, k, v, pick, q_pos, k_pos, "eager")
    torch.testing.assert_close(_run(q, k, v, pick, q_pos, k_pos, "chunked", block), eager)
    torch.testing.assert_close(_run(q, k, v, pick, q_pos, k_pos, "auto", block), eager)


@pytest.mark.parametrize(
    ("case", "fused"),
    [("plain", True), ("grad", False), ("softcap", False), ("dv", False), ("chunked", False)],
)
def test_auto_takes_the_fused_path_where_it_runs(
    case: str, fused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    run = remap_fused.run
    monkeypatch.setattr(remap_fused, "run", lambda *a: calls.append(1) or run(*a))
    q, k, v = qkv(6, 6, dtype=torch.float32, dv=5 if case == "dv" else D)
    q_pos, k_pos = _positions(6, 6)
    if case == "grad":
        q.requires_grad_()
    backend = "chunked" if case == "chunked" else "auto"
    softcap = 3.0 if case == "softcap" else None
    _run(q, k, v, String(2, 1), q_pos, k_pos, backend, softcap=softcap)
    assert calls == ([1] if fused else [])


def test_chunked_gradients_equal_eager() -> None:
    q, k, v = (t.requires_grad_() for t in qkv(7, 7))
    q_pos, k_pos = _positions(7, 7)
    grads = []
    for backend, block in (("eager", None), ("chunked", 2), ("auto", 3)):  # auto: chunked
        out = _run(q, k, v, SelfExtend(2, 3), q_pos, k_pos, backend, block)
        grads.append(torch.autograd.grad(out.square().sum(), (q, k, v)))
    for other in grads[1:]:
        for a, b in zip(grads[0], other, strict=True):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


# --- memory ---------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["chunked", "auto"], ids=["chunked", "fused"])
@pytest.mark.parametrize("pmap", [SelfExtend(8, 512), String(700, 128)], ids=["SE", "STRING"])
def test_no_square_tensor(pmap, backend: str) -> None:
    s = 2048
    q, k, v = qkv(s, s, h=2, hk=1, b=1, dtype=torch.float32)
    q_pos, k_pos = _positions(s, s)
    shapes = Shapes()
    with torch.no_grad(), shapes:
        out = _run(q, k, v, pmap, q_pos, k_pos, backend, 128)
    assert out.shape == (1, 2, s, D)
    square = shapes.square(s)
    assert square == {}
    assert any(s in k for k in shapes.seen)  # the whole sequence was seen


# --- Flex (uncompiled on the CPU: torch compiles its log-sum-exp on CUDA only) -------------


@pytest.mark.parametrize("keep", [False, True], ids=["nokeep", "keep"])
@pytest.mark.parametrize("softcap", [None, 2.0], ids=["nocap", "cap"])
@pytest.mark.parametrize("pmap", MAPS[:4])
def test_flex_equals_chunked(pmap, softcap, keep, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remap_flex, "_COMPILED", False)
    q, k, v = qkv(10, 12, dtype=torch.float32)
    q_pos, k_pos = _positions(10, 12)
    mask = torch.rand(2, 1, 10, 12) > 0.3 if keep else None
    if keep:
        mask[1, 0, 3] = False
    with torch.no_grad():
        want = _run(q, k, v, pmap, q_pos, k_pos, "chunked", 4, softcap=softcap, keep=mask)
        got = _run(q, k, v, pmap, q_pos, k_pos, "flex", softcap=softcap, keep=mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_flex_is_refused_where_it_cannot_run() -> None:
    q, k, v = qkv(4, 4, dtype=torch.float32)
    q_pos, k_pos = _positions(4, 4)
    with pytest.raises(posenc.PosEncError, match="backend='flex'"):
        _run(q, k, v, String(2, 1), q_pos, k_pos, "flex")


# --- posenc.attention(position_map=) ---------------------------------------------------------


@pytest.mark.parametrize("spec", ["map", "dict"])
@pytest.mark.parametrize(("sq", "sk"), SHAPES)
@pytest.mark.parametrize("pmap", MAPS)
def test_posenc_attention_is_remapped_attention(pmap, sq: int, sk: int, spec: str) -> None:
    q, k, v = qkv(sq, sk, dtype=torch.float32)
    keep = torch.rand(2, sk) > 0.2
    given_map = pmap if spec == "map" else pmap.to_config()
    got = posenc.attention(
        q, k, v, encoding="rope", causal=True, position_map=given_map, attn_mask=keep
    )
    q_pos, k_pos = _positions(sq, sk)
    want = _run(q, k, v, pmap, q_pos, k_pos, "auto", keep=keep[:, None, None, :])
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_posenc_attention_rotates_keys_as_keys() -> None:
    # xPos scales queries and keys apart: groups of one keep every position, so the remapped
    # attention is xPos attention itself.
    q, k, v = qkv(9, 9, dtype=torch.float32)
    enc = posenc.XPosEmbedding(D, scale_base=16.0)
    got = posenc.attention(q, k, v, encoding=enc, causal=True, position_map=SelfExtend(1, 3))
    want = posenc.attention(q, k, v, encoding=enc, causal=True, backend="eager")
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_posenc_attention_positions_and_backends() -> None:
    q, k, v = qkv(4, 6)
    q_pos, k_pos = torch.arange(10, 14), torch.arange(8, 14)
    want = reference(q, k, v, String(3, 1), q_pos, k_pos)
    for backend in ("auto", "eager", "chunked"):
        got = posenc.attention(
            q,
            k,
            v,
            encoding="rope",
            causal=True,
            position_map=String(3, 1),
            q_positions=q_pos,
            k_positions=k_pos,
            backend=backend,
        )
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
