"""RoPE per decoding step: posenc's default path against transformers, positions far out.

One new token per sequence, b 16, 32 query and 8 key/value heads, head dim 128, positions
``[b, 1]`` near 1 000 and near 100 000, float32 and bf16, ``torch.no_grad()``. Each peer
is timed in the same process on the same tensors (median of ``--repeats`` calls after a
warm-up), with posenc's two halves (cos/sin of the positions, the rotation) alongside:

    python benchmarks/rope_decode.py
    python benchmarks/rope_decode.py --out decode.json

transformers' side is ``LlamaRotaryEmbedding`` + ``apply_rotary_pos_emb`` (its eager RoPE).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import posenc
from posenc.rotary import kernels

B, HQ, HK, D = 16, 32, 8, 128


def _median_us(fn: Callable[[], Any], repeats: int, warmup: int = 30) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    from transformers.models.llama.modeling_llama import (
        LlamaConfig,
        LlamaRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    config = LlamaConfig(
        hidden_size=HQ * D,
        num_attention_heads=HQ,
        num_key_value_heads=HK,
        max_position_embeddings=131072,
    )
    theirs_rope = LlamaRotaryEmbedding(config)
    ours_rope = posenc.RotaryEmbedding(D)
    rows = []
    print(f"fused CPU path: {kernels.cpu_fast_path_enabled()}")
    print(
        f"{'dtype':9} {'position':>8} {'posenc us':>10} {'transformers us':>16} {'x faster':>9} "
        f"{'cos/sin us':>11} {'rotate us':>10}"
    )
    torch.manual_seed(0)
    with torch.no_grad():
        for dtype in (torch.float32, torch.bfloat16):
            q = torch.randn(B, HQ, 1, D, dtype=dtype)
            k = torch.randn(B, HK, 1, D, dtype=dtype)
            for start in (1000, 100_000):
                pos = start + torch.arange(B)[:, None]  # [b, 1]: one new token per sequence

                def ours(pos=pos, q=q, k=k):
                    return ours_rope(q, k, pos)

                def theirs(pos=pos, q=q, k=k):
                    cos, sin = theirs_rope(q, pos)
                    return apply_rotary_pos_emb(q, k, cos, sin)

                rotation = ours_rope.rotation_at(pos, pos, dtype=torch.float32)
                row = {
                    "dtype": str(dtype).removeprefix("torch."),
                    "position": start,
                    "posenc_us": _median_us(ours, args.repeats),
                    "transformers_us": _median_us(theirs, args.repeats),
                    "cos_sin_us": _median_us(
                        lambda pos=pos: ours_rope.rotation_at(pos, pos, dtype=torch.float32),
                        args.repeats,
                    ),
                    "rotate_us": _median_us(
                        lambda q=q, k=k, r=rotation: ours_rope.rotate(q, k, r), args.repeats
                    ),
                }
                row["x_faster"] = row["transformers_us"] / row["posenc_us"]
                rows.append(row)
                print(
                    f"{row['dtype']:9} {start:8d} {row['posenc_us']:10.0f} "
                    f"{row['transformers_us']:16.0f} {row['x_faster']:9.2f} "
                    f"{row['cos_sin_us']:11.0f} {row['rotate_us']:10.0f}"
                )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"benchmark": "rope_decode", "torch": torch.__version__, "rows": rows}, f, indent=1
            )
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
