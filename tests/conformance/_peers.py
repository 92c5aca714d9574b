"""posenc.reference as adapters (a correct implementation in each dtype: float64 math, the
output rounded once to the dtype), and the defective implementations the diagnosis must
name, each written here with its defect."""

from __future__ import annotations

import numpy as np

from posenc import reference
from posenc.conformance import Adapter, Unsupported
from posenc.conformance.diagnose import round_to

FP16_MAX = 65504.0


def rounded(x, dtype: str) -> np.ndarray:
    """``x`` rounded once to ``dtype`` (float16 refuses what overflows it)."""
    x = np.asarray(x, dtype=np.float64)
    if dtype == "float64":
        return x
    if dtype == "float32":
        return x.astype(np.float32)
    if dtype == "float16" and np.any(np.abs(x[np.isfinite(x)]) > FP16_MAX):
        raise Unsupported("a value past float16's range")
    return round_to(x, dtype)


def _frequencies(head_dim, rotary_dim, base, scaling, seq_len):
    span = head_dim if scaling and scaling.get("type") == "proportional" else rotary_dim
    inv_freq, scale = reference.rope_frequencies(span, base=base, scaling=scaling, seq_len=seq_len)
    return inv_freq[: rotary_dim // 2], scale


def rope(
    layout: str,
    dtype: str = "float64",
    *,
    sections=None,
    section_layout="contiguous",
    shift: int = 0,
    position_dtype: str | None = None,
    ignore_attention: bool = False,
    float32_angles: bool = False,
):
    """The reference rotation, or one with a defect: positions shifted, rounded to
    ``position_dtype``, the attention scale dropped, angles in float32."""

    def fn(q, k, positions, *, base, scaling, rotary_dim, **extra):
        kind = (scaling or {}).get("type", "default")
        seq_len = int(np.max(positions)) + 1 if kind in ("dynamic", "longrope") else None
        inv_freq, scale = _frequencies(q.shape[-1], rotary_dim, base, scaling, seq_len)
        pos = positions + shift
        if position_dtype:
            pos = round_to(pos, position_dtype)
        if ignore_attention:
            scale = 1.0
        xpos = extra.get("xpos_scale_base")
        out = []
        for x, sign in ((q, 1.0), (k, -1.0)):
            if extra.get("sections") is not None:
                theta = reference.sectioned_angles(
                    pos, inv_freq, extra["sections"], extra["section_layout"]
                )
            elif float32_angles:
                theta = (
                    np.asarray(pos, np.float32)[:, None] * inv_freq.astype(np.float32)[None]
                ).astype(np.float64)
            else:
                theta = reference.rotary_angles(pos, inv_freq)
            m = np.full(theta.shape, scale)
            if xpos is not None:
                m = m * reference.xpos_scale(pos, rotary_dim, sign * xpos)
            x4 = np.transpose(x, (1, 0, 2))[None]
            # p-RoPE spreads its pairs over the whole head, as transformers does
            partial = "whole_head" if kind == "proportional" else "leading"
            y = reference.apply_rotary(x4, theta, layout=layout, scale=m, partial=partial)[0]
            out.append(rounded(np.transpose(y, (1, 0, 2)), dtype))
        return tuple(out)

    return fn


def sinusoidal(layout: str, dtype: str = "float64", *, position_dtype: str | None = None):
    def fn(positions, dim, *, base):
        pos = positions if position_dtype is None else round_to(positions, position_dtype)
        return rounded(reference.sinusoidal_table(pos, dim, base=base, layout=layout), dtype)

    return fn


def _frequency_fn(dtype):
    def fn(dim, *, base, scaling, seq_len):
        inv_freq, scale = reference.rope_frequencies(
            dim, base=base, scaling=scaling, seq_len=seq_len
        )
        return rounded(inv_freq, dtype), float(rounded(scale, dtype))

    return fn


def _bias_fns(dtype):
    r = lambda x: rounded(x, dtype)  # noqa: E731

    def alibi(qp, kp, *, heads, causal):
        return r(reference.alibi_bias(qp, kp, reference.alibi_slopes(heads), causal=causal))

    def t5(qp, kp, *, heads, weights, causal, num_buckets, max_distance):
        return r(
            reference.t5_relative_bias(qp, kp, weights, causal=causal, max_distance=max_distance)
        )

    def shaw(qp, kp, *, heads, q, table):
        return r(reference.shaw_relative_logits(q[None], table, qp, kp)[0])

    def shaw_values(qp, kp, *, heads, probs, table):
        return r(reference.shaw_relative_values(probs[None], table, qp, kp)[0])

    def fire(qp, kp, *, heads, c, threshold, w1, b1, w2, b2):
        return r(reference.fire_bias(qp, kp, w1, b1, w2, b2, c=c, threshold=threshold))

    def kerple(qp, kp, *, heads, r1, r2):
        return r(reference.kerple_bias(qp, kp, r1, r2))

    def cope(qp, kp, *, heads, q, k, weight, position_logit, causal):
        return r(
            reference.cope_bias(
                q[None], k[None], weight, position_logit=position_logit, causal=causal
            )[0]
        )

    def fox(qp, kp, *, heads, log_forget):
        return r(reference.fox_bias(log_forget[None], len(qp))[0])

    def self_extend(qp, kp, *, heads, group_size, neighbor_window):
        return r(np.stack(reference.self_extend_positions(qp, kp, group_size, neighbor_window)))

    def string(qp, kp, *, heads, shift, local_window):
        return r(np.stack(reference.string_positions(qp, kp, shift, local_window)))

    return {
        "alibi": alibi,
        "t5": t5,
        "shaw": shaw,
        "shaw_values": shaw_values,
        "fire": fire,
        "kerple": kerple,
        "cope": cope,
        "fox": fox,
        "self_extend": self_extend,
        "string": string,
    }


def reference_adapters(dtype: str) -> list[Adapter]:
    """posenc.reference as one adapter per (operation, family, convention), in ``dtype``."""
    r = lambda x: rounded(x, dtype)  # noqa: E731
    out = []
    for layout in ("interleaved", "half", "flax"):
        out.append(
            Adapter(
                f"sinusoidal-{layout}",
                "table",
                "sinusoidal",
                sinusoidal(layout, dtype),
                convention={"layout": layout},
                dtype=dtype,
            )
        )
        out.append(
            Adapter(
                f"nd-{layout}",
                "table",
                "sinusoidal_nd",
                lambda pos, dim, *, base, lay=layout: r(
                    reference.sinusoidal_table_nd(pos, dim, base=base, layout=lay)
                ),
                convention={"layout": layout},
                dtype=dtype,
            )
        )
    out.append(
        Adapter(
            "index",
            "table",
            "index",
            lambda pos, dim, *, normalize, length: r(
                reference.index_table(pos, dim, normalize=normalize, length=length)
            ),
            dtype=dtype,
        )
    )

    def learned(pos, dim, *, table, size, grid, num_prefix_tokens, mode, align_corners, antialias):
        size = tuple(size) if grid else size
        return r(
            reference.resample_table(
                table,
                size,
                grid=None if grid is None else tuple(grid),
                num_prefix_tokens=num_prefix_tokens,
                mode=mode,
                align_corners=align_corners,
                antialias=antialias,
            )
        )

    out.append(Adapter("learned", "table", "learned", learned, dtype=dtype))
    out.append(
        Adapter(
            "xpos-table",
            "table",
            "xpos",
            lambda pos, dim, *, scale_base: r(reference.xpos_scale(pos, dim, scale_base)),
            dtype=dtype,
        )
    )
    out.append(
        Adapter("rope-frequencies", "frequencies", "rope", _frequency_fn(dtype), dtype=dtype)
    )
    out.append(
        Adapter(
            "axial",
            "frequencies",
            "axial_rope",
            lambda dim, *, base, axis_dims: (
                r(reference.axial_frequencies(axis_dims, base=base)),
                1.0,
            ),
            dtype=dtype,
        )
    )
    for layout in ("half", "interleaved"):
        out.append(
            Adapter(
                f"rope-{layout}",
                "rotate",
                "rope",
                rope(layout, dtype),
                convention={"layout": layout},
                dtype=dtype,
            )
        )
    out.append(Adapter("mrope", "rotate", "mrope", rope("half", dtype), dtype=dtype))
    out.append(Adapter("xpos", "rotate", "xpos", rope("half", dtype), dtype=dtype))
    for family, fn in _bias_fns(dtype).items():
        out.append(Adapter(family, "bias", family, fn, dtype=dtype))
    return out
