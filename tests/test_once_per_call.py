"""One builder, one validation: a call of ``posenc.attention`` or a forward pass of
``TinyTransformer`` builds no encoding module and validates each position tensor once.

Counted with spies: every module built goes through ``Encoding.__init__``'s base
(``torch.nn.Module.__init__`` of an ``Encoding``), and every position tensor validated
goes through ``posenc._errors.check_positions`` -> ``check_finite`` (the host
synchronisation for floating positions)."""

from __future__ import annotations

import sys

import pytest
import torch

import posenc
from posenc import _errors, registry
from posenc._base import Encoding, GatedEncoding
from posenc.attend import prepared
from posenc.models import TinyTransformer
from posenc.rotary.kernels import backends

H, D, S = 4, 8, 6


@pytest.fixture
def builds(monkeypatch):
    """The encoding modules constructed while the fixture is active (their classes)."""
    built: list[type] = []
    original = torch.nn.Module.__init__

    def init(self, *args, **kwargs):
        if isinstance(self, Encoding):
            built.append(type(self))
        original(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "__init__", init)
    return built


@pytest.fixture
def validated(monkeypatch):
    """The tensors ``check_positions`` validated (identity), in call order."""
    seen: list[torch.Tensor] = []
    original = _errors.check_finite

    def check_finite(name, value):
        if "positions" in name:
            seen.append(value)
        original(name, value)

    monkeypatch.setattr(_errors, "check_finite", check_finite)
    return seen


def _times(seen: list[torch.Tensor], t: torch.Tensor) -> int:
    return sum(x is t for x in seen)


def _encodings() -> list[str]:
    return [n for n in registry.names() if registry.get(n).kind in ("rotary", "bias")]


