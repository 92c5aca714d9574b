"""What 0.1.0 wrote still works: saved rotary configs upgrade and rebuild to the saved
outputs, and the renamed keyword ``positions=`` still rotates, with a DeprecationWarning."""

import json
import warnings
from pathlib import Path

import pytest
import torch

import posenc
from posenc import PosEncError, RotaryEmbedding, XPosEmbedding
from posenc import reference as ref
from posenc.registry import get

SAVED = json.loads((Path(__file__).parents[1] / "data" / "configs_0_1_0.json").read_text())
ROTARY = [
    (config, output)
    for config, output in zip(SAVED["configs"], SAVED["outputs"])
    if get(config["name"]).kind == "rotary"
]


def _case_id(case):
    config = case[0]
    scaling = (config.get("scaling") or {}).get("type")
    extra = "-xpos" if config.get("xpos_scale_base") is not None else ""
    return f"{config['name']}-{config.get('layout')}" + (f"-{scaling}" if scaling else "") + extra


def _inputs():
    """As the file's "inputs" note says: q, k (and x) drawn in that order from seed 0."""
    gen = torch.Generator().manual_seed(SAVED["inputs"]["seed"])
    q = torch.randn(*SAVED["inputs"]["q"], generator=gen)
    k = torch.randn(*SAVED["inputs"]["k"], generator=gen)
    return q, k


def _positions(name, s):
    p = torch.arange(s)
    if name == "mrope":
        return torch.stack([p, 2 * p, p % 2], dim=-1)  # [s, 3]
    if name == "axial_rope":
        return torch.stack([p, p % 2], dim=-1)  # [s, 2]
    return None


def test_the_saved_file_has_every_rotary_variant():
    names = {c["name"] for c, _ in ROTARY}
    assert names == {"rope", "xpos", "mrope", "axial_rope"}
    assert any(c.get("xpos_scale_base") is not None for c, _ in ROTARY)


@pytest.mark.parametrize("case", ROTARY, ids=_case_id)
def test_upgrade_config(case):
    config = case[0]
    args = {k: v for k, v in config.items() if k != "name"}
    cls = get(config["name"])
    name, upgraded = cls.upgrade_config(dict(args))
    assert "xpos_scale_base" not in upgraded
    if config["name"] == "mrope":  # M-RoPE's one spelling: "rope" with sections
        assert (name, upgraded) == ("rope", args)
    elif config["name"] != "rope":  # nothing of theirs was renamed
        assert (name, upgraded) == (config["name"], args)
    elif args["xpos_scale_base"] is None:
        assert (name, upgraded) == (
            "rope",
            {k: v for k, v in args.items() if k != "xpos_scale_base"},
        )
    else:
        want = {k: v for k, v in args.items() if k not in ("xpos_scale_base", "sections")}
        assert (name, upgraded) == ("xpos", {"scale_base": args["xpos_scale_base"], **want})
    assert args == {k: v for k, v in config.items() if k != "name"}  # the input is not changed


@pytest.mark.parametrize("case", ROTARY, ids=_case_id)
def test_saved_config_builds_to_the_saved_output(case):
    config, output = case
    enc = posenc.registry.build(config)
    name, _ = get(config["name"]).upgrade_config(dict(config))
    assert enc.name == name
    assert "xpos_scale_base" not in enc.to_config()
    q, k = _inputs()
    q_rot, k_rot = enc(q, k, _positions(config["name"], q.shape[-2]))
    got = torch.cat([q_rot, k_rot], dim=-1)  # how the file stores them: [b, h, s, 2d]
    torch.testing.assert_close(got, torch.tensor(output), atol=0, rtol=0)
    assert posenc.build(enc.to_config()).to_config() == enc.to_config()


