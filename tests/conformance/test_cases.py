"""The catalogue of golden cases: built from posenc.reference, checked against independent
closed forms, deterministic, the far cases selectable, and the tolerance model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from posenc import PosEncError, reference
from posenc.conformance import DTYPES, FAMILIES, build_cases
from posenc.conformance.cases import FAR, NEAR, OUTPUTS, coefficients, select


@pytest.fixture(scope="module")
def cases():
    return {c.name: c for c in build_cases()}


def test_every_family_has_cases_and_names_are_unique(cases):
    seen = {(c.operation, c.family) for c in cases.values()}
    expected = {(op, fam) for op, fams in FAMILIES.items() for fam in fams}
    assert seen == expected
    assert len(cases) == len(build_cases())


@pytest.mark.parametrize("layout", ["interleaved", "half", "flax"])
@pytest.mark.parametrize("dim", [64, 128, 33])
@pytest.mark.parametrize("where", ["near", "far"])
def test_sinusoidal_cases_are_the_reference(cases, layout, dim, where):
    case = cases[f"sinusoidal.{layout}.d{dim}@{where}"]
    pos = np.array(FAR if where == "far" else NEAR)
    np.testing.assert_array_equal(case.inputs["positions"], pos)
    want = reference.sinusoidal_table(pos, dim, base=10000.0, layout=layout)
    np.testing.assert_array_equal(case.expected["table"], want)
    assert case.far is (where == "far")


def test_worked_sinusoidal_rows(cases):
    """Position 1 written out by hand: sin(1), cos(1), then the next rate 10000^(-2/64)."""
    row = cases["sinusoidal.interleaved.d64@near"].expected["table"][1]
    w = 10000.0 ** (-2.0 / 64)
    np.testing.assert_allclose(
        row[:4], [math.sin(1), math.cos(1), math.sin(w), math.cos(w)], rtol=0, atol=1e-15
    )
    half = cases["sinusoidal.half.d64@near"].expected["table"][1]
    np.testing.assert_allclose(
        half[[0, 32, 1, 33]],
        [math.sin(1), math.cos(1), math.sin(w), math.cos(w)],
        rtol=0,
        atol=1e-15,
    )
    flax = cases["sinusoidal.flax.d64@near"].expected["table"][1]  # the last rate is 1/base
    np.testing.assert_allclose(
        flax[[0, 31, 32, 63]],
        [math.sin(1), math.sin(1e-4), math.cos(1), math.cos(1e-4)],
        rtol=0,
        atol=1e-15,
    )


def test_alibi_slopes_for_8_heads(cases):
    """The paper's slopes for 8 heads are 1/2, 1/4, ..., 1/256: the bias of query 1 on key 0."""
    case = cases["alibi.causal.h8@near"]
    assert case.inputs["query_positions"][1] == 1 and case.inputs["key_positions"][0] == 0
    np.testing.assert_array_equal(case.expected["bias"][:, 1, 0], -(2.0 ** -np.arange(1, 9)))


def test_rotation_cases_are_the_reference(cases):
    case = cases["rope.rotate.half.default.d64.full@far"]
    q, k, pos = case.inputs["q"], case.inputs["k"], case.inputs["positions"]
    inv_freq, _ = reference.rope_frequencies(64)
    qr, kr = reference.rotary_qk(
        q.transpose(1, 0, 2)[None], k.transpose(1, 0, 2)[None], pos, pos, inv_freq, layout="half"
    )
    np.testing.assert_array_equal(case.expected["q"], qr[0].transpose(1, 0, 2))
    np.testing.assert_array_equal(case.expected["k"], kr[0].transpose(1, 0, 2))
    # the inputs are exact in bfloat16: 8 significant bits
    assert np.all((q * 64) == np.round(q * 64)) and np.abs(q * 64).max() <= 255


