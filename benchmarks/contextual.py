"""CoPE and forgetting attention on their paths: time and memory of one training step.

    python benchmarks/contextual.py            # b=1, h=4, d=32, s in 256, 1024, 2048
    python benchmarks/contextual.py --quick    # s=256 only

For each sequence length, one forward and backward of ``posenc.attention`` (causal, float32,
gradients of q, k, v and the encoding's parameters or gates) on each path:

- CoPE: ``eager`` (every ``[b, h, q, k]`` tensor of the formula kept for the backward pass),
  ``chunked`` (blocks of query rows, each recomputed in the backward pass);
- forgetting attention: ``eager``, ``sdpa`` (the bias as SDPA's float mask) and ``chunked``.

First every path is shown to give the same output and gradients as ``eager`` (within 1e-5;
the script exits 1 otherwise). ``saved MiB`` is what autograd keeps for the backward pass
(``torch.autograd.graph.saved_tensors_hooks``, exact and machine-independent); ``ms`` the
median wall time of ``--repeats`` steps after one warm-up; ratios are against ``eager``.
No peer is timed: the CoPE paper's released code computes the eager formula (posenc equals it
to 1e-14) and forgetting attention's own kernel is Triton on CUDA.
"""

from __future__ import annotations

import argparse
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


def _step(enc, backend: str, q, k, v, gates):
    return posenc.attention(q, k, v, encoding=enc, causal=True, backend=backend, gates=gates)


def _run(name: str, s: int, backends: list[str], args) -> list[str]:
    gen = torch.Generator().manual_seed(0)
    b, h, d = args.batch, args.heads, args.head_dim
    q, k, v = _inputs(s, b, h, d, gen)
    gates = None
    if name == "cope":
        enc = posenc.build("cope", head_dim=d, npos_max=s + 1)
        with torch.no_grad():
            enc.weight.normal_(0, 0.1, generator=gen)
    else:
        enc = posenc.build("fox", num_heads=h)
        gates = torch.nn.functional.logsigmoid(torch.randn(b, h, s, generator=gen) + 3)
        gates.requires_grad_(True)
    leaves = [q, k, v, *([gates] if gates is not None else []), *enc.parameters()]

    def grads(backend: str):
        for t in leaves:
            t.grad = None
        out = _step(enc, backend, q, k, v, gates)
        out.sum().backward()
        return out.detach(), [t.grad.clone() for t in leaves]

    want, want_grads = grads("eager")
    rows, base = [], {}
    for backend in backends:
        got, got_grads = grads(backend)
        ok = torch.allclose(got, want, atol=1e-5, rtol=1e-5) and all(
            torch.allclose(g, w, atol=1e-4, rtol=1e-4) for g, w in zip(got_grads, want_grads)
        )
        if not ok:
            print(f"{name} {backend} at s={s}: not equal to eager", file=sys.stderr)
            sys.exit(1)
        saved = _saved_bytes(lambda backend=backend: _step(enc, backend, q, k, v, gates))
        times = []
        for _ in range(args.repeats + 1):
            began = time.perf_counter()
            _step(enc, backend, q, k, v, gates).sum().backward()
            times.append(time.perf_counter() - began)
        ms = 1000 * statistics.median(times[1:])
        base.setdefault("saved", saved)
        base.setdefault("ms", ms)
        rows.append(
            f"| {name} | {s} | {backend} | {saved / 2**20:.1f} | {saved / base['saved']:.3f} "
            f"| {ms:.1f} | {ms / base['ms']:.2f} |"
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
    lengths = [256] if args.quick else [256, 1024, 2048]
    print(f"b={args.batch}, h={args.heads}, d={args.head_dim}, float32, 1 thread, causal")
    print("| encoding | s | path | saved MiB | saved / eager | ms | ms / eager |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for s in lengths:
        for row in _run("cope", s, ["eager", "chunked"], args):
            print(row)
        for row in _run("fox", s, ["eager", "sdpa", "chunked"], args):
            print(row)


if __name__ == "__main__":
    main()