def test_xpos_with_scaling_upgrades():
    """0.1.0 let xpos_scale_base sit beside a scaling: the upgrade keeps both."""
    saved = {
        "name": "rope",
        "head_dim": 8,
        "base": 10000.0,
        "rotary_dim": None,
        "layout": "interleaved",
        "scaling": {"factor": 2.0, "type": "linear"},
        "sections": None,
        "xpos_scale_base": 64.0,
    }
    enc = posenc.build(saved)
    assert isinstance(enc, XPosEmbedding) and enc.scale_base == 64.0
    assert enc.scaling is not None and enc.scaling.factor == 2.0
    q, k = torch.randn(2, 1, 2, 5, 8, dtype=torch.float64).unbind(0)
    pos = torch.arange(5) + 7
    q_out, k_out = enc(q, k, pos)
    inv_freq, _ = ref.rope_frequencies(8, scaling={"type": "linear", "factor": 2.0})
    eq, ek = ref.rotary_qk(
        q.numpy(),
        k.numpy(),
        pos.numpy(),
        pos.numpy(),
        inv_freq,
        layout="interleaved",
        xpos_scale_base=64.0,
    )
    torch.testing.assert_close(q_out, torch.from_numpy(eq), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(k_out, torch.from_numpy(ek), atol=1e-10, rtol=1e-10)


def test_rope_no_longer_takes_xpos_scale_base():
    with pytest.raises(TypeError):
        RotaryEmbedding(8, xpos_scale_base=64.0)
    assert not hasattr(RotaryEmbedding(8), "xpos_scale_base")


# --- the keyword positions= (0.1.0) is q_positions= ----------------------------------------

_ENCODINGS = {
    "rope": lambda: RotaryEmbedding(8),
    "xpos": lambda: XPosEmbedding(8, scale_base=64.0),
    "mrope": lambda: RotaryEmbedding(8, sections=(1, 1, 2)),
    "axial_rope": lambda: posenc.AxialRotaryEmbedding(8, 2),
}


def _q_positions(name):
    return _positions(name, 5) if name in ("mrope", "axial_rope") else torch.arange(5) + 3


@pytest.mark.parametrize("name", _ENCODINGS)
def test_positions_keyword_warns_and_equals_q_positions(name):
    enc = _ENCODINGS[name]()
    q, k = torch.randn(2, 1, 2, 5, 8).unbind(0)
    pos = _q_positions(name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new spellings do not warn
        want = enc(q, k, q_positions=pos)
        want_rot = enc.rotation(5, q_positions=pos)
        assert all(torch.equal(a, b) for a, b in zip(enc(q, k, pos), want))  # positional
    with pytest.warns(DeprecationWarning, match="positions= is renamed q_positions="):
        got = enc(q, k, positions=pos)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    with pytest.warns(DeprecationWarning, match="positions= is renamed q_positions="):
        got_rot = enc.rotation(5, positions=pos)
    assert all(torch.equal(a, b) for a, b in zip(got_rot, want_rot))


def test_positions_keyword_warning_points_at_the_caller():
    q, rope = torch.randn(1, 1, 3, 8), RotaryEmbedding(8)
    with pytest.warns(DeprecationWarning) as record:
        rope(q, q, positions=torch.arange(3))
        rope.rotation(3, positions=torch.arange(3))
    assert [w.filename for w in record] == [__file__, __file__]


@pytest.mark.parametrize(
    "call",
    [
        lambda e, q, p: e(q, q, p, positions=p),
        lambda e, q, p: e(q, q, q_positions=p, positions=p),
        lambda e, q, p: e.rotation(3, q_positions=p, positions=p),
    ],
    ids=["forward-positional", "forward-keyword", "rotation"],
)
def test_positions_and_q_positions_together_raise(call):
    q, p = torch.randn(1, 1, 3, 8), torch.arange(3)
    with pytest.raises(PosEncError, match="q_positions and positions"):
        call(RotaryEmbedding(8), q, p)


def test_errors_name_q_positions():
    q = torch.randn(1, 1, 3, 8)
    with pytest.raises(PosEncError, match=r"^q_positions must have length 3"):
        RotaryEmbedding(8)(q, q, torch.arange(4), k_positions=torch.arange(3))
    with pytest.raises(PosEncError, match="lengths differ and q_positions is given"):
        RotaryEmbedding(8)(q, torch.randn(1, 1, 5, 8), torch.arange(3))
