"""MaxText, Gemma (JAX) and mlx-lm run once against posenc's golden vectors (not CI): each
implementation's own code, through :mod:`posenc.conformance` adapters, on every case of its
operation whose convention it claims.

    PYTHONPATH=src .cache/conf-venv-extra/bin/python benchmarks/conformance_once.py \\
        --maxtext .cache/maxtext-src/src

These three are not CI peers: MaxText 0.2.5 and Gemma 4.x need Python >= 3.12 (this project
runs 3.11), and mlx is built for Apple silicon first. How each ran here (:data:`SOURCES`):

- **MaxText**: its ``maxtext`` package imported from a checkout's ``src/`` at
  :data:`MAXTEXT_COMMIT` (``--maxtext DIR``: the ``src`` folder; the files are MaxText's,
  unchanged), in a Python 3.11 venv with what ``maxtext.layers.embeddings`` imports
  (``flax``, ``qwix``, ``aqtp``, ``pathwaysutils``, ``omegaconf``, names from MaxText's
  ``requirements.txt``). Its layers are built as MaxText's attention builds them
  (``maxtext/layers/attentions.py``): ``RotaryEmbedding`` (default and ``rope_linear_scaling_
  factor``), ``PartialRotaryEmbedding`` (leading channels), ``LLaMARotaryEmbedding`` (Llama
  3.1, adjacent pairs), ``YarnRotaryEmbedding`` (``attention_scaling=True``, so that its
  scale multiplies the output as the case's does cos and sin), and ``PositionalEmbedding``.
- **Gemma**: ``gemma.gm.math.apply_rope`` of the installed ``gemma`` 3.3.0 (the last release
  for Python 3.11; its ``_positional_embeddings.py`` equals that of v4.0.1 but for the
  copyright year), JAX 0.10.2 on the CPU.
- **mlx-lm**: the installed ``mlx`` 0.32.4 (its Linux CPU build, ``mlx[cpu]``) and
  ``mlx-lm`` 0.32.2: ``mlx_lm.models.rope_utils.initialize_rope`` turns the scaling into
  its layer (``nn.RoPE``, ``Llama3RoPE``, ``YarnRoPE``, ``SuScaledRoPE``,
  ``DynamicNTKScalingRoPE``, ``ProportionalRoPE``), which calls ``mx.fast.rope``. Each
  position is one batch row with its own ``offset`` (``mx.fast.rope`` takes an offset per
  batch row); ``DynamicNTKScalingRoPE``, whose base depends on ``offset + length``, gets one
  prefill of ``max(positions) + 1`` rows with the case's rows placed at their positions.

The venv (``.cache/conf-venv-extra``, Python 3.11), made once:

    python3 -m venv .cache/conf-venv-extra
    .cache/conf-venv-extra/bin/pip install "jax[cpu]" gemma==3.3.0 "mlx[cpu]==0.32.4" \\
        mlx-lm==0.32.2 qwix aqtp "pathwaysutils>=0.1.11" omegaconf

No adapter moves, pads or permutes a channel or rescales an output: what each returns is
what the implementation computed, cast to NumPy. The JSON (``benchmarks/conformance_once.json``)
holds the command, the date, every version and commit, and every case's result; the script
prints posenc's report table and a summary per implementation.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

OUT = Path(__file__).parent / "conformance_once.json"

MAXTEXT_REPO = "AI-Hypercomputer/maxtext"
MAXTEXT_COMMIT = "e591f30cbbf217ed67ef71263ec0538239f9c3b8"  # 2026-08-22, after maxtext-v0.2.4
GEMMA_REPO = "google-deepmind/gemma"
MLX_LM_REPO = "ml-explore/mlx-lm"

#: implementation -> how it ran here (filled in with versions by :func:`versions`).
SOURCES: dict[str, str] = {
    "MaxText": "checked once from fetched source: maxtext@{maxtext} (src/maxtext, unchanged)",
    "Gemma": "installed gemma {gemma} (gemma.gm.math.apply_rope)",
    "mlx-lm": "installed mlx {mlx}, mlx-lm {mlx_lm} (mx.fast.rope, CPU build)",
}

Fn = Callable[..., Any]


def _kind(scaling: Mapping[str, Any] | None) -> str:
    return "default" if not scaling else str(scaling.get("type", "default"))


def _jax_qk(q: np.ndarray, k: np.ndarray, positions: np.ndarray, dtype: Any):
    """``q``, ``k`` ``[seq, heads, dim]`` as JAX ``[1, seq, heads, dim]`` in ``dtype``, and
    the positions ``[1, seq]`` int32 (JAX's default integer; every case position fits)."""
    import jax.numpy as jnp

    pos = jnp.asarray(np.asarray(positions, dtype=np.int32))[None]
    return jnp.asarray(q, dtype=dtype)[None], jnp.asarray(k, dtype=dtype)[None], pos


def _to_numpy(x: Any) -> np.ndarray:
    """A JAX array (any float dtype) as float32 NumPy, dropping the batch axis of 1."""
    import jax.numpy as jnp

    return np.asarray(jnp.asarray(x).astype(jnp.float32))[0]


# --- MaxText ---------------------------------------------------------------------------------


def maxtext_adapters(source: str) -> list[Any]:
    """MaxText's ``PositionalEmbedding`` (float32 and bf16 output), its half-pair rotations
    (float32 and bf16 inputs) and its adjacent-pair rotations (``LLaMARotaryEmbedding``,
    ``YarnRotaryEmbedding(interleave=True)``)."""
    import jax.numpy as jnp
    from maxtext.layers import embeddings as emb

    from posenc.conformance import Adapter, Unsupported

    def table(fprop: Any) -> Fn:
        def fn(positions: np.ndarray, dim: int, *, base: float) -> np.ndarray:
            layer = emb.PositionalEmbedding(
                embedding_dims=dim,
                max_wavelength=base,
                cast_as_fprop_dtype=fprop is not None,
                fprop_dtype=fprop if fprop is not None else jnp.bfloat16,
            )
            pos = jnp.asarray(np.asarray(positions, dtype=np.int32))
            out = np.asarray(layer(len(positions), pos).astype(jnp.float32))
            if out.shape[-1] != dim:
                raise Unsupported(
                    f"PositionalEmbedding returns 2 * (dim // 2) = {out.shape[-1]} channels "
                    f"for dim {dim}: no zero channel for an odd dim"
                )
            return out

        return fn

    def half(dtype: Any) -> Fn:
        def fn(q, k, positions, *, base, scaling, rotary_dim):
            kind, head = _kind(scaling), q.shape[-1]
            common = {"min_timescale": 1, "max_timescale": base, "mesh": None}
            cast = {"cast_as_fprop_dtype": True, "fprop_dtype": dtype}
            if kind in ("default", "linear") and rotary_dim == head:
                factor = scaling["factor"] if kind == "linear" else 1.0
                layer = emb.RotaryEmbedding(
                    **common, embedding_dims=head, rope_linear_scaling_factor=factor, **cast
                )
            elif kind == "default":
                layer = emb.PartialRotaryEmbedding(
                    **common, embedding_dims=head, partial_rotary_factor=rotary_dim / head, **cast
                )
            elif kind == "yarn" and rotary_dim == head:
                layer = _maxtext_yarn(emb, positions, base, scaling, head, dtype, interleave=False)
            elif kind == "llama3":
                raise Unsupported(
                    "MaxText's Llama 3.1 scaling is LLaMARotaryEmbedding, which pairs adjacent "
                    "channels (the interleaved adapter)"
                )
            elif kind == "proportional":
                raise Unsupported("Gemma4PartialRotaryEmbedding (MaxText's p-RoPE) takes no factor")
            elif kind in ("linear", "yarn"):
                raise Unsupported(f"MaxText has no partial rotation with {kind} scaling")
            else:
                raise Unsupported(
                    f"MaxText has no {kind!r} scaling (rope_type: default, llama3.1, yarn)"
                )
            xq, xk, pos = _jax_qk(q, k, positions, dtype)
            return _to_numpy(layer(xq, pos)), _to_numpy(layer(xk, pos))

        return fn

    def adjacent(q, k, positions, *, base, scaling, rotary_dim):
        kind, head = _kind(scaling), q.shape[-1]
        if rotary_dim != head:
            raise Unsupported("MaxText's adjacent-pair rotations rotate every channel")
        if kind in ("default", "llama3"):
            if kind == "llama3" and any(
                scaling[key] != want
                for key, want in (
                    ("factor", 8.0),
                    ("low_freq_factor", 1.0),
                    ("high_freq_factor", 4.0),
                    ("original_max_position", 8192),
                )
            ):
                raise Unsupported("LLaMARotaryEmbedding's Llama 3.1 parameters are fixed")
            layer = emb.LLaMARotaryEmbedding(
                min_timescale=1,
                max_timescale=base,
                mesh=None,
                embedding_dims=head,
                fprop_dtype=jnp.float32,
                use_scale=kind == "llama3",
            )
        elif kind == "yarn":
            layer = _maxtext_yarn(emb, positions, base, scaling, head, jnp.float32, interleave=True)
        else:
            raise Unsupported(f"MaxText has no adjacent-pair rotation with {kind!r} scaling")
        xq, xk, pos = _jax_qk(q, k, positions, jnp.float32)
        return _to_numpy(layer(xq, pos)), _to_numpy(layer(xk, pos))

    return [
        Adapter(
            "MaxText PositionalEmbedding",
            "table",
            "sinusoidal",
            table(None),
            convention={"layout": "flax"},
            dtype="float32",
            source=source,
        ),
        Adapter(
            "MaxText PositionalEmbedding (bf16 output)",
            "table",
            "sinusoidal",
            table(jnp.bfloat16),
            convention={"layout": "flax"},
            dtype="bfloat16",
            source=source,
        ),
        Adapter(
            "MaxText RotaryEmbedding",
            "rotate",
            "rope",
            half(jnp.float32),
            convention={"layout": "half"},
            dtype="float32",
            source=source,
        ),
        Adapter(
            "MaxText RotaryEmbedding (bf16)",
            "rotate",
            "rope",
            half(jnp.bfloat16),
            convention={"layout": "half"},
            dtype="bfloat16",
            source=source,
        ),
        Adapter(
            "MaxText LLaMARotaryEmbedding / YaRN (interleave=True)",
            "rotate",
            "rope",
            adjacent,
            convention={"layout": "interleaved"},
            dtype="float32",
            source=source,
        ),
    ]


def _maxtext_yarn(emb, positions, base, scaling, head, dtype, *, interleave: bool):
    """MaxText's ``YarnRotaryEmbedding`` for posenc's YaRN parameters (MaxText's own
    defaults for the rest: beta_fast 32, beta_slow 1, truncate), its table long enough for
    the case's positions."""
    from posenc.conformance import Unsupported

    extra = set(scaling) - {"type", "factor", "original_max_position"}
    if extra:
        raise Unsupported(f"MaxText's YaRN takes no {sorted(extra)}")
    return emb.YarnRotaryEmbedding(
        embedding_dims=head,
        mesh=None,
        max_position_embeddings=int(np.max(positions)) + 1,
        original_max_position_embeddings=scaling["original_max_position"],
        rope_theta=base,
        rope_factor=scaling["factor"],
        cast_as_fprop_dtype=True,
        fprop_dtype=dtype,
        interleave=interleave,
        truncate=True,
        attention_scaling=True,
    )


# --- Gemma -----------------------------------------------------------------------------------


def gemma_adapters(source: str) -> list[Any]:
    """Gemma's ``apply_rope`` with float32 and bf16 inputs."""
    import jax.numpy as jnp
    from gemma.gm.math import apply_rope

    from posenc.conformance import Adapter, Unsupported

    def rotate(dtype: Any) -> Fn:
        def fn(q, k, positions, *, base, scaling, rotary_dim):
            kind, head = _kind(scaling), q.shape[-1]
            if kind not in ("default", "linear", "proportional"):
                raise Unsupported(f"Gemma's apply_rope has no {kind!r} scaling (linear only)")
            if kind != "proportional" and rotary_dim != head:
                raise Unsupported(
                    "Gemma's partial rotation is p-RoPE (rope_proportion), not leading channels"
                )
            options = {
                "base_frequency": base,
                "scale_factor": (scaling or {}).get("factor", 1.0),
                "rope_proportion": rotary_dim / head,
            }
            xq, xk, pos = _jax_qk(q, k, positions, dtype)
            return (
                _to_numpy(apply_rope(xq, pos, **options)),
                _to_numpy(apply_rope(xk, pos, **options)),
            )

        return fn

    return [
        Adapter(
            "Gemma apply_rope",
            "rotate",
            "rope",
            rotate(jnp.float32),
            convention={"layout": "half"},
            dtype="float32",
            source=source,
        ),
        Adapter(
            "Gemma apply_rope (bf16)",
            "rotate",
            "rope",
            rotate(jnp.bfloat16),
            convention={"layout": "half"},
            dtype="bfloat16",
            source=source,
        ),
    ]


# --- mlx-lm ----------------------------------------------------------------------------------

#: posenc's scaling keys -> the transformers-style keys ``initialize_rope`` reads.
_MLX_KEYS = {
    "factor": "factor",
    "original_max_position": "original_max_position_embeddings",
    "low_freq_factor": "low_freq_factor",
    "high_freq_factor": "high_freq_factor",
    "beta_fast": "beta_fast",
    "beta_slow": "beta_slow",
    "mscale": "mscale",
    "mscale_all_dim": "mscale_all_dim",
    "short_factor": "short_factor",
    "long_factor": "long_factor",
}


def _mlx_layer(rope_utils, scaling, head: int, rotary_dim: int, base: float, traditional: bool):
    """mlx-lm's layer for posenc's ``scaling``, built by ``initialize_rope`` from the
    transformers-style config a model's ``config.json`` would hold."""
    from posenc.conformance import Unsupported

    kind = _kind(scaling)
    if kind == "ntk":
        raise Unsupported("mlx-lm has no static NTK scaling (its 'dynamic' is dynamic NTK)")
    s = dict(scaling or {})
    config: dict[str, Any] | None = None
    max_position = s.get("max_position")
    if kind != "default":
        config = {"rope_type": kind}
        for key, value in s.items():
            if key in ("type", "max_position"):
                continue
            if key not in _MLX_KEYS:
                raise Unsupported(f"mlx-lm's {kind} takes no {key!r}")
            config[_MLX_KEYS[key]] = value
    dims = rotary_dim
    if kind == "proportional":
        config = {**(config or {}), "partial_rotary_factor": rotary_dim / head}
        dims = head
    elif kind == "yarn" and max_position is None:
        max_position = 4096  # initialize_rope passes it on; YaRN's frequencies do not read it
    return rope_utils.initialize_rope(dims, base, traditional, config, max_position)


def mlx_adapters(source: str) -> list[Any]:
    """mlx-lm's ropes (``mx.fast.rope``), both pairings in float32, and halves in bf16."""
    import mlx.core as mx
    from mlx_lm.models import rope_utils

    from posenc.conformance import Adapter

    def rotate(traditional: bool, dtype: Any) -> Fn:
        def fn(q, k, positions, *, base, scaling, rotary_dim):
            layer = _mlx_layer(rope_utils, scaling, q.shape[-1], rotary_dim, base, traditional)
            return _mlx_apply(mx, layer, q, dtype, positions), _mlx_apply(
                mx, layer, k, dtype, positions
            )

        return fn

    adapters = []
    for traditional, layout, dtype, name in (
        (False, "half", "float32", "mlx-lm rope (traditional=False)"),
        (True, "interleaved", "float32", "mlx-lm rope (traditional=True)"),
        (False, "half", "bfloat16", "mlx-lm rope (traditional=False, bf16)"),
    ):
        adapters.append(
            Adapter(
                name,
                "rotate",
                "rope",
                rotate(traditional, getattr(mx, dtype)),
                convention={"layout": layout},
                dtype=dtype,
                source=source,
            )
        )
    return adapters


def _mlx_apply(mx, layer, x: np.ndarray, dtype: Any, positions: np.ndarray) -> np.ndarray:
    """``layer`` on ``x [seq, heads, dim]`` at ``positions``: each row its own batch entry
    ``[seq, heads, 1, dim]`` with ``offset = positions``, or (dynamic NTK, whose base reads
    the length) one prefill ``[1, heads, max + 1, dim]`` holding the rows at their
    positions."""
    from mlx_lm.models.rope_utils import DynamicNTKScalingRoPE

    if isinstance(layer, DynamicNTKScalingRoPE):
        top = int(np.max(positions)) + 1
        full = np.zeros((1, x.shape[1], top, x.shape[2]), dtype=np.float32)
        full[0, :, positions, :] = x
        out = layer(mx.array(full).astype(dtype), offset=0).astype(mx.float32)
        got = np.asarray(out)[0]  # [heads, top, dim]
        return np.transpose(got[:, positions, :], (1, 0, 2))
    rows = mx.array(x.astype(np.float32)).astype(dtype)[:, :, None, :]
    offset = mx.array(np.asarray(positions, dtype=np.int32))
    out = layer(rows, offset=offset).astype(mx.float32)
    return np.asarray(out)[:, :, 0, :]


# --- what the check leaves unnamed, measured ---------------------------------------------------

Alt = dict[str, np.ndarray]


def _qk_rotated(case: Any, *, layout: str, seq_len: int | None = None):
    """The case's q and k rotated by :mod:`posenc.reference` with one convention changed
    (the pairs placed as the case places them)."""
    from posenc import reference
    from posenc.conformance._rotary import rotated_frequencies

    p = case.parameters
    inv_freq, scale = rotated_frequencies(
        case.inputs["q"].shape[-1], p["rotary_dim"], p["scaling"], seq_len
    )
    angles = reference.rotary_angles(case.inputs["positions"], inv_freq)
    partial = case.convention.get("partial", "leading")
    out = {}
    for key in ("q", "k"):
        x = np.transpose(case.inputs[key], (1, 0, 2))[None]
        y = reference.apply_rotary(
            x, angles, layout=layout, scale=np.full(angles.shape, scale), partial=partial
        )
        out[key] = np.transpose(y[0], (1, 0, 2))
    return out


def _halves(x: np.ndarray) -> np.ndarray:
    """Adjacent pairs ``(2i, 2i + 1)`` moved to ``(i, i + d/2)``: ``[x_0, x_2, ... | x_1, ...]``."""
    return np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)


