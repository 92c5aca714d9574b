"""``benchmarks/engines.py``: the llama.cpp flags ``posenc extend --emit`` writes, as
``llama_cpp.Llama`` arguments (a flag it does not know is refused, never dropped), Self-Extend's
group-attention flags as llama-completion's arguments, and the float64 perplexity it computes
from llama.cpp's logits."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "engines.py"
_spec = importlib.util.spec_from_file_location("posenc_benchmark_engines", PATH)
assert _spec is not None and _spec.loader is not None
engines: Any = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(engines)

D = engines.SERVER_DEFAULTS

CASES = {
    "yarn": (
        "-c 16384 --rope-scaling yarn --rope-scale 2 --yarn-orig-ctx 8192",
        {
            **D,
            "n_ctx": 16384,
            "rope_scaling_type": 2,
            "rope_freq_scale": 0.5,
            "yarn_orig_ctx": 8192,
        },
    ),
    "linear": (
        "--ctx-size=16384 --rope-scaling linear --rope-scale 4",
        {**D, "n_ctx": 16384, "rope_scaling_type": 1, "rope_freq_scale": 0.25},
    ),
    "ntk as a base": (
        "-c 16384 --rope-freq-base 206158.4",
        {**D, "n_ctx": 16384, "rope_freq_base": 206158.4},
    ),
    "none": ("--rope-scaling none", {**D, "rope_scaling_type": 0}),
    "yarn sub-parameters": (
        "--yarn-ext-factor 1 --yarn-attn-factor 0.5 --yarn-beta-fast 16 --yarn-beta-slow 2 "
        "--rope-freq-scale 0.5",
        {
            **D,
            "yarn_ext_factor": 1.0,
            "yarn_attn_factor": 0.5,
            "yarn_beta_fast": 16.0,
            "yarn_beta_slow": 2.0,
            "rope_freq_scale": 0.5,
        },
    ),
    "override-kv": (
        "-c 16384 --override-kv llama.context_length=int:16384,a.b=float:1.5 "
        "--override-kv c=bool:true --override-kv d=str:yarn",
        {
            **D,
            "n_ctx": 16384,
            "kv_overrides": {"llama.context_length": 16384, "a.b": 1.5, "c": True, "d": "yarn"},
        },
    ),
    "no flags": ("", dict(D)),
}


@pytest.mark.parametrize("flags, expected", list(CASES.values()), ids=list(CASES))
def test_flags_become_llama_arguments(flags: str, expected: dict[str, Any]) -> None:
    got = engines.llama_kwargs(flags.split())
    assert got == expected
    assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in expected.items()}


GROUP_CASES = {
    "emitted": (
        "--rope-scaling none --rope-freq-base 100000.0 --grp-attn-n 8 --grp-attn-w 2048 "
        "--batch-size 2048",
        ({**D, "rope_scaling_type": 0, "rope_freq_base": 1e5}, 8, 2048, 2048),
    ),
    "= form, no batch size": (
        "--grp-attn-n=4 --grp-attn-w=1024 -c 16384",
        ({**D, "n_ctx": 16384}, 4, 1024, 2048),
    ),
}


@pytest.mark.parametrize("flags, expected", list(GROUP_CASES.values()), ids=list(GROUP_CASES))
def test_group_attention_args(flags: str, expected: tuple) -> None:
    assert engines.group_attention_args(flags.split()) == expected


# each reader of flags: llama_cpp.Llama's arguments (llama), llama-completion's group
# attention (group); the case, the reader, the flags, what the message says
REFUSED = {
    "unknown flag": ("llama", "-c 16384 --grp-attn-n 4", "'--grp-attn-n' is not one"),
    "unknown flag, = form": ("llama", "--rope-theta=1e5", "'--rope-theta' is not one"),
    "no value": ("llama", "-c", "has no value"),
    "twice": ("llama", "-c 8 -c 16", "already set"),
    "same argument, two spellings": ("llama", "-c 8 --ctx-size 16", "already set"),
    "bad scaling type": ("llama", "--rope-scaling dynamic", "must be one of none, linear, yarn"),
    "zero scale": ("llama", "--rope-scale 0", "must be positive"),
    "nan": ("llama", "--yarn-attn-factor nan", "finite"),
    "negative context": ("llama", "-c -5", "positive integer"),
    "override without type": (
        "llama",
        "--override-kv llama.context_length=16384",
        "KEY=TYPE:VALUE",
    ),
    "override with a bad type": ("llama", "--override-kv a=u32:3", "type must be int"),
    "override bool": ("llama", "--override-kv a=bool:yes", "true or false"),
    "override twice": ("llama", "--override-kv a=int:1 --override-kv a=int:2", "given twice"),
    "override twice in one list": ("llama", "--override-kv a=int:1,a=int:2", "given twice"),
    "override list, one bad": ("llama", "--override-kv a=int:1,b", "KEY=TYPE:VALUE"),
    "group: no W": ("group", "--grp-attn-n 4", "needs --grp-attn-w"),
    "group: no G or W": ("group", "-c 8", "needs --grp-attn-n and --grp-attn-w"),
    "group: twice": ("group", "--grp-attn-n 4 --grp-attn-w 8 --grp-attn-n 2", "given twice"),
    "group: no value": ("group", "--grp-attn-w 8 --grp-attn-n", "has no value"),
    "group: zero": ("group", "--grp-attn-n 0 --grp-attn-w 8", "positive integer"),
    "group: another flag": (
        "group",
        "--grp-attn-n 2 --grp-attn-w 8 --flash-attn on",
        "'--flash-attn' is not",
    ),
}
READERS = {"llama": engines.llama_kwargs, "group": engines.group_attention_args}


@pytest.mark.parametrize("reader, flags, message", list(REFUSED.values()), ids=list(REFUSED))
def test_flags_not_understood_are_refused(reader: str, flags: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        READERS[reader](flags.split())


def test_server_defaults_are_llama_cpps() -> None:
    """The defaults passed are llama.cpp's own (``llama_context_default_params``), and the
    scaling types its enum's values."""
    llama_cpp = pytest.importorskip("llama_cpp")
    params = llama_cpp.llama_context_default_params()
    assert {k: getattr(params, k) for k in D} == D
    assert engines.ROPE_SCALING_TYPES == {
        "none": llama_cpp.LLAMA_ROPE_SCALING_TYPE_NONE,
        "linear": llama_cpp.LLAMA_ROPE_SCALING_TYPE_LINEAR,
        "yarn": llama_cpp.LLAMA_ROPE_SCALING_TYPE_YARN,
    }


