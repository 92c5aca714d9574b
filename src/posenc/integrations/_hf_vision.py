"""Vision towers: transformers' axial rotary (rope type ``"axial"``), its facts and its reading.

transformers' axial vision rotaries take, per axis, the 1-D frequencies of ``spatial_dim``
channels, ``1 / theta ** (arange(0, spatial_dim, 2) / spatial_dim)``, applied to (h, w)
patch coordinates; the angles are concatenated axis after axis and doubled for
``rotate_half`` (``cat([a, a])``: half pairing) or repeated per pair
(``repeat_interleave(2)``: interleaved, SAM's ``rotate_pairwise``). The tables below hold
what differs per ``model_type`` (read from transformers 5.24's and 5.25's modeling files,
checked by ``tests/integrations/test_hf_vision_rotary.py``); :func:`axial_from_config`
builds the equal :class:`~posenc.AxialRotaryEmbedding` for
:func:`~._hf_config.rotary_from_config`.
"""

from __future__ import annotations

from typing import Any

from posenc._errors import PosEncError, check_float, check_int
from posenc.integrations._hf_reader import first
from posenc.integrations._hf_sizes import check_head_dim
from posenc.rotary.layout import Layout
from posenc.rotary.nd import AxialRotaryEmbedding

__all__ = [
    "AXIAL_DEFAULT",
    "AXIAL_LAYOUT",
    "AXIAL_MEMORY_ATTENTION",
    "AXIAL_THIRDS",
    "AXIAL_UNSUPPORTED",
    "AXIAL_WIDTH_KEY",
    "axial_from_config",
    "axial_layout",
    "is_axial",
]

# model_type -> (n_axes, layout). Families not listed here nor in AXIAL_UNSUPPORTED are read
# as (2, "half"), Qwen2-VL's vision RoPE.
AXIAL_LAYOUT: dict[str, tuple[int, Layout]] = {
    "minimax_m3_vl_vision": (3, "half"),  # T, H, W; spatial_dim = 2 * (head_dim // 3 // 2)
    "sam3_vit_model": (2, "interleaved"),
    "sam2_video": (2, "interleaved"),
    "sam3_tracker_video": (2, "interleaved"),
    "edgetam_video": (2, "interleaved"),
}
# The per-axis channels when they are not head_dim / n_axes: the rest pass through.
AXIAL_THIRDS = frozenset({"minimax_m3_vl_vision"})
# Where the head dim is read when not head_dim / (hidden_size // num_attention_heads).
AXIAL_WIDTH_KEY = {"qwen2_vl_vision": "embed_dim"}  # hidden_size is the merger's output
AXIAL_MEMORY_ATTENTION = frozenset({"sam2_video", "sam3_tracker_video", "edgetam_video"})

_WH = "take the axes in the order W, H (posenc's axis 0 is the first coordinate, H)"
AXIAL_UNSUPPORTED: dict[str, str] = {
    "gemma4_vision": (
        "its apply rotates each axis' channels as a half-paired block of their own (H-H-W-W), "
        "not one half pairing over the rotated channels"
    ),
    "pixtral": (
        "its W axis takes the odd frequencies of one head_dim-wide vector (offset by "
        "theta ** (-2 / head_dim) from H's), not the same per-axis frequencies"
    ),
    "kimi_k25_vision": "interleave the W and H frequencies one by one (w0, h0, w1, h1, ...)",
    "step3p5_vision": _WH,
    "inkling2_vision": _WH,
    "glm_image_vision": "its vision tower has no rotary embedding (nothing to reproduce)",
}


# Every model_type whose config class defaults to rope type "axial" (a dict may omit it).
AXIAL_DEFAULT = frozenset(
    {
        "cohere_compass_vision",
        "dots3_note_vision_encoder",
        "edgetam_video",
        "ernie4_5_vl_moe_vision",
        "exaone4_5_vision",
        "gemma4_vision",
        "glm4v_moe_vision",
        "glm4v_vision",
        "glm5_next_vision",
        "glm_image_vision",
        "glm_ocr_vision",
        "inkling2_vision",
        "kimi_k25_vision",
        "lfm3_vl_vision",
        "llava_onevision1_5_vision",
        "minimax_m3_vl_vision",
        "mlcd_vision_model",
        "muse_glimmer_vision",
        "muse_spark_vision",
        "ovis2_5_vision",
        "paddleocr_vl_vision",
        "pixtral",
        "qwen2_5_omni_vision_encoder",
        "qwen2_5_vl_vision",
        "qwen2_vl_vision",
        "qwen3_5_moe_vision",
        "qwen3_5_vision",
        "qwen3_omni_moe_vision_encoder",
        "qwen3_vl_moe_vision",
        "qwen3_vl_vision",
        "qwen4_exp_vision",
        "sam2_video",
        "sam3_tracker_video",
        "sam3_vit_model",
        "step3p5_vision",
        "video_llama_3_vision",
    }
)