#: (words, applies to the case, the expected outputs under it). Tried in order on a
#: failure; the first the output meets names it.
EXPLANATIONS: list[tuple[str, Callable[[Any], bool], Callable[[Any], Alt]]] = [
    (
        "pairs adjacent channels but returns the rotated pairs as [x_a | x_b] halves",
        lambda c: c.convention["layout"] == "interleaved",
        lambda c: {k: _halves(v) for k, v in c.expected.items()},
    ),
    (
        "LongRoPE's long factors at every length (short_factor unused)",
        lambda c: (c.parameters["scaling"] or {}).get("type") == "longrope",
        lambda c: _qk_rotated(c, layout=c.convention["layout"], seq_len=10**9),
    ),
    (
        "LongRoPE's long factors at every length, and pairs halves whatever `traditional` says",
        lambda c: (c.parameters["scaling"] or {}).get("type") == "longrope",
        lambda c: _qk_rotated(c, layout="half", seq_len=10**9),
    ),
]


def explain(adapter: Any, case: Any) -> dict[str, Any] | None:
    """For a failing rotation: the first of :data:`EXPLANATIONS` the adapter's output meets,
    with the largest error against it and against the reference; None when none does.

    "Meets": within one unit in the last place of the adapter's dtype (twice the case's
    output term) plus the case's arithmetic and angle terms with float32 angles allowed (a
    far case is judged on the convention, not on its angles), those two terms taken at
    their largest over each row's channels (an explanation may move which channels
    rotate)."""
    from posenc.conformance.cases import coefficients

    if case.operation != "rotate" or case.family != "rope":
        return None
    outputs = adapter.fn(*case.args(), **case.kwargs())
    got = {key: np.asarray(o, np.float64) for key, o in zip(("q", "k"), outputs)}
    c = coefficients(adapter.dtype, far=False)
    for words, applies, alt_of in EXPLANATIONS:
        if not applies(case):
            continue
        alt = alt_of(case)
        if all(np.allclose(alt[k], case.expected[k], rtol=0, atol=1e-12) for k in alt):
            continue  # the explanation is the convention here (e.g. long factors far): no news
        within = True
        for key, value in alt.items():
            mag = np.broadcast_to(case.magnitude[key], value.shape).max(axis=-1, keepdims=True)
            ang = np.broadcast_to(case.angle_bound[key], value.shape).max(axis=-1, keepdims=True)
            tol = 2 * c["output"] * np.abs(value) + c["arithmetic"] * mag + c["angle"] * ang
            within = within and bool(np.all(np.abs(got[key] - value) <= tol))
        if within:
            return {
                "explanation": words,
                "max_error_against_it": max(float(np.max(np.abs(got[k] - alt[k]))) for k in alt),
                "max_error_against_reference": max(
                    float(np.max(np.abs(got[k] - case.expected[k]))) for k in alt
                ),
            }
    return None


