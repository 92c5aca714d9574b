"""More valid calls for the bad-input matrix (appended to ``_targets.TARGETS``): the
contextual and gated families, the layer schedules, the last scaling, figures saved to a
path, the study settings and tasks, and the transformers config readers given dicts (whose
keys ``_mutations`` mutates one at a time).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

import posenc
from posenc import contextual, gated, models, plot
from posenc.experiments import StudySettings, make_task
from posenc.experiments.comparisons import (
    Comparison,
    compare,
    describe,
    paired_verdict,
    verdict,
)
from posenc.experiments.results import (
    check_results,
    comparisons_record,
    load_results,
    refresh_results,
    summarize,
)
from posenc.experiments.student_t import t_quantile
from posenc.integrations import transformers as hf
from posenc.models import schedules

from ._targets import fn, target


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


# --- CoPE: a term computed from the logits, q and k ----------------------------------------
fn(
    "cope_bias",
    contextual.cope_bias,
    lambda: {
        "q": _r(1, 2, 4, 8),
        "k": _r(1, 2, 4, 8),
        "weight": _r(6, 8),
        "position_logit": "scaled",
        "scale": 0.3,
        "causal": True,
        "attn_mask": torch.ones(1, 4, dtype=torch.bool),
    },
)
fn(
    "cope_positions",
    contextual.cope_positions,
    lambda: {
        "q": _r(1, 2, 4, 8),
        "k": _r(1, 2, 4, 8),
        "npos_max": 6,
        "scale": 0.3,
        "causal": True,
        "attn_mask": torch.ones(1, 4, dtype=torch.bool),
    },
)
fn(
    "cope_position_logits",
    contextual.cope_position_logits,
    lambda: {"q": _r(1, 2, 4, 8), "weight": _r(6, 8), "positions": torch.rand(1, 2, 4, 4) * 5},
)
fn(
    "CoPEBias",
    contextual.CoPEBias,
    lambda: {"head_dim": 8, "npos_max": 6, "position_logit": "scaled", "dtype": torch.float32},
)
fn(
    "attention[cope]",
    posenc.attention,
    lambda: {
        "q": _r(1, 2, 4, 8),
        "k": _r(1, 2, 4, 8),
        "v": _r(1, 2, 4, 8),
        "encoding": {"name": "cope", "head_dim": 8, "npos_max": 6},
        "causal": True,
        "attn_mask": torch.ones(1, 4, dtype=torch.bool),
        "backend": "eager",
    },
)


def _cached() -> tuple[Any, dict[str, Any]]:
    """A model's forward continuing a KV cache filled by a first call (batch 1, 4 tokens)."""
    model = models.TinyTransformer(11, dim=16, num_layers=1, num_heads=2, encoding="rope")
    cache = models.KVCache()
    model(torch.randint(0, 11, (1, 4)), cache=cache)
    return model, {"tokens": torch.randint(0, 11, (1, 1)), "cache": cache}


target("models.TinyTransformer.forward[cache]")(_cached)
# A module afresh for every case (the matrix moves one to the meta device).
target("CoPEBias.__call__")(
    lambda: (contextual.CoPEBias(8, 6), {"q": _r(1, 2, 4, 8), "k": _r(1, 2, 4, 8)})
)
target("FoXBias.__call__")(lambda: (gated.FoXBias(2), {"gates": -torch.rand(1, 2, 4), "q_len": 3}))

# --- forgetting attention: a term from per-token gates --------------------------------------
fn("fox_bias", gated.fox_bias, lambda: {"gates": -torch.rand(1, 2, 4), "q_len": 3})
fn("fox_cumulative", gated.fox_cumulative, lambda: {"gates": -torch.rand(1, 2, 4)})
fn("FoXBias", gated.FoXBias, lambda: {"num_heads": 2})
fn(
    "attention[fox]",
    posenc.attention,
    lambda: {
        "q": _r(1, 2, 4, 8),
        "k": _r(1, 2, 4, 8),
        "v": _r(1, 2, 4, 8),
        "encoding": "fox",
        "causal": True,
        "gates": -torch.rand(1, 2, 4),
    },
)

