"""``posenc.integrations.engines``: one RoPE setting in every engine's spelling.

- The worked example of ``../shared/ENGINES.md`` (SmolLM2, L 8192, theta 1e5, YaRN factor 2
  to 16384), whole, for every engine: command, settings and the sources of its warnings.
- Engines x rope types (none, static NTK as its base, linear, dynamic, YaRN plain, with
  attention_factor, with mscale, with betas, with a partial rotary factor, Llama 3, LongRoPE,
  nested per layer type): the whole settings, or a refusal naming engine and scaling.
- Every vLLM / SGLang key is one that engine reads for its rope type (``VLLM_KEYS``,
  ``SGLANG_KEYS``, from vLLM 0.34.0's and SGLang 0.5.23's ``get_rope``).
- YaRN's attention factor: transformers' own ``_compute_yarn_parameters`` against each
  engine's formula, re-derived here from the source read (vLLM: ``attention_factor``
  replaces ``0.1 ln(f) + 1``; SGLang: ``attn_factor`` multiplies it; llama.cpp: float32,
  ``get_mscale(f) / (1 + 0.1 ln f) * rope.scaling.attn_factor`` in the context, times
  ``1 + 0.1 ln(1 / freq_scale)`` in ggml's rope).
- Commands: shell-quoted so that ``shlex.split`` gives the settings back, no absolute path.
"""

from __future__ import annotations

import json
import math
import shlex
from typing import Any

import numpy as np
import pytest

from posenc import PosEncError
from posenc.integrations.engines import (
    ENGINES,
    GGUF_VALUE_TYPES,
    SGLANG_KEYS,
    VLLM_KEYS,
    EngineSetting,
    engine_setting,
    gguf_metadata,
)

L, TARGET, THETA = 8192, 16384, 1e5
YARN = {
    "rope_type": "yarn",
    "rope_theta": THETA,
    "factor": 2.0,
    "original_max_position_embeddings": L,
}
NESTED_FULL = {**YARN, "rope_theta": 1e6}
SLIDING = {"rope_type": "default", "rope_theta": 1e4}
LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 1e4,
    "short_factor": [1.0, 1.5],
    "long_factor": [2.0, 4.0],
    "original_max_position_embeddings": 4096,
}
LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 5e5,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": L,
}
NTK_THETA = THETA * 2.0 ** (64 / 62)  # static NTK factor 2, head dim 64, written as its base
#: name -> (rope_parameters, GGUF arch)
CASES: dict[str, tuple[dict[str, Any], str]] = {
    "none": ({"rope_type": "default", "rope_theta": THETA}, "llama"),
    "ntk": ({"rope_type": "default", "rope_theta": NTK_THETA}, "llama"),
    "linear": ({"rope_type": "linear", "rope_theta": THETA, "factor": 2.0}, "llama"),
    "dynamic": ({"rope_type": "dynamic", "rope_theta": THETA, "factor": 2.0}, "llama"),
    "yarn": (YARN, "llama"),
    "yarn_attention": ({**YARN, "attention_factor": 1.0}, "llama"),
    "yarn_mscale": (
        {**YARN, "factor": 4.0, "original_max_position_embeddings": 4096}
        | {"mscale": 1.0, "mscale_all_dim": 0.5},
        "llama",
    ),
    "yarn_betas": ({**YARN, "beta_fast": 16.0, "beta_slow": 2.0}, "llama"),
    "yarn_partial": ({**YARN, "partial_rotary_factor": 0.5}, "llama"),
    "llama3": (LLAMA3, "llama"),
    "longrope": (LONGROPE, "phi3"),
    "nested": ({"full_attention": NESTED_FULL, "sliding_attention": SLIDING}, "gemma3"),
}
# attention_factor 1.0 over 0.1 ln(2) + 1; mscale's ratio at factor 4 over 0.1 ln(4) + 1
ONE_OVER_M2 = 1 / (0.1 * math.log(2.0) + 1)
MSCALE_4 = (0.1 * math.log(4.0) + 1) / (0.05 * math.log(4.0) + 1) / (0.1 * math.log(4.0) + 1)
LONG_MSCALE = math.sqrt(1 + math.log(16384 / 4096) / math.log(4096))  # factor = target / original
WITHOUT_ATTN = {k: v for k, v in CASES["yarn_mscale"][0].items() if "mscale" not in k}


def _model(engine: str) -> str:
    return "m.gguf" if engine in ("llama.cpp", "gguf", "ollama") else "m"


def _setting(engine: str, case: str, **kwargs: Any) -> EngineSetting:
    params, arch = CASES[case]
    args = {"trained": L, "target": TARGET, "arch": arch, "model": _model(engine)} | kwargs
    return engine_setting(engine, params, **args)


