"""``benchmarks/_reference_shims``: the CPU stand-ins for flash-attn that the reference
implementations import (``benchmarks/remap_reference.py``), checked against a plain softmax
written from flash-attn's documented rule: query ``i`` sees key ``j`` iff
``i + sk - sq - left <= j <= i + sk - sq + right`` (``-1``: unbounded; causal: ``right = 0``),
a row that sees no key gives 0 and ``lse = +inf``."""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

SHIMS = Path(__file__).resolve().parents[2] / "benchmarks" / "_reference_shims"
NAMES = ("flash_attn", "flash_attn.losses", "flash_attn.losses.cross_entropy", "flash_attn_2_cuda")


@pytest.fixture(scope="module")
def shims() -> Iterator[SimpleNamespace]:
    """The shims imported by their real names, then taken out of ``sys.modules`` and
    ``sys.path`` again (the module objects stay usable)."""
    if any(name in sys.modules for name in NAMES):
        pytest.skip("a real flash_attn is imported in this process")
    sys.path.insert(0, str(SHIMS))
    try:
        modules = {name: importlib.import_module(name) for name in NAMES}
    finally:
        sys.path.remove(str(SHIMS))
        for name in NAMES:
            sys.modules.pop(name, None)
    yield SimpleNamespace(
        flash=modules["flash_attn"],
        cuda=modules["flash_attn_2_cuda"],
        losses=modules["flash_attn.losses.cross_entropy"],
    )


