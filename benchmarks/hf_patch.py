"""A transformers Llama with posenc's RoPE patched in, against the same model unpatched.

    python benchmarks/hf_patch.py                      # b=4, s=1024, 7 repeats
    python benchmarks/hf_patch.py --quick              # a fast run (nothing written)
    python benchmarks/hf_patch.py --device cuda --dtype bfloat16 --out run.json

The model is a tiny random ``LlamaForCausalLM`` built from its config (``--hidden`` 256,
``--layers`` 2, ``--heads`` 8 with 4 key/value heads, head_dim 32, MLP 2x, vocab 512, SDPA
attention, no download). ``patched`` is a deep copy of it given to
``posenc.integrations.transformers.patch``: posenc's cos/sin (float64 angles reduced before
rounding, used in float32) and its fused rotation of q and k; ``unpatched`` is
transformers' own rotary module and ``apply_rotary_pos_emb``. Two things are timed:

- ``prefill``: one forward over ``--batch-size`` x ``--seq-len`` tokens under
  ``torch.no_grad()`` (logits for every position, as a prefill computes them);
- ``train step``: forward, the language-model loss, backward and one AdamW step (each model
  its own optimizer, built before timing).

First the two models are shown to be one model (the same logits within float32 rounding,
rtol 1e-5 / atol 1e-5; the script exits 1 otherwise). Then each repeat runs both, the
order alternating between repeats, after ``--warmup`` untimed calls of each; each cell is
the median over ``--repeats`` of one call's wall time (CUDA: synchronised). ``patched /
unpatched`` below 1 means posenc's RoPE makes the whole model faster; the median of the
per-repeat ratios is printed too (it cancels load that hits both calls of a repeat).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).parent / "results"


def build(args: argparse.Namespace) -> tuple[Any, Any]:
    import transformers

    from posenc.integrations.transformers import patch

    config = transformers.LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=max(1, args.heads // 2),
        max_position_embeddings=max(4096, args.seq_len),
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        unpatched = transformers.LlamaForCausalLM(config)
    unpatched = unpatched.to(device=args.device, dtype=getattr(torch, args.dtype))
    patched = patch(copy.deepcopy(unpatched))
    return unpatched, patched


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def check_equal(unpatched: Any, patched: Any, ids: torch.Tensor) -> dict[str, float]:
    with torch.no_grad():
        a = unpatched(ids[:, :256]).logits.float()
        b = patched(ids[:, :256]).logits.float()
    tol = 1e-5 if a.dtype == torch.float32 and ids.device.type == "cpu" else 2e-2
    err = float((a - b).abs().max())
    torch.testing.assert_close(b, a, rtol=tol, atol=tol)
    return {"max_abs_logit_diff": err, "max_abs_logit": float(a.abs().max()), "tolerance": tol}


def prefill(model: Any, ids: torch.Tensor) -> None:
    with torch.no_grad():
        model(ids)


def train_step(model: Any, optimizer: Any, ids: torch.Tensor) -> None:
    loss = model(ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def timed(fn: Any, device: str) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def run(args: argparse.Namespace) -> dict[str, Any]:
    unpatched, patched = build(args)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, args.vocab, (args.batch_size, args.seq_len), generator=gen)
    ids = ids.to(args.device)
    checks = check_equal(unpatched.eval(), patched.eval(), ids)
    models = {"unpatched": unpatched, "patched": patched}
    optimizers = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    phases = {
        "prefill": lambda name: prefill(models[name].eval(), ids),
        "train step": lambda name: train_step(models[name].train(), optimizers[name], ids),
    }
    rows = []
    for phase, call in phases.items():
        for _ in range(args.warmup):
            for name in models:
                call(name)
        times: dict[str, list[float]] = {name: [] for name in models}
        for repeat in range(args.repeats):
            order = list(models) if repeat % 2 == 0 else list(reversed(models))
            for name in order:
                times[name].append(timed(lambda c=call, n=name: c(n), args.device))
        ratios = [p / u for p, u in zip(times["patched"], times["unpatched"])]
        row = {
            "phase": phase,
            "unpatched_ms": statistics.median(times["unpatched"]) * 1e3,
            "patched_ms": statistics.median(times["patched"]) * 1e3,
            "median_paired_ratio": statistics.median(ratios),
            "times_s": times,
        }
        row["ratio"] = row["patched_ms"] / row["unpatched_ms"]
        rows.append(row)
    return {"checks": checks, "rows": rows}


def print_table(rows: list[dict[str, Any]]) -> None:
    print("| phase | unpatched | patched | patched / unpatched | median paired ratio |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['phase']} | {r['unpatched_ms']:.1f} ms | {r['patched_ms']:.1f} ms | "
            f"{r['ratio']:.3f} | {r['median_paired_ratio']:.3f} |"
        )


def machine(device: str) -> dict[str, Any]:
    import transformers

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "threads": torch.get_num_threads(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            models = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        info["cpu"] = f"{models[0]} x {len(models)}" if models else platform.processor()
    except OSError:
        info["cpu"] = platform.processor()
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per model")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls per model first")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--quick", action="store_true", help="s=256, 3 repeats, no file")
    parser.add_argument(
        "--out",
        default=None,
        help="the JSON file (default: benchmarks/results/hf-patch-<device>-<date>.json; "
        "none with --quick)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seq_len = min(args.seq_len, 256)
    args.repeats = args.repeats or (3 if args.quick else 7)
    if min(args.batch_size, args.seq_len, args.repeats, args.hidden, args.layers) < 1:
        parser.error("sizes and --repeats must be >= 1")
    if args.hidden % args.heads or (args.hidden // args.heads) % 2:
        parser.error("--hidden must be a multiple of --heads with an even head_dim")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(
        f"Llama: {args.layers} layers, hidden {args.hidden}, {args.heads} heads "
        f"(head_dim {args.hidden // args.heads}), vocab {args.vocab}; batch {args.batch_size} "
        f"x {args.seq_len}, {args.dtype} on {args.device}, {torch.get_num_threads()} thread(s), "
        f"{args.repeats} repeats (+{args.warmup} warm-up)\n"
    )
    try:
        result = run(args)
    except AssertionError as error:
        print(f"the patched model's logits differ from the unpatched model's: {error}")
        sys.exit(1)
    print(
        f"check: max |logit difference| {result['checks']['max_abs_logit_diff']:.2e} "
        f"(largest |logit| {result['checks']['max_abs_logit']:.2f})\n"
    )
    print_table(result["rows"])
    date = datetime.date.today().isoformat()
    out = args.out
    if out is None and not args.quick:
        out = str(RESULTS / f"hf-patch-{args.device}-{date}.json")
    if out:
        document = {
            "benchmark": "hf_patch",
            "date": date,
            "device": args.device,
            "machine": machine(args.device),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "command": "python "
            + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
            "settings": {k: v for k, v in vars(args).items() if k != "out"},
            "checks": result["checks"],
            "rows": result["rows"],
        }
        with open(out, "w") as f:
            json.dump(document, f, indent=1)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
