"""The valid calls the bad-input matrix mutates: one per public callable and module method.

Each :class:`Target` builds its callable and its arguments afresh for every case (a case may
mutate a tensor in place). ``positional`` names the arguments passed by position; ``fixed``
those the matrix leaves alone (callables, results of other calls).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

import posenc
from posenc import analysis, bias, models, plot, rotary
from posenc import positions as P
from posenc.integrations import spelling
from posenc.integrations import transformers as hf


@dataclass(frozen=True)
class Target:
    name: str
    make: Callable[[], tuple[Callable[..., Any], dict[str, Any]]]
    positional: tuple[str, ...] = ()
    fixed: frozenset[str] = frozenset()


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _qk() -> dict[str, Any]:
    return {"q": _r(1, 2, 3, 8), "k": _r(1, 2, 3, 8)}


TARGETS: list[Target] = []


def target(name: str, *, positional: tuple[str, ...] = (), fixed: tuple[str, ...] = ()):
    def deco(make: Callable[[], tuple[Callable[..., Any], dict[str, Any]]]):
        TARGETS.append(Target(name, make, positional, frozenset(fixed)))
        return make

    return deco


def fn(name: str, f: Callable[..., Any], args: Callable[[], dict[str, Any]], **kw: Any) -> None:
    target(name, **kw)(lambda: (f, args()))


# --- posenc top level: entry points -------------------------------------------------------
fn(
    "attention",
    posenc.attention,
    lambda: {
        **_qk(),
        "v": _r(1, 2, 3, 8),
        "encoding": "alibi",
        "causal": True,
        "q_positions": torch.arange(3),
        "k_positions": torch.arange(3),
    },
)
fn("build", posenc.build, lambda: {"spec": "rope", "head_dim": 8}, positional=("spec",))
fn(
    "build[config]",
    posenc.build,
    lambda: {"spec": {"name": "alibi", "num_heads": 4}},
    positional=("spec",),
)

# --- additive -----------------------------------------------------------------------------
fn(
    "sinusoidal_table",
    posenc.sinusoidal_table,
    lambda: {
        "positions": torch.arange(4),
        "dim": 8,
        "base": 10000.0,
        "layout": "interleaved",
        "dtype": torch.float32,
        "device": "cpu",
    },
)
fn(
    "sinusoidal_table_nd",
    posenc.sinusoidal_table_nd,
    lambda: {"grid": (2, 3), "dim": 8, "base": 10000.0, "dtype": torch.float32},
)
fn(
    "index_table",
    posenc.index_table,
    lambda: {
        "positions": torch.arange(4),
        "dim": 8,
        "normalize": "length",
        "length": 8,
        "dtype": torch.float32,
    },
)
fn("resample_table", posenc.resample_table, lambda: {"table": _r(6, 8), "size": 9})
fn(
    "resample_table[grid]",
    posenc.resample_table,
    lambda: {"table": _r(6, 8), "size": (3, 4), "grid": (2, 3)},
)
fn(
    "SinusoidalEmbedding",
    posenc.SinusoidalEmbedding,
    lambda: {"dim": 8, "base": 10000.0, "dropout": 0.0, "scale": 1.0, "layout": "interleaved"},
)
fn("IndexEmbedding", posenc.IndexEmbedding, lambda: {"dim": 8})
fn(
    "LearnedEmbedding",
    posenc.LearnedEmbedding,
    lambda: {
        "max_len": 16,
        "dim": 8,
        "num_prefix_tokens": 0,
        "dropout": 0.0,
        "init_std": 0.02,
        "device": "cpu",
        "dtype": torch.float32,
    },
)
fn(
    "LearnedEmbedding.from_table",
    posenc.LearnedEmbedding.from_table,
    lambda: {"table": _r(6, 8), "grid": (2, 3)},
)
fn("NoPositionalEncoding", posenc.NoPositionalEncoding, lambda: {})

for _name, _mod in {
    "SinusoidalEmbedding": lambda: posenc.SinusoidalEmbedding(8),
    "IndexEmbedding": lambda: posenc.IndexEmbedding(8),
    "LearnedEmbedding": lambda: posenc.LearnedEmbedding(16, 8),
    "NoPositionalEncoding": lambda: posenc.NoPositionalEncoding(),
}.items():
    target(f"{_name}.forward")(
        lambda m=_mod: (m(), {"x": _r(1, 4, 8), "positions": torch.arange(4), "offset": 1})
    )
    if _name != "NoPositionalEncoding":
        target(f"{_name}.table")(lambda m=_mod: (m().table, {"positions": torch.arange(4)}))
target("LearnedEmbedding.resample")(
    lambda: (posenc.LearnedEmbedding(16, 8).resample, {"new_len_or_grid": 24})
)

# --- rotary -------------------------------------------------------------------------------
fn(
    "rope_frequencies",
    posenc.rope_frequencies,
    lambda: {"dim": 8, "base": 10000.0, "scaling": {"type": "linear", "factor": 2.0}},
)
fn(
    "rope_frequencies[dynamic]",
    posenc.rope_frequencies,
    lambda: {
        "dim": 8,
        "scaling": {"type": "dynamic", "factor": 2.0, "max_position": 16},
        "seq_len": 32.0,
    },
)
fn(
    "rotary_cos_sin",
    posenc.rotary_cos_sin,
    lambda: {
        "positions": torch.arange(3),
        "inv_freq": rotary.rope_frequencies(8)[0],
        "attention_scale": 1.0,
        "dtype": torch.float32,
    },
)


def _cos_sin() -> dict[str, torch.Tensor]:
    cos, sin = posenc.rotary_cos_sin(torch.arange(3), rotary.rope_frequencies(8)[0])
    return {"cos": cos, "sin": sin}


fn(
    "apply_rotary",
    posenc.apply_rotary,
    lambda: {"x": _r(1, 2, 3, 8), **_cos_sin(), "layout": "half", "rotary_dim": 8, "seq_dim": -2},
)
fn(
    "xpos_scale",
    posenc.xpos_scale,
    lambda: {"positions": torch.arange(3), "rotary_dim": 8, "scale_base": 512.0},
)
fn("axial_frequencies", posenc.axial_frequencies, lambda: {"axis_dims": (4, 4), "base": 100.0})
fn(
    "layout_permutation",
    rotary.layout_permutation,
    lambda: {"head_dim": 8, "source": "half", "target": "interleaved", "rotary_dim": 8},
)
fn(
    "permute_qk_weight",
    rotary.permute_qk_weight,
    lambda: {
        "weight": _r(16, 4),
        "num_heads": 2,
        "source": "half",
        "target": "interleaved",
        "dim": 0,
    },
)
fn("parse_scaling", rotary.parse_scaling, lambda: {"scaling": {"type": "ntk", "factor": 2.0}})
fn("LinearScaling", rotary.LinearScaling, lambda: {"factor": 2.0})
fn("NTKScaling", rotary.NTKScaling, lambda: {"factor": 2.0})
fn("DynamicScaling", rotary.DynamicScaling, lambda: {"factor": 2.0, "max_position": 16})
fn(
    "YarnScaling",
    rotary.YarnScaling,
    lambda: {"factor": 2.0, "original_max_position": 16, "beta_fast": 32.0, "beta_slow": 1.0},
)
fn(
    "Llama3Scaling",
    rotary.Llama3Scaling,
    lambda: {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position": 16,
    },
)
fn(
    "LongRopeScaling",
    rotary.LongRopeScaling,
    lambda: {
        "short_factor": (1.0, 1.0),
        "long_factor": (2.0, 2.0),
        "original_max_position": 16,
        "max_position": 32,
    },
)
fn(
    "RotaryEmbedding",
    posenc.RotaryEmbedding,
    lambda: {
        "head_dim": 8,
        "base": 10000.0,
        "rotary_dim": 8,
        "layout": "half",
        "scaling": {"type": "linear", "factor": 2.0},
    },
)
fn(
    "XPosEmbedding",
    posenc.XPosEmbedding,
    lambda: {"head_dim": 8, "scale_base": 512.0, "base": 10000.0, "layout": "half"},
)
fn(
    "MultimodalRotaryEmbedding",
    posenc.MultimodalRotaryEmbedding,
    lambda: {"head_dim": 8, "sections": (2, 1, 1), "base": 10000.0},
)
fn(
    "AxialRotaryEmbedding",
    posenc.AxialRotaryEmbedding,
    lambda: {"head_dim": 8, "n_axes": 2, "base": 10000.0, "axis_dims": (4, 4)},
)

_ROTARY = {
    "RotaryEmbedding": (lambda: posenc.RotaryEmbedding(8), lambda s: torch.arange(s)),
    "XPosEmbedding": (lambda: posenc.XPosEmbedding(8), lambda s: torch.arange(s)),
    "MultimodalRotaryEmbedding": (
        lambda: posenc.MultimodalRotaryEmbedding(8, (2, 1, 1)),
        lambda s: torch.arange(s)[:, None].expand(s, 3).clone(),
    ),
    "AxialRotaryEmbedding": (
        lambda: posenc.AxialRotaryEmbedding(8, 2),
        lambda s: torch.arange(s)[:, None].expand(s, 2).clone(),
    ),
}
for _name, (_mod, _pos) in _ROTARY.items():
    target(f"{_name}.forward")(
        lambda m=_mod, p=_pos: (
            m(),
            {**_qk(), "q_positions": p(3), "k_positions": p(3), "seq_dim": -2},
        )
    )
    target(f"{_name}.cos_sin")(
        lambda m=_mod, p=_pos: (m().cos_sin, {"positions": p(3), "dtype": torch.float32})
    )
    target(f"{_name}.rotation")(
        lambda m=_mod, p=_pos: (
            m().rotation,
            {
                "q_len": 3,
                "k_len": 3,
                "q_positions": p(3),
                "k_positions": p(3),
                "batch": 1,
                "device": "cpu",
                "dtype": torch.float32,
            },
        )
    )

    def _rotate(m=_mod):
        mod = m()
        rot = mod.rotation(3)
        return mod.rotate, {**_qk(), "rotation": rot, "seq_dim": -2}

    target(f"{_name}.rotate", fixed=("rotation",))(_rotate)

# --- bias ---------------------------------------------------------------------------------
_pq = lambda: {"q_positions": torch.arange(3), "k_positions": torch.arange(3)}  # noqa: E731
fn("alibi_slopes", posenc.alibi_slopes, lambda: {"num_heads": 4})
fn(
    "alibi_bias",
    posenc.alibi_bias,
    lambda: {**_pq(), "slopes": posenc.alibi_slopes(2), "causal": True},
)
fn(
    "t5_relative_bucket",
    posenc.t5_relative_bucket,
    lambda: {
        "relative_position": torch.arange(-3, 4),
        "causal": False,
        "num_buckets": 8,
        "max_distance": 16,
    },
)
fn(
    "t5_relative_bias",
    posenc.t5_relative_bias,
    lambda: {**_pq(), "table": _r(32, 2), "causal": False, "max_distance": 16},
)
fn(
    "shaw_relative_logits",
    posenc.shaw_relative_logits,
    lambda: {"q": _r(1, 2, 3, 8), "table": _r(9, 8), **_pq()},
)
fn(
    "shaw_relative_values",
    posenc.shaw_relative_values,
    lambda: {"probs": torch.rand(1, 2, 3, 3), "table": _r(9, 8), **_pq()},
)
fn(
    "kerple_bias",
    posenc.kerple_bias,
    lambda: {**_pq(), "r1": torch.rand(2) + 0.1, "r2": torch.rand(2) + 0.1},
)
fn(
    "fire_bias",
    posenc.fire_bias,
    lambda: {**_pq(), "mlp": posenc.FIREBias(2).mlp, "c": 0.1, "threshold": 512.0, "eps": 1e-6},
    fixed=("mlp",),
)
fn(
    "fire_normalized_distance",
    bias.fire_normalized_distance,
    lambda: {**_pq(), "c": 0.1, "threshold": 512.0, "eps": 1e-6},
)

_BIAS = {
    "ALiBiBias": (
        posenc.ALiBiBias,
        {"num_heads": 2, "causal": True, "slopes": (0.5, 0.25), "device": "cpu"},
    ),
    "T5RelativeBias": (
        posenc.T5RelativeBias,
        {
            "num_heads": 2,
            "num_buckets": 8,
            "max_distance": 16,
            "causal": True,
            "device": "cpu",
            "dtype": torch.float32,
        },
    ),
    "ShawRelativeBias": (
        posenc.ShawRelativeBias,
        {
            "num_heads": 2,
            "head_dim": 8,
            "max_distance": 4,
            "values": True,
            "device": "cpu",
            "dtype": torch.float32,
        },
    ),
    "FIREBias": (
        posenc.FIREBias,
        {
            "num_heads": 2,
            "mlp_width": 8,
            "init_c": 0.1,
            "init_threshold": 512.0,
            "eps": 1e-6,
            "device": "cpu",
            "dtype": torch.float32,
        },
    ),
    "KerpleBias": (
        posenc.KerpleBias,
        {"num_heads": 2, "eps": 0.01, "device": "cpu", "dtype": torch.float32},
    ),
}
for _name, (_cls, _kw) in _BIAS.items():
    fn(_name, _cls, lambda kw=_kw: dict(kw))
    _small = lambda c=_cls, kw=_kw: c(**{k: v for k, v in kw.items() if k != "device"})  # noqa: E731
    _bargs = {
        "q_len": 3,
        "k_len": 3,
        "q_positions": torch.arange(3),
        "k_positions": torch.arange(3),
    }
    if _name == "ShawRelativeBias":
        target(f"{_name}.bias")(
            lambda m=_small: (m().bias, {"q_len": 3, "k_len": 3, **_pq(), "q": _r(1, 2, 3, 8)})
        )
        target(f"{_name}.value_bias")(
            lambda m=_small: (m().value_bias, {"probs": torch.rand(1, 2, 3, 3), **_pq()})
        )
    else:
        target(f"{_name}.bias")(lambda m=_small: (m().bias, {"q_len": 3, "k_len": 3, **_pq()}))
        target(f"{_name}.score_mod")(lambda m=_small: (m().score_mod, _pq()))
target("T5RelativeBias.buckets")(
    lambda: (posenc.T5RelativeBias(2).buckets, {"q_len": 3, "k_len": 3, **_pq()})
)
# --- positions ----------------------------------------------------------------------------
fn(
    "positions.arange",
    P.arange,
    lambda: {"seq_len": 4, "offset": 2, "device": "cpu", "dtype": torch.int64},
)
fn("positions.as_tensor", P.as_tensor, lambda: {"positions": torch.arange(4), "device": "cpu"})
fn("positions.from_seq_lens", P.from_seq_lens, lambda: {"seq_lens": [3, 2]})
fn("positions.from_cu_seqlens", P.from_cu_seqlens, lambda: {"cu_seqlens": [0, 3, 5]})
fn(
    "positions.from_attention_mask",
    P.from_attention_mask,
    lambda: {"mask": torch.tensor([[0, 1, 1], [1, 1, 1]])},
)
fn("positions.grid", P.grid, lambda: {"shape": (2, 3), "device": "cpu"})
fn(
    "positions.randomized",
    P.randomized,
    lambda: {"seq_len": 3, "max_len": 8, "batch_size": 2, "device": "cpu"},
)
fn(
    "positions.resolve",
    P.resolve,
    lambda: {"positions": torch.arange(4), "seq_len": 4, "offset": 1, "batch": 2, "device": "cpu"},
)
fn(
    "positions.resolve_pair",
    P.resolve_pair,
    lambda: {"q_len": 3, "k_len": 3, **_pq(), "batch": 1, "device": "cpu"},
)

# --- analysis and plots -------------------------------------------------------------------
fn(
    "analysis.boundedness",
    analysis.boundedness,
    lambda: {"encoding": "sinusoidal", "positions": 16, "dtype": torch.float32},
)
fn(
    "analysis.uniqueness",
    analysis.uniqueness,
    lambda: {
        "encoding": "sinusoidal",
        "positions": 16,
        "dtype": torch.float32,
        "rtol": 1e-4,
        "max_examples": 4,
    },
)
fn(
    "analysis.uniqueness[position_dtype]",
    analysis.uniqueness,
    lambda: {"encoding": "sinusoidal", "positions": 16, "position_dtype": torch.float32},
)
fn(
    "analysis.shift_structure",
    analysis.shift_structure,
    lambda: {"encoding": "rope", "positions": 16, "offsets": [1, 2], "tol": 1e-4},
)
fn(
    "analysis.decay",
    analysis.decay,
    lambda: {"encoding": "alibi", "max_distance": 16, "anchors": 2},
)
fn(
    "analysis.properties",
    analysis.properties,
    lambda: {"encoding": "alibi", "positions": 16, "shift_positions": 8, "max_distance": 8},
)
fn("analysis.resolve_encoding", analysis.resolve_encoding, lambda: {"encoding": "rope"})
fn(
    "analysis.roformer_bound",
    analysis.roformer_bound,
    lambda: {"inv_freq": rotary.rope_frequencies(8)[0].float(), "distances": torch.arange(4)},
)
fn(
    "analysis.order_sensitivity",
    analysis.order_sensitivity,
    lambda: {"dim": 8, "num_heads": 2, "swamp_position": 10, "seed": 0},
)
fn(
    "plot.plot_table",
    plot.plot_table,
    lambda: {"encoding": "sinusoidal", "positions": 8, "figsize": (3.0, 2.0), "dpi": 20},
)
fn(
    "plot.plot_similarity",
    plot.plot_similarity,
    lambda: {"encoding": "rope", "positions": 8, "figsize": (3.0, 2.0), "dpi": 20},
)
fn(
    "plot.plot_decay",
    plot.plot_decay,
    lambda: {"encodings": ["alibi"], "max_distance": 8, "figsize": (3.0, 2.0), "dpi": 20},
)
fn(
    "plot.plot_bias",
    plot.plot_bias,
    lambda: {"encoding": "alibi", "positions": 8, "max_heads": 2, "figsize": (3.0, 2.0), "dpi": 20},
)
fn(
    "plot.plot_clock_hands",
    plot.plot_clock_hands,
    lambda: {
        "encoding": "rope",
        "positions": 8,
        "frequencies": [0, 1],
        "figsize": (3.0, 2.0),
        "dpi": 20,
    },
)


def _fig():
    return plot.plot_table("sinusoidal", 4, figsize=(2.0, 2.0), dpi=10)


fn("plot.figure_bytes", plot.figure_bytes, lambda: {"fig": _fig(), "format": "png"})

# --- integrations -------------------------------------------------------------------------
fn(
    "integrations.scaling_from_transformers",
    hf.scaling_from_transformers,
    lambda: {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
)
fn(
    "integrations.spelling.to_rope_parameters",
    spelling.to_rope_parameters,
    lambda: {
        "scaling": {"type": "ntk", "factor": 2.0},
        "base": 10000.0,
        "rotary_dim": 8,
        "partial_rotary_factor": 0.5,
    },
)
fn(
    "integrations.spelling.transformers_spelling",
    spelling.transformers_spelling,
    lambda: {"scaling": {"type": "yarn", "factor": 2.0, "original_max_position": 64}},
)
fn(
    "integrations.spelling.config_max_position",
    spelling.config_max_position,
    lambda: {"scaling": {"type": "dynamic", "factor": 2.0, "max_position": 64}},
)


def _hf_config():
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=4)


fn(
    "integrations.rotary_from_config",
    hf.rotary_from_config,
    lambda: {"config": _hf_config(), "layout": "half"},
)

fn(
    "integrations.rope_layer_types",
    hf.rope_layer_types,
    lambda: {"config": _hf_config()},  # an object: a dict may hold any other keys
)


def _hf_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=32,
            hidden_size=32,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=4,
        )
    )


fn(
    "integrations.patch",
    hf.patch,
    lambda: {"model": _hf_model(), "scaling": {"type": "linear", "factor": 2.0}},
)
fn("integrations.unpatch", hf.unpatch, lambda: {"model": hf.patch(_hf_model())})


def _llama4_config():
    from transformers import Llama4TextConfig

    return Llama4TextConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=4
    )


def _deepseek_config():
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        rope_scaling={
            "type": "yarn",
            "factor": 40.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096,
        },
        max_position_embeddings=163840,
    )


fn(
    "integrations.query_scale_from_config",
    hf.query_scale_from_config,
    lambda: {"config": _llama4_config(), "layer_idx": 3},
)
fn("integrations.rope_layers", hf.rope_layers, lambda: {"config": _llama4_config()})
fn(
    "integrations.softmax_scale_factor",
    hf.softmax_scale_factor,
    lambda: {"config": _deepseek_config()},
)
fn("integrations.QueryScale", hf.QueryScale, lambda: {"beta": 0.1, "length": 8.0, "offset": 1.0})
fn(
    "rotary.rotated_frequencies",
    rotary.rotated_frequencies,
    lambda: {
        "head_dim": 16,
        "rotary_dim": 8,
        "base": 1e4,
        "scaling": {"type": "proportional", "factor": 2.0},
    },
)

# --- models -------------------------------------------------------------------------------
fn(
    "models.TinyTransformer",
    models.TinyTransformer,
    lambda: {
        "vocab_size": 11,
        "dim": 16,
        "num_layers": 1,
        "num_heads": 2,
        "encoding": "rope",
        "causal": True,
        "mlp_ratio": 2,
        "dropout": 0.0,
        "max_len": 16,
    },
)


def _tiny() -> models.TinyTransformer:
    return models.TinyTransformer(11, dim=16, num_layers=1, num_heads=2, encoding="rope")


target("models.TinyTransformer.forward")(
    lambda: (
        _tiny(),
        {
            "tokens": torch.randint(0, 11, (1, 4)),
            "positions": torch.arange(4),
            "attn_mask": torch.ones(1, 4, dtype=torch.bool),
        },
    )
)
target("models.TinyTransformer.generate")(
    lambda: (
        _tiny().generate,
        {"tokens": torch.randint(0, 11, (1, 3)), "max_new_tokens": 2, "use_cache": True},
    )
)
target("models.TinyTransformer.from_config")(
    lambda: (models.TinyTransformer.from_config, {"config": _tiny().to_config()})
)


# --- posenc extend: its settings (the model itself is checked when it loads) -----------------
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from posenc.extend.settings import ExtendSettings  # noqa: E402


def _gguf_path() -> str:
    path = Path(tempfile.gettempdir()) / "posenc-bad-inputs-model.gguf"
    path.touch()
    return str(path)


fn(
    "extend.ExtendSettings.from_options",
    ExtendSettings.from_options,
    lambda: {
        "model": _gguf_path(),
        "to": 2.0,
        "multiples": (1.0, 1.5),
        "scalings": ("none", "yarn"),
        "documents": 2,
        "depths": (0.5,),
        "trials": 1,
        "tasks": ("passkey", "vartrack"),
        "seed": 0,
        "bar": 0.9,
        "ppl_tolerance": 0.1,
        "emit": ("vllm", "llama.cpp"),
        "scaling": "yarn",
        "dtype": "float32",
        "context": 512,
    },
)


# --- GGUF metadata (a header-only file written with the gguf package) ------------------------
from posenc.integrations import gguf as gg  # noqa: E402


def _gguf_file() -> str:
    import gguf

    path = str(Path(tempfile.mkdtemp()) / "tiny.gguf")
    writer = gguf.GGUFWriter(path, "gemma3")
    writer.add_context_length(4096)
    writer.add_block_count(6)
    writer.add_embedding_length(256)
    writer.add_head_count(4)
    writer.add_key_length(64)
    writer.add_rope_freq_base(1e6)
    writer.add_sliding_window(512)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


fn(
    "integrations.rotary_from_gguf",
    gg.rotary_from_gguf,
    lambda: {"path_or_reader": _gguf_file(), "layer": 5, "layout_for": "transformers"},
)
fn("integrations.gguf_layer_types", gg.gguf_layer_types, lambda: {"path_or_reader": _gguf_file()})
fn(
    "integrations.gguf_rope_metadata",
    gg.gguf_rope_metadata,
    lambda: {"path_or_reader": _gguf_file()},
)
