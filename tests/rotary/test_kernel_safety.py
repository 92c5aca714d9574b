"""Bad inputs to the fused rotary entry points raise PosEncError (or give the right answer),
never crash: run with the CPU fast path on, in a child process, so a segfault fails
these tests instead of killing pytest.

The child (this file run as a script) runs every case of ``CASES`` and prints one JSON
line per case as soon as it is done; the parent asserts, case by case, that the child
exited with 0 and that each case printed its expected PosEncError (or ``"correct"``). A
case that kills the child (the first one without a line) fails with the exit code, and
a new child goes on from the case after it.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import posenc
from posenc import PosEncError
from posenc.rotary import kernels
from posenc.rotary.kernels import dispatch_rotary, fused_rotary, ops
from posenc.rotary.kernels.plain import apply_rotary_torch

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CC", "cc")) is None, reason="the CPU fast path needs a C compiler"
)

B, HQ, HK, S, D = 2, 4, 2, 5, 8
CORRECT = "correct"


def _tables(device="cpu"):
    cos, sin = posenc.rotary_cos_sin(torch.arange(S), posenc.rope_frequencies(D)[0])
    return cos.to(device), sin.to(device)


def _qk(device="cpu"):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, HQ, S, D, generator=gen).to(device)
    k = torch.randn(B, HK, S, D, generator=gen).to(device)
    return q, k


def _plain(x, cos, sin, seq_dim=-2):
    return apply_rotary_torch(x, cos, sin, seq_dim=seq_dim)


def _equal(actual, expected) -> str:
    """``"correct"`` when equal bit for bit (meta: same shape and device), else what differs."""
    if actual.device != expected.device or actual.shape != expected.shape:
        return f"wrong: {actual.device} {tuple(actual.shape)}"
    if actual.device.type == "meta" or torch.equal(actual, expected):
        return CORRECT
    return f"wrong: max difference {(actual - expected).abs().max().item()}"


def _all(*results: str) -> str:
    return next((r for r in results if r != CORRECT), CORRECT)


# --- devices: cos/sin, q or k on meta ---------------------------------------------------


def apply_cos_meta():
    return posenc.apply_rotary(_qk()[0], *_tables("meta"))


def apply_sin_meta():
    q, _ = _qk()
    cos, sin = _tables()
    return posenc.apply_rotary(q, cos, sin.to("meta"))


def apply_x_meta():
    return posenc.apply_rotary(_qk("meta")[0], *_tables())


def apply_all_meta():
    q, _ = _qk("meta")
    cos, sin = _tables("meta")
    return _equal(posenc.apply_rotary(q, cos, sin), torch.empty_like(q))


def module_k_meta():
    q, k = _qk()
    return posenc.RotaryEmbedding(D)(q, k.to("meta"))


def module_q_meta():
    q, k = _qk()
    return posenc.RotaryEmbedding(D)(q.to("meta"), k)


def module_k_meta_own_positions():
    q, k = _qk()
    positions = torch.arange(S)
    return posenc.RotaryEmbedding(D)(q, k.to("meta"), positions, k_positions=positions)


def module_rotation_meta():
    q, k = _qk()
    rope = posenc.RotaryEmbedding(D)
    return rope.rotate(q, k, rope.rotation(S, device="meta"))


def module_rotate_k_meta():
    q, k = _qk()
    rope = posenc.RotaryEmbedding(D)
    return rope.rotate(q, k.to("meta"), rope.rotation(S))


def module_all_meta():
    q, k = _qk("meta")
    q_out, k_out = posenc.RotaryEmbedding(D)(q, k)
    return _all(_equal(q_out, q), _equal(k_out, k))


def dispatch_cos_meta():
    q, k = _qk()
    return dispatch_rotary(q, k, *_tables("meta"))


def dispatch_k_meta():
    q, k = _qk()
    return dispatch_rotary(q, k.to("meta"), *_tables())


def dispatch_k_meta_other_dtype():
    q, k = _qk()
    return dispatch_rotary(q, k.to("meta", torch.float64), *_tables())


def fused_cos_meta_cpu():
    q, k = _qk()
    return fused_rotary(q, k, *_tables("meta"), backend="cpu")


def fused_k_meta():
    q, k = _qk()
    return fused_rotary(q, k.to("meta"), *_tables())


def fused_cos_meta_with_grad():  # the custom-op (autograd) path
    q, k = _qk()
    return fused_rotary(q.requires_grad_(), k, *_tables("meta"))


def fused_all_meta_cpu():
    q, k = _qk("meta")
    return fused_rotary(q, k, *_tables("meta"), backend="cpu")


def fused_all_meta_auto():
    q, k = _qk("meta")
    q_out, k_out = fused_rotary(q, k, *_tables("meta"))
    return _all(_equal(q_out, q), _equal(k_out, k))


def ops_rotary_op_cos_meta():
    return ops.rotary_op(_qk()[0], None, *_tables("meta"), False, False, -2, "cpu")


def ops_rotary_op_inplace_cos_meta():
    return ops.rotary_op_(_qk()[0], None, *_tables("meta"), False, False, -2, "cpu")


def _eager(q, k=None, cos=None, sin=None, *, inplace=False):
    """``ops.launch`` (what the eager calls take) on the CPU launcher, with the good
    cos/sin by default."""
    if cos is None:
        cos, sin = _tables()
    xs = [q] if k is None else [q, k]
    return ops.launch("cpu", xs, cos, sin, interleaved=False, seq_dim=-2, inplace=inplace)


def ops_rotate_eager_cos_meta():
    return _eager(_qk()[0], None, *_tables("meta"))


def ops_rotate_eager_all_meta():
    return _eager(*_qk("meta"), *_tables("meta"))


def triton_on_cpu_without_interpreter():
    return fused_rotary(*_qk(), *_tables(), backend="triton")


# --- dtypes and shapes reaching a launcher directly --------------------------------------


def ops_int_q():
    return _eager(torch.ones(B, HQ, S, D, dtype=torch.int32))


def ops_short_cos():
    cos, sin = _tables()
    return _eager(_qk()[0], None, cos[:2], sin[:2])


def ops_k_other_length():
    return _eager(_qk()[0], torch.randn(B, HK, S + 3, D))


def ops_k_other_dtype():
    q, k = _qk()
    return _eager(q, k.double())


def ops_cos_too_wide():
    cos = torch.ones(S, D)  # r = 2 D > D
    return _eager(_qk()[0], None, cos, cos)


# --- memory: in place on overlapping views, k sharing q ---------------------------------


def _expanded():
    return torch.randn(B, 1, S, D).expand(B, HQ, S, D)


def inplace_expanded(backend):
    return fused_rotary(_expanded(), None, *_tables(), inplace=True, backend=backend)


def inplace_expanded_k(backend):
    q, _ = _qk()
    return fused_rotary(q, _expanded(), *_tables(), inplace=True, backend=backend)


def inplace_k_is_q(backend):
    q, _ = _qk()
    return fused_rotary(q, q, *_tables(), inplace=True, backend=backend)


def inplace_k_view_of_q(backend):
    q, _ = _qk()
    return fused_rotary(q, q[:, 1:3], *_tables(), inplace=True, backend=backend)


def inplace_k_strided_into_q(backend):  # k: every other channel, half of them q's
    buffer = torch.randn(B, HQ, S, 2 * D)
    q, k = buffer[..., :D], buffer[..., 1 : 2 * D : 2]
    return fused_rotary(q, k, *_tables(), inplace=True, backend=backend)


def ops_rotate_eager_inplace_expanded():
    return _eager(_expanded(), inplace=True)


def ops_rotary_op_inplace_k_is_q():
    q, _ = _qk()
    return ops.rotary_op_(q, q, *_tables(), False, False, -2, "cpu")


def inplace_qkv_slices(backend, seq_dim):
    """q and k: slices of one fused qkv buffer (GQA head counts), rotated in place."""
    cos, sin = _tables()
    buffer = torch.randn(B, S, HQ + 2 * HK, D)  # [b, s, heads, d]
    q, k = buffer[:, :, :HQ], buffer[:, :, HQ : HQ + HK]
    if seq_dim == -2:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    expected = (_plain(q, cos, sin, seq_dim), _plain(k, cos, sin, seq_dim))
    v = buffer[:, :, HQ + HK :].clone()
    q_out, k_out = fused_rotary(q, k, cos, sin, seq_dim=seq_dim, inplace=True, backend=backend)
    return _all(
        _equal(q_out, expected[0]),
        _equal(k_out, expected[1]),
        _equal(buffer[:, :, HQ + HK :], v),  # v untouched
        CORRECT if q_out.data_ptr() == q.data_ptr() else "wrong: not in place",
    )


def inplace_qkv_per_head(backend):
    """GPT-NeoX packing: q, k, v side by side in each head's channels ``[b, s, h, 3 d]``."""
    cos, sin = _tables()
    buffer = torch.randn(B, S, HQ, 3 * D)
    q, k = buffer[..., :D], buffer[..., D : 2 * D]
    expected = (_plain(q, cos, sin, -3), _plain(k, cos, sin, -3))
    v = buffer[..., 2 * D :].clone()
    q_out, k_out = fused_rotary(q, k, cos, sin, seq_dim=-3, inplace=True, backend=backend)
    return _all(
        _equal(q_out, expected[0]), _equal(k_out, expected[1]), _equal(buffer[..., 2 * D :], v)
    )


