"""The setting ``posenc extend --emit`` writes, checked in llama.cpp (an engine posenc did not
write): perplexity of the same token ids in posenc and in llama.cpp, per RoPE scaling.

    nice -n 5 python benchmarks/engines.py                    # yarn, linear, ntk, self-extend at 2L
    python benchmarks/engines.py --quick                      # L taken as 1024, 2L = 2048
    python benchmarks/engines.py --scalings yarn --length 16384 --out run.json

The model is SmolLM2-135M-Instruct Q4_1 (``python scripts/fetch_models.py smollm2``: trained
context L = 8192, rope theta 1e5). The ids are the first ``--length`` tokens of the first
document ``posenc extend`` measures (``posenc.extend.data.documents(tokenizer, (), 1)``, the
transformers tokenizer read from the GGUF, BOS included); llama.cpp is fed the same ids
(``Llama.eval``), never its own tokenization. For each scaling S at factor 2:

- ``posenc``: the model as ``posenc extend`` loads it (``load_model(..., dtype="float32")``:
  transformers dequantizes the GGUF), patched with S (``scaled``), ``nll_by_position``;
- ``(a) flags``: the ORIGINAL GGUF with the llama.cpp flags ``engine_setting("llama.cpp")``
  emits, translated to ``llama_cpp.Llama`` arguments by :data:`FLAGS` (a flag it does not know
  is refused, never dropped); every RoPE argument not set by a flag is llama.cpp's own default
  (``-1``/``0``: "from the model", as ``llama-server`` has it, :data:`SERVER_DEFAULTS`), not
  llama-cpp-python's (which sets ``yarn_attn_factor=1``, ``yarn_beta_fast=32``, ...);
- ``(b) copy``: the GGUF copy ``write_scaled_gguf`` writes with ``gguf_metadata``'s keys, run
  with ``n_ctx`` only (``llama-server -m copy.gguf -c N``).

For Self-Extend (``self-extend``, LongLM's map with ``posenc extend``'s ``G``, ``W`` for 2L):

- ``(c) group attention``: the ORIGINAL GGUF with the flags ``--emit llama.cpp`` writes for
  it (``--grp-attn-n G --grp-attn-w W --batch-size W``), replayed as llama-completion runs
  them (``group_attention.py``: batches of ``W`` tokens, the cached positions moved with
  ``llama_memory_seq_add`` / ``seq_div`` before each). It is not LongLM's map (it groups
  every key before the current block, near ones too): the row reports the perplexities, the
  share of (query, key) pairs whose relative position differs, and the first ``W`` tokens,
  where both maps are plain RoPE; no bar. ``(c) in transformers`` runs the same procedure in
  the unpatched transformers model, its cached keys re-rotated by each move twice over: as
  intended (by ``new - old``), and as llama.cpp's ``llama_kv_cells::pos_div`` does it (by
  ``old - new`` for a division): the one that lands on (c) says what llama.cpp computed.

llama.cpp's perplexity is computed in float64 from its float32 logits (``Llama.scores``,
``logits_all=True``), over the same ``N - 1`` predicted tokens. The bar (issue 40): (a) and
(b) each within 0.5% of posenc's perplexity for S. A ``none`` row at L (the original GGUF, no
flags, ``n_ctx = L``) shows how far the two engines are apart with no scaling at all (Q4_1
weights times 8-bit activations and an f16 KV cache in llama.cpp against dequantized float32
in torch). ``--quick`` overrides the trained context to 1024 (``load_model(context=1024)``,
``trained=1024`` in the emitted setting) for a smoke run of a few minutes.

Not CI: llama-cpp-python builds from its sdist only (about 17 minutes on 2 cores), and a
native build faults at the first eval on these machines. Installed with

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF \\
      -DGGML_AMX_BF16=OFF -DGGML_LLAMAFILE=OFF" pip install --no-binary llama-cpp-python \\
      llama-cpp-python==0.3.36

The JSON (``benchmarks/results/engines-DATE.json``) holds every number, the flags and keys,
llama.cpp's own log lines about its RoPE, the load average before and after, and versions.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"
CACHE = Path(os.environ.get("POSENC_MODEL_CACHE", ROOT / ".cache"))
MODEL = CACHE / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SCALINGS = ("yarn", "linear", "ntk")
FACTOR = 2.0
BAR = 0.005  # (a) and (b) within 0.5% of posenc's perplexity (issue 40)
QUICK_TRAINED = 1024
THREADS = 2

# --- llama.cpp's flags as llama_cpp.Llama arguments ------------------------------------------

#: ``llama_rope_scaling_type`` (include/llama.h): the values of ``--rope-scaling``.
ROPE_SCALING_TYPES = {"none": 0, "linear": 1, "yarn": 2}

#: The RoPE arguments of ``llama-server`` when no flag sets them (common/common.h,
#: ``common_params``: negative or zero means "from the model's GGUF keys"). llama-cpp-python's
#: own defaults differ (``yarn_attn_factor=1.0``, ``yarn_beta_fast=32.0``,
#: ``yarn_beta_slow=1.0``) and would hide a key the GGUF copy sets, so these are passed.
SERVER_DEFAULTS: dict[str, Any] = {
    "rope_scaling_type": -1,  # LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED: the GGUF's
    "rope_freq_base": 0.0,
    "rope_freq_scale": 0.0,
    "yarn_ext_factor": -1.0,
    "yarn_attn_factor": -1.0,
    "yarn_beta_fast": -1.0,
    "yarn_beta_slow": -1.0,
    "yarn_orig_ctx": 0,
}


def _positive_int(flag: str, text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(f"{flag} must be a positive integer, got {text!r}")
    return value


def _float(flag: str, text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{flag} must be a finite number, got {text!r}")
    return value


def _scale(flag: str, text: str) -> float:
    value = _float(flag, text)
    if value <= 0:
        raise ValueError(f"{flag} must be positive, got {text!r}")
    return 1.0 / value  # common/arg.cpp: params.rope_freq_scale = 1.0f / value


def _scaling_type(flag: str, text: str) -> int:
    if text not in ROPE_SCALING_TYPES:
        raise ValueError(f"{flag} must be one of {', '.join(ROPE_SCALING_TYPES)}, got {text!r}")
    return ROPE_SCALING_TYPES[text]


#: flag -> (``Llama`` argument, value from the flag's text), as common/arg.cpp of llama.cpp
#: 0c1e570 (vendored by llama-cpp-python 0.3.36) reads each. Only these are understood.
FLAGS: dict[str, tuple[str, Any]] = {
    "-c": ("n_ctx", _positive_int),
    "--ctx-size": ("n_ctx", _positive_int),
    "--rope-scaling": ("rope_scaling_type", _scaling_type),
    "--rope-scale": ("rope_freq_scale", _scale),
    "--rope-freq-scale": ("rope_freq_scale", _float),
    "--rope-freq-base": ("rope_freq_base", _float),
    "--yarn-orig-ctx": ("yarn_orig_ctx", _positive_int),
    "--yarn-ext-factor": ("yarn_ext_factor", _float),
    "--yarn-attn-factor": ("yarn_attn_factor", _float),
    "--yarn-beta-fast": ("yarn_beta_fast", _float),
    "--yarn-beta-slow": ("yarn_beta_slow", _float),
}
_KV_TYPES = {"int": int, "float": float, "str": str}


def _overrides(text: str) -> list[tuple[str, Any]]:
    """``KEY=TYPE:VALUE,...`` of ``--override-kv`` (common/arg.cpp splits on commas, then
    common/common.cpp ``string_parse_kv_override``) as keys and typed Python values (what
    ``Llama(kv_overrides=)`` takes: a value's Python type decides the override's type)."""
    out = []
    for item in text.split(","):
        key, sep, typed = item.partition("=")
        kind, colon, value = typed.partition(":")
        if not key or not sep or not colon or '"' in item:
            raise ValueError(f"--override-kv must be KEY=TYPE:VALUE,..., got {text!r}")
        if kind == "bool":
            if value not in ("true", "false"):
                raise ValueError(f"--override-kv {key}: a bool is true or false, got {value!r}")
            out.append((key, value == "true"))
            continue
        if kind not in _KV_TYPES:
            raise ValueError(
                f"--override-kv {key}: type must be int, float, bool or str, got {kind!r}"
            )
        out.append((key, _KV_TYPES[kind](value)))
    return out


def llama_kwargs(flags: Sequence[str]) -> dict[str, Any]:
    """``llama_cpp.Llama`` keyword arguments for the llama.cpp command-line ``flags``
    (``["-c", "16384", "--rope-scaling", "yarn", ...]``; ``--flag=value`` too): RoPE arguments
    not set by a flag keep ``llama-server``'s defaults (:data:`SERVER_DEFAULTS`). Raises
    ValueError on a flag not in :data:`FLAGS` (or ``--override-kv``), a flag without its
    value, a flag given twice, or a value it cannot read."""
    kwargs: dict[str, Any] = dict(SERVER_DEFAULTS)
    overrides: dict[str, Any] = {}
    seen: set[str] = set()
    items = list(flags)
    i = 0
    while i < len(items):
        flag, eq, value = str(items[i]).partition("=")
        if not eq:
            if i + 1 >= len(items):
                raise ValueError(f"llama.cpp flag {flag!r} has no value")
            value, i = str(items[i + 1]), i + 1
        i += 1
        if flag == "--override-kv":
            for key, typed in _overrides(value):
                if key in overrides:
                    raise ValueError(f"--override-kv {key} given twice")
                overrides[key] = typed
            continue
        if flag not in FLAGS:
            raise ValueError(
                f"llama.cpp flag {flag!r} is not one this benchmark can pass to llama_cpp.Llama "
                f"(known: {', '.join([*FLAGS, '--override-kv'])})"
            )
        name, read = FLAGS[flag]
        if name in seen:
            raise ValueError(f"llama.cpp flag {flag!r} sets {name}, which is already set")
        seen.add(name)
        kwargs[name] = read(flag, value)
    if overrides:
        kwargs["kv_overrides"] = overrides
    return kwargs


# --- perplexity in both engines --------------------------------------------------------------


def nll_from_logits(logits: np.ndarray, ids: Sequence[int], chunk: int = 512) -> np.ndarray:
    """Per-token loss (float64 nats) of ``ids[1:]`` from ``logits`` ``[>= len(ids) - 1,
    vocab]`` (row ``i`` predicts ``ids[i + 1]``): float64 log-softmax, in chunks of rows."""
    targets = np.asarray(ids[1:], dtype=np.int64)
    out = np.empty(len(targets), dtype=np.float64)
    for start in range(0, len(targets), chunk):
        rows = np.asarray(logits[start : start + chunk], dtype=np.float64)[: len(targets) - start]
        top = rows.max(axis=1, keepdims=True)
        lse = np.log(np.exp(rows - top).sum(axis=1)) + top[:, 0]
        out[start : start + len(rows)] = (
            lse - rows[np.arange(len(rows)), targets[start:][: len(rows)]]
        )
    return out


def summary(nll: np.ndarray, trained: int) -> dict[str, Any]:
    """Perplexity of all predicted tokens, of those at positions below ``trained`` and of
    those at or past it (entry ``i`` predicts position ``i + 1``)."""
    positions = np.arange(1, len(nll) + 1)
    below, past = nll[positions < trained], nll[positions >= trained]
    return {
        "ppl": math.exp(float(nll.mean())),
        "ppl_below_L": math.exp(float(below.mean())) if below.size else None,
        "ppl_from_L": math.exp(float(past.mean())) if past.size else None,
    }


#: llama.cpp's log lines kept: what it read and used for RoPE and the context.
_LOG_PREFIXES = ("print_info:", "llama_context:", "validate_override:", "llama_model_loader: - kv")
_LOG_WORDS = (
    "rope",
    "yarn",
    "freq_",
    "n_ctx",
    "context_length",
    "override",
    "flash_attn",
    "type_k",
)


def _log_lines(text: str, hide: Path) -> list[str]:
    return [
        " ".join(line.replace(str(hide), "").split())
        for line in text.splitlines()
        if line.startswith(_LOG_PREFIXES) and any(w in line for w in _LOG_WORDS)
    ]


def llama_nll(path: Path, ids: Sequence[int], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Run ``ids`` through llama.cpp (``path`` with ``kwargs``): the per-token losses, the
    seconds, and llama.cpp's log lines about RoPE and the context (what it really used)."""
    import llama_cpp

    args = {"n_ctx": len(ids), **kwargs}
    if args["n_ctx"] < len(ids):
        raise ValueError(f"n_ctx {args['n_ctx']} is shorter than the {len(ids)} ids")
    log = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stderr(log):  # llama-cpp-python prints llama.cpp's log there
        llm = llama_cpp.Llama(
            model_path=str(path),
            n_threads=THREADS,
            n_threads_batch=THREADS,
            n_batch=512,
            logits_all=True,
            verbose=True,
            **args,
        )
        try:
            llm.eval(list(ids))
            nll = nll_from_logits(llm.scores, ids)
        finally:
            llm.close()
            del llm
    seconds = time.perf_counter() - start
    lines = _log_lines(log.getvalue(), path.parent)
    return {"nll": nll, "seconds": seconds, "kwargs": _plain(args), "log": lines}


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


