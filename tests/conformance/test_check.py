"""The conformance check: the reference passes in every dtype, each defective
implementation written here fails with the words that name its defect, and an adapter's
bad output or bad construction is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import PosEncError, reference
from posenc.conformance import DTYPES, Adapter, CaseResult, Report, Unsupported, Vectors, check
from posenc.conformance._case import make
from posenc.conformance.diagnose import diagnose, layout_words, round_to

from ._peers import reference_adapters, rope, sinusoidal

HALF = {"layout": "half"}


@pytest.fixture(scope="module")
def vectors():
    return Vectors.build()


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_reference_passes_every_case(vectors, dtype):
    report = check(reference_adapters(dtype), vectors)
    assert report.ok, str(report)
    ran = {r.case for r in report.results if r.status == "pass"}
    skipped = {r.case: r.detail for r in report.results if r.status == "skip"}
    assert ran | set(skipped) == set(vectors.names())
    if dtype == "float64":  # the same formulas: exact
        assert not skipped and all(r.max_error == 0.0 for r in report.results)
    else:  # float16 cannot hold positions past 65504: the only skips
        assert set(skipped.values()) <= {"a value past float16's range"}


def _only(report: Report) -> CaseResult:
    assert len(report.results) == 1, str(report)
    return report.results[0]


def _positions_bf16_rope(q, k, positions, *, base, scaling, rotary_dim):
    """Defect: positions rounded to bfloat16 before the angles (as bf16 code does)."""
    return rope("half", "bfloat16", position_dtype="bfloat16")(
        q, k, positions, base=base, scaling=scaling, rotary_dim=rotary_dim
    )


def _rotate_angles(q, k, positions, *, base, rotary_dim, angles_of):
    """q, k rotated in halves by ``angles_of(angles)`` ([seq, r/2] -> (angles, scale))."""
    inv_freq, _ = reference.rope_frequencies(rotary_dim, base=base)
    angles, scale = angles_of(reference.rotary_angles(positions, inv_freq))
    out = []
    for x in (q, k):
        x4 = np.transpose(x, (1, 0, 2))[None]
        rotated = reference.apply_rotary(x4, angles, layout="half", scale=scale)
        out.append(np.transpose(rotated[0], (1, 0, 2)))
    return out[0], out[1]


def _angles_bf16_rope(q, k, positions, *, base, scaling, rotary_dim):
    """Defect: the angles (position times frequency) rounded to bfloat16."""
    return _rotate_angles(
        q,
        k,
        positions,
        base=base,
        rotary_dim=rotary_dim,
        angles_of=lambda a: (round_to(a, "bfloat16"), None),
    )


def _cos_sin_bf16_rope(q, k, positions, *, base, scaling, rotary_dim):
    """Defect: cos and sin rounded to bfloat16, the rotation then exact (the same rotation by
    the angle and length of the rounded pair)."""

    def rounded(a):
        c, s = round_to(np.cos(a), "bfloat16"), round_to(np.sin(a), "bfloat16")
        return np.arctan2(s, c), np.hypot(c, s)

    return _rotate_angles(q, k, positions, base=base, rotary_dim=rotary_dim, angles_of=rounded)


def _uniform_dynamic(dim, *, base, scaling, seq_len):
    """Defect: ``dynamic`` applied as a uniform factor (positions divided by it)."""
    inv_freq, _ = reference.rope_frequencies(dim, base=base)
    return inv_freq / scaling["factor"], 1.0


def _placed_rope(partial):
    """Defect: halves pairs always placed ``partial`` (``"leading"``: the first ``r``
    channels; ``"whole_head"``: ``(i, i + d/2)``), whatever the case's convention."""

    def fn(q, k, positions, *, base, scaling, rotary_dim):
        kind = (scaling or {}).get("type")
        span = q.shape[-1] if kind == "proportional" else rotary_dim  # p-RoPE: the head's
        inv_freq, scale = reference.rope_frequencies(span, base=base, scaling=scaling)
        angles = reference.rotary_angles(positions, inv_freq[: rotary_dim // 2])
        x4 = np.transpose(np.stack([q, k]), (0, 2, 1, 3))  # [2, heads, seq, dim]
        y = reference.apply_rotary(x4, angles, scale=np.full(angles.shape, scale), partial=partial)
        return np.transpose(y[0], (1, 0, 2)), np.transpose(y[1], (1, 0, 2))

    return fn


DEFECTS = [
    (
        "adjacent-pairs",
        Adapter("adjacent", "rotate", "rope", rope("interleaved"), convention=HALF),
        "rope.rotate.half.default.d64.full@near",
        "pairs adjacent channels where the convention pairs halves",
    ),
    (
        "halves",
        Adapter("halves", "rotate", "rope", rope("half"), convention={"layout": "interleaved"}),
        "rope.rotate.interleaved.llama3.d64.full@near",
        "pairs halves where the convention pairs adjacent channels",
    ),
    (
        "leading-where-whole-head",
        Adapter("leading", "rotate", "rope", _placed_rope("leading"), convention=HALF),
        "rope.rotate.half.proportional.d64.r16@near",
        "rotates the leading channels where the convention spreads the pairs over the whole head",
    ),
    (
        "whole-head-where-leading",
        Adapter("whole-head", "rotate", "rope", _placed_rope("whole_head"), convention=HALF),
        "rope.rotate.half.yarn.d64.r32@far",
        "spreads the pairs over the whole head where the convention rotates the leading channels",
    ),
    (
        "concatenated",
        Adapter(
            "concat",
            "table",
            "sinusoidal",
            sinusoidal("half"),
            convention={"layout": "interleaved"},
        ),
        "sinusoidal.interleaved.d128@near",
        "[sin | cos] concatenated where the convention interleaves",
    ),
    (
        "flax-as-half",
        Adapter(
            "tutorial", "table", "sinusoidal", sinusoidal("half"), convention={"layout": "flax"}
        ),
        "sinusoidal.flax.d64@near",
        "exponent 2i/d where the convention log-spaces the rates over d/2 - 1",
    ),
    (
        "bf16-positions",
        Adapter("bf16", "rotate", "rope", _positions_bf16_rope, convention=HALF, dtype="bfloat16"),
        "rope.rotate.half.default.d64.full@near",
        "positions rounded in bf16 before the rotation: positions 256 and 257 give equal rows",
    ),
    (
        "bf16-angles",
        Adapter("bf16-angles", "rotate", "rope", _angles_bf16_rope, convention=HALF),
        "rope.rotate.half.default.d64.full@near",
        "angles rounded in bf16 before the rotation",  # low frequencies: rows 256, 257 differ
    ),
    (
        "bf16-cos-sin",
        Adapter("bf16-cos", "rotate", "rope", _cos_sin_bf16_rope, convention=HALF),
        "rope.rotate.half.default.d64.full@near",
        "cos and sin rounded to bf16 before the rotation",
    ),
    (
        "bf16-table",
        Adapter(
            "bf16-table",
            "table",
            "sinusoidal",
            sinusoidal("interleaved", "bfloat16", position_dtype="bfloat16"),
            convention={"layout": "interleaved"},
            dtype="bfloat16",
        ),
        "sinusoidal.interleaved.d64@near",
        "positions rounded in bf16 before the sin and cos: positions 256 and 257 give equal rows",
    ),
    (
        "fp16-positions",
        Adapter(
            "fp16",
            "rotate",
            "rope",
            rope("half", "float16", position_dtype="float16"),
            convention=HALF,
            dtype="float16",
        ),
        "rope.rotate.half.default.d64.full@near",
        "positions rounded in fp16 before the rotation: positions 2048 and 2049 give equal rows",
    ),
    (
        "uniform-dynamic",
        Adapter("keras-like", "frequencies", "rope", _uniform_dynamic),
        "rope.frequencies.dynamic-8192.d128",
        "`dynamic` is a uniform factor, not NTK: every frequency divided by 4",
    ),
    (
        "no-yarn-scale",
        Adapter("no-scale", "rotate", "rope", rope("half", ignore_attention=True), convention=HALF),
        "rope.rotate.half.yarn.d64.full@near",
        "the yarn attention scale is missing (cos and sin not multiplied by it)",
    ),
    (
        "off-by-one",
        Adapter("off", "rotate", "rope", rope("half", shift=1), convention=HALF),
        "rope.rotate.half.default.d64.full@near",
        "positions off by one: position p rotated as p + 1",
    ),
    (
        "float32-angles",
        Adapter(
            "f32",
            "rotate",
            "rope",
            rope("half", "float32", float32_angles=True),
            convention=HALF,
            dtype="float32",
        ),
        "rope.rotate.half.default.d64.full@far",
        None,
    ),
]


@pytest.mark.parametrize(
    ("adapter", "case", "words"), [d[1:] for d in DEFECTS], ids=[d[0] for d in DEFECTS]
)
def test_a_defect_is_named(vectors, adapter, case, words):
    result = _only(check(adapter, vectors, cases=case))
    assert result.status == "fail"
    if words is None:  # float32 angles: the error at the farthest position, measured
        expected = vectors[case].expected["q"][-1]
        got = adapter.fn(*vectors[case].args(), **vectors[case].kwargs())[0][-1]
        err = float(np.max(np.abs(got - expected)))
        words = (
            f"angles computed in float32: the error grows with position, {err:.2g} at "
            "position 1000001"
        )
    assert result.deviation == words


def test_float32_angles_pass_near_and_fail_far(vectors):
    adapter = Adapter(
        "f32",
        "rotate",
        "rope",
        rope("half", "float32", float32_angles=True),
        convention=HALF,
        dtype="float32",
    )
    report = check(adapter, vectors, cases="rope.rotate.half.default.d64.full@*")
    assert [(r.case.split("@")[1], r.status) for r in report.results] == [
        ("near", "pass"),
        ("far", "fail"),
    ]


def test_uniform_dynamic_in_a_rotation(vectors):
    def uniform(q, k, positions, *, base, scaling, rotary_dim):
        linear = {"type": "linear", "factor": scaling["factor"]}
        return rope("half")(q, k, positions, base=base, scaling=linear, rotary_dim=rotary_dim)

    adapter = Adapter(
        "uniform", "rotate", "rope", uniform, convention={**HALF, "scaling": "dynamic"}
    )
    result = _only(check(adapter, vectors, cases="rope.rotate.half.*.d64.full@near"))
    assert (
        result.deviation == "`dynamic` is a uniform factor, not NTK: every frequency divided by 4"
    )


def test_a_fitted_base(vectors):
    def wrong_base(positions, dim, *, base):
        return reference.sinusoidal_table(positions, dim, base=500000.0)

    adapter = Adapter(
        "base", "table", "sinusoidal", wrong_base, convention={"layout": "interleaved"}
    )
    result = _only(check(adapter, vectors, cases="sinusoidal.interleaved.d64@near"))
    assert result.deviation == "base 500000 where the convention has 10000"


def test_a_deviation_no_hypothesis_names_says_where(vectors):
    def broken(positions, dim, *, base):
        table = reference.sinusoidal_table(positions, dim, base=base)
        table[positions >= 1000, 5:9] += 0.5  # a defect no hypothesis names
        return table

    adapter = Adapter("broken", "table", "sinusoidal", broken, convention={"layout": "interleaved"})
    result = _only(check(adapter, vectors, cases="sinusoidal.interleaved.d64@near"))
    assert result.deviation is None
    assert result.detail == "differs from the reference from position 1000 on, in channels 5-8"
    assert result.where.startswith("position 1000, channel ") and result.max_error == 0.5


@settings(max_examples=25, deadline=None)
@given(
    layouts=st.permutations(["interleaved", "half", "flax"]),
    half_dim=st.integers(2, 32),
    positions=st.lists(st.integers(1, 5000), min_size=2, max_size=8, unique=True),
)
def test_any_other_layout_is_named_as_that_layout(layouts, half_dim, positions):
    """A correct table in layout B checked against layout A is named "B where A"."""
    claimed, actual = layouts[0], layouts[1]
    dim, pos = 2 * half_dim, np.array(sorted(positions), dtype=np.int64)
    case = make(
        f"sinusoidal.{claimed}.d{dim}@near",
        "sinusoidal",
        "table",
        convention={"layout": claimed},
        parameters={"dim": dim, "base": 10000.0},
        inputs={"positions": pos},
        expected={"table": reference.sinusoidal_table(pos, dim, layout=claimed)},
        magnitude={"table": np.ones((1, 1))},
        doc="a drawn case",
    )
    got = {"table": reference.sinusoidal_table(pos, dim, layout=actual)}
    deviation, _ = diagnose(case, got, "float64")
    assert deviation == layout_words(claimed, actual)


@given(st.floats(-1e6, 1e6, allow_nan=False))
def test_round_to_bfloat16_is_nearest(x):
    r = float(round_to(x, "bfloat16"))
    assert abs(r - x) <= 2.0**-8 * abs(x) + 2.0**-133  # below 2^-126: the subnormal step
    assert (
        float(round_to(257.0, "bfloat16")) == 256.0 and float(round_to(2049.0, "float16")) == 2048
    )


# --- an adapter's output, refused in one line ------------------------------------------------


def _table_returning(value):
    return Adapter(
        "bad",
        "table",
        "sinusoidal",
        lambda positions, dim, *, base: value,
        convention={"layout": "interleaved"},
    )


BAD_OUTPUTS = [
    ("shape", np.zeros((3, 3)), "field table must have shape [14, 64], got [3, 3]"),
    (
        "dtype",
        np.zeros((14, 64), dtype=complex),
        "field table must be real numbers, got dtype complex128",
    ),
    ("type", "a string", "field table must be real numbers, got dtype <U8"),
    (
        "nan",
        np.full((14, 64), np.nan),
        "field table must be finite, got nan at position 0, channel 0",
    ),
]


@pytest.mark.parametrize(
    ("value", "message"), [b[1:] for b in BAD_OUTPUTS], ids=[b[0] for b in BAD_OUTPUTS]
)
def test_a_bad_output_is_one_line(vectors, value, message):
    result = _only(check(_table_returning(value), vectors, cases="sinusoidal.interleaved.d64@near"))
    assert result.status == "fail"
    assert result.detail == (f"adapter 'bad' case 'sinusoidal.interleaved.d64@near' {message}")


def test_a_rotation_returning_one_array(vectors):
    adapter = Adapter("one", "rotate", "rope", lambda q, k, p, **kw: q, convention=HALF)
    result = _only(check(adapter, vectors, cases="rope.rotate.half.default.d64.full@near"))
    assert "field output must be (q_rot, k_rot), got ndarray" in result.detail


def test_unsupported_is_a_skip_and_an_exception_a_failure(vectors):
    def unsupported(*args, **kwargs):
        raise Unsupported("no yarn here")

    def crash(*args, **kwargs):
        raise RuntimeError("boom\nsecond line")

    skip = _only(
        check(
            Adapter("u", "rotate", "rope", unsupported, convention=HALF),
            vectors,
            cases="rope.rotate.half.yarn.d64.full@near",
        )
    )
    assert (skip.status, skip.detail) == ("skip", "no yarn here")
    fail = _only(
        check(
            Adapter("c", "rotate", "rope", crash, convention=HALF),
            vectors,
            cases="rope.rotate.half.yarn.d64.full@near",
        )
    )
    assert (fail.status, fail.detail) == ("fail", "raised RuntimeError: boom second line")


def test_frequencies_without_the_scale_compare_inv_freq_only(vectors):
    adapter = Adapter(
        "f",
        "frequencies",
        "rope",
        lambda dim, **kw: reference.rope_frequencies(
            dim, base=kw["base"], scaling=kw["scaling"], seq_len=kw["seq_len"]
        )[0],
    )
    result = _only(check(adapter, vectors, cases="rope.frequencies.yarn.d64"))
    assert (result.status, result.detail) == ("pass", "no attention scale returned: not compared")


BAD_ADAPTERS = [
    ({"name": ""}, "Adapter name must be a non-empty string, got ''"),
    (
        {"operation": "shift"},
        "Adapter 'x' operation must be one of 'table', 'frequencies', "
        "'rotate', 'bias', got 'shift'",
    ),
    ({"family": "wavelet"}, "Adapter 'x' family must be one of 'sinusoidal', .* got 'wavelet'"),
    ({"fn": 3}, "Adapter 'x' fn must be callable, got int"),
    ({"dtype": "int8"}, "Adapter 'x' dtype must be one of 'float64', .* got 'int8'"),
    ({"convention": {"layout": [1]}}, "Adapter 'x' convention must map str to"),
    ({"convention": 3}, "Adapter 'x' convention must be a mapping"),
]


@pytest.mark.parametrize(("change", "message"), BAD_ADAPTERS, ids=[m[:30] for _, m in BAD_ADAPTERS])
def test_a_bad_adapter_is_refused(change, message):
    args = {"name": "x", "operation": "table", "family": "sinusoidal", "fn": len, **change}
    with pytest.raises(PosEncError, match=message):
        Adapter(**args)


def test_check_refuses_bad_arguments(vectors):
    with pytest.raises(PosEncError, match="adapter must be an Adapter or a non-empty sequence"):
        check("nope", vectors)  # type: ignore[arg-type]
    ok = reference_adapters("float64")[0]
    with pytest.raises(PosEncError, match="adapters must have distinct names"):
        check([ok, ok], vectors)
    with pytest.raises(PosEncError, match="vectors must be None, a Vectors or a directory"):
        check(ok, 3)  # type: ignore[arg-type]


def test_an_adapter_no_case_applies_to_is_one_skip(vectors):
    adapter = Adapter("odd", "table", "sinusoidal", len, convention={"layout": "spiral"})
    result = _only(check(adapter, vectors))
    assert result.status == "skip" and "no table/sinusoidal case" in result.detail


def test_report_table_and_json(vectors):
    report = check(DEFECTS[0][1], vectors, cases="rope.rotate.half.default.d64.full@near")
    text = str(report)
    assert text.splitlines()[0].split() == [
        "adapter",
        "case",
        "status",
        "max",
        "error",
        "tolerance",
        "where",
    ]
    assert "pairs adjacent channels where the convention pairs halves" in text
    assert text.endswith("0 passed, 1 failed, 0 skipped -- MISMATCH")
    data = report.to_json()
    assert data["ok"] is False and data["counts"] == {"pass": 0, "fail": 1, "skip": 0}


def test_assert_conforms(vectors):
    from posenc.conformance.pytest_plugin import assert_conforms

    good = reference_adapters("float32")[0]
    assert assert_conforms(good, vectors, cases="sinusoidal.*").ok
    bad = {d[0]: d[1] for d in DEFECTS}["concatenated"]
    with pytest.raises(AssertionError, match="concatenated where the convention interleaves"):
        assert_conforms(bad, vectors, cases="sinusoidal.interleaved.d64@near")
    expect = {
        "sinusoidal.interleaved.d64@near": "[sin | cos] concatenated where the convention "
        "interleaves"
    }
    assert_conforms(bad, vectors, cases="sinusoidal.interleaved.d64@near", expect=expect)


def test_the_fixture(posenc_vectors):
    assert len(posenc_vectors) > 100


pytest_plugins = ["posenc.conformance.pytest_plugin"]
