"""llama.cpp's spelling of a RoPE setting: llama-server and llama-cli flags, the keys of a GGUF
copy that says the same with no flag, and ollama's Modelfile ``FROM`` that copy.

Read at llama.cpp 0c1e570 (2026-10-01, vendored by llama-cpp-python 0.3.36). How llama.cpp
computes what transformers does (``src/llama-context.cpp``, ``ggml/src/ggml-cpu/ops.cpp``):

- angles: ``p * base^(-2i/n_rot)``, times ``freq_scale = 1 / --rope-scale`` (linear; YaRN
  where its ramp interpolates); YaRN's ramp runs between ``floor`` and ``ceil`` of the
  correction dims of ``beta_fast`` / ``beta_slow`` rotations in ``n_ctx_orig_yarn`` tokens
  (transformers' ``truncate=True``): ``--yarn-orig-ctx`` pins it to
  ``original_max_position_embeddings``, whatever ``context_length`` says;
- YaRN's attention factor: llama.cpp recomputes ``yarn_attn_factor`` from the factor
  (``--yarn-attn-factor`` is overwritten), and cos/sin end up times ``(0.1 ln(factor) + 1)
  * rope.scaling.attn_factor``; transformers' factor ``A`` is therefore written as
  ``rope.scaling.attn_factor = A / (0.1 ln(factor) + 1)`` (1 for the paper's value);
- the cap: llama-server serves at most ``n_ctx_train`` tokens a slot
  (``tools/server/server-context.cpp`` ``n_ctx_slot``; llama.cpp #17459), which is
  ``context_length``, or ``yarn_orig_ctx * factor`` (truncated) when YaRN's factor differs
  from the file's: ``--override-kv`` sets ``context_length`` and, for YaRN, the file's factor,
  so that the cap is exactly the target.

Dynamic NTK has no llama.cpp spelling; Llama 3's and LongRoPE's factors are the file's own
tensors (``rope_freqs``, ``rope_factors_long`` / ``_short``), carried unchanged.

Self-Extend is llama.cpp's group attention, ``--grp-attn-n G --grp-attn-w W``
(:func:`group_attention`): ``common/arg.cpp`` registers the two flags for
``LLAMA_EXAMPLE_COMPLETION`` (``llama-completion``, the former ``llama-cli``) and ``-gan``
alone for the passkey example; llama-server dropped them (llama.cpp #9860) and the chat
``llama-cli`` does not take them. ``tools/completion/completion.cpp`` asserts ``W % G == 0``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from posenc.integrations._engine_request import (
    EngineSetting,
    Request,
    mscale,
    num,
    refuse,
    request,
    shell,
    yarn_attention,
)

__all__ = ["GGUF_VALUE_TYPES", "gguf_metadata", "group_attention", "llama_writers"]

#: The GGUF value type (a ``gguf.GGUFValueType`` member name) of each key :func:`gguf_metadata`
#: writes, by its name after ``{arch}.`` (gguf-py ``GGUFWriter.add_context_length``,
#: ``add_rope_*``: uint32 lengths, float32 factors, the scaling type a string).
GGUF_VALUE_TYPES = {
    "context_length": "UINT32",
    "rope.freq_base": "FLOAT32",
    "rope.scaling.type": "STRING",
    "rope.scaling.factor": "FLOAT32",
    "rope.scaling.original_context_length": "UINT32",
    "rope.scaling.attn_factor": "FLOAT32",
    "rope.scaling.yarn_ext_factor": "FLOAT32",
    "rope.scaling.yarn_beta_fast": "FLOAT32",
    "rope.scaling.yarn_beta_slow": "FLOAT32",
    "rope.scaling.yarn_log_multiplier": "FLOAT32",
}
# The archs that read YaRN keys from the file (src/models/*.cpp): a copy holds them at the
# values that give transformers' YaRN. beta_* only grok and mistral3 read: every other arch
# takes 32 and 1, whatever its file says.
_ARCH_YARN_KEYS = {
    "grok": ("yarn_ext_factor", "yarn_beta_fast", "yarn_beta_slow"),
    "mistral3": ("yarn_beta_fast", "yarn_beta_slow", "yarn_log_multiplier"),
    "deepseek2": ("yarn_log_multiplier",),
    "deepseek32": ("yarn_log_multiplier",),
}
_DEFAULT_BETAS = (32.0, 1.0)
_SOURCE = "llama.cpp 0c1e570"


@dataclasses.dataclass(frozen=True)
class _Rope:
    """The scaled layers' RoPE as llama.cpp takes it."""

    kind: str  # rope.scaling.type: none, linear, yarn; "" for the file's own (llama3, longrope)
    base: float
    factor: float = 1.0
    original: int = 0
    attn_factor: float = 1.0  # rope.scaling.attn_factor
    betas: tuple[float, float] = _DEFAULT_BETAS
    rope_type: str = "default"