def vllm(rope: dict[str, Any], **extra: Any) -> dict[str, Any]:
    overrides = {"rope_parameters": rope, **extra}
    return {"hf_overrides": overrides, "max_model_len": TARGET, "env": {}}


def sglang(rope: dict[str, Any], **extra: Any) -> dict[str, Any]:
    overrides = {"rope_parameters": rope, **extra}
    return {"json_model_override_args": overrides, "context_length": TARGET, "env": {}}


def flags(*words: str) -> dict[str, Any]:
    return {"flags": list(words), "env": {}}


def meta(arch: str, **keys: Any) -> dict[str, Any]:
    return {"metadata": {f"{arch}.{k.replace('__', '.')}": v for k, v in keys.items()}}


MML, MPE = {"model_max_length": TARGET}, {"max_position_embeddings": TARGET}
CAP = "llama.context_length=int:16384"
CAP_YARN = CAP + ",llama.rope.scaling.factor=float:2.0"
YARN_FLAGS = ("--rope-scaling", "yarn", "--rope-scale", "2.0", "--rope-freq-base", "100000.0")
YARN_FLAGS += ("--yarn-orig-ctx", "8192")
YARN_META = {
    "context_length": TARGET,
    "rope__freq_base": THETA,
    "rope__scaling__type": "yarn",
    "rope__scaling__factor": 2.0,
    "rope__scaling__original_context_length": L,
    "rope__scaling__attn_factor": 1.0,
}
NONE_META = {"rope__scaling__type": "none", "rope__scaling__attn_factor": 1.0}
TRANSFORMERS = {case: params for case, (params, _) in CASES.items()}
REFUSED = "refused"