# --- one scaling -----------------------------------------------------------------------------


def posenc_nll(loaded: Any, scaling: str, ids: Sequence[int]) -> tuple[np.ndarray, float]:
    """posenc's per-token losses of ``ids`` with ``scaling`` at :data:`FACTOR`, and seconds."""
    from posenc.extend.measure import nll_by_position
    from posenc.extend.model import scaled, scaling_for
    from posenc.integrations.transformers import unpatch

    start = time.perf_counter()
    model = scaled(loaded, scaling_for(scaling, FACTOR, loaded))
    try:
        nll = nll_by_position(loaded.model, ids).numpy()
    finally:
        unpatch(model)
    return nll, time.perf_counter() - start


def emitted(loaded: Any, scaling: str, target: int, arch: str) -> dict[str, Any]:
    """What ``posenc extend --emit`` writes for ``scaling``: llama.cpp's flags and the GGUF
    copy's keys (``posenc.integrations.engines``)."""
    from posenc.extend.save import rope_parameters_for
    from posenc.integrations.engines import engine_setting, gguf_metadata

    rope = rope_parameters_for(loaded, scaling, FACTOR)
    setting = engine_setting(
        "llama.cpp", rope, trained=loaded.trained, target=target, arch=arch, model=MODEL.name
    )
    metadata = gguf_metadata(rope, trained=loaded.trained, target=target, arch=arch)
    return {
        "rope_parameters": rope,
        "command": setting.command,
        "flags": list(setting.settings["flags"]),
        "env": dict(setting.settings.get("env") or {}),
        "warnings": list(setting.warnings),
        "metadata": metadata,
    }


