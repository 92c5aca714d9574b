"""rotary-embedding-torch and x-transformers, run for real through posenc.conformance (the
main venv has torch; each test skips without its package). Outcomes measured
(rotary-embedding-torch 0.9.1, x-transformers 2.31.10, torch 2.13 CPU), then asserted."""

from __future__ import annotations

import pytest

from posenc.conformance import check

from ._framework_peers import AND_FLOAT32, FLOAT32_ANGLES, expect, named

UNSCALED = ["*.dynamic.*", "*.yarn.*", "*.longrope.*", "*.llama3.*", "*.proportional.*"]
SWAP = "pairs adjacent channels where the convention pairs halves"
PACKAGES = ["rotary_embedding_torch", "x_transformers"]


def _adapter(package: str, kind: str, *args, **kwargs):
    """``posenc.conformance.adapters.<package>_<kind>(*args, **kwargs)``; skipped without
    ``package``."""
    pytest.importorskip(package)
    from posenc.conformance import adapters

    return getattr(adapters, f"{package}_{kind}")(*args, **kwargs)


@pytest.mark.parametrize("package", PACKAGES)
def test_rope_interleaved_conforms_near_and_fails_far_in_float32_angles(package):
    report = check(_adapter(package, "rope", "float32"))
    expect(report, [*[(g, "skip") for g in UNSCALED], ("*@far", "fail"), ("*@near", "pass")])
    assert report.counts() == {"pass": 5, "fail": 5, "skip": 12}
    named(report, [("*", FLOAT32_ANGLES)])


@pytest.mark.parametrize("package", PACKAGES)
def test_rope_without_a_layout_claim_fails_every_halves_case_named(package):
    """Both pair adjacent channels only: on the halves cases they fail, named so (far, with
    their float32 angles too)."""
    report = check(_adapter(package, "rope", "float32", layout=None))
    expect(
        report,
        [
            *[(g, "skip") for g in UNSCALED],
            ("rope.rotate.half.*", "fail"),
            ("*@far", "fail"),
            ("*@near", "pass"),
        ],
    )
    named(
        report,
        [
            ("rope.rotate.half.*@near", SWAP),
            ("rope.rotate.half.*@far", SWAP + AND_FLOAT32),
            ("*", FLOAT32_ANGLES),
        ],
    )


@pytest.mark.parametrize("package", PACKAGES)
def test_xpos_fails_the_halves_uncentred_case(package):
    """Both pair adjacent channels and centre the xPos scale on the sequence's middle."""
    report = check(_adapter(package, "xpos", "float32"))
    expect(report, [("xpos.rotate.half.d64@near", "fail")])
    centred = "the xPos scale centred on the middle of the sequence: zeta^((p - 2048) / 512)"
    named(report, [("*", f"{SWAP}, and {centred} where the convention has zeta^(p / 512)")])


def test_x_transformers_sinusoidal_alibi_t5():
    pytest.importorskip("x_transformers")
    from posenc.conformance import adapters

    report = check(adapters.x_transformers_sinusoidal())
    expect(report, [("*.d33@*", "skip"), ("*@far", "fail"), ("*@near", "pass")])
    named(report, [("*", FLOAT32_ANGLES)])
    expect(check(adapters.x_transformers_alibi()), [("alibi.symmetric.*", "pass")])
    t5 = check(adapters.x_transformers_t5())
    expect(t5, [("t5.*", "pass")])
    assert len(t5) == 8 and max(r.max_error for r in t5) == 0.0


def test_rotary_embedding_torch_bfloat16_rounds_its_positions():
    """It forms the positions in the dtype of the tensor it rotates: in bfloat16, 257 is 256
    (and 100001 is 99840, as 100000 is)."""
    pytest.importorskip("rotary_embedding_torch")
    from posenc.conformance import adapters

    report = check(adapters.rotary_embedding_torch_rope("bfloat16"))
    expect(report, [*[(g, "skip") for g in UNSCALED], ("*", "fail")])
    words = "positions rounded in bf16 before the rotation: positions "
    named(
        report,
        [
            ("*@near", words + "256 and 257 give equal rows"),
            ("*@far", words + "100000 and 100001 give equal rows" + AND_FLOAT32),
        ],
    )