@pytest.mark.parametrize(
    "rows, chunk", [(7, 3), (7, 512), (1, 1)], ids=["chunked", "one", "single"]
)
def test_nll_from_logits_is_float64_cross_entropy(rows: int, chunk: int) -> None:
    generator = torch.Generator().manual_seed(rows)
    logits = (torch.randn(rows + 2, 11, generator=generator, dtype=torch.float64) * 30).float()
    ids = torch.randint(0, 11, (rows + 1,), generator=generator)
    got = engines.nll_from_logits(logits.numpy(), ids.tolist(), chunk=chunk)
    want = torch.nn.functional.cross_entropy(
        logits[:rows].double(), ids[1:], reduction="none"
    ).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert got.dtype == np.float64


def test_summary_splits_at_the_trained_context() -> None:
    nll = np.array([1.0, 2.0, 3.0, 4.0])  # predicting positions 1, 2, 3, 4
    got = engines.summary(nll, 3)
    assert got == {
        "ppl": math.exp(2.5),
        "ppl_below_L": math.exp(1.5),
        "ppl_from_L": math.exp(3.5),
    }


def test_log_keeps_what_llama_cpp_used_for_rope(tmp_path: Path) -> None:
    log = "\n".join(
        [
            f"llama_model_loader: loaded meta data from {tmp_path}/m.gguf",
            "llama_model_loader: - kv  10:   llama.context_length   u32   = 8192",
            "llama_model_loader: - kv  11:   llama.block_count   u32   = 30",
            "print_info: n_ctx_orig_yarn  = 8192",
            "print_info: n_embd = 576",
            "create_tensor: loading tensor rope_freqs.weight",
            "llama_context: freq_scale    = 0.5",
            "validate_override: Using metadata override ( int) 'llama.context_length' = 16384",
        ]
    )
    assert engines._log_lines(log, tmp_path) == [
        "llama_model_loader: - kv 10: llama.context_length u32 = 8192",
        "print_info: n_ctx_orig_yarn = 8192",
        "llama_context: freq_scale = 0.5",
        "validate_override: Using metadata override ( int) 'llama.context_length' = 16384",
    ]