# --- per-layer schedules ------------------------------------------------------------------
fn(
    "schedules.nope_every",
    schedules.nope_every,
    lambda: {"k": 2, "num_layers": 4, "window": 8},
)
fn(
    "schedules.local_global",
    schedules.local_global,
    lambda: {
        "num_layers": 6,
        "ratio": 5,
        "window": 16,
        "local_base": 1e4,
        "global_base": 1e6,
        "encoding": "rope",
    },
)
fn(
    "schedules.schedule",
    schedules.schedule,
    lambda: {"name": "nope-every-4", "num_layers": 4, "train_len": 16, "encoding": "rope"},
)

# --- the last scaling, and figures written to a path ----------------------------------------
fn("ProportionalScaling", posenc.rotary.ProportionalScaling, lambda: {"factor": 2.0})


def _fig() -> Any:
    return plot.plot_table("sinusoidal", 4, figsize=(2.0, 2.0), dpi=10)


fn(
    "plot.save_figure",
    plot.save_figure,
    lambda: {"fig": _fig(), "path": str(Path(tempfile.mkdtemp()) / "table.png")},
    fixed=("path",),
)

# --- studies: their settings and tasks (nothing is trained) --------------------------------
fn(
    "experiments.StudySettings.from_options",
    StudySettings.from_options,
    lambda: {
        "task": "copy",
        "encodings": ["none", "rope"],
        "preset": "quick",
        "train_len": 16,
        "eval_lens": [16, 32],
        "steps": 4,
        "seeds": [0, 1],
        "batch_size": 2,
        "dim": 16,
        "num_layers": 1,
        "num_heads": 2,
        "lr": 1e-3,
    },
)
fn(
    "experiments.make_task",
    make_task,
    lambda: {"name": "counting", "eval_tokens": 256, "eval_examples": 4, "num_vars": 2},
)


# --- transformers configs given as dicts: every key is mutated ------------------------------
def _llama() -> dict[str, Any]:
    return {
        "model_type": "llama",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "max_position_embeddings": 256,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    }


def _gptj() -> dict[str, Any]:
    return {"model_type": "gptj", "n_embd": 64, "n_head": 4, "rotary_dim": 8, "n_positions": 256}


def _phi3() -> dict[str, Any]:
    return {
        "model_type": "phi3",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "max_position_embeddings": 1024,
        "original_max_position_embeddings": 256,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
    }


def _qwen2_vl() -> dict[str, Any]:
    return {
        "model_type": "qwen2_vl",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    }


#: One config of each reading path (llama3 scaling, GPT-J's names, LongRoPE, M-RoPE); the
#: CLI's ``--hf-config`` matrix (``test_config_files``) writes the same dicts to files.
CONFIGS = {"llama": _llama, "gptj": _gptj, "phi3": _phi3, "qwen2_vl": _qwen2_vl}

for _name, _config in CONFIGS.items():
    fn(
        f"integrations.rotary_from_config[{_name}]",
        hf.rotary_from_config,
        (lambda c=_config: {"config": c()}),
    )
fn(
    "integrations.rope_layers[dict]",
    hf.rope_layers,
    lambda: {"config": {"model_type": "llama", "num_hidden_layers": 4}},  # the keys it reads
)


# --- comparisons over seeds: their specs, the t quantile, the record and its words ---------
def _study_record() -> dict[str, Any]:
    runs = [
        {"encoding": label, "seed": seed, "eval": {"8": {"ppl": p}, "16": {"ppl": 2 * p}}}
        for label, values in (("rope", (6.0, 6.2, 6.1)), ("alibi", (7.0, 7.3, 7.1)))
        for seed, p in enumerate(values)
    ]
    record: dict[str, Any] = {
        "task": "lm",
        "metric": "ppl",
        "train_len": 8,
        "eval_lens": [8, 16],
        "seeds": [0, 1, 2],
        "runs": runs,
    }
    record["summary"] = summarize(runs, [8, 16])
    return record


_ALIBI_ROPE = Comparison("alibi", "rope", "ppl", "all", expect="worse", source="X et al.")

