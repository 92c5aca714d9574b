"""remapped_attention and posenc.attention(position_map=) refuse each bad argument by name."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import posenc
from posenc.remap import SelfExtend, String, remapped_attention

from ._cases import qkv, rope_rotate


def _args() -> dict[str, Any]:
    q, k, v = qkv(4, 6, dtype=torch.float32)
    return {
        "q": q,
        "k": k,
        "v": v,
        "rotate": rope_rotate(),
        "position_map": SelfExtend(2, 2),
        "q_positions": torch.arange(2, 6),
        "k_positions": torch.arange(6),
    }


BAD = {
    "q-3d": ("q", lambda a: a["q"][0]),
    "k-heads": ("k", lambda a: torch.randn(2, 3, 6, 8)),
    "v-length": ("v", lambda a: a["v"][:, :, :5]),
    "q-dtype": ("q", lambda a: a["q"].double()),
    "q-int": ("q", lambda a: a["q"].long()),
    "rotate": ("rotate", lambda a: "rope"),
    "rotate_keys": ("rotate_keys", lambda a: 3),
    "map-type": ("position_map", lambda a: {"type": "ntk"}),
    "map-key": ("position_map", lambda a: {"type": "string", "shift": 2, "no_such_key": 1}),
    "map-str": ("position_map", lambda a: "self_extend"),
    "qpos-float": ("q_positions", lambda a: a["q_positions"].double()),
    "qpos-length": ("q_positions", lambda a: torch.arange(5)),
    "kpos-2d": ("k_positions", lambda a: torch.arange(6)[None]),
    "kpos-list": ("k_positions", lambda a: list(range(6))),
    "scale-0": ("scale", lambda a: 0.0),
    "scale-nan": ("scale", lambda a: float("nan")),
    "softcap-0": ("softcap", lambda a: 0.0),
    "softcap-neg": ("softcap", lambda a: -1.0),
    "keep-float": ("keep", lambda a: torch.ones(2, 4, 4, 6)),
    "keep-shape": ("keep", lambda a: torch.ones(2, 4, 5, 6, dtype=torch.bool)),
    "keep-5d": ("keep", lambda a: torch.ones(1, 2, 4, 4, 6, dtype=torch.bool)),
    "backend": ("backend", lambda a: "sdpa"),
    "block-0": ("block", lambda a: 0),
    "block-bool": ("block", lambda a: True),
}


@pytest.mark.parametrize("case", list(BAD))
def test_remapped_attention_refuses(case: str) -> None:
    name, make = BAD[case]
    args = _args()
    args[name] = make(args)
    with pytest.raises(posenc.PosEncError, match=rf"\b{name.split('_')[0]}"):
        remapped_attention(**args)


ATTENTION_BAD = {
    "alibi": ({"encoding": "alibi"}, "position_map"),
    "none": ({"encoding": None}, "position_map"),
    "axial": ({"encoding": posenc.AxialRotaryEmbedding(8)}, "position_map"),
    "not-causal": ({"causal": False}, "causal"),
    "dropout": ({"dropout_p": 0.1}, "dropout_p"),
    "sdpa": ({"backend": "sdpa"}, "backend"),
    "batched-positions": ({"q_positions": torch.arange(4)[None].expand(2, 4)}, "q_positions"),
    "float-positions": ({"k_positions": torch.arange(6.0)}, "k_positions"),
    "map": ({"position_map": {"type": "string", "shift": 0, "local_window": 0}}, "shift"),
}


@pytest.mark.parametrize("case", list(ATTENTION_BAD))
def test_posenc_attention_refuses(case: str) -> None:
    change, name = ATTENTION_BAD[case]
    q, k, v = qkv(4, 6, dtype=torch.float32)
    kw: dict[str, Any] = {"encoding": "rope", "causal": True, "position_map": String(2, 1)}
    kw.update(change)
    with pytest.raises(posenc.PosEncError, match=rf"\b{name}\b"):
        posenc.attention(q, k, v, **kw)
