"""CoPE and forgetting attention on their paths: time and memory of one training step.

    python benchmarks/contextual.py            # b=1, h=4, d=32, s in 128, 256, 1024, 2048
    python benchmarks/contextual.py --quick    # s=256 only

For each sequence length, one forward and backward of ``posenc.attention`` (causal, float32,
gradients of q, k, v and the encoding's parameters or gates) on each path:

- ``none``: SDPA with no encoding (``is_causal``), the floor every ratio ``/ none`` is to;
- CoPE: ``eager`` (every ``[b, h, q, k]`` tensor of the formula kept for the backward pass),
  ``chunked`` (blocks of query rows, each recomputed in the backward pass), ``auto`` (the
  fused CPU path, :mod:`posenc.contextual.cope_fused`: torch's products per block, one C loop
  a row between them); and with the position logits added unscaled (``cope-unscaled``, as
  x-transformers adds them) posenc's fused and chunked paths beside x-transformers'
  ``Attend`` with its ``CoPE`` (the same table), when x-transformers is installed (the dev
  extra);
- forgetting attention through ``sdpa`` (the term folded into the keys,
  :mod:`posenc.attend.folded`), ``auto`` (the same, but the eager path for a short call the
  fold would cut into blocks) and ``eager`` (its chunked twin is in
  ``results/contextual-2026-12-02.md``), with gates that remember (``fox``: log f =
  logsigmoid(N(0, 1) + 3), about -0.07 a token), forget (``fox-forget``: + -3 instead,
  about -3 a token) and one head of each of +5, +3, 0, -3 (``fox-mixed``).

First every path is shown to be as close to the float64 eager answer as the float32 eager
path is, output and every gradient (within 4x and 1e-6; the script exits 1 otherwise).
``saved MiB`` is what autograd keeps for the backward pass
(``torch.autograd.graph.saved_tensors_hooks``, exact and machine-independent); ``ms`` the
median wall time of ``--repeats`` steps after one warm-up, the paths of one length timed in
turn each repeat (so a slow spell of the machine is shared), with the range after it;
``/ none`` the median and range of each repeat's ratio to that repeat's SDPA step.
The CoPE paper's released code computes the eager formula (posenc equals it to 1e-14);
forgetting attention's own kernel is Triton on CUDA, so it has no CPU peer.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time

import torch

import posenc


def _saved_bytes(fn) -> int:
    total = 0
    seen: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    out.sum().backward()
    return total


def _inputs(s: int, b: int, h: int, d: int, gen: torch.Generator):
    return [torch.randn(b, h, s, d, generator=gen).requires_grad_(True) for _ in range(3)]


PEERS: dict[int, object] = {}  # id(encoding) -> x-transformers' Attend sharing its table


def _step(enc, backend: str, q, k, v, gates):
    if enc is None:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    if backend == "x-transformers":
        return PEERS[id(enc)](q, k, v)[0]
    return posenc.attention(q, k, v, encoding=enc, causal=True, backend=backend, gates=gates)


SHIFTS = {"fox": [3.0], "fox-forget": [-3.0], "fox-mixed": [5.0, 3.0, 0.0, -3.0]}


def _setup(name: str, s: int, args, gen: torch.Generator):
    b, h, d = args.batch, args.heads, args.head_dim
    q, k, v = _inputs(s, b, h, d, gen)
    gates = enc = None
    if name in ("cope", "cope-unscaled"):
        logit = "scaled" if name == "cope" else "unscaled"
        enc = posenc.build("cope", head_dim=d, npos_max=s + 1, position_logit=logit)
        with torch.no_grad():
            enc.weight.normal_(0, 0.1, generator=gen)
        if name == "cope-unscaled":
            from x_transformers.attend import Attend
            from x_transformers.x_transformers import CoPE

            peer = CoPE(d, h, s + 1)
            peer.pos_emb = enc.weight  # one table: its gradient is checked against posenc's
            PEERS[id(enc)] = Attend(causal=True, cope=peer, flash=False)
    elif name in SHIFTS:
        enc = posenc.build("fox", num_heads=h)
        shift = torch.tensor(SHIFTS[name] * h)[:h, None]
        gates = torch.nn.functional.logsigmoid(torch.randn(b, h, s, generator=gen) + shift)
        gates.requires_grad_(True)
    leaves = [q, k, v, *([gates] if gates is not None else [])]
    return enc, (q, k, v, gates), leaves + ([] if enc is None else list(enc.parameters()))


def _checked(name: str, s: int, enc, tensors, leaves, backends: list[str]) -> None:
    """Exit 1 unless every path is as close to the float64 eager answer (output and every
    gradient) as the float32 eager path is, within 4x and 1e-6."""

    def grads(backend: str, wide: bool = False):
        inputs = list(tensors)
        params = leaves[len([t for t in tensors if t is not None]) :]
        if wide:
            inputs = [
                None if t is None else t.detach().double().requires_grad_(True) for t in inputs
            ]
            for p in params:
                p.data = p.data.double()
        for t in leaves:
            t.grad = None
        out = _step(enc, backend, *inputs)
        out.sum().backward()
        got = [t.grad for t in inputs if t is not None] + [p.grad for p in params]
        result = [out.detach().double(), *[g.detach().double().clone() for g in got]]
        if wide:
            for p in params:
                p.data = p.data.float()
                p.grad = None
        return result

    truth = grads("eager", wide=True)
    floor = [float((g - t).abs().max()) for g, t in zip(grads("eager"), truth)]
    allowed = [4 * f + 1e-6 for f in floor]
    for backend in backends:
        errors = [float((g - t).abs().max()) for g, t in zip(grads(backend), truth)]
        if any(e > a for e, a in zip(errors, allowed)):
            print(
                f"{name} {backend} at s={s}: errors {errors} against float64, eager's {floor}",
                file=sys.stderr,
            )
            sys.exit(1)


PATHS = {
    "none": ["sdpa"],
    "cope": ["eager", "chunked", "auto"],
    "cope-unscaled": ["auto", "chunked", "x-transformers"],
    "fox": ["sdpa", "auto", "eager"],
    "fox-forget": ["sdpa", "auto", "eager"],
    "fox-mixed": ["sdpa", "auto", "eager"],
}


def _length(s: int, args) -> list[str]:
    gen = torch.Generator().manual_seed(0)
    runs = []
    for name, backends in PATHS.items():
        if "x-transformers" in backends and importlib.util.find_spec("x_transformers") is None:
            print(f"{name}: x-transformers is not installed (pip install x-transformers)")
            continue
        enc, tensors, leaves = _setup(name, s, args, gen)
        if enc is not None:
            _checked(name, s, enc, tensors, leaves, backends)
        for backend in backends:
            step = lambda enc=enc, backend=backend, t=tensors: _step(enc, backend, *t)  # noqa: E731
            runs.append((name, "sdpa" if enc is None else backend, step, _saved_bytes(step)))
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(args.repeats + 1):
        for i, (_, _, step, _) in enumerate(runs):
            began = time.perf_counter()
            step().sum().backward()
            times[i].append(time.perf_counter() - began)
    rows = []
    for (name, backend, _, saved), ts in zip(runs, times):
        ms = [1000 * t for t in ts[1:]]
        paired = [t / f for t, f in zip(ts[1:], times[0][1:])]  # the same repeat's floor
        rows.append(
            f"| {name} | {s} | {backend} | {saved / 2**20:.1f} | {statistics.median(ms):.1f} "
            f"| {min(ms):.1f}-{max(ms):.1f} | {statistics.median(paired):.2f} "
            f"({min(paired):.2f}-{max(paired):.2f}) |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    lengths = [256] if args.quick else [128, 256, 1024, 2048]
    print(f"b={args.batch}, h={args.heads}, d={args.head_dim}, float32, 1 thread, causal")
    print("| encoding | s | path | saved MiB | ms | range | / none, paired (min-max) |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for s in lengths:
        for row in _length(s, args):
            print(row, flush=True)


if __name__ == "__main__":
    main()
