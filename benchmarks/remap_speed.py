"""Time of Self-Extend and STRING attention by path, beside plain RoPE attention (SDPA).

    python benchmarks/remap_speed.py                       # L = 1024, 4096 on the CPU
    python benchmarks/remap_speed.py --lengths 8192 --threads 2 --out remap_speed.json

Causal self-attention, inference (``torch.no_grad()``), b = 1, h = 9, h_kv = 3, d = 64
(SmolLM2-135M's attention), float32. The maps are each paper's parameters for a model
trained on L / 2 run at L (``self_extend_for``, ``string_for``). Paths:

- ``sdpa``: ``posenc.attention(encoding=rope, causal=True)``, no map: the floor;
- ``fused``: ``remapped_attention(backend="auto")``: torch's CPU flash kernel per block and
  branch through its private entry point returning the log-sum-exp
  (``aten::_scaled_dot_product_flash_attention_for_cpu``), merged by it;
- ``chunked``: the readable twin (matrix products, ``torch.where`` per pair, softmax).

Each cell is the median of ``--repeats`` calls after one warm-up call, all paths of a length
in the same run (paired); ``max_diff`` is the fused output against the chunked one.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from typing import Any

import torch

import posenc
from posenc.remap import remapped_attention, self_extend_for, string_for


def _rotate(enc: Any):
    def rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return enc.rotate_at(x, x, enc.rotation_at(positions, positions, dtype=torch.float32))[0]

    return rotate


def _time(fn: Any, repeats: int) -> tuple[float, Any]:
    out = fn()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def run_length(s: int, repeats: int) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    h, hk, d = 9, 3, 64
    q, k, v = torch.randn(1, h, s, d), torch.randn(1, hk, s, d), torch.randn(1, hk, s, d)
    enc = posenc.RotaryEmbedding(d)
    pos = torch.arange(s)
    common: dict[str, Any] = {"rotate": _rotate(enc), "q_positions": pos, "k_positions": pos}
    rows = []
    with torch.no_grad():
        floor, _ = _time(lambda: posenc.attention(q, k, v, encoding=enc, causal=True), repeats)
        rows.append({"length": s, "map": "none", "path": "sdpa", "s": floor, "ratio": 1.0})
        for name, pmap in (
            ("self_extend", self_extend_for(s // 2, s)),
            ("string", string_for(s // 2, s)),
        ):
            outs = {}
            for path, backend in (("fused", "auto"), ("chunked", "chunked")):

                def call(backend: str = backend, pmap: Any = pmap) -> torch.Tensor:
                    return remapped_attention(q, k, v, position_map=pmap, backend=backend, **common)

                t, outs[path] = _time(call, repeats)
                rows.append(
                    {
                        "length": s,
                        "map": name,
                        "config": pmap.to_config(),
                        "path": path,
                        "s": t,
                        "ratio": t / floor,
                    }
                )
            diff = float((outs["fused"] - outs["chunked"]).abs().max())
            rows[-2]["max_diff"] = rows[-1]["max_diff"] = diff
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [row for s in args.lengths for row in run_length(s, args.repeats)]
    for r in rows:
        extra = f"  max_diff {r['max_diff']:.2e}" if "max_diff" in r else ""
        print(
            f"L={r['length']:6d} {r['map']:12s} {r['path']:8s} {r['s']:8.3f} s  "
            f"x{r['ratio']:.2f}{extra}"
        )
    if args.out:
        meta = {"torch": torch.__version__, "threads": args.threads, "cpu": platform.processor()}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