#: (engine, case) -> the whole settings (less ``python``, ``llama_cli``, ``types``: tested
#: on their own), or REFUSED.
EXPECTED: dict[tuple[str, str], Any] = {
    **{
        ("transformers", case): {
            "rope_parameters": params,
            "max_position_embeddings": L if case == "dynamic" else TARGET,
        }
        for case, params in TRANSFORMERS.items()
    },
    ("vllm", "none"): vllm(TRANSFORMERS["none"], **MPE, **MML),
    ("vllm", "ntk"): vllm(TRANSFORMERS["ntk"], **MPE, **MML),
    ("vllm", "linear"): vllm(TRANSFORMERS["linear"], **MML),  # table 8192 * 2 already
    ("vllm", "dynamic"): REFUSED,
    ("vllm", "yarn"): vllm(YARN, **MML),  # table original * factor: no max_position_embeddings
    ("vllm", "yarn_attention"): vllm(TRANSFORMERS["yarn_attention"], **MML),
    ("vllm", "yarn_mscale"): vllm(TRANSFORMERS["yarn_mscale"], **MML),
    ("vllm", "yarn_betas"): vllm(TRANSFORMERS["yarn_betas"], **MML),
    ("vllm", "yarn_partial"): vllm(TRANSFORMERS["yarn_partial"], **MML),
    ("vllm", "llama3"): vllm(LLAMA3, **MPE, **MML),
    ("vllm", "longrope"): vllm(
        LONGROPE | {"short_mscale": LONG_MSCALE, "long_mscale": LONG_MSCALE},
        **MPE,
        **MML,
    ),
    ("vllm", "nested"): vllm(TRANSFORMERS["nested"], **MPE, **MML),  # the sliding table
    ("sglang", "none"): sglang(TRANSFORMERS["none"], **MPE),
    ("sglang", "ntk"): sglang(TRANSFORMERS["ntk"], **MPE),
    ("sglang", "linear"): sglang(TRANSFORMERS["linear"]),  # 8192 * factor 2 already
    ("sglang", "dynamic"): REFUSED,
    ("sglang", "yarn"): sglang(YARN, **MPE),
    ("sglang", "yarn_attention"): sglang({**YARN, "attn_factor": ONE_OVER_M2}, **MPE),
    ("sglang", "yarn_mscale"): sglang({**WITHOUT_ATTN, "attn_factor": MSCALE_4}, **MPE),
    ("sglang", "yarn_betas"): sglang(TRANSFORMERS["yarn_betas"], **MPE),
    ("sglang", "yarn_partial"): sglang(YARN, **MPE),  # SGLang keeps the model's own
    ("sglang", "llama3"): sglang(LLAMA3, **MPE),
    ("sglang", "longrope"): sglang(
        LONGROPE | {"short_mscale": LONG_MSCALE, "long_mscale": LONG_MSCALE}, **MPE
    ),
    ("sglang", "nested"): sglang(TRANSFORMERS["nested"], **MPE),
    ("llama.cpp", "none"): flags(
        "--rope-scaling", "none", "--rope-freq-base", "100000.0", "--override-kv", CAP
    ),
    ("llama.cpp", "ntk"): flags(
        "--rope-scaling", "none", "--rope-freq-base", repr(NTK_THETA), "--override-kv", CAP
    ),
    ("llama.cpp", "linear"): flags(
        *("--rope-scaling", "linear", "--rope-scale", "2.0", "--rope-freq-base", "100000.0"),
        *("--override-kv", CAP),
    ),
    ("llama.cpp", "dynamic"): REFUSED,
    ("llama.cpp", "yarn"): flags(*YARN_FLAGS, "--override-kv", CAP_YARN),
    ("llama.cpp", "yarn_attention"): flags(
        *YARN_FLAGS,
        "--override-kv",
        f"llama.rope.scaling.attn_factor=float:{ONE_OVER_M2!r}," + CAP_YARN,
    ),
    ("llama.cpp", "yarn_mscale"): flags(
        *("--rope-scaling", "yarn", "--rope-scale", "4.0", "--rope-freq-base", "100000.0"),
        *("--yarn-orig-ctx", "4096", "--override-kv"),
        f"llama.rope.scaling.attn_factor=float:{MSCALE_4!r},{CAP}"
        ",llama.rope.scaling.factor=float:4.0",
    ),
    ("llama.cpp", "yarn_betas"): flags(
        *YARN_FLAGS,
        "--yarn-beta-fast",
        "16.0",
        "--yarn-beta-slow",
        "2.0",
        "--override-kv",
        CAP_YARN,
    ),
    ("llama.cpp", "yarn_partial"): flags(*YARN_FLAGS, "--override-kv", CAP_YARN),
    ("llama.cpp", "llama3"): flags("--override-kv", CAP),  # the file's own rope_freqs
    ("llama.cpp", "longrope"): flags("--override-kv", "phi3.context_length=int:16384"),
    ("llama.cpp", "nested"): flags(
        *("--rope-scaling", "yarn", "--rope-scale", "2.0", "--rope-freq-base", "1000000.0"),
        *("--yarn-orig-ctx", "8192", "--override-kv"),
        "gemma3.context_length=int:16384,gemma3.rope.scaling.factor=float:2.0",
    ),
    ("gguf", "none"): meta("llama", context_length=TARGET, rope__freq_base=THETA, **NONE_META),
    ("gguf", "ntk"): meta("llama", context_length=TARGET, rope__freq_base=NTK_THETA, **NONE_META),
    ("gguf", "linear"): meta(
        "llama",
        context_length=TARGET,
        rope__freq_base=THETA,
        rope__scaling__type="linear",
        rope__scaling__factor=2.0,
        rope__scaling__attn_factor=1.0,
    ),
    ("gguf", "dynamic"): REFUSED,
    ("gguf", "yarn"): meta("llama", **YARN_META),
    ("gguf", "yarn_attention"): meta(
        "llama", **(YARN_META | {"rope__scaling__attn_factor": ONE_OVER_M2})
    ),
    ("gguf", "yarn_mscale"): meta(
        "llama",
        **YARN_META
        | {
            "rope__scaling__factor": 4.0,
            "rope__scaling__original_context_length": 4096,
            "rope__scaling__attn_factor": MSCALE_4,
        },
    ),
    ("gguf", "yarn_betas"): REFUSED,  # llama reads no beta key from a file
    ("gguf", "yarn_partial"): meta("llama", **YARN_META),
    ("gguf", "llama3"): meta("llama", context_length=TARGET, rope__freq_base=5e5),
    ("gguf", "longrope"): meta("phi3", context_length=TARGET, rope__freq_base=1e4),
    ("gguf", "nested"): meta("gemma3", **YARN_META | {"rope__freq_base": 1e6}),
    **{
        ("ollama", case): {"modelfile": "FROM ./m.gguf\nPARAMETER num_ctx 16384\n"}
        for case in CASES
    },
    ("ollama", "dynamic"): REFUSED,
    ("ollama", "yarn_betas"): REFUSED,
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("engine", ENGINES)
def test_engine_x_rope_type(engine: str, case: str) -> None:
    expected = EXPECTED[engine, case]
    if expected == REFUSED:
        scaling = CASES[case][0]["rope_type"]
        with pytest.raises(PosEncError, match=f"engine '{engine}' cannot take scaling '{scaling}"):
            _setting(engine, case)
        return
    got = dict(_setting(engine, case).settings)
    for derived in ("python", "llama_cli", "types"):
        got.pop(derived, None)
    assert got == expected


# --- the worked example, whole ------------------------------------------------------------

SMOL = json.dumps({"rope_parameters": YARN, "model_max_length": TARGET})
SMOL_SG = json.dumps({"rope_parameters": YARN, "max_position_embeddings": TARGET})
SERVER = (
    "llama-server -m SmolLM2.gguf -c 16384 --rope-scaling yarn --rope-scale 2.0 "
    "--rope-freq-base 100000.0 --yarn-orig-ctx 8192 --override-kv "
    "llama.context_length=int:16384,llama.rope.scaling.factor=float:2.0"
)
#: engine -> (command, settings, a source each warning names)
SMOLLM2: dict[str, tuple[str | None, dict[str, Any], tuple[str, ...]]] = {
    "transformers": (
        None,
        {
            "rope_parameters": YARN,
            "max_position_embeddings": TARGET,
            "python": "import transformers\n"
            "config = transformers.AutoConfig.from_pretrained('SmolLM2')\n"
            "text = config.get_text_config()\n"
            f"text.rope_parameters = {YARN!r}\n"
            "text.max_position_embeddings = 16384\n"
            "model = transformers.AutoModelForCausalLM.from_pretrained('SmolLM2', config=config)\n",
        },
        ("modeling_rope_utils",),
    ),
    "vllm": (
        f"vllm serve SmolLM2 --hf-overrides '{SMOL}' --max-model-len 16384",
        vllm(YARN, **MML),
        (),
    ),
    "sglang": (
        "python -m sglang.launch_server --model-path SmolLM2 --json-model-override-args "
        f"'{SMOL_SG}' --context-length 16384",
        sglang(YARN, **MPE),
        ("hf_transformers/config.py",),
    ),
    "llama.cpp": (
        SERVER,
        flags(*YARN_FLAGS, "--override-kv", CAP_YARN)
        | {"llama_cli": SERVER.replace("llama-server", "llama-cli")},
        ("llama.cpp #17459", "src/llama-context.cpp"),
    ),
    "gguf": (
        "llama-server -m SmolLM2.gguf -c 16384",
        meta("llama", **YARN_META)
        | {
            "types": {
                "llama.context_length": "UINT32",
                "llama.rope.freq_base": "FLOAT32",
                "llama.rope.scaling.type": "STRING",
                "llama.rope.scaling.factor": "FLOAT32",
                "llama.rope.scaling.original_context_length": "UINT32",
                "llama.rope.scaling.attn_factor": "FLOAT32",
            }
        },
        (),
    ),
    "ollama": (
        "ollama create smollm2 -f Modelfile",
        {"modelfile": "FROM ./SmolLM2.gguf\nPARAMETER num_ctx 16384\n"},
        ("llm/server.go", "ollama #18262", "ollama #8493"),
    ),
}


@pytest.mark.parametrize("engine", ENGINES)
def test_smollm2_worked_example(engine: str) -> None:
    model = "SmolLM2.gguf" if engine in ("llama.cpp", "gguf", "ollama") else "SmolLM2"
    got = engine_setting(engine, YARN, trained=L, target=TARGET, arch="llama", model=model)
    command, settings, sources = SMOLLM2[engine]
    assert (got.engine, got.command, got.settings) == (engine, command, settings)
    assert len(got.warnings) == len(sources)
    for warning, source in zip(got.warnings, sources, strict=True):
        assert source in warning


# --- the keys each engine reads -----------------------------------------------------------


SERVED = [
    (e, c) for (e, c), want in EXPECTED.items() if e in ("vllm", "sglang") and want != REFUSED
]


@pytest.mark.parametrize(("engine", "case"), SERVED)
def test_every_key_is_read(engine: str, case: str) -> None:
    keys = VLLM_KEYS if engine == "vllm" else SGLANG_KEYS
    settings = _setting(engine, case).settings
    overrides = settings["hf_overrides" if engine == "vllm" else "json_model_override_args"]
    rope = overrides["rope_parameters"]
    layers = [rope] if "rope_type" in rope else list(rope.values())
    unread = [sorted(set(p) - keys[p["rope_type"]]) for p in layers]
    assert unread == [[] for _ in layers]
    assert set(overrides) <= {"rope_parameters", "max_position_embeddings", "model_max_length"}


def test_key_tables_cover_transformers_spelling() -> None:
    """vLLM 0.34.0 reads every key of transformers' YaRN and Llama 3; SGLang all but
    ``attention_factor`` (written as ``attn_factor``)."""
    from posenc.integrations.spelling import ROPE_TYPE_KEYS

    assert set(ROPE_TYPE_KEYS["yarn"]) - VLLM_KEYS["yarn"] == set()
    assert set(ROPE_TYPE_KEYS["yarn"]) - SGLANG_KEYS["yarn"] == {"attention_factor"}
    assert set(ROPE_TYPE_KEYS["llama3"]) - VLLM_KEYS["llama3"] == set()
    assert set(ROPE_TYPE_KEYS["llama3"]) - SGLANG_KEYS["llama3"] == set()


# --- YaRN's attention factor --------------------------------------------------------------

ATTENTION_CASES = {
    "paper": {},
    "given 1.0": {"attention_factor": 1.0},
    "given 1.3": {"attention_factor": 1.3},
    "mscale 1 / 0.5": {"mscale": 1.0, "mscale_all_dim": 0.5},
    "mscale 0.707 / 0.707": {"mscale": 0.707, "mscale_all_dim": 0.707},
    "mscale without all_dim": {"mscale": 1.0},
}


def _transformers_attention(params: dict[str, Any]) -> float:
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(
        hidden_size=128,
        num_attention_heads=2,
        max_position_embeddings=int(params["original_max_position_embeddings"] * params["factor"]),
        rope_parameters=params,
    )
    _, attention = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    return float(attention)


def _mscale(factor: float, weight: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * weight * math.log(factor) + 1.0


def _vllm_attention(rope: dict[str, Any]) -> float:
    """vLLM 0.34.0 ``YaRNScalingRotaryEmbedding.__init__`` (yarn_scaling_rope.py)."""
    factor = rope["factor"]
    if rope.get("attention_factor") is not None:
        return float(rope["attention_factor"])
    if rope.get("mscale") and rope.get("mscale_all_dim"):
        return _mscale(factor, rope["mscale"]) / _mscale(factor, rope["mscale_all_dim"])
    return _mscale(factor)


def _sglang_attention(rope: dict[str, Any]) -> float:
    """SGLang 0.5.23 ``YaRNScalingRotaryEmbedding.__init__`` (layers/rotary_embedding/yarn.py)."""
    factor = rope["factor"]
    if rope.get("mscale") is not None and rope.get("mscale_all_dim") is not None:
        scale = _mscale(factor, rope["mscale"]) / _mscale(factor, rope["mscale_all_dim"])
    else:
        scale = _mscale(factor)
    return scale * rope.get("attn_factor", 1.0)


def _llama_cpp_attention(factor_text: str, attn_factor: float) -> float:
    """llama.cpp 0c1e570: ``llama_context`` (src/llama-context.cpp) sets ``yarn_attn_factor =
    get_mscale(factor) / (1 + 0.1 logf(factor)) * hparams.rope_attn_factor`` and ggml's
    ``rope_yarn`` (ggml-cpu/ops.cpp) multiplies it by ``1 + 0.1 logf(1 / freq_scale)``;
    ``freq_scale = 1.0f / stof(--rope-scale)``: all float32."""
    f32 = np.float32
    freq_scale = f32(1.0) / f32(float(factor_text))
    factor = f32(1.0) / freq_scale
    attn = f32(0.1) * np.log(factor) + f32(1.0) if factor > 1 else f32(1.0)
    attn = attn * (f32(1.0) / (f32(1.0) + f32(0.1) * np.log(factor)))
    attn = attn * f32(attn_factor)
    return float(attn * (f32(1.0) + f32(0.1) * np.log(f32(1.0) / freq_scale)))


@pytest.mark.parametrize("factor", [1.5, 2.0, 4.0, 16.0])
@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_yarn_attention_factor_in_every_engine(case: str, factor: float) -> None:
    params = {**YARN, "factor": factor, **ATTENTION_CASES[case]}
    want = _transformers_attention(params)
    target = int(L * factor)
    args = {"trained": L, "target": target, "arch": "llama", "model": "m"}
    vllm_rope = engine_setting("vllm", params, **args).settings["hf_overrides"]["rope_parameters"]
    sg = engine_setting("sglang", params, **args).settings["json_model_override_args"]
    words = engine_setting("llama.cpp", params, **args).settings["flags"]
    kv = dict(item.split("=", 1) for item in words[words.index("--override-kv") + 1].split(","))
    cpp_attn = float(kv.get("llama.rope.scaling.attn_factor", "float:1.0").removeprefix("float:"))
    copy = gguf_metadata(params, trained=L, target=target, arch="llama")
    got = {
        "vllm": _vllm_attention(vllm_rope),
        "sglang": _sglang_attention(sg["rope_parameters"]),
        "llama.cpp flags": _llama_cpp_attention(words[words.index("--rope-scale") + 1], cpp_attn),
        "gguf": _llama_cpp_attention(
            repr(copy["llama.rope.scaling.factor"]), copy["llama.rope.scaling.attn_factor"]
        ),
    }
    assert got == pytest.approx(dict.fromkeys(got, want), rel=1e-6)
    exact = {k: v for k, v in got.items() if k in ("vllm", "sglang")}
    assert exact == pytest.approx(dict.fromkeys(exact, want), rel=1e-14)


# --- commands -----------------------------------------------------------------------------

LIVE = [(e, c) for (e, c), expected in EXPECTED.items() if expected != REFUSED]


@pytest.mark.parametrize(("engine", "case"), LIVE)
def test_commands_split_back_into_the_settings(engine: str, case: str) -> None:
    got = _setting(engine, case)
    settings = got.settings
    n = str(TARGET)
    want: list[str] | None
    if engine == "vllm":
        overrides = json.dumps(settings["hf_overrides"])
        want = ["vllm", "serve", "m", "--hf-overrides", overrides, "--max-model-len", n]
    elif engine == "sglang":
        overrides = json.dumps(settings["json_model_override_args"])
        want = ["python", "-m", "sglang.launch_server", "--model-path", "m"]
        want += ["--json-model-override-args", overrides, "--context-length", n]
    elif engine == "llama.cpp":
        want = ["llama-server", "-m", "m.gguf", "-c", n, *settings["flags"]]
        cli = ["llama-cli", "-m", "m.gguf", "-c", n, *settings["flags"]]
        assert shlex.split(settings["llama_cli"]) == cli
    elif engine == "gguf":
        want = ["llama-server", "-m", "m.gguf", "-c", n]
    elif engine == "ollama":
        want = ["ollama", "create", "m", "-f", "Modelfile"]
    else:
        want = None
    assert (shlex.split(got.command) if got.command is not None else None) == want
    for json_flag in ("--hf-overrides", "--json-model-override-args"):
        if want is not None and json_flag in want:
            assert json.loads(want[want.index(json_flag) + 1]) == next(
                v for k, v in settings.items() if k in ("hf_overrides", "json_model_override_args")
            )


@pytest.mark.parametrize("model", ["/home/u/m", "C:\\models\\m", "~/m", "\\\\srv\\m", ""])
@pytest.mark.parametrize("engine", ENGINES)
def test_an_absolute_path_is_refused(engine: str, model: str) -> None:
    with pytest.raises(PosEncError, match="model must be a file or folder name"):
        engine_setting(engine, YARN, trained=L, target=TARGET, arch="llama", model=model)


@pytest.mark.parametrize(("engine", "case"), LIVE)
def test_no_command_holds_an_absolute_path(engine: str, case: str) -> None:
    got = _setting(engine, case, model="out dir/m's model")
    words = shlex.split(got.command) if got.command is not None else []
    assert [w for w in words if w.startswith(("/", "~"))] == []
    if engine != "transformers":
        assert "out dir/m's model" in words or engine == "ollama"


def test_transformers_snippet_of_a_gguf_model_runs_its_folder() -> None:
    got = engine_setting(
        "transformers", YARN, trained=L, target=TARGET, arch="llama", model="d/m.gguf"
    )
    assert got.settings["python"].splitlines()[1] == (
        "config = transformers.AutoConfig.from_pretrained('d', gguf_file='m.gguf')"
    )


def test_ollama_modelfile_from_a_subfolder() -> None:
    got = engine_setting(
        "ollama", YARN, trained=L, target=TARGET, arch="llama", model="out/My Model.gguf"
    )
    assert (got.command, got.settings) == (
        "ollama create my-model -f Modelfile",
        {"modelfile": "FROM out/My Model.gguf\nPARAMETER num_ctx 16384\n"},
    )


# --- GGUF keys ----------------------------------------------------------------------------


@pytest.mark.parametrize(("engine", "case"), [k for k in LIVE if k[0] == "gguf"])
def test_gguf_metadata_is_the_gguf_setting(engine: str, case: str) -> None:
    params, arch = CASES[case]
    got = gguf_metadata(params, trained=L, target=TARGET, arch=arch)
    setting = _setting(engine, case).settings
    assert got == setting["metadata"]
    assert setting["types"] == {k: GGUF_VALUE_TYPES[k.removeprefix(arch + ".")] for k in got}


def test_gguf_keys_and_types_are_gguf_py_s() -> None:
    gguf = pytest.importorskip("gguf")
    keys = gguf.constants.Keys
    spelled = {
        "context_length": keys.LLM.CONTEXT_LENGTH,
        "rope.freq_base": keys.Rope.FREQ_BASE,
        "rope.scaling.type": keys.Rope.SCALING_TYPE,
        "rope.scaling.factor": keys.Rope.SCALING_FACTOR,
        "rope.scaling.original_context_length": keys.Rope.SCALING_ORIG_CTX_LEN,
        "rope.scaling.attn_factor": keys.Rope.SCALING_ATTN_FACTOR,
        "rope.scaling.yarn_ext_factor": keys.Rope.SCALING_YARN_EXT_FACTOR,
        "rope.scaling.yarn_beta_fast": keys.Rope.SCALING_YARN_BETA_FAST,
        "rope.scaling.yarn_beta_slow": keys.Rope.SCALING_YARN_BETA_SLOW,
        "rope.scaling.yarn_log_multiplier": keys.Rope.SCALING_YARN_LOG_MUL,
    }
    assert {k: v.format(arch="a") for k, v in spelled.items()} == {
        k: f"a.{k}" for k in GGUF_VALUE_TYPES
    }
    assert {k: gguf.GGUFValueType[v].name for k, v in GGUF_VALUE_TYPES.items()} == GGUF_VALUE_TYPES
    assert {t.value for t in gguf.RopeScalingType} >= {"none", "linear", "yarn"}


@pytest.mark.parametrize(
    ("arch", "extra"),
    [
        ("mistral3", {"yarn_beta_fast": 16.0, "yarn_beta_slow": 2.0, "yarn_log_multiplier": 0.0}),
        ("grok", {"yarn_ext_factor": 1.0, "yarn_beta_fast": 16.0, "yarn_beta_slow": 2.0}),
    ],
)
def test_archs_that_read_yarn_keys_get_them(arch: str, extra: dict[str, float]) -> None:
    params = {**YARN, "beta_fast": 16.0, "beta_slow": 2.0}
    got = gguf_metadata(params, trained=L, target=TARGET, arch=arch)
    want = {f"{arch}.{k.replace('__', '.')}": v for k, v in YARN_META.items()}
    want |= {f"{arch}.rope.scaling.{k}": v for k, v in extra.items()}
    assert got == want


# --- refusals and bad input ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "params", "kwargs", "match"),
    [
        (
            "vllm",
            YARN,
            {"target": 20000},
            "engine 'vllm' cannot take scaling 'yarn': its YaRN table",
        ),
        (
            "vllm",
            {"rope_type": "proportional", "rope_theta": 1e4},
            {},
            "'vllm' cannot take scaling 'proportional'",
        ),
        (
            "sglang",
            {"rope_type": "proportional", "rope_theta": 1e4},
            {},
            "'sglang' cannot take scaling 'proportional'",
        ),
        (
            "llama.cpp",
            {**YARN, "truncate": False},
            {},
            "'llama.cpp' cannot take scaling 'yarn with truncate false'",
        ),
        (
            "llama.cpp",
            {"full_attention": YARN, "sliding_attention": {**YARN, "factor": 4.0}},
            {"arch": "gemma3"},
            "'llama.cpp' cannot take scaling 'yarn': llama.cpp scales only the full-attention",
        ),
        ("gguf", {"sliding_attention": SLIDING}, {}, "'gguf' cannot take scaling 'per layer type'"),
    ],
)
def test_refusals_name_engine_and_scaling(
    engine: str, params: dict[str, Any], kwargs: dict[str, Any], match: str
) -> None:
    args = {"trained": L, "target": TARGET, "arch": "llama", "model": "m"} | kwargs
    with pytest.raises(PosEncError, match=match):
        engine_setting(engine, params, **args)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"engine": "tgi"},
            "engine must be one of transformers, vllm, sglang, llama.cpp, gguf, ollama, got 'tgi'",
        ),
        ({"trained": 0}, "trained"),
        ({"target": "16k"}, "target"),
        ({"arch": "Llama"}, "arch must be a GGUF architecture name"),
        ({"arch": "llama,x"}, "arch must be a GGUF architecture name"),
        ({"arch": ""}, "arch must be a GGUF architecture name"),
        ({"arch": 3}, "arch must be a GGUF architecture name"),
        ({"model": 3}, "model must be a file or folder name"),
        ({"model": "m\nrm -rf x"}, "model must be a file or folder name"),
        ({"rope_parameters": {}}, "rope_parameters must be a non-empty dict"),
        ({"rope_parameters": {"factor": 2.0}}, "rope_parameters must hold 'rope_type'"),
        (
            {"rope_parameters": {"rope_type": "yarn", "factor": 2.0}},
            r"rope_parameters\['rope_theta'\]",
        ),
        ({"rope_parameters": {**YARN, "attn_factor": 1.0}}, "does not take: \\['attn_factor'\\]"),
        (
            {"rope_parameters": {**YARN, "factor": "2"}},
            r"rope_parameters\['factor'\] must be a number",
        ),
        (
            {"rope_parameters": {"rope_type": "su", "rope_theta": 1e4}},
            r"\['rope_type'\] must be one of",
        ),
        (
            {"rope_parameters": {**LONGROPE, "long_factor": []}},
            r"\['long_factor'\] must be a number",
        ),
        (
            {"rope_parameters": {"full_attention": {"rope_theta": 1e4}}},
            r"rope_parameters\['full_attention'\]\['rope_type'\]",
        ),
    ],
)
def test_bad_input_names_the_argument(kwargs: dict[str, Any], match: str) -> None:
    args = {
        "engine": "vllm",
        "rope_parameters": YARN,
        "trained": L,
        "target": TARGET,
        "arch": "llama",
        "model": "m",
    } | kwargs
    engine, params = args.pop("engine"), args.pop("rope_parameters")
    with pytest.raises(PosEncError, match=match):
        engine_setting(engine, params, **args)