def _scaled_layer(engine: str, req: Request) -> dict[str, Any]:
    """The dict of the layers llama.cpp scales: the flat one, or ``full_attention`` (the
    sliding-window layers keep the file's own base and scale: ``get_rope_freq_scale``)."""
    if None in req.layers:
        return req.layers[None]
    for name, params in req.layers.items():
        if name != "full_attention" and params["rope_type"] != "default":
            raise refuse(
                engine,
                params["rope_type"],
                f"llama.cpp scales only the full-attention layers; layer type {name!r} keeps "
                f"the file's own (src/llama-model.cpp get_rope_freq_scale, {_SOURCE})",
            )
    if "full_attention" not in req.layers:
        raise refuse(engine, "per layer type", "llama.cpp needs a 'full_attention' layer type")
    return req.layers["full_attention"]


def _rope(engine: str, req: Request) -> _Rope:
    params = _scaled_layer(engine, req)
    kind, base = params["rope_type"], float(params["rope_theta"])
    if kind == "default":
        return _Rope("none", base)
    if kind == "linear":
        return _Rope("linear", base, float(params["factor"]), rope_type=kind)
    if kind in ("llama3", "longrope"):
        return _Rope("", base, rope_type=kind)
    if kind != "yarn":
        why = "llama.cpp's --rope-scaling takes none, linear, yarn"
        raise refuse(engine, kind, why + (" (no dynamic NTK)" if kind == "dynamic" else ""))
    if not params.get("truncate", True):
        raise refuse(
            engine, "yarn with truncate false", f"ggml floors and ceils YaRN's ramp ({_SOURCE})"
        )
    factor = float(params["factor"])
    betas = (float(params.get("beta_fast") or 32), float(params.get("beta_slow") or 1))
    reads = _ARCH_YARN_KEYS.get(req.arch, ())
    if engine != "llama.cpp" and betas != _DEFAULT_BETAS and "yarn_beta_fast" not in reads:
        raise refuse(
            engine,
            f"yarn with beta_fast {num(betas[0])}, beta_slow {num(betas[1])}",
            f"llama.cpp reads rope.scaling.yarn_beta_* from a file only for grok and mistral3 "
            f"(src/models/*.cpp, {_SOURCE}); use the llama.cpp flags",
        )
    attn = yarn_attention(params) / mscale(factor)
    original = int(params["original_max_position_embeddings"])
    return _Rope("yarn", base, factor, original, attn, betas, kind)


def _flags(rope: _Rope, req: Request) -> list[str]:
    arch, flags = req.arch, []
    if rope.kind:
        flags += ["--rope-scaling", rope.kind]
        flags += [] if rope.kind == "none" else ["--rope-scale", num(rope.factor)]
        flags += ["--rope-freq-base", num(rope.base)]
    reads = _ARCH_YARN_KEYS.get(arch, ()) if rope.kind == "yarn" else ()
    if rope.kind == "yarn":
        flags += ["--yarn-orig-ctx", str(rope.original)]
        if rope.betas != _DEFAULT_BETAS or "yarn_beta_fast" in reads:
            flags += [
                "--yarn-beta-fast",
                num(rope.betas[0]),
                "--yarn-beta-slow",
                num(rope.betas[1]),
            ]
        if "yarn_ext_factor" in reads:
            flags += ["--yarn-ext-factor", "1.0"]
    kv = []
    if rope.kind == "yarn" and rope.attn_factor != 1.0:
        kv.append(f"{arch}.rope.scaling.attn_factor=float:{num(rope.attn_factor)}")
    if "yarn_log_multiplier" in reads:
        kv.append(f"{arch}.rope.scaling.yarn_log_multiplier=float:0.0")
    if req.target > req.trained:
        kv.append(f"{arch}.context_length=int:{req.target}")
        if rope.kind == "yarn":  # the file's factor = the flags': no re-adjust of n_ctx_train
            kv.append(f"{arch}.rope.scaling.factor=float:{num(rope.factor)}")
    return flags + (["--override-kv", ",".join(kv)] if kv else [])


