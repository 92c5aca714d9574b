"""The real non-torch implementations through posenc.conformance: the seed's TensorFlow
``positional_encoding``, the TensorFlow tutorial's concatenated one, Flax examples'
``sinusoidal_init`` (fetched source) and keras-hub on JAX.

Runs without torch: ``bash .ci/frameworks`` (a fresh venv), or in one that has the
frameworks: ``KERAS_BACKEND=jax python -m pytest -q -p no:cacheprovider --noconftest
tests/conformance/test_frameworks.py`` (``--noconftest``: tests/conftest.py imports torch).
Each outcome below was measured (keras-hub 0.32.0, Keras 3.15.1, JAX 0.10.2, TensorFlow
2.21.0), then asserted.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(__file__))

from _framework_peers import AND_FLOAT32, FLOAT32_ANGLES, expect, named

from posenc import reference
from posenc.conformance import check

# --- TensorFlow: the seed and the tutorial ---------------------------------------------------


def test_the_peers_rows_equal_the_unmodified_tables():
    """The adapters evaluate the published arithmetic at given positions: the same rows as
    the functions themselves over ``arange(length)``."""
    pytest.importorskip("tensorflow")
    import _framework_peers as P

    pos = np.arange(300)
    for dim in (64, 33):
        full = np.asarray(P.seed_positional_encoding(300, dim))[0]
        np.testing.assert_array_equal(P._seed_rows(pos, dim, base=10000.0), full)
    full = np.asarray(P.tutorial_positional_encoding(300, 64))
    np.testing.assert_array_equal(P._tutorial_rows(pos, 64, base=10000.0), full)
    pytest.importorskip("jax")
    for dim in (64, 33):
        full = np.asarray(P.flax_sinusoidal_init(300)(None, (1, 300, dim)))[0]
        np.testing.assert_array_equal(P._flax_rows(pos, dim, base=10000.0), full)


def test_seed_positional_encoding_conforms_everywhere():
    """float64 NumPy angles, one float32 rounding: interleaved, near and far, odd dim too."""
    pytest.importorskip("tensorflow")
    import _framework_peers as P

    report = check(P.seed_adapter())
    expect(report, [("sinusoidal.interleaved.*", "pass")])
    assert len(report) == 6 and max(r.max_error for r in report) < 3e-8


def test_tf_tutorial_concatenated_conforms_to_half_but_odd_depth_adds_a_channel():
    pytest.importorskip("tensorflow")
    import _framework_peers as P

    report = check(P.tutorial_adapter())
    expect(report, [("sinusoidal.half.d33@*", "fail"), ("sinusoidal.half.*", "pass")])
    for r in report.failures:  # depth / 2 = 16.5: np.arange(16.5) has 17 rates, 34 channels
        assert "table must have shape" in r.detail and "34]" in r.detail, r.detail
    odd = "odd depth: ceil(33/2) = 17 rates, a sin and a cos each, 34 channels"
    named(report, [("*", f"{odd} (the first 33 are the convention's)")])
    assert max(r.max_error for r in report if r.status == "pass") < 3e-8


def test_flax_sinusoidal_init_equals_layout_flax():
    """Fetched source (google/flax examples): parity with posenc's layout="flax"."""
    pytest.importorskip("jax")
    import _framework_peers as P

    report = check(P.flax_adapter())
    expect(report, [("sinusoidal.flax.*", "pass")])
    assert len(report) == 6 and max(r.max_error for r in report) < 3e-8
    # and the d = 2 rule: Flax divides by d // 2 - 1 = 0 (NaN), posenc refuses
    with np.errstate(divide="ignore", invalid="ignore"):
        assert np.isnan(P._flax_rows(np.arange(3), 2, base=10000.0)[1:]).any()
    with pytest.raises(ValueError, match="dim must be >= 4 for layout='flax'"):
        reference.sinusoidal_table(np.arange(3), 2, layout="flax")


# --- keras-hub on JAX ------------------------------------------------------------------------


#: The scalings keras-hub's RotaryEmbedding cannot express: skipped.
UNSCALED = [
    (f"rope.rotate.half.{kind}.*", "skip") for kind in ("longrope", "llama3", "proportional")
]