def _ratio(theirs: float, ours: float) -> float:
    return theirs / ours - 1.0


def run_scaling(loaded: Any, scaling: str, ids: Sequence[int], folder: Path) -> dict[str, Any]:
    """posenc, (a) and (b) for one scaling at ``len(ids)`` tokens."""
    from posenc.integrations.gguf_write import write_scaled_gguf

    arch = _arch(MODEL)
    setting = emitted(loaded, scaling, len(ids), arch)
    if setting["env"]:
        raise ValueError(f"{scaling}: the emitted llama.cpp setting needs env {setting['env']}")
    ours, seconds = posenc_nll(loaded, scaling, ids)
    row: dict[str, Any] = {
        "scaling": scaling,
        "factor": FACTOR,
        "tokens": len(ids),
        "emitted": setting,
        "posenc": {**summary(ours, loaded.trained), "seconds": seconds},
    }
    runs = {"a_flags": (MODEL, llama_kwargs(setting["flags"]))}
    copy = folder / f"{MODEL.stem}.{scaling}x{FACTOR:g}.gguf"
    written = write_scaled_gguf(MODEL, copy, setting["metadata"], overwrite=True)
    row["copy"] = {k: written[k] for k in ("bytes", "tensors", "tensor_sha256", "set")}
    runs["b_copy"] = (copy, {**SERVER_DEFAULTS, "n_ctx": len(ids)})
    for name, (path, kwargs) in runs.items():
        theirs = llama_nll(path, ids, kwargs)
        row[name] = _llama_row(theirs, ours, loaded.trained)
    copy.unlink()
    row["pass"] = all(abs(row[k]["ratio"]) <= BAR for k in runs)
    return row


