"""Two trees of posenc in one process, paired by round: does a change keep the speed?

    git worktree add /tmp/base 07680e1
    python benchmarks/trees.py --base /tmp/base/src --rounds 200

The base tree's package is copied to a temporary folder as ``posenc_base`` (every
``posenc.`` module path, ``import posenc`` and the ``posenc::`` custom-op namespace renamed),
so both trees are imported side by side; the new tree is the installed ``posenc``. Each
round times one call of each tree, in an order of its own (a seeded shuffle), of
``RotaryEmbedding(d)(q, k, positions)`` forward at ``rope.py``'s CPU sizes (decode,
prefill-512, goal), float32 and bfloat16, with the fused CPU path on (``fused``, the
default) and off (``plain``: the torch path). The summary pairs the rounds: each round's
time of the new tree over the base tree's, as the median, the quartiles and the share of
rounds the new tree was the faster; the collector is off while timing.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import posenc
from posenc.rotary.kernels import enable_cpu_fast_path

# the shapes of benchmarks/rope.py: (b, hq, hk, s, d), and rounds at least (a small call
# is timed over more rounds)
SIZES = {
    "decode": (16, 32, 8, 1, 128),
    "prefill-512": (1, 32, 8, 512, 128),
    "goal": (4, 16, 16, 2048, 128),
}
_RENAME = [
    (re.compile(r"\bposenc::"), "posenc_base::"),
    (re.compile(r"\bposenc(?=\.[A-Za-z_])"), "posenc_base"),
    (re.compile(r"^(\s*)import posenc\b", re.M), r"\1import posenc_base"),
    (re.compile(r"^(\s*)from posenc\b", re.M), r"\1from posenc_base"),
]


def load_base(src: Path) -> object:
    """The package under ``src/posenc`` imported as ``posenc_base``."""
    folder = Path(tempfile.mkdtemp(prefix="posenc-base-"))
    shutil.copytree(src / "posenc", folder / "posenc_base")
    for path in (folder / "posenc_base").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for pattern, repl in _RENAME:
            text = pattern.sub(repl, text)
        path.write_text(text, encoding="utf-8")
    sys.path.insert(0, str(folder))
    return importlib.import_module("posenc_base")


def _switch(package: object) -> object:
    return importlib.import_module(f"{package.__name__}.rotary.kernels").enable_cpu_fast_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, type=Path, help="the base tree's src folder")
    parser.add_argument("--rounds", type=int, default=200, help="rounds per cell (decode: 10x)")
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--contextual",
        nargs="*",
        choices=["cope", "fox"],
        default=["cope", "fox"],
        help="also time a training step of posenc.attention with CoPE / forgetting attention",
    )
    parser.add_argument("--length", type=int, default=1024, help="tokens of the CoPE/FoX step")
    parser.add_argument("--out", type=Path, default=None, help="write the summary as JSON here")
    args = parser.parse_args()
    base = load_base(args.base)
    trees = {"base": (base, _switch(base)), "new": (posenc, enable_cpu_fast_path)}
    order = random.Random(args.seed)
    print(
        f"new / base, paired by round; torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(f"{'cell':<28} {'median':>7} {'q1':>6} {'q3':>6} {'faster':>7}  base median")
    summary = {}
    for size in args.sizes:
        b, hq, hk, s, d = SIZES[size]
        rounds = args.rounds * (10 if s == 1 else 1) // (10 if size == "goal" else 1)
        gen = torch.Generator().manual_seed(0)
        for dtype in (torch.float32, torch.bfloat16):
            q = torch.randn(b, hq, s, d, generator=gen).to(dtype)
            k = torch.randn(b, hk, s, d, generator=gen).to(dtype)
            positions = torch.arange(s) + 1000
            for path in ("fused", "plain"):
                calls = {}
                for label, (package, switch) in trees.items():
                    rope = package.RotaryEmbedding(d)
                    calls[label] = (rope, switch)
                    switch(path == "fused")
                    for _ in range(3):
                        rope(q, k, positions)
                times = {label: [] for label in trees}
                labels = list(trees)
                gc.collect()
                gc.disable()
                for _ in range(max(rounds, 5)):
                    order.shuffle(labels)
                    for label in labels:
                        rope, switch = calls[label]
                        switch(path == "fused")
                        t = time.perf_counter()
                        rope(q, k, positions)
                        times[label].append(time.perf_counter() - t)
                gc.enable()
                cell = f"{size} {str(dtype).removeprefix('torch.')} {path}"
                summary.update(_paired(cell, times))
    for name in args.contextual:
        summary.update(_contextual(name, trees, args, order))
    if args.out is not None:
        args.out.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")


def _contextual(name: str, trees: dict, args, order: random.Random) -> dict:
    """One training step (forward and backward) of ``posenc.attention`` with CoPE or
    forgetting attention (``benchmarks/contextual.py``'s shapes: b 1, h 4, d 32), each tree
    with its own module of the same weights, paired by round."""
    b, h, d, s = 1, 4, 32, args.length
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(b, h, s, d, generator=gen) for _ in range(3))
    gates = torch.nn.functional.logsigmoid(torch.randn(b, h, s, generator=gen) + 3.0)
    steps = {}
    for label, (package, switch) in trees.items():
        switch(True)
        if name == "cope":
            enc = package.build("cope", head_dim=d, npos_max=s + 1)
            with torch.no_grad():
                enc.weight.copy_(torch.randn(enc.weight.shape, generator=gen.manual_seed(2)) * 0.1)
        else:
            enc = package.build("fox", num_heads=h)

        def step(package=package, enc=enc):
            leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
            g = gates.clone().requires_grad_(True) if name == "fox" else None
            out = package.attention(*leaves, encoding=enc, causal=True, gates=g)
            out.sum().backward()

        steps[label] = step
        step()
    times = {label: [] for label in trees}
    labels = list(trees)
    for _ in range(max(args.rounds // 10, 5)):
        order.shuffle(labels)
        for label in labels:
            t = time.perf_counter()
            steps[label]()
            times[label].append(time.perf_counter() - t)
    return _paired(f"{name} s{s} fwd+bwd", times)


def _paired(cell: str, times: dict[str, list[float]]) -> dict:
    """Print and return one cell: each round's new / base, its median, quartiles and the
    share of rounds the new tree was the faster, and the base's median time."""
    ratios = sorted(n / b for n, b in zip(times["new"], times["base"]))
    q1, med, q3 = statistics.quantiles(ratios, n=4)
    faster = sum(r < 1 for r in ratios) / len(ratios)
    base_s = statistics.median(times["base"])
    print(f"{cell:<28} {med:7.3f} {q1:6.3f} {q3:6.3f} {faster:7.0%}  {base_s * 1e6:9.1f} us")
    keys = ("median", "q1", "q3", "faster", "base_s", "rounds")
    return {cell: dict(zip(keys, (med, q1, q3, faster, base_s, len(ratios))))}


if __name__ == "__main__":
    main()