def _positions_for(enc) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct float query / key positions (integer ones for Shaw and T5, whose tables need
    them)."""
    coords = getattr(enc, "position_coords", None)
    q = torch.arange(S, dtype=torch.float64) + 0.5
    k = torch.arange(S, dtype=torch.float64) + 0.5
    if getattr(enc, "name", "") in ("shaw", "t5"):  # tables indexed by integer distances
        q, k = torch.arange(S) + 2, torch.arange(S) + 2
    if coords is not None:
        q, k = q[:, None].repeat(1, coords), k[:, None].repeat(1, coords)
    return q, k.clone()


@pytest.mark.parametrize("name", _encodings())
def test_attention_with_an_instance_builds_nothing_and_validates_once(name, builds, validated):
    extra = {"sections": [2, 1, 1]} if name == "mrope" else {}
    fill = {"num_heads": H, "head_dim": D, "npos_max": 2 * S}
    enc = posenc.build(name, fill=fill, **extra)
    builds.clear()
    q, k, v = torch.randn(3, 2, H, S, D).unbind(0)
    qp, kp = _positions_for(enc)
    gates = torch.zeros(2, H, S) if isinstance(enc, GatedEncoding) else None  # FoX
    posenc.attention(
        q, k, v, encoding=enc, causal=True, q_positions=qp, k_positions=kp, gates=gates
    )
    assert builds == []
    assert (_times(validated, qp), _times(validated, kp)) == (1, 1)


def test_attention_by_name_builds_once_for_parameter_free_encodings(builds, monkeypatch):
    monkeypatch.setattr(prepared, "_BUILT", type(prepared._BUILT)())
    q, k, v = torch.randn(3, 1, H, S, D).unbind(0)
    for _ in range(3):
        posenc.attention(q, k, v, encoding="alibi", causal=True)
        posenc.attention(q, k, v, encoding={"name": "rope", "base": 500.0}, causal=True)
    assert [c.name for c in builds] == ["alibi", "rope"]
    # Learned biases from a name are built afresh (random parameters): pass an instance.
    builds.clear()
    posenc.attention(q, k, v, encoding="t5")
    posenc.attention(q, k, v, encoding="t5")
    assert [c.name for c in builds] == ["t5", "t5"]


def test_attention_by_name_validates_once(validated):
    q, k, v = torch.randn(3, 1, H, S, D).unbind(0)
    qp = torch.arange(S, dtype=torch.float32)
    posenc.attention(q, k, v, encoding="rope", q_positions=qp, k_positions=qp)
    assert _times(validated, qp) == 1


MODEL_ENCODINGS = [
    n for n in registry.names() if n not in ("mrope", "axial_rope")
]  # N-D positions are not token positions


@pytest.mark.parametrize("name", MODEL_ENCODINGS)
def test_tiny_transformer_forward_builds_nothing_and_validates_once(name, builds, validated):
    spec = {"name": name, "max_len": 32} if name == "learned" else name
    spec = {"name": name, "npos_max": 32} if name == "cope" else spec
    model = TinyTransformer(11, dim=H * D, num_heads=H, num_layers=3, encoding=spec).eval()
    builds.clear()
    tokens = torch.randint(0, 11, (2, S))
    float_ok = name not in ("learned", "shaw", "t5")  # tables indexed by integer positions
    positions = (torch.arange(S) + 3).to(torch.float32 if float_ok else torch.long)
    with torch.no_grad():
        model(tokens, positions)
    assert builds == []
    assert _times(validated, positions) == 1


# --- the common paths, counted -------------------------------------------------------


def _frames(call) -> list[tuple[str, str]]:
    """``(module, function)`` of every posenc function ``call()`` enters, in order
    (comprehensions and generator expressions left out: they are a function's own lines)."""
    seen: list[tuple[str, str]] = []

    def profile(frame, event, arg):
        if event == "call":
            module, name = frame.f_globals.get("__name__", ""), frame.f_code.co_name
            if module.startswith("posenc") and not name.startswith("<"):
                seen.append((module, name))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen


def _checks(frames: list[tuple[str, str]]) -> list[str]:
    return [name for _, name in frames if name.startswith("check")]


def _warm(call):
    for _ in range(2):  # built, the C library decided, every call shape planned
        call()
    return call


# (what is called, the most posenc functions it may enter, the most checks it may run):
# a call validates where it enters and trusts what it validated below. The rotary call
# through posenc.attention entered 86 functions at 07680e1, 35 of them validation. (The
# checks of q, k and v count twice: check_qkv and the check_tensor of each under it.)
_QKV = torch.randn(3, 1, H, S, D).unbind(0)
COMMON = {
    "attention-rope": (lambda: posenc.attention(*_QKV, encoding="rope", causal=True), 43, 7),
    "attention-alibi": (lambda: posenc.attention(*_QKV, encoding="alibi", causal=True), 43, 6),
    "attention-none": (lambda: posenc.attention(*_QKV, causal=True), 20, 6),
}


@pytest.mark.parametrize("name", list(COMMON))
def test_a_common_call_validates_at_its_door_and_trusts_below(name):
    call, most, most_checks = COMMON[name]
    if name == "attention-rope" and not backends.cpu_fast_path_enabled():
        pytest.skip("the fused CPU path is not built here (no C compiler)")
    frames = _frames(_warm(call))
    checks = _checks(frames)
    assert len(frames) <= most, f"{name} entered {len(frames)} functions: {frames}"
    assert len(checks) <= most_checks, f"{name} ran {len(checks)} checks: {checks}"


def test_the_module_call_checks_each_argument_once(monkeypatch):
    """``RotaryEmbedding(d)(q, k, positions)``, the call every model makes: a call shape
    planned once runs no check (fused path on, or off: the torch engine); a call no plan
    serves (float64) checks q, k and the positions at the door, once each."""
    rope = posenc.RotaryEmbedding(D)
    q, k, _ = _QKV
    positions = torch.arange(S)
    if backends.cpu_fast_path_enabled():
        frames = _frames(_warm(lambda: rope(q, k, positions)))
        assert len(frames) <= 12 and not _checks(frames), frames
    monkeypatch.setattr(backends, "_cpu_on", False)  # the fused path off, as with no compiler
    frames = _frames(_warm(lambda: rope(q, k, positions)))
    assert not _checks(frames), frames
    q64, k64 = q.double(), k.double()
    checks = _checks(_frames(_warm(lambda: rope(q64, k64, positions))))
    assert checks.count("check_qk") == 1 and checks.count("check_positions") == 1, checks
    assert len(checks) <= 14, checks