def run_none(loaded: Any, ids: Sequence[int]) -> dict[str, Any]:
    """The sanity row: no scaling at L tokens, the original GGUF with no flags."""
    ours, seconds = posenc_nll(loaded, "none", ids)
    theirs = llama_nll(MODEL, ids, {**SERVER_DEFAULTS, "n_ctx": len(ids)})
    flags = _llama_row(theirs, ours, loaded.trained)
    return {
        "scaling": "none",
        "factor": 1.0,
        "tokens": len(ids),
        "posenc": {**summary(ours, loaded.trained), "seconds": seconds},
        "a_flags": flags,
        "pass": abs(flags["ratio"]) <= BAR,
    }


def _llama_row(theirs: dict[str, Any], ours: np.ndarray, trained: int) -> dict[str, Any]:
    nll = theirs["nll"]
    diff = nll - ours
    mine = summary(nll, trained)
    return {
        **mine,
        "ratio": _ratio(mine["ppl"], math.exp(float(ours.mean()))),
        "max_abs_nll_diff": float(np.abs(diff).max()),
        "mean_abs_nll_diff": float(np.abs(diff).mean()),
        "seconds": theirs["seconds"],
        "kwargs": theirs["kwargs"],
        "log": theirs["log"],
    }


# --- Self-Extend: llama.cpp's group attention ------------------------------------------------