fn(
    "experiments.Comparison",
    Comparison,
    lambda: {
        "a": "prope-0.75",
        "b": "rope",
        "metric": "ppl",
        "lengths": "past",
        "expect": "better",
        "b_metric": "ppl_past",
        "source": "Barbero et al. 2025",
    },
)
fn("experiments.t_quantile", t_quantile, lambda: {"p": 0.975, "df": 4})
fn("experiments.paired_verdict", paired_verdict, lambda: {"differences": [-1.0, -0.9, -1.2]})
fn(
    "experiments.compare",
    compare,
    lambda: {"results": _study_record(), "comparisons": [_ALIBI_ROPE]},
)
fn(
    "experiments.verdict",
    verdict,
    lambda: {
        "rows": compare(_study_record(), [_ALIBI_ROPE]),
        "comparisons": [_ALIBI_ROPE],
        "names": {"rope": "RoPE"},
    },
)
fn(
    "experiments.describe",
    describe,
    lambda: {"row": compare(_study_record(), [_ALIBI_ROPE])[0], "names": {"rope": "RoPE"}},
)
fn(
    "experiments.comparisons_record",
    comparisons_record,
    lambda: {"results": _study_record(), "comparisons": [_ALIBI_ROPE], "study": "prope"},
)
fn(
    "experiments.refresh_results",
    refresh_results,
    lambda: {"results": _study_record(), "study": "prope", "comparisons": [_ALIBI_ROPE]},
)
fn("experiments.check_results", check_results, lambda: {"results": _study_record(), "where": "r"})


def _results_file() -> str:
    path = Path(tempfile.mkdtemp()) / "results.json"
    path.write_text(json.dumps(_study_record()))
    return str(path)


fn("experiments.load_results", load_results, lambda: {"results": _results_file()})


# --- posenc extend's probes, the engines' spellings, the GGUF copy (issue 40) ---------------
from posenc.extend import emit as extend_emit  # noqa: E402
from posenc.extend import probes  # noqa: E402
from posenc.integrations import engines  # noqa: E402
from posenc.integrations.gguf_write import write_scaled_gguf  # noqa: E402

_YARN = {
    "rope_type": "yarn",
    "rope_theta": 100000.0,
    "factor": 2.0,
    "original_max_position_embeddings": 8192,
}


def _byte_tokenizer() -> Any:
    from tests.extend._tiny import byte_tokenizer

    return byte_tokenizer()


fn(
    "extend.probes.haystacks",
    probes.haystacks,
    lambda: {
        "tokenizer": _byte_tokenizer(),
        "filler": list(range(32, 120)) * 40,
        "length": 3000,
        "seed": 0,
        "tasks": ("passkey", "vartrack"),
        "count": 1,
        "depths": (0.1, 0.5, 0.9),
    },
    fixed=frozenset({"tokenizer"}),
)
# A model's output is free text (empty, or "bogus": score 0), and so is an answer ("x" is
# one): their types are checked in tests/extend/test_probes.py.
fn(
    "extend.probes.score",
    probes.score,
    lambda: {"output": " 1234567.", "answers": ["1234567"]},
    fixed=("output", "answers"),
)
fn("extend.probes.wilson", probes.wilson, lambda: {"mean": 0.5, "n": 8})
fn(
    "extend.probes.summarize",
    probes.summarize,
    lambda: {"rows": [{"task": "passkey", "score": 1.0}, {"task": "passkey", "score": 0.0}]},
)
fn(
    "integrations.engine_setting",
    engines.engine_setting,
    lambda: {
        "engine": "vllm",
        "rope_parameters": dict(_YARN),
        "trained": 8192,
        "target": 16384,
        "arch": "llama",
        "model": "SmolLM2",
    },
    # free text: any GGUF architecture name ("bogus" is one llama.cpp may add), any model
    # name; their rules (a name, no absolute path) are checked in test_engines.py
    fixed=("arch", "model"),
)
fn(
    "integrations.gguf_metadata",
    engines.gguf_metadata,
    lambda: {"rope_parameters": dict(_YARN), "trained": 8192, "target": 16384, "arch": "llama"},
    fixed=("arch",),  # as for engine_setting
)
fn(
    "extend.check_emit",
    extend_emit.check_emit,
    lambda: {"engines": ("vllm", "llama.cpp"), "scaling": "yarn", "is_gguf": True},
)


