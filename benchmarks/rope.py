"""RoPE speed: posenc's fused path against the plain path and the peers, same inputs, same run.

    python benchmarks/rope.py                                   # CPU: decode .. 2048-token prefill
    python benchmarks/rope.py --sizes goal --dtypes float32     # the CPU goal only
    python benchmarks/rope.py --device cuda --out rope-h200.json # GPU: up to 32k-token prefill

What is timed is the rotary step of attention: q ``[b, hq, s, d]`` and k ``[b, hk, s, d]``
rotated at explicit positions (cos/sin computed inside the call, as a model does), forward
(``fwd``) and forward + backward (``fwdbwd``, the gradient of both outputs):

- ``posenc fused``: ``posenc.RotaryEmbedding`` with the fast path (CPU loop / Triton);
- ``posenc plain``: the same module on the plain torch path;
- ``posenc kernel``: ``fused_rotary`` with cos/sin given (the kernel alone);
- ``compile plain``: ``torch.compile`` (inductor) of the plain path;
- ``transformers``: ``LlamaRotaryEmbedding`` cos/sin + ``apply_rotary_pos_emb`` (eager);
- ``rotary-emb-torch``: rotary-embedding-torch's ``rotate_queries_or_keys`` (its
  interleaved layout, positions ``arange(s)``: it takes no position tensor);
- ``liger`` (CUDA, if installed): Liger-Kernel's Triton ``liger_rotary_pos_emb`` with
  transformers' cos/sin;
- ``copy``: ``q.clone(), k.clone()``, the floor: one read and one write of q and k.

Peers are timed round-robin (one call of each, repeated, each round in an order of its own,
a seeded shuffle, so that no peer always runs after the one whose freed memory it faults
back in), so load on the machine hits them alike, with Python's garbage collector off while
timing (as ``timeit`` has it); each cell is the median (``--repeats`` calls, ten times as
many for calls under 10 MB). The summary's last lines pair the rounds: each round's time of
the plain path (and of the fused one) over transformers' in the same round, as the median,
the quartiles and the share of rounds it was the faster (the JSON rows' ``paired``).
``GB/s`` counts the least bytes a call must move:
q and k read once and written once (twice that for fwdbwd). ``%copy`` is that rate over
the copy's rate in the same run (``x copy``: the time over the time to copy as many
bytes); ``x fused`` is the peer's time over posenc fused's.
CPU runs also time ``copy_`` into preallocated buffers (``copy prealloc``): the memory
bandwidth without the page faults of fresh allocations, which every out-of-place
operation (clone included) pays; and (Linux) ``copy huge pages``, a copy into fresh
tensors advised to transparent huge pages as posenc's CPU kernel advises its outputs of
8 MiB and more, the fair floor for that kernel at the large sizes.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.util
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import posenc
from posenc.rotary.kernels import backends, fused_rotary
from posenc.rotary.kernels.plain import apply_rotary_torch

# name -> (b, hq, hk, s, d)
SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "decode": (16, 32, 8, 1, 128),
    "prefill-512": (1, 32, 8, 512, 128),
    "goal": (4, 16, 16, 2048, 128),  # the CPU goal: q and k [4, 16, 2048, 128]
    "prefill-16k": (1, 32, 8, 16384, 128),
    "prefill-32k": (2, 32, 8, 32768, 128),
}
CPU_SIZES = ["decode", "prefill-512", "goal"]
CUDA_SIZES = ["decode", "prefill-512", "goal", "prefill-16k", "prefill-32k"]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# --- peers ----------------------------------------------------------------------------------


class _FastPath:
    """posenc's fast path on or off (CPU loop or Triton, by device) inside a ``with``
    block: made once per peer, a class rather than a generator, so that entering it costs
    well under a microsecond beside calls of tens of microseconds at decode."""

    def __init__(self, on: bool, device: str):
        self.device = device
        self.on = on if device == "cpu" else on and importlib.util.find_spec("triton") is not None
        self.previous = (backends._cpu_on, backends._triton_on)

    def __enter__(self) -> None:
        self.previous = (backends._cpu_on, backends._triton_on)
        if self.device == "cpu":
            backends._cpu_on = self.on
        else:
            backends._triton_on = self.on

    def __exit__(self, *exc: object) -> None:
        backends._cpu_on, backends._triton_on = self.previous


def make_peers(size, dtype, device, *, compile_plain: bool) -> dict[str, Callable[..., Any]]:
    """Functions ``f(q, k) -> (q_out, k_out)`` with their tables built inside, as in a model."""
    _, hq, hk, s, d = size
    rope = posenc.RotaryEmbedding(d)
    positions = torch.arange(s, device=device)  # explicit positions, [s]
    peers: dict[str, Callable[..., Any]] = {}
    fast_on, fast_off = _FastPath(True, device), _FastPath(False, device)

    def fused(q, k):
        with fast_on:
            return rope(q, k, positions)

    def plain(q, k):
        with fast_off:
            return rope(q, k, positions)

    def plain_path(q, k):  # the plain path written out, for torch.compile
        cos, sin = rope.cos_sin(positions)
        return apply_rotary_torch(q, cos, sin), apply_rotary_torch(k, cos, sin)

    cos, sin = rope.cos_sin(positions)

    def kernel(q, k):
        with fast_on:
            return fused_rotary(q, k, cos, sin)

    peers["posenc fused"] = fused
    peers["posenc plain"] = plain
    peers["posenc kernel"] = kernel
    if compile_plain:
        torch._dynamo.reset()  # a fresh cache per size and dtype: no recompile limit reached
        peers["compile plain"] = torch.compile(plain_path)

    if importlib.util.find_spec("transformers") is not None:
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import (
            LlamaRotaryEmbedding,
            apply_rotary_pos_emb,
        )

        config = LlamaConfig(
            hidden_size=hq * d,
            num_attention_heads=hq,
            num_key_value_heads=hk,
            head_dim=d,
            max_position_embeddings=max(s, 2048),
        )
        hf_rope = LlamaRotaryEmbedding(config).to(device)
        position_ids = positions[None]  # [1, s]: the same positions for every sequence

        def transformers(q, k):
            cos, sin = hf_rope(q, position_ids)
            return apply_rotary_pos_emb(q, k, cos, sin)

        peers["transformers"] = transformers
        if device == "cuda" and importlib.util.find_spec("liger_kernel") is not None:
            from liger_kernel.transformers.rope import liger_rotary_pos_emb

            def liger(q, k):
                cos, sin = hf_rope(q, position_ids)
                return liger_rotary_pos_emb(q, k, cos, sin)

            peers["liger"] = liger

    if importlib.util.find_spec("rotary_embedding_torch") is not None:
        from rotary_embedding_torch import RotaryEmbedding as PeerRotary

        peer = PeerRotary(dim=d).to(device)

        def rotary_embedding_torch(q, k):
            return peer.rotate_queries_or_keys(q), peer.rotate_queries_or_keys(k)

        peers["rotary-emb-torch"] = rotary_embedding_torch

    def copy(q, k):
        return q.clone(), k.clone()

    peers["copy"] = copy
    return peers


def _libc_madvise():
    """libc's ``madvise`` (Linux), or None."""
    import ctypes
    import ctypes.util

    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn if sys.platform.startswith("linux") else None