SELF_EXTEND = "self-extend"
#: The flags of llama.cpp's group attention (``common/arg.cpp``), taken out of the emitted
#: setting before the rest goes to :func:`llama_kwargs`.
GROUP_FLAGS = ("--grp-attn-n", "--grp-attn-w", "--batch-size")
N_BATCH_DEFAULT = 2048  # common_params.n_batch


def group_attention_args(flags: Sequence[str]) -> tuple[dict[str, Any], int, int, int]:
    """``(llama_kwargs of the other flags, G, W, n_batch)`` of an emitted group-attention
    setting (``--grp-attn-n G --grp-attn-w W --batch-size N``, ``--flag=value`` too). Raises
    ValueError when G or W is missing, a group flag is given twice or has no value, or the
    rest is refused by :func:`llama_kwargs`."""
    rest: list[str] = []
    got: dict[str, int] = {}
    items = [str(item) for item in flags]
    i = 0
    while i < len(items):
        flag, eq, value = items[i].partition("=")
        if flag not in GROUP_FLAGS:
            rest.append(items[i])
            i += 1
            continue
        if not eq:
            if i + 1 >= len(items):
                raise ValueError(f"llama.cpp flag {flag!r} has no value")
            value, i = items[i + 1], i + 1
        if flag in got:
            raise ValueError(f"llama.cpp flag {flag!r} given twice")
        got[flag] = _positive_int(flag, value)
        i += 1
    missing = [f for f in GROUP_FLAGS[:2] if f not in got]
    if missing:
        raise ValueError(f"group attention needs {' and '.join(missing)}, got {list(flags)}")
    n_batch = got.get("--batch-size", N_BATCH_DEFAULT)
    return llama_kwargs(rest), got["--grp-attn-n"], got["--grp-attn-w"], n_batch


