"""Time and peak memory of ALiBi and T5 attention by path: SDPA with the bias materialised,
FlexAttention with the encoding's score_mod, and eager matmul + softmax.

    python benchmarks/attention_bias.py                      # CPU: L = 512, 1024, 2048
    python benchmarks/attention_bias.py --lengths 1024 16384 # CUDA default: 1k .. 16k
    python benchmarks/attention_bias.py --out bench.json

Causal self-attention, inference (``torch.no_grad()``: Flex has no backward on CPU),
b = 1, h = 8, d = 64, float32 (``--dtype bfloat16`` on CUDA). Each cell is the median of
``--repeats`` timed calls after one warm-up call (whose time, the Flex compile included,
is reported as ``first_s``). A row ``none`` (SDPA without any bias) gives the floor.

Peak memory:
- CUDA: ``torch.cuda.max_memory_allocated()`` during the call, minus the memory held
  before it (inputs excluded);
- CPU: the peak resident set size during the call (``/proc/self/statm``, sampled by a
  thread every 0.5 ms) minus the size before it, after ``malloc_trim(0)`` has given freed
  heap memory back to the OS. This is approximate (allocations may still reuse memory the
  process holds, and the sampler can miss short peaks), but it tracks the big tensors
  (bias, logits, probabilities). ``bias_MiB`` is exact: the ``[h, L, L]``
  float32 bias the path materialises (0 for Flex, which computes it from indices).

Ratios are against the SDPA path of the same encoding and length. Every path's output is
checked against SDPA's (``max_diff``).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import threading
import time
import warnings
from typing import Any

import torch

import posenc
from posenc.attend import FLEX_MIN_BIAS_BYTES

CPU_LENGTHS = [512, 1024, 2048]
CUDA_LENGTHS = [1024, 2048, 4096, 8192, 16384]
PATHS = ["sdpa", "flex", "eager"]


def _malloc_trim() -> None:
    """Give freed heap memory back to the OS (glibc), so the next peak is measured from a
    low baseline instead of reusing memory the process already holds."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


class _RssPeak:
    """Peak resident set size above the baseline, sampled by a thread (Linux)."""

    def __init__(self, interval: float = 0.0005) -> None:
        self.interval = interval
        self.page = os.sysconf("SC_PAGE_SIZE")

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def __enter__(self) -> _RssPeak:
        _malloc_trim()
        self.base = self.peak = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            time.sleep(self.interval)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())

    @property
    def bytes(self) -> int:
        return self.peak - self.base


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measure(fn, device: torch.device) -> tuple[float, int, torch.Tensor]:
    """(seconds, peak bytes above baseline, output) of one call."""
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        start = time.perf_counter()
        out = fn()
        _sync(device)
        seconds = time.perf_counter() - start
        return seconds, torch.cuda.max_memory_allocated(device) - base, out
    with _RssPeak() as peak:
        start = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - start
    return seconds, peak.bytes, out


def bench_cell(enc, length: int, path: str, args, device, dtype) -> dict[str, Any]:
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (
        torch.randn(1, args.heads, length, args.head_dim, generator=g).to(device, dtype)
        for _ in range(3)
    )
    backend = "sdpa" if path == "none" else path

    def call():
        return posenc.attention(q, k, v, encoding=enc, causal=True, backend=backend)

    row: dict[str, Any] = {"length": length, "path": path}
    try:
        with torch.no_grad():
            first, _, _ = _measure(call, device)
            runs = [_measure(call, device) for _ in range(args.repeats)]
    except (RuntimeError, MemoryError) as e:  # out of memory, or a path that cannot run
        row["error"] = str(e).splitlines()[0][:200]
        return row
    row["first_s"] = first
    row["time_ms"] = 1000 * statistics.median(r[0] for r in runs)
    row["peak_bytes"] = max(r[1] for r in runs)
    bias_bytes = 4 * args.heads * length * length
    row["bias_bytes"] = 0 if path in ("flex", "none") else bias_bytes
    row["_out"] = runs[-1][2]
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", help="sequence lengths")
    parser.add_argument("--encodings", nargs="+", default=["alibi", "t5"])
    parser.add_argument("--paths", nargs="+", default=PATHS, choices=PATHS)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=None, help="timed calls (CPU 2, CUDA 10)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    cuda = device.type == "cuda"
    lengths = args.lengths or (CUDA_LENGTHS if cuda else CPU_LENGTHS)
    args.repeats = args.repeats or (10 if cuda else 2)
    torch.manual_seed(0)
    warnings.filterwarnings("ignore", message=".*flex_attention.*")

    rows: list[dict[str, Any]] = []
    for name in args.encodings:
        build = {"t5": {"causal": True}}.get(name, {})
        enc = posenc.build(name, num_heads=args.heads, **build).to(device)
        for length in lengths:
            cells = [bench_cell(None, length, "none", args, device, dtype)]
            cells += [bench_cell(enc, length, p, args, device, dtype) for p in args.paths]
            ref = next((c for c in cells if c["path"] == "sdpa" and "error" not in c), None)
            ref_out = None if ref is None else ref["_out"].float()
            for c in cells:
                c["encoding"] = name
                out = c.pop("_out", None)
                if ref_out is not None and out is not None and c["path"] != "none":
                    c["max_diff"] = float((out.float() - ref_out).abs().max())
                if ref is not None and "error" not in c:
                    c["time_ratio"] = c["time_ms"] / ref["time_ms"]
                    c["memory_ratio"] = c["peak_bytes"] / max(ref["peak_bytes"], 1)
            del ref_out
            rows.extend(cells)
            for c in cells:
                _print_row(c)

    result = {
        "benchmark": "attention_bias",
        "device": torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "batch": 1,
        "heads": args.heads,
        "head_dim": args.head_dim,
        "dtype": args.dtype,
        "causal": True,
        "repeats": args.repeats,
        "flex_min_bias_bytes": FLEX_MIN_BIAS_BYTES,
        "memory": "cuda max_memory_allocated" if cuda else "peak RSS delta (sampled)",
        "results": rows,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.out}")
    return result


_HEADER = False


def _print_row(c: dict[str, Any]) -> None:
    global _HEADER
    if not _HEADER:
        print(
            f"{'encoding':8} {'L':>6} {'path':6} {'time ms':>10} {'x sdpa':>7} {'first s':>8} "
            f"{'peak MiB':>9} {'x sdpa':>7} {'bias MiB':>9} {'max diff':>9}"
        )
        _HEADER = True
    mib = 2**20
    if "error" in c:
        print(f"{c['encoding']:8} {c['length']:>6} {c['path']:6} error: {c['error']}")
        return
    print(
        f"{c['encoding']:8} {c['length']:>6} {c['path']:6} {c['time_ms']:>10.2f} "
        f"{c.get('time_ratio', float('nan')):>7.2f} {c['first_s']:>8.2f} "
        f"{c['peak_bytes'] / mib:>9.1f} {c.get('memory_ratio', float('nan')):>7.2f} "
        f"{c['bias_bytes'] / mib:>9.1f} {c.get('max_diff', 0.0):>9.1e}",
        flush=True,
    )


if __name__ == "__main__":
    main()