def inplace_cos_in_q_buffer(backend):
    """cos/sin living in the same buffer as q (read while q is written): still correct."""
    cos, sin = _tables()
    half = cos.shape[-1]
    buffer = torch.randn(B, HQ, S, D + 2 * half)
    q = buffer[..., :D]
    buffer[0, 0, :, D : D + half] = cos
    buffer[0, 0, :, D + half :] = sin
    cos_view, sin_view = buffer[0, 0, :, D : D + half], buffer[0, 0, :, D + half :]
    expected = _plain(q, cos, sin)
    q_out, _ = fused_rotary(q, None, cos_view, sin_view, inplace=True, backend=backend)
    return _equal(q_out, expected)


def outofplace_k_is_q(backend):
    q, _ = _qk()
    cos, sin = _tables()
    q_out, k_out = fused_rotary(q, q, cos, sin, backend=backend)
    expected = _plain(q, cos, sin)
    return _all(_equal(q_out, expected), _equal(k_out, expected))


def outofplace_k_view_of_q(backend):
    q, _ = _qk()
    cos, sin = _tables()
    k = q[:, 1:3]
    q_out, k_out = fused_rotary(q, k, cos, sin, backend=backend)
    return _all(_equal(q_out, _plain(q, cos, sin)), _equal(k_out, _plain(k, cos, sin)))