_madvise = _libc_madvise()
_MADV_HUGEPAGE = 14


def _huge_copy(x: torch.Tensor) -> torch.Tensor:
    """A copy of x into a fresh tensor advised to huge pages (as posenc's CPU kernel
    advises its outputs of 8 MiB and more): the floor for an out-of-place result that
    does not fault its memory in 4 KiB pages."""
    y = torch.empty_like(x)
    n, huge = y.numel() * y.element_size(), 1 << 21
    if _madvise is not None and n >= 4 * huge:
        lo = (y.data_ptr() + huge - 1) & ~(huge - 1)
        hi = (y.data_ptr() + n) & ~(huge - 1)
        if hi > lo:
            _madvise(lo, hi - lo, _MADV_HUGEPAGE)
    return y.copy_(x)


# --- timing ---------------------------------------------------------------------------------


def _timer(device: str):
    if device == "cuda":

        def measure(fn: Callable[[], Any]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3

    else:

        def measure(fn: Callable[[], Any]) -> float:
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0

    return measure


def run_size(name, dtype, device, args) -> list[dict[str, Any]]:
    size = SIZES[name]
    b, hq, hk, s, d = size
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(b, hq, s, d, generator=gen).to(device=device, dtype=dtype)
    k = torch.randn(b, hk, s, d, generator=gen).to(device=device, dtype=dtype)
    grads = (torch.randn_like(q), torch.randn_like(k))
    elem = q.element_size()
    fwd_bytes = 2 * (q.numel() + k.numel()) * elem  # read q, k once; write them once
    peers = make_peers(size, dtype, device, compile_plain=not args.no_compile)
    measure = _timer(device)
    rows = []
    for mode in args.modes:
        leaves = (q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_())

        def call(fn, mode=mode, leaves=leaves):
            if mode == "fwd" or fn is peers["copy"]:  # the copy is the forward-only floor
                with torch.no_grad():
                    return fn(q, k)
            outs = fn(*leaves)
            if isinstance(outs[0], torch.Tensor) and outs[0].requires_grad:
                torch.autograd.backward(outs, grads)
            return None

        active = dict(peers)
        if device == "cpu" and mode == "fwd":
            buffers = (torch.empty_like(q), torch.empty_like(k))
            active["copy prealloc"] = lambda q, k, o=buffers: (o[0].copy_(q), o[1].copy_(k))
            if _madvise is not None:
                active["copy huge pages"] = lambda q, k: (_huge_copy(q), _huge_copy(k))
        first: dict[str, float] = {}
        for peer, fn in active.items():  # warm-up: compilation, caches, allocator
            t0 = time.perf_counter()
            call(fn)
            if device == "cuda":
                torch.cuda.synchronize()
            first[peer] = time.perf_counter() - t0
            for _ in range(args.warmup - 1):
                call(fn)
        times: dict[str, list[float]] = {peer: [] for peer in active}
        repeats = args.repeats * (10 if fwd_bytes < 10e6 else 1)  # small calls: more samples
        order = list(active.items())
        shuffle = random.Random(0)  # seeded: the same orders every run
        gc.collect()  # then no collection inside a timed call: as timeit, the collector is
        gc.disable()  # off while timing (a full one here took 0.1-0.2 s, whoever's call it hit)
        try:
            for _ in range(repeats):  # each round in an order of its own: no peer always
                for peer, fn in shuffle.sample(order, len(order)):  # follows the same one
                    for t in leaves:
                        t.grad = None
                    times[peer].append(measure(lambda fn=fn: call(fn)))
        finally:
            gc.enable()
        paired = _paired_ratios(times)
        for peer, ts in times.items():
            nbytes = fwd_bytes * (2 if mode == "fwdbwd" and "copy" not in peer else 1)
            rows.append(
                {
                    "size": name,
                    "shape_bhqhksd": list(size),
                    "dtype": str(dtype).removeprefix("torch."),
                    "mode": mode,
                    "peer": peer,
                    "median_ms": statistics.median(ts) * 1e3,
                    "min_ms": min(ts) * 1e3,
                    "max_ms": max(ts) * 1e3,
                    "repeats": len(ts),
                    "first_call_s": first[peer],
                    "bytes": nbytes,
                    "gbps": nbytes / statistics.median(ts) / 1e9,
                    "paired": paired.get(peer, {}),
                }
            )
    for mode in args.modes:
        same = [r for r in rows if r["mode"] == mode]
        fused = next(r for r in same if r["peer"] == "posenc fused")
        copy = next(r for r in same if r["peer"] == "copy")
        for r in same:
            r["pct_copy"] = 100 * r["gbps"] / copy["gbps"]
            r["x_copy"] = copy["gbps"] / r["gbps"]  # time over the time to copy as many bytes
            r["x_fused"] = r["median_ms"] / fused["median_ms"]
    return rows


# the paired ratios kept per row: (peer, over) -> each round's time of peer over over's
PAIRED = (
    ("posenc fused", "transformers"),
    ("posenc fused", "copy"),
    ("posenc plain", "transformers"),
)


def _paired_ratios(times: dict[str, list[float]]) -> dict[str, dict[str, dict[str, float]]]:
    """Each round's time of a peer over another's in that round (both timed in it, one
    after the other in its order), for the pairs of ``PAIRED``: the median, the quartiles
    and the share of rounds in which the peer was the faster, so that a claim reads the
    spread of the comparison and not the two medians alone."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for peer, over in PAIRED:
        if peer not in times or over not in times:
            continue
        ratios = sorted(a / b for a, b in zip(times[peer], times[over]))
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        out.setdefault(peer, {})[over] = {
            "median": statistics.median(ratios),
            "q1": q1,
            "q3": q3,
            "faster_share": sum(r < 1 for r in ratios) / len(ratios),
        }
    return out


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'size':<12} {'dtype':<9} {'mode':<7} {'peer':<17} {'ms':>10} {'GB/s':>8} "
        f"{'%copy':>6} {'x copy':>7} {'x fused':>8}"
    )
    for r in rows:
        print(
            f"{r['size']:<12} {r['dtype']:<9} {r['mode']:<7} {r['peer']:<17} "
            f"{r['median_ms']:>10.3f} {r['gbps']:>8.3g} {r['pct_copy']:>6.0f} "
            f"{r['x_copy']:>7.2f} {r['x_fused']:>8.2f}"
        )
    print()


def print_summary(rows: list[dict[str, Any]]) -> None:
    """posenc fused against the copy and transformers, per size, dtype and mode."""
    for r in rows:
        if r["peer"] != "posenc fused":
            continue
        peers = {
            p["peer"]: p
            for p in rows
            if (p["size"], p["dtype"], p["mode"]) == (r["size"], r["dtype"], r["mode"])
        }
        line = f"{r['size']} {r['dtype']} {r['mode']}: posenc fused = {r['x_copy']:.2f}x copy"
        for peer in ("transformers", "compile plain", "liger", "rotary-emb-torch"):
            if peer in peers:
                line += f", {peers[peer]['x_fused']:.2f}x faster than {peer}"
        print(line)
    for r in rows:
        for over, p in r.get("paired", {}).items():
            if r["peer"] == "posenc fused" and over == "copy":
                continue  # the line above has it
            print(
                f"{r['size']} {r['dtype']} {r['mode']}: {r['peer']} / {over}, paired by round: "
                f"{p['median']:.2f} (quartiles {p['q1']:.2f}-{p['q3']:.2f}), "
                f"faster in {100 * p['faster_share']:.0f}% of {r['repeats']} rounds"
            )


def machine(device: str) -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "threads": torch.get_num_threads(),
    }
    try:
        models = [
            ln.split(":", 1)[1].strip()
            for ln in open("/proc/cpuinfo")
            if ln.startswith("model name")
        ]
        info["cpu"] = f"{models[0]} x {len(models)}" if models else platform.processor()
    except OSError:
        info["cpu"] = platform.processor()
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
        if importlib.util.find_spec("triton") is not None:
            import triton

            info["triton"] = triton.__version__
    return info


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=None)
    parser.add_argument(
        "--dtypes", nargs="+", choices=list(DTYPES), default=["float32", "bfloat16"]
    )
    parser.add_argument("--modes", nargs="+", choices=["fwd", "fwdbwd"], default=["fwd", "fwdbwd"])
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per peer")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--max-mb",
        type=float,
        default=None,
        help="skip sizes whose forward moves more than this many MB",
    )
    parser.add_argument("--no-compile", action="store_true", help="leave out torch.compile")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    device = args.device
    if args.threads:
        torch.set_num_threads(args.threads)
    if device == "cpu" and not backends.cpu_fast_path_enabled():  # the default, where it builds
        print(
            "note: the fused CPU path is off here (see the 'posenc' log line); fused rows = plain"
        )
    sizes = args.sizes or (CPU_SIZES if device == "cpu" else CUDA_SIZES)
    args.repeats = args.repeats or (7 if device == "cpu" else 50)
    rows: list[dict[str, Any]] = []
    for dtype_name in args.dtypes:
        for name in sizes:
            b, hq, hk, s, d = SIZES[name]
            mb = 2 * b * (hq + hk) * s * d * DTYPES[dtype_name].itemsize / 1e6
            if args.max_mb is not None and mb > args.max_mb:
                print(f"skip {name} {dtype_name}: {mb:.0f} MB per forward > --max-mb {args.max_mb}")
                continue
            new = run_size(name, DTYPES[dtype_name], device, args)
            print_table(new)
            rows += new
            if device == "cuda":
                torch.cuda.empty_cache()
    print_summary(rows)
    result = {
        "date": datetime.date.today().isoformat(),
        "device": device,
        "machine": machine(device),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "command": "python "
        + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "rows": rows,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
