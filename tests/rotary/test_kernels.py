"""The fused CPU path and the public API of posenc.rotary.kernels.

The CPU loop (``rope_cpu.c``) against the plain torch twin (bit for bit) and the float64
reference, over odd head dims, partial rotary, GQA, strided views, per-token and packed
positions, every dtype and both layouts; in place; gradients; torch.compile; dispatch;
every bad input. The Triton kernel has the same checks in test_kernels_triton.py.
"""

from __future__ import annotations

import os
import shutil
import warnings

import pytest
import torch

import posenc
from posenc import PosEncError
from posenc.rotary import kernels
from posenc.rotary.kernels import backends, cpu, fused_rotary, select_backend
from posenc.rotary.kernels.plain import apply_rotary_torch

from ._kernel_cases import (
    LAYOUTS,
    SMALL_CASES,
    Case,
    check_compile_grads,
    check_forward,
    check_inplace,
    check_rounding_ties,
    make_inputs,
    matrix_tests,
    plain,
    poisoned_outputs,
)

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CC", "cc")) is None, reason="the CPU fast path needs a C compiler"
)


@pytest.fixture
def cpu_path():
    """The CPU fast path switched on for one test, and back to its previous state after."""
    previous = backends._cpu_on
    kernels.enable_cpu_fast_path(True)
    yield
    backends._cpu_on = previous


(
    test_cpu_matches_plain_and_reference,
    test_cpu_inplace_writes_only_rotated_channels,
    test_cpu_backward_equals_plain_autograd,
) = matrix_tests("cpu", SMALL_CASES, 3)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cpu_rows_split_over_threads(layout, threads):
    # Large enough to run in parallel; q and k rows are split across threads unevenly.
    case = Case(64, 48, 5, 3, 2, 301, layout, seq_dim=-3, positions="batched", view="transposed")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        check_forward(case, "cpu")
    finally:
        torch.set_num_threads(before)


def test_cpu_int64_offsets():
    # A view whose elements lie past 2^31 elements of its storage (virtual memory only:
    # pages that are never touched are never allocated).
    storage = torch.empty(2**31 + 2**16, dtype=torch.float16)
    x = storage.as_strided((1, 2, 3, 8), (0, 2**31, 8, 1))  # head 1 starts at 2^31
    x.copy_(torch.randn(1, 2, 3, 8, dtype=torch.float16))
    cos, sin = posenc.rotary_cos_sin(torch.arange(3), posenc.rope_frequencies(8)[0])
    with poisoned_outputs():
        out, _ = fused_rotary(x, None, cos, sin, backend="cpu")
    torch.testing.assert_close(out, apply_rotary_torch(x, cos, sin), atol=0, rtol=0)


def test_empty_inputs():
    q, k = torch.randn(2, 3, 0, 8), torch.randn(2, 1, 0, 8)
    cos, sin = torch.empty(0, 4), torch.empty(0, 4)
    q_out, k_out = fused_rotary(q, k, cos, sin, backend="cpu")
    assert q_out.shape == q.shape and k_out.shape == k.shape


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_gradcheck_float64(backend, layout):
    # double and second derivatives of the op (whose backward is the op itself)
    case = Case(6, 4, 2, 1, 1, 3, layout, torch.float64, positions="batched", view="sliced")
    _, _, cos, sin, _, (q_base, k_base) = make_inputs(case)
    q = q_base[1:, 1:-1, :-1, ::2].detach().requires_grad_()
    k = k_base[1:, 1:-1, :-1, ::2].detach().requires_grad_()

    def f(q, k):
        return fused_rotary(q, k, cos, sin, layout=layout, backend=backend)

    assert torch.autograd.gradcheck(f, (q, k))
    assert torch.autograd.gradgradcheck(f, (q, k))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_compile_fullgraph(cpu_path, layout):
    torch._dynamo.reset()
    case = Case(
        head_dim=16, rotary_dim=12, hq=4, hk=2, batch=2, seq=5, layout=layout, positions="batched"
    )
    q, k, cos, sin, _, _ = make_inputs(case)

    def f(q, k):
        q_out, k_out = fused_rotary(q * 2, k, cos, sin, layout=layout)
        return q_out.sum() + k_out.square().sum()

    check_compile_grads(f, q, k, backend="aot_eager")


def test_inplace_with_grad_is_refused():
    q, k, cos, sin, _, _ = make_inputs(Case(8, 8, 2, 1, 1, 3))
    with pytest.raises(PosEncError, match="inplace=True cannot be used on tensors that require"):
        fused_rotary(q.requires_grad_(), k, cos, sin, inplace=True, backend="cpu")


def test_torch_backend_inplace():
    case = Case(10, 6, 2, 1, 2, 3, layout="interleaved", view="sliced")
    check_inplace(case, "torch")