def outofplace_expanded(backend):
    q = _expanded()
    cos, sin = _tables()
    q_out, k_out = fused_rotary(q, q[:, :2], cos, sin, backend=backend)
    return _all(_equal(q_out, _plain(q, cos, sin)), _equal(k_out, _plain(q[:, :2], cos, sin)))


DEVICE_RULE = "must be on"
OWN_MEMORY = "inplace=True needs q with every element in memory of its own"
OWN_MEMORY_K = "inplace=True needs k with every element in memory of its own"
K_IS_Q = "inplace=True needs k and q in separate memory (each would be rotated twice), got k is q"
K_OVERLAPS = "inplace=True needs k and q in separate memory (shared elements would be rotated"

# case id -> (function, expected: a PosEncError message fragment, or CORRECT)
CASES: dict[str, tuple[Callable[[], object], str]] = {
    "apply-cos-meta": (apply_cos_meta, "cos and sin must be on x's device cpu, got meta"),
    "apply-sin-meta": (apply_sin_meta, "cos and sin must be on x's device cpu, got meta"),
    "apply-x-meta": (apply_x_meta, "cos and sin must be on x's device meta, got cpu"),
    "apply-all-meta": (apply_all_meta, CORRECT),
    "module-k-meta": (module_k_meta, "k must be on q's device cpu, got meta"),
    "module-q-meta": (module_q_meta, "k must be on q's device meta, got cpu"),
    "module-k-meta-own-positions": (module_k_meta_own_positions, DEVICE_RULE),
    "module-rotation-meta": (module_rotation_meta, "device cpu, got meta"),
    "module-rotate-k-meta": (module_rotate_k_meta, DEVICE_RULE),
    "module-all-meta": (module_all_meta, CORRECT),
    "dispatch-cos-meta": (dispatch_cos_meta, "cos and sin must be on q's device cpu, got meta"),
    "dispatch-k-meta": (dispatch_k_meta, "k must be on q's device cpu, got meta"),
    "dispatch-k-meta-other-dtype": (dispatch_k_meta_other_dtype, "k must be on q's device cpu"),
    "fused-cos-meta-cpu": (fused_cos_meta_cpu, "cos and sin must be on q's device cpu, got meta"),
    "fused-k-meta": (fused_k_meta, "k must be on q's device cpu, got meta"),
    "fused-cos-meta-with-grad": (fused_cos_meta_with_grad, "cos and sin must be on q's device"),
    "fused-all-meta-cpu": (fused_all_meta_cpu, "backend='cpu' needs CPU tensors, got q on meta"),
    "fused-all-meta-auto": (fused_all_meta_auto, CORRECT),
    "ops-rotary-op-cos-meta": (ops_rotary_op_cos_meta, "cos and sin must be on q's device cpu"),
    "ops-rotary-op-inplace-cos-meta": (ops_rotary_op_inplace_cos_meta, "cos and sin must be on"),
    "ops-rotate-eager-cos-meta": (ops_rotate_eager_cos_meta, "cos and sin must be on q's device"),
    "ops-rotate-eager-all-meta": (ops_rotate_eager_all_meta, "needs CPU tensors, got q on meta"),
    "ops-int-q": (ops_int_q, "backend='cpu' supports float32, bfloat16, float16 and float64"),
    "ops-short-cos": (ops_short_cos, r"cos must be [s, r/2] or [b, s, r/2] with s == 5"),
    "ops-k-other-length": (ops_k_other_length, "k must have q's batch size, sequence length"),
    "ops-k-other-dtype": (ops_k_other_dtype, "k must have q's dtype torch.float32"),
    "ops-cos-too-wide": (ops_cos_too_wide, "must be <= q's last dimension 8, got 16"),
    "ops-rotate-eager-inplace-expanded": (ops_rotate_eager_inplace_expanded, OWN_MEMORY),
    "ops-rotary-op-inplace-k-is-q": (ops_rotary_op_inplace_k_is_q, K_IS_Q),
}
if importlib.util.find_spec("triton") is not None:
    CASES["triton-on-cpu"] = (triton_on_cpu_without_interpreter, "'triton' needs CUDA tensors")