def _metadata(rope: _Rope, req: Request) -> dict[str, Any]:
    arch = req.arch
    meta: dict[str, Any] = {
        f"{arch}.context_length": req.target,
        f"{arch}.rope.freq_base": rope.base,
    }
    if not rope.kind:
        return meta
    scaling = f"{arch}.rope.scaling."
    meta[scaling + "type"] = rope.kind
    if rope.kind != "none":
        meta[scaling + "factor"] = rope.factor
    if rope.kind == "yarn":
        meta[scaling + "original_context_length"] = rope.original
    meta[scaling + "attn_factor"] = rope.attn_factor  # multiplies cos/sin whatever the type
    if rope.kind == "yarn":
        values = {
            "yarn_ext_factor": 1.0,
            "yarn_beta_fast": rope.betas[0],
            "yarn_beta_slow": rope.betas[1],
            "yarn_log_multiplier": 0.0,  # 0: the factor's own 0.1 ln(factor) + 1
        }
        for key in _ARCH_YARN_KEYS.get(arch, ()):
            meta[scaling + key] = values[key]
    return meta


def gguf_metadata(rope_parameters: Any, *, trained: int, target: int, arch: str) -> dict[str, Any]:
    """The GGUF keys a copy of the model's file needs so that llama.cpp, with no rope flag,
    computes the angles and attention factor of ``rope_parameters`` (transformers 5's
    spelling) at ``target`` tokens: ``{arch}.context_length`` (the target: llama-server's
    cap), ``{arch}.rope.freq_base`` and, but for Llama 3's and LongRoPE's own tensors,
    ``{arch}.rope.scaling.type``, ``.factor``, ``.original_context_length`` (YaRN),
    ``.attn_factor`` and the YaRN keys the arch reads. Values are Python ints, floats and
    strings; :data:`GGUF_VALUE_TYPES` gives each key's GGUF type.

    Raises:
        PosEncError: a bad argument, or a scaling a GGUF file cannot say (naming it).
    """
    req = request(rope_parameters, trained, target, arch, "model.gguf")
    return _metadata(_rope("gguf", req), req)


def _warnings(engine: str, rope: _Rope, req: Request) -> list[str]:
    out = []
    if engine == "llama.cpp" and req.target > req.trained:
        out.append(
            f"without --override-kv {req.arch}.context_length llama-server caps each slot at "
            f"the trained {req.trained} tokens (llama.cpp #17459; tools/server/"
            f"server-context.cpp n_ctx_slot)"
        )
    if engine == "llama.cpp" and rope.kind == "yarn":
        out.append(
            "--yarn-attn-factor does nothing under YaRN: llama.cpp recomputes it from the "
            f"factor (src/llama-context.cpp, {_SOURCE}); the attention factor is "
            f"{req.arch}.rope.scaling.attn_factor"
        )
    if not rope.kind:
        out.append(
            f"{rope.rope_type}'s factors are the GGUF's own tensors (rope_freqs, "
            "rope_factors_long / _short, written by convert_hf_to_gguf.py): a file without "
            "them serves plain RoPE"
        )
    if rope.rope_type == "longrope":
        out.append(
            "llama.cpp picks LongRoPE's long factors by the context size (-c), not per "
            f"sequence (src/llama-model.cpp get_rope_factors, {_SOURCE})"
        )
    if None not in req.layers:
        out.append(
            "llama.cpp's sliding-window layers keep the file's own base and scale "
            f"(src/llama-model.cpp get_rope_freq_base, {_SOURCE})"
        )
    if engine == "ollama":
        out += _ollama_warnings(rope, req)
    return out


def _ollama_warnings(rope: _Rope, req: Request) -> list[str]:
    out = [
        f"ollama clamps num_ctx to the GGUF's {req.arch}.context_length (llm/server.go, "
        f"ollama v0.33.0-rc2): FROM must name the copy whose context_length is {req.target}",
        "ollama's MLX runner ignores YaRN and clamps num_ctx to max_position_embeddings "
        "(ollama #18262): serve the GGUF with the llama.cpp runner",
    ]
    if rope.kind == "yarn":
        out.append(
            "a Modelfile has no YaRN parameter: YaRN comes only from the GGUF copy's "
            "rope.scaling keys (ollama #8493)"
        )
    return out