def axial_layout(
    model_type: str, get: Any, rope: dict[str, Any]
) -> tuple[int, int, tuple[int, ...], Layout, float]:
    """``(head_dim, n_axes, axis_dims, layout, theta)`` of a family's axial vision RoPE, read
    as its rotary module reads them; ``get`` reads the config, ``rope`` is its
    ``rope_parameters``."""
    extra = sorted(k for k, v in rope.items() if v is not None and k not in _AXIAL_KEYS)
    if extra:
        raise PosEncError(f"rope type 'axial' takes only rope_theta, got {extra}")
    theta = check_float(
        "rope_theta",
        first(rope.get("rope_theta"), get("rope_theta"), 10000.0),
        min=1.0,
        min_exclusive=True,
    )
    reason = AXIAL_UNSUPPORTED.get(model_type)
    if reason is not None:
        raise PosEncError(f"posenc cannot express this family's axial vision RoPE: {reason}")
    n_axes, layout = AXIAL_LAYOUT.get(model_type, (2, "half"))  # Qwen2-VL's
    if model_type in AXIAL_MEMORY_ATTENTION:  # SAM 2 video: the memory attention's heads
        keys = (
            "memory_attention_hidden_size",
            "memory_attention_downsample_rate",
            "memory_attention_num_attention_heads",
        )
        values = [get(k) for k in keys]
        if any(v is None for v in values):
            raise PosEncError(f"config must give {', '.join(keys)} (the memory attention's)")
        head_dim = check_int(keys[0], values[0], min=1) // (
            check_int(keys[1], values[1], min=1) * check_int(keys[2], values[2], min=1)
        )
    else:
        head_dim = get("head_dim")
        if head_dim is None:
            key = AXIAL_WIDTH_KEY.get(model_type, "hidden_size")
            # a dict keeps attribute_map's targets: num_heads (Qwen2-VL's vision, ...)
            width, heads = get(key), first(get("num_attention_heads"), get("num_heads"))
            if width is None or heads is None:
                raise PosEncError(f"config must give head_dim, or {key} and num_attention_heads")
            head_dim = check_int(key, width, min=1) // check_int(
                "num_attention_heads", heads, min=1
            )
    head_dim = check_head_dim("head_dim", head_dim)
    spatial = 2 * (head_dim // 3 // 2) if model_type in AXIAL_THIRDS else head_dim // n_axes
    if spatial < 2 or spatial % 2:
        raise PosEncError(
            f"the per-axis rotary dim {spatial} (head_dim {head_dim}, {n_axes} axes) must be "
            f"even and >= 2 (transformers' doubled angles do not fit the head otherwise)"
        )
    return head_dim, n_axes, (spatial,) * n_axes, layout, theta


_AXIAL_KEYS = ("rope_type", "type", "rope_theta")


def is_axial(model_type: str, rope: dict[str, Any]) -> bool:
    """Whether a config is an axial vision rotary: its rope type says so, or (none given) its
    config class defaults to it."""
    kind = first(rope.get("rope_type"), rope.get("type"))
    return kind == "axial" or (kind is None and model_type in AXIAL_DEFAULT)


def axial_from_config(
    model_type: str, get: Any, rope: dict[str, Any], layout: Layout | None
) -> AxialRotaryEmbedding:
    """The :class:`~posenc.AxialRotaryEmbedding` of an axial vision config (``get`` reads
    it; ``layout``: None for the family's pairing, else an override)."""
    head_dim, n_axes, dims, pairs, theta = axial_layout(model_type, get, rope)
    return AxialRotaryEmbedding(
        head_dim, n_axes, base=theta, layout=layout or pairs, axis_dims=dims
    )