# --- the angles llama.cpp computes from the flags and from the copy's keys ----------------


def _ggml_inv_freq(n_dims: int, base: float, freq_scale: float, orig: int, betas: tuple) -> Any:
    """llama.cpp 0c1e570's angle per position of each pair, float64: ``ggml_rope_yarn_corr_dims``
    (ggml/src/ggml.c) and ``rope_yarn`` / ``rope_yarn_ramp`` (ggml-cpu/ops.cpp); YaRN's ramp at
    ext_factor 1 when ``orig`` is given, none otherwise."""
    i = np.arange(n_dims // 2)
    extrap = base ** (-2.0 * i / n_dims)
    interp = freq_scale * extrap
    if not orig:
        return interp

    def corr(n_rot: float) -> float:
        return n_dims * math.log(orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(0.0, math.floor(corr(betas[0]))), min(n_dims - 1.0, math.ceil(corr(betas[1])))
    ramp = 1 - np.clip((i - low) / max(0.001, high - low), 0, 1)
    return interp * (1 - ramp) + extrap * ramp


def _read_flags(words: list[str]) -> tuple[float, float, int, tuple[float, float]]:
    value = dict(zip(words[::2], words[1::2], strict=True))
    scale = 1.0 / float(value.get("--rope-scale", "1.0"))
    orig = int(value.get("--yarn-orig-ctx", "0")) if value.get("--rope-scaling") == "yarn" else 0
    betas = (float(value.get("--yarn-beta-fast", 32)), float(value.get("--yarn-beta-slow", 1)))
    return float(value["--rope-freq-base"]), scale, orig, betas


def _read_copy(copy: dict[str, Any]) -> tuple[float, float, int, tuple[float, float]]:
    rope = "llama.rope."
    kind = copy[rope + "scaling.type"]
    scale = 1.0 if kind == "none" else 1.0 / copy[rope + "scaling.factor"]
    orig = copy[rope + "scaling.original_context_length"] if kind == "yarn" else 0
    return copy[rope + "freq_base"], scale, orig, (32.0, 1.0)  # llama reads no beta key


@pytest.mark.parametrize(
    "case", ["none", "ntk", "linear", "yarn", "yarn_mscale", "yarn_betas", "yarn_partial"]
)
def test_llama_cpp_computes_transformers_frequencies(case: str) -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params, _ = CASES[case]
    config = transformers.LlamaConfig(
        hidden_size=128,
        num_attention_heads=2,
        max_position_embeddings=TARGET,
        rope_parameters=params,
    )
    n_dims = int(64 * params.get("partial_rotary_factor", 1.0))
    if params["rope_type"] == "default":  # transformers 5 models' compute_default_rope_parameters
        torch = pytest.importorskip("torch")
        exponent = torch.arange(0, n_dims, 2, dtype=torch.int64).float() / n_dims
        inv_freq = 1.0 / (params["rope_theta"] ** exponent)
    else:
        inv_freq, _ = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu")
    words = _setting("llama.cpp", case).settings["flags"]
    got = {"flags": _ggml_inv_freq(n_dims, *_read_flags(words[: words.index("--override-kv")]))}
    if EXPECTED["gguf", case] != REFUSED:
        copy = gguf_metadata(params, trained=L, target=TARGET, arch="llama")
        got["gguf"] = _ggml_inv_freq(n_dims, *_read_copy(copy))
    want = inv_freq.double().numpy()
    for path, freqs in got.items():
        np.testing.assert_allclose(freqs, want, rtol=2e-7, err_msg=path)