def _llama_cpp(req: Request) -> EngineSetting:
    rope = _rope("llama.cpp", req)
    flags = _flags(rope, req)
    head = ["-m", req.model, "-c", str(req.target)]
    server, cli = (
        shell(["llama-server", *head, *flags], {}),
        shell(["llama-cli", *head, *flags], {}),
    )
    settings = {"flags": flags, "env": {}, "llama_cli": cli}
    return EngineSetting("llama.cpp", server, settings, tuple(_warnings("llama.cpp", rope, req)))


def _gguf(req: Request) -> EngineSetting:
    rope = _rope("gguf", req)
    meta = _metadata(rope, req)
    types = {key: GGUF_VALUE_TYPES[key.removeprefix(req.arch + ".")] for key in meta}
    command = shell(["llama-server", "-m", req.model, "-c", str(req.target)], {})
    warnings = tuple(_warnings("gguf", rope, req))
    return EngineSetting("gguf", command, {"metadata": meta, "types": types}, warnings)


def _ollama(req: Request) -> EngineSetting:
    rope = _rope("ollama", req)
    source = req.model if "/" in req.model else "./" + req.model
    modelfile = f"FROM {source}\nPARAMETER num_ctx {req.target}\n"
    stem = req.model.rsplit("/", 1)[-1].removesuffix(".gguf")
    name = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-.") or "extended"
    command = shell(["ollama", "create", name, "-f", "Modelfile"], {})
    warnings = tuple(_warnings("ollama", rope, req))
    return EngineSetting("ollama", command, {"modelfile": modelfile}, warnings)


def group_attention(req: Request, group: int, window: int) -> EngineSetting:
    """Self-Extend (``group_size`` ``group``, ``neighbor_window`` ``window``) as llama.cpp
    runs it: ``llama-completion -m MODEL -c N`` with the RoPE flags of ``req`` and
    ``--grp-attn-n G --grp-attn-w W``, prompts fed in batches of ``W`` tokens
    (``--batch-size``: its group attention moves the cached positions between batches).

    Raises:
        PosEncError: ``W`` is not a multiple of ``G`` (llama-completion asserts it).
    """
    if window % group:
        raise refuse(
            "llama.cpp",
            "self_extend",
            f"llama-completion needs grp_attn_w to be a multiple of grp_attn_n (GGML_ASSERT in "
            f"tools/completion/completion.cpp, {_SOURCE}); neighbor_window {window} is not a "
            f"multiple of group_size {group}",
        )
    rope = _rope("llama.cpp", req)
    flags = _flags(rope, req)
    flags += ["--grp-attn-n", str(group), "--grp-attn-w", str(window), "--batch-size", str(window)]
    command = shell(["llama-completion", "-m", req.model, "-c", str(req.target), *flags], {})
    settings = {
        "flags": flags,
        "env": {},
        "group_attention": {"grp_attn_n": group, "grp_attn_w": window},
    }
    warnings = [w for w in _warnings("llama.cpp", rope, req) if "llama-server" not in w]
    warnings += [
        "llama-server and the chat llama-cli do not take --grp-attn-n / --grp-attn-w "
        f"(llama.cpp #9860; common/arg.cpp, {_SOURCE}): run llama-completion",
        "llama.cpp's group attention is not LongLM's Self-Extend pair by pair: it shifts and "
        "divides the positions held in the KV cache, a block of grp_attn_w at a time, so each "
        "key has one position for every query (tools/completion/completion.cpp); LongLM "
        "merges a neighbour attention and a grouped one per pair, which is what was measured",
        "llama.cpp rotates the keys its group attention divides the wrong way: "
        "llama_kv_cells::pos_div adds p_old - p_new to the pending shift where pos_add adds "
        f"the move p_new - p_old (src/llama-kv-cells.h, {_SOURCE}), so a divided key lands at "
        "2 p_old - p_new; posenc's check replays it (benchmarks/engines.py): on SmolLM2-135M "
        "at 16384 tokens (G 8, W 2048) llama.cpp gives perplexity 2127 where posenc's "
        "Self-Extend gives 5.33 and the procedure with the keys turned right 5.42: expect a "
        "far higher perplexity than posenc measured until llama.cpp fixes it",
    ]
    return EngineSetting("llama.cpp", command, settings, tuple(warnings))


#: The writers of this module, by engine name.
llama_writers = {"llama.cpp": _llama_cpp, "gguf": _gguf, "ollama": _ollama}