def _group_attention() -> Any:
    """``benchmarks/group_attention.py`` (llama-completion's procedure), loaded beside this
    file whether it runs as a script or is imported by the tests."""
    import importlib.util

    name = "posenc_benchmark_group_attention"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, Path(__file__).with_name("group_attention.py")
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def run_self_extend(loaded: Any, ids: Sequence[int]) -> dict[str, Any]:
    """posenc's Self-Extend (LongLM's map, :data:`SELF_EXTEND` at :data:`FACTOR`) against
    llama.cpp's group attention with the flags ``--emit llama.cpp`` writes for it, replayed
    as llama-completion runs them, and that procedure replayed in transformers with the cached
    keys turned both ways (``group_attention.ROTATIONS``). No bar: the two are different maps
    (``group_attention.py``); the first ``W`` tokens, where they agree, are the sanity check."""
    from posenc.extend.model import scaling_for, split_spec
    from posenc.extend.save import rope_parameters_for
    from posenc.integrations.engines import engine_setting

    spec = split_spec(scaling_for(SELF_EXTEND, FACTOR, loaded))[0]
    rope = rope_parameters_for(loaded, SELF_EXTEND, FACTOR)
    setting = engine_setting(
        "llama.cpp", rope, trained=loaded.trained, target=len(ids), arch=_arch(MODEL),
        model=MODEL.name, position_map=spec,
    )  # fmt: skip
    flags = list(setting.settings["flags"])
    kwargs, group, window, n_batch = group_attention_args(flags)
    if (group, window) != (spec["group_size"], spec["neighbor_window"]):
        raise ValueError(f"the emitted flags {flags} are not the map {spec}")
    ours, seconds = posenc_nll(loaded, SELF_EXTEND, ids)
    ga = _group_attention()
    theirs = ga.replay_nll(MODEL, ids, kwargs, group, window, n_batch, THREADS)
    twins = {
        r: ga.torch_replay_nll(loaded.model, ids, group, window, n_batch, r) for r in ga.ROTATIONS
    }
    first = slice(0, window - 1)  # predicting positions 1 .. W - 1: the same map in both
    diff = theirs["nll"] - ours
    return {
        "scaling": SELF_EXTEND,
        "factor": FACTOR,
        "tokens": len(ids),
        "map": spec,
        "emitted": {"command": setting.command, "flags": flags, "warnings": setting.warnings},
        "posenc": {**summary(ours, loaded.trained), "seconds": seconds},
        "c_group_attention": {
            **summary(theirs["nll"], loaded.trained),
            "ratio": _ratio(math.exp(float(theirs["nll"].mean())), math.exp(float(ours.mean()))),
            "max_abs_nll_diff": float(np.abs(diff).max()),
            "mean_abs_nll_diff": float(np.abs(diff).mean()),
            "seconds": theirs["seconds"],
            "kwargs": _plain({**kwargs, "n_batch": n_batch}),
            "cached_pos_max": theirs["pos_max"],
            "log": _log_lines(theirs["log"], MODEL.parent),
        },
        "c_in_transformers": {
            rotation: _twin_row(twin, theirs["nll"], ours, loaded.trained)
            for rotation, twin in twins.items()
        },
        "first_window": {
            "tokens": window,
            "posenc_ppl": math.exp(float(ours[first].mean())),
            "llama_ppl": math.exp(float(theirs["nll"][first].mean())),
            "ratio": _ratio(
                math.exp(float(theirs["nll"][first].mean())), math.exp(float(ours[first].mean()))
            ),
        },
        "map_difference": ga.map_difference(len(ids), group, window, n_batch),
    }


def _twin_row(
    twin: Mapping[str, Any], llama: np.ndarray, ours: np.ndarray, trained: int
) -> dict[str, Any]:
    """One transformers replay of llama.cpp's procedure, against llama.cpp's own losses
    and against posenc's Self-Extend."""
    ppl = math.exp(float(twin["nll"].mean()))
    return {
        **summary(twin["nll"], trained),
        "ratio_to_c": _ratio(ppl, math.exp(float(llama.mean()))),
        "ratio_to_posenc": _ratio(ppl, math.exp(float(ours.mean()))),
        "max_abs_nll_diff_to_c": float(np.abs(twin["nll"] - llama).max()),
        "seconds": twin["seconds"],
    }