def _gguf_copy_paths() -> dict[str, Any]:
    from tests.extend._tiny import tiny_llama_gguf

    folder = Path(tempfile.mkdtemp())
    src = tiny_llama_gguf(folder / "tiny.gguf")
    return {
        "src": str(src),
        "dst": str(folder / "copy.gguf"),
        "metadata": {"llama.context_length": 1024},
    }


fn("integrations.write_scaled_gguf", write_scaled_gguf, _gguf_copy_paths)


# --- position maps (Self-Extend, STRING) and their attention ---------------------------------
def _rope_rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    enc = posenc.RotaryEmbedding(x.shape[-1])
    return enc.rotate_at(x, x, enc.rotation_at(positions, positions, dtype=torch.float32))[0]


fn("SelfExtend", posenc.SelfExtend, lambda: {"group_size": 2, "neighbor_window": 4})
fn("String", posenc.String, lambda: {"shift": 8, "local_window": 2})
fn(
    "position_map",
    posenc.position_map,
    lambda: {"spec": {"type": "string", "shift": 8, "local_window": 2}},
    positional=("spec",),
)
fn("SelfExtend.check_trained", posenc.SelfExtend(2, 4).check_trained, lambda: {"trained": 16})
fn("String.check_trained", posenc.String(8, 2).check_trained, lambda: {"trained": 16})
fn("remap.self_extend_for", posenc.remap.self_extend_for, lambda: {"trained": 16, "target": 64})
fn("remap.string_for", posenc.remap.string_for, lambda: {"trained": 16, "target": 64})
fn(
    "remap.remapped_attention",
    posenc.remap.remapped_attention,
    lambda: {
        "q": _r(1, 2, 5, 8),
        "k": _r(1, 2, 5, 8),
        "v": _r(1, 2, 5, 6),
        "rotate": _rope_rotate,
        "position_map": posenc.SelfExtend(2, 2),
        "q_positions": torch.arange(5),
        "k_positions": torch.arange(5),
        "scale": 0.3,
        "softcap": 5.0,
        "keep": torch.rand(1, 1, 5, 5) > 0.2,
        "backend": "chunked",
        "block": 2,
    },
    fixed=("rotate",),
)
fn(
    "attention[position_map]",
    posenc.attention,
    lambda: {
        "q": _r(1, 2, 5, 8),
        "k": _r(1, 1, 5, 8),
        "v": _r(1, 1, 5, 8),
        "encoding": "rope",
        "causal": True,
        "position_map": {"type": "self_extend", "group_size": 2, "neighbor_window": 2},
        "q_positions": torch.arange(5),
        "k_positions": torch.arange(5),
        "backend": "chunked",
    },
)


# --- the factor search (issue 41): its settings, LongRoPE's factors in a GGUF copy ------------
from posenc.extend.settings import ExtendSettings  # noqa: E402
from posenc.integrations.gguf_longrope import write_longrope_gguf  # noqa: E402

from ._targets import _gguf_path  # noqa: E402


def _longrope_copy() -> dict[str, Any]:
    paths = _gguf_copy_paths()
    scaling = {
        "type": "longrope",
        "short_factor": [1.0] * 4,
        "long_factor": [1.0, 1.25, 1.5, 2.0],
        "original_max_position": 512,
        "factor": 2.0,
    }
    return {"src": paths["src"], "dst": paths["dst"], "scaling": scaling, "target": 1024}


fn("integrations.write_longrope_gguf", write_longrope_gguf, _longrope_copy)
fn(
    "extend.ExtendSettings.from_options.search",
    ExtendSettings.from_options,
    lambda: {
        "model": _gguf_path(),
        "multiples": (1.0, 1.5),
        "search": 5.0,
        "search_length": 1.5,
        "search_population": 8,
    },
)
fn(
    "remap.remapped_attention[fused]",  # backend "auto" on the CPU: torch's flash kernel
    posenc.remap.remapped_attention,
    lambda: {
        "q": _r(1, 4, 5, 8),
        "k": _r(1, 2, 7, 8),
        "v": _r(1, 2, 7, 8),
        "rotate": _rope_rotate,
        "position_map": posenc.String(3, 1),
        "q_positions": torch.arange(2, 7),
        "k_positions": torch.arange(7),
        "keep": torch.rand(1, 4, 5, 7) > 0.2,
        "backend": "auto",
        "block": 2,
    },
    fixed=("rotate",),
)