@pytest.mark.parametrize("where", ["near", "far"])
def test_the_proportional_rotation_spreads_its_pairs_over_the_head(cases, where):
    """p-RoPE as transformers, Gemma, mlx-lm and MaxText place it: pair i < 8 is channels
    (i, i + 32) at the rate 10000^(-2i / 64) / 2, written out here; the other channels pass."""
    case = cases[f"rope.rotate.half.proportional.d64.r16@{where}"]
    assert dict(case.convention) == {
        "layout": "half",
        "scaling": "proportional",
        "partial": "whole_head",
    }
    pos = case.inputs["positions"].astype(np.float64)
    for key in ("q", "k"):
        x = case.inputs[key]
        want = x.copy()
        for i in range(8):
            angle = (pos * (10000.0 ** (-2.0 * i / 64) / 2.0))[:, None]
            c, s = np.cos(angle), np.sin(angle)
            want[..., i] = x[..., i] * c - x[..., i + 32] * s
            want[..., i + 32] = x[..., i + 32] * c + x[..., i] * s
        np.testing.assert_allclose(case.expected[key], want, rtol=0, atol=1e-9)
        untouched = [c for c in range(64) if c % 32 >= 8]
        np.testing.assert_array_equal(case.expected[key][..., untouched], x[..., untouched])
    assert cases[f"rope.rotate.half.default.d64.r32@{where}"].convention["partial"] == "leading"


@pytest.mark.parametrize("kind", ["yarn", "longrope", "dynamic", "llama3"])
def test_frequency_cases_are_the_reference(cases, kind):
    for name, case in cases.items():
        if name.startswith(f"rope.frequencies.{kind}"):
            p = case.parameters
            inv, scale = reference.rope_frequencies(
                p["dim"], base=p["base"], scaling=p["scaling"], seq_len=p["seq_len"]
            )
            np.testing.assert_array_equal(case.expected["inv_freq"], inv)
            assert float(case.expected["attention_scale"]) == scale


def test_build_is_deterministic():
    a, b = build_cases("rope.rotate.*"), build_cases("rope.rotate.*")
    for x, y in zip(a, b):
        for key in x.inputs:
            np.testing.assert_array_equal(x.inputs[key], y.inputs[key])


def test_far_cases_are_selectable(cases):
    far = select(list(cases.values()), "*@far")
    assert far and all(c.far for c in far)
    assert all(c.far for c in cases.values() if c.name.endswith("@far"))
    for c in far:
        pos = c.inputs.get("positions", c.inputs.get("query_positions"))
        assert pos.max() >= 100_000


def test_outputs_match_the_operation(cases):
    for case in cases.values():
        assert tuple(case.expected) == OUTPUTS[case.operation], case.name


def test_select_refuses_a_pattern_matching_nothing():
    with pytest.raises(PosEncError, match=r"cases 'nothing\*' match no case"):
        build_cases("nothing*")
    with pytest.raises(PosEncError, match=r"cases must be non-empty glob strings, got 3"):
        build_cases([3])  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("dtype", "far", "output", "angle"),
    [
        ("float64", False, 2.0**-53, 16 * 2.0**-53),
        ("float32", False, 2.0**-24, 16 * 2.0**-24),
        ("bfloat16", False, 2.0**-8, 16 * 2.0**-24),
        ("float16", False, 2.0**-11, 16 * 2.0**-24),
        ("float32", True, 2.0**-24, 16 * 2.0**-53),
        ("bfloat16", True, 2.0**-8, 16 * 2.0**-53),
    ],
)
def test_tolerance_model(dtype, far, output, angle):
    c = coefficients(dtype, far=far)
    assert (c["output"], c["angle"]) == (output, angle)
    compute = 2.0**-53 if dtype == "float64" else 2.0**-24
    assert c["arithmetic"] == 8 * compute


def test_tolerance_arrays_have_the_output_shape(cases):
    for case in cases.values():
        for key, expected in case.expected.items():
            for dtype in DTYPES:
                tol = case.tolerance(key, dtype)
                assert tol.shape == expected.shape and np.all(tol >= 0), case.name


def test_coefficients_refuse_an_unknown_dtype():
    with pytest.raises(PosEncError, match=r"dtype must be one of .*, got 'int8'"):
        coefficients("int8", far=False)