# --- dispatch ----------------------------------------------------------------------------


def test_select_backend(cpu_path):
    x, cos = torch.randn(1, 2, 3, 8), torch.randn(3, 4)
    assert select_backend(x, cos, cos) == "cpu"
    assert select_backend(x.to("meta"), cos.to("meta"), cos.to("meta")) == "torch"
    assert select_backend(x, cos.requires_grad_(), cos) == "torch"  # kernels skip cos grads
    kernels.enable_cpu_fast_path(False)
    assert select_backend(x, cos.detach(), cos.detach()) == "torch"
    assert not kernels.cpu_fast_path_enabled()


def test_auto_uses_the_cpu_path_when_enabled(cpu_path, monkeypatch):
    q, k, cos, sin, _, _ = make_inputs(Case(8, 8, 2, 1, 1, 3))
    calls = []
    original = cpu.launch_cpu
    monkeypatch.setattr(cpu, "launch_cpu", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    q_out, _ = fused_rotary(q, k, cos, sin)
    assert calls == [1]
    torch.testing.assert_close(q_out, apply_rotary_torch(q, cos, sin), atol=0, rtol=0)


def test_env_var_turns_the_cpu_path_on(monkeypatch):
    monkeypatch.setattr(backends, "_cpu_on", None)
    monkeypatch.setenv("POSENC_CPU_FAST_PATH", "1")
    assert kernels.cpu_fast_path_enabled()


def test_env_var_with_a_failing_build_warns_and_keeps_plain(monkeypatch):
    monkeypatch.setattr(backends, "_cpu_on", None)
    monkeypatch.setenv("POSENC_CPU_FAST_PATH", "1")

    def broken():
        raise RuntimeError("no compiler")

    monkeypatch.setattr(cpu, "load", broken)
    with pytest.warns(RuntimeWarning, match="no compiler; using the plain torch path"):
        assert not kernels.cpu_fast_path_enabled()


def test_build_is_cached_and_reports_compiler_errors(tmp_path, monkeypatch):
    first = cpu.build()
    assert cpu.build() == first and first.exists()  # cached: no second compile
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler-posenc")
    with pytest.raises(RuntimeError, match="'no-such-compiler-posenc' was not found"):
        cpu.build()


def test_unwritable_cache_dir_falls_back_to_a_temporary_one(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("POSENC_CACHE_DIR", str(blocker / "cache"))
    built = cpu.build()
    assert built.exists() and blocker not in built.parents
    assert built.name == cpu.build().name


def test_enable_triton_without_triton_raises(monkeypatch):
    monkeypatch.setattr(backends.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match=r"pip install 'posenc\[triton\]'"):
        kernels.enable_triton(True)


# --- bad input -----------------------------------------------------------------------------


def _good():
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)
    cos, sin = posenc.rotary_cos_sin(torch.arange(5), posenc.rope_frequencies(6)[0])
    return {"q": q, "k": k, "cos": cos, "sin": sin}


BAD = [
    ("q-not-tensor", {"q": [1.0]}, "q must be a torch.Tensor, got list"),
    ("q-int", {"q": torch.ones(2, 4, 5, 8, dtype=torch.long)}, "q must have a floating-point"),
    ("q-3d", {"q": torch.randn(4, 5, 8)}, r"q must be \[b, h, s, d\]"),
    ("k-int", {"k": torch.ones(2, 2, 5, 8, dtype=torch.int32)}, "k must have a floating-point"),
    ("k-seq", {"k": torch.randn(2, 2, 4, 8)}, "k must have q's batch size, sequence length"),
    ("k-batch", {"k": torch.randn(1, 2, 5, 8)}, "k must have q's batch size"),
    (
        "k-dim",
        {"k": torch.randn(2, 2, 5, 10)},
        "k must have q's batch size, sequence length and head dim",
    ),
    ("k-dtype", {"k": torch.randn(2, 2, 5, 8, dtype=torch.float64)}, "k must have q's dtype"),
    ("cos-seq", {"cos": torch.randn(4, 3), "sin": torch.randn(4, 3)}, r"cos must be \[s, r/2\]"),
    ("cos-sin-shape", {"sin": torch.randn(5, 2)}, "cos and sin must have the same shape"),
    ("cos-batch", {"cos": torch.randn(3, 5, 3), "sin": torch.randn(3, 5, 3)}, "must have b == 2"),
    (
        "rotary-too-big",
        {"cos": torch.randn(5, 5), "sin": torch.randn(5, 5)},
        "rotary_dim must be <= q's last dimension 8, got 10",
    ),
]


@pytest.mark.parametrize("change,match", [pytest.param(c, m, id=i) for i, c, m in BAD])
def test_bad_tensors(change, match):
    args = {**_good(), **change}
    with pytest.raises(PosEncError, match=match):
        fused_rotary(args["q"], args["k"], args["cos"], args["sin"])


BAD_OPTIONS = [
    ("layout", {"layout": "neox"}, "layout must be one of 'half', 'interleaved', got 'neox'"),
    ("seq_dim", {"seq_dim": 1}, "seq_dim must be one of -2, -3, got 1"),
    ("backend", {"backend": "cuda"}, "backend must be one of 'auto', 'triton', 'cpu', 'torch'"),
    ("rotary_dim", {"rotary_dim": 4}, r"rotary_dim must equal 2 \* cos.shape\[-1\] = 6, got 4"),
    ("rotary_dim-type", {"rotary_dim": 6.0}, "rotary_dim must be an integer, got 6.0"),
    ("inplace", {"inplace": 1}, "inplace must be a bool, got 1"),
]


@pytest.mark.parametrize("options,match", [pytest.param(o, m, id=i) for i, o, m in BAD_OPTIONS])
def test_bad_options(options, match):
    args = _good()
    with pytest.raises(PosEncError, match=match):
        fused_rotary(args["q"], args["k"], args["cos"], args["sin"], **options)


def test_kernel_backend_refuses_cos_with_grad():
    args = _good()
    with pytest.raises(PosEncError, match="does not differentiate through cos/sin"):
        fused_rotary(args["q"], None, args["cos"].requires_grad_(), args["sin"], backend="cpu")


def test_kernel_backend_refuses_other_dtypes():
    q = torch.randn(1, 1, 2, 4).to(torch.float8_e4m3fn)
    cos = torch.randn(2, 2)
    with pytest.raises(PosEncError, match="backend='cpu' supports float32, bfloat16"):
        fused_rotary(q, None, cos, cos, backend="cpu")


def test_cos_on_another_device_is_refused():
    args = _good()
    with pytest.raises(PosEncError, match="cos and sin must be on q's device cpu, got meta"):
        fused_rotary(args["q"], None, args["cos"].to("meta"), args["sin"].to("meta"))


def test_plain_fallback_matches_when_cos_needs_grad():
    case = Case(8, 8, 2, 1, 1, 3, positions="batched")
    q, k, cos, sin, _, _ = make_inputs(case)
    cos = cos.clone().requires_grad_()
    q_out, _ = fused_rotary(q, k, cos, sin)  # auto: the plain path, which differentiates cos
    q_out.sum().backward()
    assert cos.grad is not None and cos.grad.shape == cos.shape
    torch.testing.assert_close(q_out, plain(case, q, cos, sin), atol=0, rtol=0)


def test_no_warnings_on_the_fast_path(cpu_path):
    q, k, cos, sin, _, _ = make_inputs(Case(8, 8, 2, 1, 1, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fused_rotary(q, k, cos, sin)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_cpu_rounds_ties_to_even(dtype):
    check_rounding_ties("cpu", dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("half", [8, 24, 37])
def test_cpu_special_values_match_plain_bit_for_bit(cpu_path, layout, dtype, half):
    """NaN, infinities, signed zeros, subnormals and values whose products overflow give
    the plain path's bits exactly, in the vector steps and the scalar tail alike (NaN
    where it has NaN: torch itself writes different NaN payloads in its vector and scalar
    conversions)."""
    info = torch.finfo(dtype)
    specials = torch.tensor(
        [
            float("nan"),
            float("inf"),
            -float("inf"),
            0.0,
            -0.0,
            info.tiny / 4,
            -info.tiny / 2,
            info.max,
            -info.max,
            info.max / 2,
            1.0,
            -3.5,
        ],
        dtype=torch.float64,
    )
    gen = torch.Generator().manual_seed(half)
    d = 2 * half + 2  # two pass-through channels
    index = torch.randint(0, specials.numel(), (2, 3, 5, d), generator=gen)
    x = specials[index].to(dtype)  # [b, h, s, d]
    angles = torch.rand(5, half, generator=gen, dtype=torch.float64) * 6.3
    cos, sin = angles.cos().float(), angles.sin().float()
    cos[0, 0], sin[1, 1] = 1.0, float("inf")  # an infinite sin makes NaN from zero inputs
    expected = apply_rotary_torch(x, cos, sin, layout=layout)
    out, _ = fused_rotary(x, None, cos, sin, layout=layout, backend="cpu")
    bits = torch.int16 if dtype != torch.float32 else torch.int32
    nan = expected.isnan()
    assert nan.any() and torch.equal(out.isnan(), nan)
    assert torch.equal(out.view(bits)[~nan], expected.view(bits)[~nan])
