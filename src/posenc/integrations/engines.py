"""One RoPE setting in the spelling of each engine people serve with, as that engine's current
source reads it (the file and version each table cites), with the engine's known silent
failures for that setting (``../shared/ENGINES.md``).

:func:`engine_setting` takes a ``rope_parameters`` dict in transformers 5's spelling (what
:func:`posenc.integrations.spelling.to_rope_parameters` writes: static NTK as its base), flat
or nested per layer type, and gives an :class:`EngineSetting` for one of :data:`ENGINES`:

- ``transformers``: the config's ``rope_parameters`` and ``max_position_embeddings`` (the
  target, except dynamic NTK, which reads it as the trained context), and a snippet;
- ``vllm``: ``vllm serve MODEL --hf-overrides JSON --max-model-len N``, only keys vLLM reads
  (:data:`VLLM_KEYS`), plus the config lengths vLLM needs to size its tables and its limit;
- ``sglang``: ``python -m sglang.launch_server ... --json-model-override-args JSON
  --context-length N``, only keys SGLang reads (:data:`SGLANG_KEYS`), YaRN's attention
  factor as SGLang's ``attn_factor`` (a factor on ``0.1 ln(factor) + 1``);
- ``llama.cpp``: ``llama-server -m MODEL -c N`` with flags that make llama.cpp compute the
  same angles and attention factor, and what lifts llama-server's cap at the trained context;
- ``gguf``: :func:`gguf_metadata`, the keys a copy of the GGUF file needs so that llama.cpp
  with no rope flag computes the same; ``ollama``: a Modelfile ``FROM`` that copy.

Refused with :class:`posenc.PosEncError` naming the engine and the scaling: dynamic NTK in
every engine but transformers (vLLM, SGLang: a table fixed at one length; llama.cpp: none),
a YaRN llama.cpp cannot express, a served length past vLLM's YaRN table.

A position map (``position_map=``, :mod:`posenc.remap`) moves the positions inside
attention, pair by pair, which no config key says: Self-Extend is written for llama.cpp
only, as its group-attention flags (:func:`posenc.integrations._engine_llama.group_attention`);
every other engine refuses it, and every engine refuses STRING, each reason ending in
where it runs (:data:`POSENC_ONLY`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from posenc._errors import PosEncError
from posenc.integrations._engine_llama import (
    GGUF_VALUE_TYPES,
    gguf_metadata,
    group_attention,
    llama_writers,
)
from posenc.integrations._engine_request import (
    EngineSetting,
    Request,
    longrope_attention,
    mscale,
    refuse,
    request,
    shell,
    yarn_attention,
)

__all__ = [
    "ENGINES",
    "GGUF_VALUE_TYPES",
    "POSENC_ONLY",
    "SGLANG_KEYS",
    "VLLM_KEYS",
    "EngineSetting",
    "engine_setting",
    "gguf_metadata",
]

ENGINES = ("transformers", "vllm", "sglang", "llama.cpp", "gguf", "ollama")
_MROPE = frozenset({"mrope_section", "mrope_interleaved"})
_VLLM_GENERAL = frozenset({"rope_type", "rope_theta", "partial_rotary_factor", "rope_dim"})
#: The keys vLLM reads from rope_parameters, per rope_type: vLLM 0.34.0 (PyPI wheel, built
#: 2026-11-16), vllm/model_executor/layers/rotary_embedding/__init__.py ``get_rope``. Its
#: YaRN takes transformers' ``attention_factor`` (it replaces ``0.1 ln(factor) + 1``, as in
#: transformers; yarn_scaling_rope.py); ``attn_factor`` is no longer read.
VLLM_KEYS: dict[str, frozenset[str]] = {
    "default": _VLLM_GENERAL | _MROPE,
    "linear": _VLLM_GENERAL | {"factor"},
    "dynamic": _VLLM_GENERAL | {"factor", "alpha", "max_trained_positions"},
    "yarn": _VLLM_GENERAL
    | _MROPE
    | {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow"}
    | {"mscale", "mscale_all_dim", "attention_factor", "truncate"},
    "llama3": _VLLM_GENERAL
    | {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "longrope": _VLLM_GENERAL
    | {"short_factor", "long_factor", "original_max_position_embeddings"}
    | {"short_mscale", "long_mscale"},
}
_SGLANG_GENERAL = frozenset({"rope_type", "rope_theta"})
#: The keys SGLang reads, per rope_type: SGLang 0.5.23 (PyPI wheel, built 2026-10-30),
#: sglang/srt/layers/rotary_embedding/factory.py ``get_rope``; models/llama.py reads
#: ``rope_theta`` from rope_parameters. Its YaRN reads ``attn_factor``, which multiplies
#: ``0.1 ln(factor) + 1`` (layers/rotary_embedding/yarn.py); ``attention_factor`` is dropped.
SGLANG_KEYS: dict[str, frozenset[str]] = {
    "default": _SGLANG_GENERAL | _MROPE,
    "linear": _SGLANG_GENERAL | {"factor"},
    "dynamic": _SGLANG_GENERAL | {"factor", "alpha"},
    "yarn": _SGLANG_GENERAL
    | _MROPE
    | {"factor", "original_max_position_embeddings", "extrapolation_factor", "attn_factor"}
    | {"beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"},
    "llama3": VLLM_KEYS["llama3"] - {"partial_rotary_factor", "rope_dim"},
    "longrope": VLLM_KEYS["longrope"] - {"partial_rotary_factor", "rope_dim"},
}
_WHY_DYNAMIC = {
    "vllm": "vLLM's dynamic is one table fixed at max_position_embeddings "
    "(dynamic_ntk_scaling_rope.py, vLLM 0.34.0), not transformers' per-length base",
    "sglang": "SGLang's dynamic is one table fixed at max_position_embeddings * factor "
    "(layers/rotary_embedding/rope_variant.py, SGLang 0.5.23), not transformers' per-length base",
}


#: How every refusal of a position map ends: where the map does run.
POSENC_ONLY = "transformers with posenc only"
_SELF_EXTEND_RUNS = (
    f"it runs in llama.cpp's llama-completion (--emit llama.cpp) and in {POSENC_ONLY}"
)
#: Why each engine cannot run Self-Extend (llama.cpp runs it: its group attention).
_WHY_NO_SELF_EXTEND = {
    "transformers": "a transformers config sets RoPE's frequencies (rope_parameters), not the "
    "positions a (query, key) pair is rotated at inside attention",
    "vllm": "vLLM rotates each token once, at its own position, before attention (get_rope, "
    "vLLM 0.34.0): no position per (query, key) pair",
    "sglang": "SGLang rotates each token once, at its own position, before attention "
    "(layers/rotary_embedding/factory.py get_rope, SGLang 0.5.23): no position per pair",
    "gguf": "a GGUF file has no key for group attention: llama.cpp takes it only as "
    "llama-completion's --grp-attn-n / --grp-attn-w flags (common/arg.cpp, llama.cpp 0c1e570)",
    "ollama": "ollama has no group-attention parameter (docs/modelfile.mdx, ollama v0.33.0-rc2)",
}
_WHY_NO_STRING = (
    "STRING rotates each (query, key) pair at its own shifted offset inside attention "
    "(HKUNLP/STRING patches transformers' attention), which no engine's attention does"
)


def _remapped(engine: str, req: Request, position_map: Any) -> EngineSetting:
    """The setting of a position map for ``engine``: llama.cpp's group attention for
    Self-Extend; refused everywhere else (a reason ending in where it runs)."""
    from posenc.remap import SelfExtend
    from posenc.remap.maps import coerce

    remap = coerce(position_map, "position_map")
    kind = str(remap.to_config()["type"])
    if isinstance(remap, SelfExtend):
        if engine == "llama.cpp":
            return group_attention(req, remap.group_size, remap.neighbor_window)
        raise refuse(engine, kind, f"{_WHY_NO_SELF_EXTEND[engine]}; {_SELF_EXTEND_RUNS}")
    raise refuse(engine, kind, f"{_WHY_NO_STRING}; it runs in {POSENC_ONLY}")


def engine_setting(
    engine: str,
    rope_parameters: Mapping[str, Any],
    *,
    trained: int,
    target: int,
    arch: str,
    model: str,
    position_map: Any = None,
) -> EngineSetting:
    """``rope_parameters`` (transformers 5's spelling, flat or nested per layer type) served
    at ``target`` tokens by ``engine``, for a model trained on ``trained`` tokens (what its
    config holds as ``max_position_embeddings``), whose GGUF architecture is ``arch`` and
    whose file or folder is named ``model`` in commands (never an absolute path; for
    ``gguf`` and ``ollama``: the GGUF copy's name). ``position_map`` (a map or its config,
    :func:`posenc.remap.position_map`) runs with ``rope_parameters``: Self-Extend in
    llama.cpp only, STRING nowhere.

    ``settings`` holds: transformers ``{"rope_parameters", "max_position_embeddings",
    "python"}``; vllm ``{"hf_overrides", "max_model_len", "env"}``; sglang
    ``{"json_model_override_args", "context_length", "env"}``; llama.cpp ``{"flags", "env",
    "llama_cli"}`` (Self-Extend: ``{"flags", "env", "group_attention"}``); gguf
    ``{"metadata", "types"}``; ollama ``{"modelfile"}``.

    Raises:
        PosEncError: an unknown engine, a bad argument (naming it), or a scaling the engine
            cannot take (naming both).
    """
    if not isinstance(engine, str) or engine not in ENGINES:
        raise PosEncError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    req = request(rope_parameters, trained, target, arch, model)
    if position_map is not None:
        return _remapped(engine, req, position_map)
    return _WRITERS[engine](req)


def _transformers(req: Request) -> EngineSetting:
    params = req.spelled(req.layers)
    length = req.trained if "dynamic" in req.types() else req.target
    if req.model.endswith(".gguf"):
        head, _, tail = req.model.rpartition("/")
        where = f"{head or '.'!r}, gguf_file={tail!r}"
    else:
        where = repr(req.model)
    python = (
        "import transformers\n"
        f"config = transformers.AutoConfig.from_pretrained({where})\n"
        "text = config.get_text_config()\n"
        f"text.rope_parameters = {params!r}\n"
        f"text.max_position_embeddings = {length}\n"
        f"model = transformers.AutoModelForCausalLM.from_pretrained({where}, config=config)\n"
    )
    settings = {"rope_parameters": params, "max_position_embeddings": length, "python": python}
    warning = (
        "transformers 5 builds the rotary tables when the model is made: set the config "
        "before from_pretrained (config=), a change to model.config afterwards does nothing "
        "(transformers 5 modeling_rope_utils; ../shared/ENGINES.md)"
    )
    return EngineSetting("transformers", None, settings, (warning,))


# --- vLLM and SGLang ----------------------------------------------------------------------


def _served(engine: str, req: Request, keys: Mapping[str, frozenset[str]]) -> dict:
    """Each layer type's dict as ``engine`` reads it (translated where it spells otherwise)."""
    out: dict[str | None, dict[str, Any]] = {}
    for name, params in req.layers.items():
        kind = params["rope_type"]
        if kind == "dynamic":
            raise refuse(engine, kind, _WHY_DYNAMIC[engine])
        if kind not in keys:
            written = ", ".join(k for k in keys if k != "dynamic")
            raise refuse(engine, kind, f"posenc writes {written} for {engine}")
        params = dict(params)
        if kind == "longrope":  # both read short_mscale / long_mscale, not attention_factor
            scale = longrope_attention(params, req.target)
            params.pop("attention_factor", None), params.pop("factor", None)
            params.update(short_mscale=scale, long_mscale=scale)
        if kind == "yarn" and engine == "sglang":  # attn_factor multiplies 0.1 ln(f) + 1
            scale = yarn_attention(params) / mscale(float(params["factor"]))
            for key in ("attention_factor", "mscale", "mscale_all_dim"):
                params.pop(key, None)
            if scale != 1.0:
                params["attn_factor"] = scale
        if kind == "yarn" and engine == "vllm":
            table = math.ceil(params["original_max_position_embeddings"] * params["factor"])
            if req.target > table:
                raise refuse(
                    engine,
                    kind,
                    f"its YaRN table holds original_max_position_embeddings * factor = {table} "
                    f"positions (yarn_scaling_rope.py, vLLM 0.34.0), target is {req.target}",
                )
        if engine == "sglang":  # SGLang keeps the model's own partial rotary factor
            params.pop("partial_rotary_factor", None)
        dropped = sorted(set(params) - keys[kind])
        if dropped:
            raise refuse(engine, kind, f"it does not read {dropped}")
        out[name] = params
    return out


def _vllm(req: Request) -> EngineSetting:
    overrides: dict[str, Any] = {"rope_parameters": req.spelled(_served("vllm", req, VLLM_KEYS))}
    # vLLM sizes a default, llama3 or longrope table by max_position_embeddings, a linear one
    # by max_position_embeddings * factor, a YaRN one by original * factor (get_rope); it
    # takes the smallest length key of the config, capped by the tokenizer's
    # model_max_length, and lifts that cap for a config model_max_length at least
    # --max-model-len (config/model.py _get_and_verify_max_len): so no
    # VLLM_ALLOW_LONG_MAX_MODEL_LEN, whose positions past the table are NaN.
    needed = _needed_length(req, yarn_own_table=True)
    if needed > req.trained:
        overrides["max_position_embeddings"] = needed
    if req.target > req.trained:
        overrides["model_max_length"] = req.target
    argv = ["vllm", "serve", req.model, "--hf-overrides", json.dumps(overrides)]
    argv += ["--max-model-len", str(req.target)]
    settings = {"hf_overrides": overrides, "max_model_len": req.target, "env": {}}
    return EngineSetting("vllm", shell(argv, {}), settings, tuple(_served_warnings("vllm", req)))


def _sglang(req: Request) -> EngineSetting:
    overrides: dict[str, Any] = {
        "rope_parameters": req.spelled(_served("sglang", req, SGLANG_KEYS))
    }
    # SGLang's limit is the config's first length key (max_position_embeddings for most)
    # times rope_scaling's factor, but 1 where it holds original_max_position_embeddings or
    # is llama3 (utils/hf_transformers/common.py get_context_length): written so that it is
    # at least the target, without SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN.
    needed = _needed_length(req, yarn_own_table=False)
    if needed > req.trained:
        overrides["max_position_embeddings"] = needed
    argv = ["python", "-m", "sglang.launch_server", "--model-path", req.model]
    argv += ["--json-model-override-args", json.dumps(overrides)]
    argv += ["--context-length", str(req.target)]
    settings = {"json_model_override_args": overrides, "context_length": req.target, "env": {}}
    warnings = _served_warnings("sglang", req)
    return EngineSetting("sglang", shell(argv, {}), settings, tuple(warnings))


def _needed_length(req: Request, *, yarn_own_table: bool) -> int:
    """The ``max_position_embeddings`` an engine needs for ``req.target`` tokens: the target
    over the factor for linear layers, the target for the others (vLLM: but YaRN, whose
    table is sized by original_max_position_embeddings * factor)."""
    needed = 0
    for params in req.layers.values():
        kind = params["rope_type"]
        if kind == "linear":
            needed = max(needed, math.ceil(req.target / params["factor"]))
        elif not (yarn_own_table and kind == "yarn"):
            needed = max(needed, req.target)
    return needed


def _served_warnings(engine: str, req: Request) -> list[str]:
    out = []
    kinds = req.types()
    if engine == "sglang":
        out.append(
            "SGLang merges rope_parameters into the model's own (utils/hf_transformers/"
            "config.py get_config, SGLang 0.5.23): a scaling key of the model's own config "
            "that is not written here stays in force"
        )
    yarn = [p for p in req.layers.values() if p["rope_type"] == "yarn"]
    if any(yarn_attention(p) != mscale(float(p["factor"])) for p in yarn):
        if engine == "vllm":
            out.append(
                "vLLM 0.25.0 and older drop attention_factor, mscale and mscale_all_dim and "
                "scale YaRN by 0.1 ln(factor) + 1 (vllm #48621, PR #48351): serve with a vLLM "
                "that reads them (0.34.0 does)"
            )
        else:
            out.append(
                "SGLang drops transformers' attention_factor without a word: it is written as "
                "attn_factor, a factor on 0.1 ln(factor) + 1 (layers/rotary_embedding/yarn.py)"
            )
    if "linear" in kinds:
        out.append(
            "do not also write the served length into max_position_embeddings: the engine "
            "multiplies it by factor again (NVIDIA-NeMo/Safe-Synthesizer PR #623)"
        )
    if "longrope" in kinds:
        out.append(
            f"{engine} uses LongRoPE's long factors for every sequence once the served length "
            "passes original_max_position_embeddings; transformers switches by sequence "
            "length (phi3_long_rope_scaled_rope.py)"
        )
    return out


_WRITERS: dict[str, Callable[[Request], EngineSetting]] = {
    "transformers": _transformers,
    "vllm": _vllm,
    "sglang": _sglang,
    **llama_writers,
}