for _backend in ("cpu", "torch", "auto"):
    _bind = functools.partial
    CASES |= {
        f"inplace-expanded-{_backend}": (_bind(inplace_expanded, _backend), OWN_MEMORY),
        f"inplace-expanded-k-{_backend}": (_bind(inplace_expanded_k, _backend), OWN_MEMORY_K),
        f"inplace-k-is-q-{_backend}": (_bind(inplace_k_is_q, _backend), K_IS_Q),
        f"inplace-k-view-of-q-{_backend}": (_bind(inplace_k_view_of_q, _backend), K_OVERLAPS),
        f"inplace-k-strided-into-q-{_backend}": (
            _bind(inplace_k_strided_into_q, _backend),
            K_OVERLAPS,
        ),
        f"inplace-qkv-bhsd-{_backend}": (_bind(inplace_qkv_slices, _backend, -2), CORRECT),
        f"inplace-qkv-bshd-{_backend}": (_bind(inplace_qkv_slices, _backend, -3), CORRECT),
        f"inplace-qkv-per-head-{_backend}": (_bind(inplace_qkv_per_head, _backend), CORRECT),
        f"inplace-cos-in-q-buffer-{_backend}": (_bind(inplace_cos_in_q_buffer, _backend), CORRECT),
        f"outofplace-k-is-q-{_backend}": (_bind(outofplace_k_is_q, _backend), CORRECT),
        f"outofplace-k-view-of-q-{_backend}": (_bind(outofplace_k_view_of_q, _backend), CORRECT),
        f"outofplace-expanded-{_backend}": (_bind(outofplace_expanded, _backend), CORRECT),
    }