def _self_extend_table(rows: Sequence[Mapping[str, Any]]) -> str:
    head = (
        "| map | tokens | posenc ppl | (c) group attention ppl | (c) vs posenc | (c) in "
        "transformers, keys turned as intended: ppl / vs (c) | ... turned as llama.cpp's "
        "pos_div: ppl / vs (c) | first W: posenc / (c) / vs | pairs at another relative "
        "position | mean abs shift |"
    )
    lines = [head, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    for row in rows:
        c, w, m = row["c_group_attention"], row["first_window"], row["map_difference"]
        twins = [row["c_in_transformers"][k] for k in ("intended", "llama.cpp")]
        cells = [
            f"Self-Extend G={row['map']['group_size']} W={row['map']['neighbor_window']}",
            str(row["tokens"]),
            f"{row['posenc']['ppl']:.4f}",
            f"{c['ppl']:.4f}",
            f"{100 * c['ratio']:+.3f}%",
            *(f"{t['ppl']:.4f} / {100 * t['ratio_to_c']:+.3f}%" for t in twins),
            f"{w['posenc_ppl']:.4f} / {w['llama_ppl']:.4f} / {100 * w['ratio']:+.3f}%",
            f"{100 * m['fraction_differing']:.1f}%",
            f"{m['mean_abs_difference']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _arch(path: Path) -> str:
    from posenc.integrations.gguf import gguf_rope_metadata

    return str(gguf_rope_metadata(path).get("general.architecture", "llama"))


# --- the run ---------------------------------------------------------------------------------


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("llama-cpp-python", "gguf", "transformers", "torch", "numpy", "posenc"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def _machine() -> dict[str, Any]:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }


def _table(rows: Sequence[Mapping[str, Any]]) -> str:
    head = "| scaling | tokens | posenc ppl | (a) flags ppl | (a) vs posenc | (b) copy ppl | (b) vs posenc | bar 0.5% |"
    lines = [head, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for row in rows:
        a, b = row["a_flags"], row.get("b_copy")
        cells = [
            row["scaling"] if row["factor"] == 1.0 else f"{row['scaling']} x{row['factor']:g}",
            str(row["tokens"]),
            f"{row['posenc']['ppl']:.4f}",
            f"{a['ppl']:.4f}",
            f"{100 * a['ratio']:+.3f}%",
            f"{b['ppl']:.4f}" if b else "",
            f"{100 * b['ratio']:+.3f}%" if b else "",
            ("PASS" if row["pass"] else "FAIL") + (" (sanity)" if row["factor"] == 1.0 else ""),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=None, help="2L tokens (default 2L)")
    choices = [*SCALINGS, SELF_EXTEND]
    parser.add_argument("--scalings", nargs="+", default=choices, choices=choices)
    parser.add_argument("--quick", action="store_true", help=f"L = {QUICK_TRAINED}, 2L tokens")
    parser.add_argument("--no-none", action="store_true", help="skip the none row at L")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not MODEL.is_file():
        print(f"{MODEL} is missing: python scripts/fetch_models.py smollm2", file=sys.stderr)
        return 1
    import torch
    from _record import record_head

    from posenc.extend.data import documents
    from posenc.extend.model import load_model

    torch.set_num_threads(THREADS)
    load_before = os.getloadavg()
    started = time.perf_counter()
    context = QUICK_TRAINED if args.quick else None
    loaded = load_model(MODEL, dtype="float32", device="cpu", context=context)
    length = args.length or 2 * loaded.trained
    doc = documents(loaded.tokenizer, (), 1)[0]
    if len(doc.ids) < length:
        raise SystemExit(f"{doc.name} has {len(doc.ids)} tokens, fewer than {length}")
    ids = doc.ids[:length]
    rows: list[dict[str, Any]] = []
    remapped: list[dict[str, Any]] = []  # Self-Extend against llama.cpp's group attention
    if not args.no_none:
        rows.append(run_none(loaded, ids[: loaded.trained]))
        print(_table(rows[-1:]).splitlines()[-1], flush=True)
    with tempfile.TemporaryDirectory(prefix="posenc-engines-") as tmp:
        for scaling in args.scalings:
            if scaling == SELF_EXTEND:
                remapped.append(run_self_extend(loaded, ids))
                print(_self_extend_table(remapped[-1:]).splitlines()[-1], flush=True)
                continue
            rows.append(run_scaling(loaded, scaling, ids, Path(tmp)))
            print(_table(rows[-1:]).splitlines()[-1], flush=True)
    load_after = os.getloadavg()
    if rows:
        print()
        print(_table(rows))
    if remapped:
        print(f"\n{_self_extend_table(remapped)}\n(c): reported, no bar (another map)")
    scaled_rows = [r for r in rows if r["factor"] != 1.0]
    verdict = all(r["pass"] for r in scaled_rows)
    if scaled_rows:  # no bar to pass where only Self-Extend (reported, not barred) ran
        print(f"\n{'PASS' if verdict else 'FAIL'}: (a) and (b) within {100 * BAR:g}% of posenc")
    result = {
        **record_head("engines"),
        "model": {
            "file": MODEL.name,
            "trained": loaded.trained,
            "sha256": loaded.identity["files"].get(MODEL.name),
            "parameters": loaded.identity["parameters"],
        },
        "document": {"name": doc.name, "sha256": doc.sha256, "tokens_used": length},
        "threads": THREADS,
        "bar": BAR,
        "machine": _machine(),
        "load_before": load_before,
        "load_after": load_after,
        "seconds": time.perf_counter() - started,
        "versions": _versions(),
        "rows": rows,
        "self_extend": remapped,
        "pass": verdict,
    }
    day = datetime.date.today().isoformat()
    out = args.out or RESULTS / f"engines-{'quick-' if args.quick else ''}{day}.json"
    out.write_text(json.dumps(_plain(result), indent=1) + "\n")
    print(f"wrote {out}")
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