def _keras_hub():
    pytest.importorskip("keras_hub")
    from posenc.conformance import adapters

    return adapters


def test_keras_hub_sine_position_encoding_float32_fails_only_far():
    """float32 positions and angles: within float32's angle tolerance near, 2e-2 off far."""
    a = _keras_hub()
    report = check(a.keras_hub_sine_position_encoding("float32"))
    expect(report, [("*@far", "fail"), ("*@near", "pass")])
    far = {r.case: r.max_error for r in report.failures}
    assert all(1e-2 < e < 5e-2 for e in far.values()), far
    named(report, [("*", FLOAT32_ANGLES)])


def test_keras_hub_sine_position_encoding_bfloat16_collapses_positions():
    """Positions, rates and angles formed in bfloat16: 257 becomes 256, so whole rows are
    wrong near too (and far, 100001 becomes 99840, as 100000 does)."""
    a = _keras_hub()
    report = check(a.keras_hub_sine_position_encoding("bfloat16"))
    expect(report, [("*", "fail")])
    assert min(r.max_error for r in report) > 0.3
    words = "positions, rates and angles rounded in bf16 before the sin and cos: positions "
    named(
        report,
        [
            ("*@near", words + "256 and 257 give equal rows"),
            ("*@far", words + "100000 and 100001 give equal rows"),
        ],
    )


def test_keras_hub_rotary_embedding_float32():
    """Halves, float32 angles: default, linear and YaRN conform near; ntk and dynamic are
    one factor for every frequency (about 10 off); every far case fails."""
    a = _keras_hub()
    report = check(a.keras_hub_rotary_embedding("float32"))
    expect(
        report,
        [
            *UNSCALED,
            ("rope.rotate.half.ntk.*", "fail"),
            ("rope.rotate.half.dynamic.*", "fail"),
            ("*@far", "fail"),
            ("*@near", "pass"),
        ],
    )
    uniform = [r.max_error for r in report.failures if ".ntk." in r.case or ".dynamic." in r.case]
    assert min(uniform) > 1.0
    named(
        report,
        [
            ("*.ntk.*@near", _uniform("ntk")),
            ("*.ntk.*@far", _uniform("ntk") + AND_FLOAT32),
            ("*.dynamic.*@near", _uniform("dynamic")),
            ("*.dynamic.*@far", _uniform("dynamic") + AND_FLOAT32),
            ("*", FLOAT32_ANGLES),
        ],
    )


#: keras-hub's ``dynamic`` divides every frequency by ``factor^(d / (d - 2))``, measured.
def _uniform(kind: str) -> str:
    return f"`{kind}` is a uniform factor, not NTK: every frequency divided by 4.183 = 4^(64/62)"


def test_keras_hub_rotary_embedding_bfloat16_fails_everywhere():
    """cos and sin cast to bfloat16 before the multiply: every case it runs fails."""
    a = _keras_hub()
    report = check(a.keras_hub_rotary_embedding("bfloat16"))
    expect(
        report,
        [
            *UNSCALED,
            ("*", "fail"),
        ],
    )
    cos_sin = "cos and sin rounded to bf16 before the rotation, computed in bf16"
    named(
        report,
        [
            ("*.ntk.*@near", f"{_uniform('ntk')}, and {cos_sin}"),
            ("*.ntk.*@far", f"{_uniform('ntk')}, and {cos_sin}{AND_FLOAT32}"),
            ("*.dynamic.*@near", f"{_uniform('dynamic')}, and {cos_sin}"),
            ("*.dynamic.*@far", f"{_uniform('dynamic')}, and {cos_sin}{AND_FLOAT32}"),
            ("*@near", cos_sin),
            ("*@far", cos_sin + AND_FLOAT32),
        ],
    )


def test_keras_hub_bad_dtype_is_refused_by_name():
    a = _keras_hub()
    from posenc._errors import PosEncError

    with pytest.raises(PosEncError, match="dtype must be one of 'float32', 'bfloat16', 'float16'"):
        a.keras_hub_rotary_embedding("int8")