def plain(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    window: tuple[int, int],
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """flash-attn's documented semantics, one (batch, head, query) at a time, float64."""
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = d**-0.5 if scale is None else scale
    left, right = window
    if causal:
        right = 0
    out = torch.zeros(b, sq, hq, v.shape[-1], dtype=torch.float64)
    lse = torch.full((b, hq, sq), math.inf, dtype=torch.float64)
    for bi in range(b):
        for h in range(hq):
            kv = h // (hq // hk)
            for i in range(sq):
                diag = i + sk - sq
                keys = [
                    j
                    for j in range(sk)
                    if (left < 0 or j >= diag - left) and (right < 0 or j <= diag + right)
                ]
                if not keys:
                    continue
                scores = torch.stack(
                    [(q[bi, i, h].double() @ k[bi, j, kv].double()) * scale for j in keys]
                )
                lse[bi, h, i] = torch.logsumexp(scores, 0)
                probs = torch.softmax(scores, 0)
                out[bi, i, h] = sum(p * v[bi, j, kv].double() for p, j in zip(probs, keys))
    return out, lse


def _qkv(sq: int, sk: int, hq: int = 2, hk: int = 2, dtype: Any = torch.float64) -> tuple:
    g = torch.Generator().manual_seed(sq * 100 + sk * 10 + hq + hk)
    q = torch.randn(2, sq, hq, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, sk, hk, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, sk, hk, 6, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


CASES = {
    "causal, square": (7, 7, 2, 2, True, (-1, -1), None),
    "causal, more keys: bottom-right": (3, 8, 2, 2, True, (-1, -1), None),
    "causal, more queries: empty rows": (6, 3, 2, 2, True, (-1, -1), None),
    "STRING's window [S, 0] with causal": (8, 8, 2, 2, True, (3, 0), None),
    "window (2, 1), not causal": (9, 9, 2, 2, False, (2, 1), None),
    "window (1, 1) with causal: right becomes 0": (6, 6, 2, 2, True, (1, 1), None),
    "not causal, no window": (4, 5, 2, 2, False, (-1, -1), None),
    "grouped-query heads": (5, 5, 4, 2, True, (-1, -1), None),
    "softmax_scale given": (5, 5, 2, 1, True, (2, 0), 0.3),
}


@pytest.mark.parametrize(
    "sq, sk, hq, hk, causal, window, scale", list(CASES.values()), ids=list(CASES)
)
def test_flash_attn_func_is_the_documented_softmax(
    shims: SimpleNamespace,
    sq: int,
    sk: int,
    hq: int,
    hk: int,
    causal: bool,
    window: tuple[int, int],
    scale: float | None,
) -> None:
    q, k, v = _qkv(sq, sk, hq, hk)
    out, lse, probs = shims.flash.flash_attn_func(
        q, k, v, softmax_scale=scale, causal=causal, window_size=window, return_attn_probs=True
    )
    want_out, want_lse = plain(q, k, v, causal, window, scale)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)
    assert probs is None
    alone = shims.flash.flash_attn_func(
        q, k, v, softmax_scale=scale, causal=causal, window_size=window
    )
    torch.testing.assert_close(alone, out, rtol=0, atol=0)


def test_float32_inputs_give_float32_out_and_lse(shims: SimpleNamespace) -> None:
    q, k, v = _qkv(5, 5, dtype=torch.float32)
    out, lse, _ = shims.flash.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    want_out, want_lse = plain(q, k, v, True, (-1, -1))
    assert (out.dtype, lse.dtype) == (torch.float32, torch.float32)
    torch.testing.assert_close(out, want_out.float(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse, want_lse.float(), rtol=1e-5, atol=1e-6)


KVCACHE = {
    "per-row lengths": (torch.tensor([4, 7], dtype=torch.int32), False, (-1, -1)),
    "one int length": (5, False, (-1, -1)),
    "causal over the cache": (torch.tensor([6, 3], dtype=torch.int32), True, (-1, -1)),
    "empty cache row: 0 and +inf": (torch.tensor([0, 2], dtype=torch.int32), False, (-1, -1)),
    "no lengths: the whole cache": (None, False, (-1, -1)),
}


@pytest.mark.parametrize("lengths, causal, window", list(KVCACHE.values()), ids=list(KVCACHE))
def test_fwd_kvcache_reads_the_first_cache_seqlens_keys(
    shims: SimpleNamespace, lengths: Any, causal: bool, window: tuple[int, int]
) -> None:
    q, k, v = _qkv(1, 10, hq=4, hk=2)
    out, lse = shims.cuda.fwd_kvcache(
        q, k, v, None, None, lengths, None, None, None, None, None, None, None, causal,
        window[0], window[1], True, 0,
    )  # fmt: skip
    sizes = [10, 10] if lengths is None else torch.as_tensor(lengths).expand(2).tolist()
    parts = [
        plain(q[b : b + 1], k[b : b + 1, :n], v[b : b + 1, :n], causal, window)
        for b, n in enumerate(sizes)
    ]
    torch.testing.assert_close(out, torch.cat([p[0] for p in parts]), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, torch.cat([p[1] for p in parts]), rtol=1e-12, atol=1e-12)
    via = shims.flash.flash_attn_with_kvcache(
        q, k, v, cache_seqlens=lengths, causal=causal, window_size=window, return_softmax_lse=True
    )
    torch.testing.assert_close(via[0], out, rtol=0, atol=0)


REFUSED = {
    "appending k": ({"k": torch.zeros(2, 1, 2, 8)}, NotImplementedError, "'k'"),
    "rotary": ({"rotary_cos": torch.zeros(4, 4)}, NotImplementedError, "rotary_cos"),
    "paged": ({"block_table": torch.zeros(2, 1)}, NotImplementedError, "block_table"),
    "past the cache": ({"cache_seqlens": 11}, ValueError, "outside the cache's 10 slots"),
}


@pytest.mark.parametrize("change, error, message", list(REFUSED.values()), ids=list(REFUSED))
def test_fwd_kvcache_refuses_what_it_does_not_do(
    shims: SimpleNamespace, change: dict[str, Any], error: type, message: str
) -> None:
    q, k, v = _qkv(1, 10)
    args = {
        "k": None, "v": None, "cache_seqlens": 3, "rotary_cos": None, "rotary_sin": None,
        "cache_batch_idx": None, "block_table": None, "alibi_slopes": None, "out": None,
    }  # fmt: skip
    args.update(change)
    with pytest.raises(error, match=message):
        shims.cuda.fwd_kvcache(
            q, k, v, args["k"], args["v"], args["cache_seqlens"], args["rotary_cos"],
            args["rotary_sin"], args["cache_batch_idx"], args["block_table"],
            args["alibi_slopes"], args["out"], None, False, -1, -1, True, 0,
        )  # fmt: skip


def test_flash_attn_func_refuses_dropout_and_alibi(shims: SimpleNamespace) -> None:
    q, k, v = _qkv(3, 3)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        shims.flash.flash_attn_func(q, k, v, dropout_p=0.1)
    with pytest.raises(NotImplementedError, match="alibi_slopes"):
        shims.flash.flash_attn_func(q, k, v, alibi_slopes=torch.ones(2))
    with pytest.raises(NotImplementedError, match="varlen"):
        shims.flash.flash_attn_varlen_func(q, k, v)


def test_cross_entropy_loss_is_torchs(shims: SimpleNamespace) -> None:
    g = torch.Generator().manual_seed(3)
    logits, labels = torch.randn(6, 11, generator=g), torch.tensor([1, 2, -100, 4, 0, 10])
    got = shims.losses.CrossEntropyLoss()(logits, labels)
    torch.testing.assert_close(got, torch.nn.functional.cross_entropy(logits, labels))


def _triton() -> ModuleType:
    """The triton shim under another name (``triton`` itself never enters ``sys.modules``)."""
    name = "posenc_test_triton_shim"
    spec = importlib.util.spec_from_file_location(
        name, SHIMS / "triton" / "__init__.py", submodule_search_locations=[str(SHIMS / "triton")]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
        sys.modules.pop(f"{name}.language", None)
    return module


def test_triton_shim_imports_kernels_and_refuses_to_launch_them() -> None:
    triton = _triton()

    @triton.heuristics({"EVEN": lambda args: True})
    @triton.jit
    def kernel(x: Any, BLOCK: triton.language.constexpr) -> None:
        pass

    with pytest.raises(NotImplementedError, match="cannot run on the CPU"):
        kernel[(triton.cdiv(7, 2), 1)](None, BLOCK=4)
    assert (triton.cdiv(7, 2), triton.cdiv(8, 2), triton.next_power_of_2(5)) == (4, 4, 8)