def _run_case(fn: Callable[[], object]) -> dict[str, str]:
    try:
        result = fn()
    except PosEncError as err:
        return {"raised": "PosEncError", "message": str(err)}
    except Exception as err:  # reported to the parent, which fails the case
        return {"raised": type(err).__name__, "message": str(err)}
    if isinstance(result, str):
        return {"result": result}
    return {"result": f"returned without an error: {type(result).__name__}"}


def main(first: int = 0) -> None:
    """The child: fast path on, the cases from index ``first`` on, one JSON line each,
    flushed at once."""
    kernels.enable_cpu_fast_path(True)
    for case_id, (fn, _) in list(CASES.items())[first:]:
        print(json.dumps({"case": case_id, **_run_case(fn)}), flush=True)


@pytest.fixture(scope="module")
def child() -> dict[str, dict]:
    """Every case's record from child processes: one runs them all; if it dies, the
    case it died in is recorded with its exit code and a new child goes on after it."""
    env = {**os.environ, "POSENC_CPU_FAST_PATH": "1"}
    env.pop("TRITON_INTERPRET", None)
    ids = list(CASES)
    results: dict[str, dict] = {}
    while len(results) < len(ids):
        first = len(results)
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), str(first)],
            capture_output=True,
            text=True,
            env=env,
            cwd=Path(__file__).resolve().parents[2],
            timeout=300,
            check=False,
        )
        done = len(results) + sum(line.startswith("{") for line in proc.stdout.splitlines())
        # A child that died before the end died in the case after its last line.
        code = proc.returncode if done == len(ids) else 0
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                case_id = record.pop("case")
                results[case_id] = {**record, "exit_code": code}
        if proc.returncode != 0 and len(results) < len(ids):
            results[ids[len(results)]] = {
                "exit_code": proc.returncode,
                "stderr": proc.stderr[-2000:],
            }
        elif len(results) == first:
            raise RuntimeError(f"the child reported nothing:\n{proc.stderr[-2000:]}")
    return results


@pytest.mark.parametrize("case_id", list(CASES))
def test_bad_input_case(child, case_id):
    record = dict(child[case_id])
    assert "stderr" not in record, f"the child crashed in this case:\n{record}"
    assert record.pop("exit_code") == 0, f"the child exited with an error: {record}"
    expected = CASES[case_id][1]
    if expected == CORRECT:
        assert record == {"result": CORRECT}, record
    else:
        assert record.get("raised") == "PosEncError", record
        assert expected in record["message"], record


@pytest.mark.parametrize("backend", ["cpu", "triton"])
@pytest.mark.parametrize(
    "case,match",
    [
        ("k-is-q", K_IS_Q),
        ("expanded", OWN_MEMORY),
        ("k-view-of-q", K_OVERLAPS),
        ("meta", "needs C"),
        ("cos-meta", "cos and sin must be on q's device cpu, got meta"),
    ],
)
def test_check_launch_guards_every_launcher(monkeypatch, backend, case, match):
    """The launch checks are the launchers' (in process: they raise before any pointer)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # CPU tensors count as Triton's here
    q, _ = _qk()
    cos, sin = _tables()
    xs = {
        "k-is-q": [q, q],
        "expanded": [_expanded()],
        "k-view-of-q": [q, q[:, :1]],
        "meta": [q.to("meta")],
        "cos-meta": [q],
    }[case]
    if case == "meta":
        cos, sin = cos.to("meta"), sin.to("meta")
    if case == "cos-meta":
        cos = cos.to("meta")
    with pytest.raises(PosEncError, match=re.escape(match)):
        ops.check_launch(backend, xs, cos, sin, seq_dim=-2, inplace=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