# --- the run ---------------------------------------------------------------------------------


def versions(maxtext_dir: Path | None) -> dict[str, str]:
    """The versions (and MaxText's commit) of everything that ran."""
    from importlib import metadata

    out = {"python": platform.python_version(), "maxtext": MAXTEXT_COMMIT}
    for dist in ("posenc", "numpy", "jax", "jaxlib", "flax", "gemma", "mlx", "mlx-lm"):
        try:
            out[dist.replace("-", "_")] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist.replace("-", "_")] = "not installed"
    if out["posenc"] == "not installed":
        from posenc._version import __version__

        out["posenc"] = f"{__version__} (source tree)"
    if maxtext_dir is not None:
        out["maxtext_dir"] = str(maxtext_dir)
    return out


def summary(report: Any, explained: Mapping[tuple[str, str], Mapping[str, Any]]) -> dict[str, Any]:
    """Per adapter: its counts, the cases it passes, and its failures and skips grouped by
    the words that explain them: the check's deviation, else this script's measured
    explanation (``explained``, marked "measured here"), else the check's detail."""
    out: dict[str, dict[str, Any]] = {}
    for r in report.results:
        row = out.setdefault(
            r.adapter, {"pass": 0, "fail": 0, "skip": 0, "passes": [], "fails": {}, "skips": {}}
        )
        row[r.status] += 1
        if r.status == "pass":
            row["passes"].append(r.case)
            continue
        words = r.deviation or r.detail or "-"
        if r.status == "fail" and not r.deviation and (r.adapter, r.case) in explained:
            words = f"measured here: {explained[r.adapter, r.case]['explanation']}"
        row["fails" if r.status == "fail" else "skips"].setdefault(words, []).append(r.case)
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--maxtext",
        type=Path,
        help="the src/ folder of a MaxText checkout at MAXTEXT_COMMIT (omit: MaxText not run)",
    )
    parser.add_argument("--skip", nargs="*", default=[], choices=sorted(SOURCES))
    parser.add_argument("--cases", nargs="*", help="fnmatch globs on case names (default: all)")
    parser.add_argument("--out", type=Path, default=OUT)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from _record import record_head

    from posenc.conformance import Vectors, check

    if args.maxtext is not None:
        sys.path.insert(0, str(args.maxtext.resolve()))
    found = versions(args.maxtext)
    sources = {
        name: text.format(**found)
        for name, text in SOURCES.items()
        if name not in args.skip and (name != "MaxText" or args.maxtext is not None)
    }
    builders = {"MaxText": maxtext_adapters, "Gemma": gemma_adapters, "mlx-lm": mlx_adapters}
    adapters = [a for name, source in sources.items() for a in builders[name](source)]
    vectors = Vectors.build()
    report = check(adapters, vectors, cases=args.cases or None)
    print(report)
    by_name = {a.name: a for a in adapters}
    cases = {c.name: c for c in vectors.select(args.cases or None).cases}
    explained = {}
    for r in report.failures:
        if r.deviation is None and r.case in cases:
            found_words = explain(by_name[r.adapter], cases[r.case])
            if found_words is not None:
                explained[r.adapter, r.case] = found_words
    per_adapter = summary(report, explained)
    print()
    for name, row in per_adapter.items():
        print(f"{name}: {row['pass']} pass, {row['fail']} fail, {row['skip']} skip")
        for words, cases in row["fails"].items():
            print(f"  fails ({len(cases)}): {words}: {', '.join(cases)}")
    record = {
        **record_head("conformance_once"),
        "versions": found,
        "sources": sources,
        "repositories": {"MaxText": MAXTEXT_REPO, "Gemma": GEMMA_REPO, "mlx-lm": MLX_LM_REPO},
        "adapters": [
            {
                "name": a.name,
                "operation": a.operation,
                "family": a.family,
                "convention": dict(a.convention),
                "dtype": a.dtype,
                "source": a.source,
            }
            for a in adapters
        ],
        "summary": per_adapter,
        "explained": [
            {"adapter": adapter, "case": case, **words}
            for (adapter, case), words in explained.items()
        ],
        "report": report.to_json(),
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
