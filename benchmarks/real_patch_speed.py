"""SmolLM2-135M with posenc's RoPE patched in, against the same checkpoint unpatched.

    python benchmarks/real_patch_speed.py                  # float32 and bfloat16, 5 repeats
    python benchmarks/real_patch_speed.py --dtypes float32 --phases prefill-1k decode --repeats 3

The model is the real checkpoint ``.cache/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``
(``python scripts/fetch_models.py smollm2`` fetches it; the script skips with that command
when it is absent), loaded once per ``--dtypes`` value through transformers' GGUF reader
(weights dequantized into plain layers of that dtype; SDPA attention). ``patched`` is a
deep copy given to ``posenc.integrations.transformers.patch`` (posenc's cos/sin: float64
angles reduced before rounding, used in float32; its fused rotation of q and k),
``unpatched`` is transformers' own rotary module and ``apply_rotary_pos_emb``. The tokens are
the start of the standard library's ``_pydecimal.py``. Phases, all under
``torch.inference_mode()``:

- ``prefill-1k`` / ``prefill-8k``: one forward over 1024 / 8192 tokens, ``use_cache=False``,
  logits at the last position only (``logits_to_keep=1``);
- ``decode``: a 256-token prompt prefilled into transformers' KV cache (not timed), then 256
  new tokens chosen greedily, one forward each: the time of those 256 steps, as tokens/s.

First the two models are shown to be one model: the same logits over 256 tokens within
float32 rounding (float32: max |difference| <= 1e-3 against logits of size ~20, else the
script exits 1; bfloat16 rounds cos/sin and the rotation differently in the two, so there
the difference and the greedy agreement are reported only). Each phase then runs
``--warmup`` untimed calls of each model (decode: of ``--warmup-tokens`` 16 steps) and ``--repeats`` timed repeats (``prefill-8k``:
``--repeats-8k``, no warm-up, as it takes seconds per call), each repeat running both models,
the order alternating between repeats. A cell is the median with min-max over the repeats;
``patched / unpatched`` is the ratio of the medians, and the paired ratios of one repeat each
give the spread (median, min-max): "level" when that spread contains 1.

RoPE's share: during every timed call, a forward pre-hook and hook on the rotary module
(``model.model.rotary_emb``: transformers' or posenc's) and a timing wrapper around the apply
function each attention layer's ``forward`` finds under ``apply_rotary_pos_emb`` in its
globals (transformers' module's, or the copy ``patch`` gave the patched model with posenc's
function in it) add up the wall time of computing cos/sin and of rotating q and k; the share
is that over the call's time (decode: over the 256 steps), median over the repeats; the
JSON also holds the two parts in ms per call (decode: per step).

On a shared machine run it with ``--threads 1``: with two threads and another process on the
second core, every parallel region waits for it (a [1, 576] x [576, 1536] matmul took 8 ms
there against 0.17 ms on one thread), so the times measure the other tenants, and favour
whichever model has fewer operations, more than they measure RoPE.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import inspect
import json
import statistics
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from real_precision import (
    RESULTS,
    find_model,
    load_average,
    load_model,
    load_tokenizer,
    machine,
    missing_packages,
    text_ids,
)

PHASES = ("prefill-1k", "prefill-8k", "decode")
APPLY = "apply_rotary_pos_emb"
FP32_TOLERANCE = 1e-3


# --- RoPE's share: hooks on the rotary module, a wrapper around the apply function ---------


class RopeClock:
    """Wall time spent in one model's rotary module and apply function since ``reset``."""

    def __init__(self, model: Any, expect_posenc: bool) -> None:
        self.rotary_s = self.apply_s = 0.0
        self.calls = 0
        self._start = 0.0
        rotary = model.model.rotary_emb
        rotary.register_forward_pre_hook(lambda *_: self._enter())
        rotary.register_forward_hook(lambda *_: self._leave())
        self.globals_: list[dict[str, Any]] = []
        for layer in model.model.layers:
            found = inspect.unwrap(layer.self_attn.forward.__func__).__globals__
            if all(found is not g for g in self.globals_):
                self.globals_.append(found)
        for found in self.globals_:
            module = getattr(found[APPLY], "__module__", "")
            if module.startswith("posenc") != expect_posenc:
                raise SystemExit(f"the attention's {APPLY} is {module}'s: cannot time RoPE")

    def _enter(self) -> None:
        self._start = time.perf_counter()

    def _leave(self) -> None:
        self.rotary_s += time.perf_counter() - self._start

    def reset(self) -> None:
        self.rotary_s = self.apply_s = 0.0
        self.calls = 0

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        """The apply function timed for the duration (put back after)."""
        originals = [g[APPLY] for g in self.globals_]
        for g, original in zip(self.globals_, originals):
            g[APPLY] = self._timed(original)
        try:
            yield
        finally:
            for g, original in zip(self.globals_, originals):
                g[APPLY] = original

    def _timed(self, apply: Callable[..., Any]) -> Callable[..., Any]:
        def timed_apply(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            out = apply(*args, **kwargs)
            self.apply_s += time.perf_counter() - t0
            self.calls += 1
            return out

        return timed_apply


# --- the phases -------------------------------------------------------------------------------


def prefill(model: Any, ids: torch.Tensor) -> None:
    with torch.inference_mode():
        model(ids, use_cache=False, logits_to_keep=1)


def decode(model: Any, prompt: torch.Tensor, new: int) -> tuple[float, list[int]]:
    """``(seconds, tokens)``: ``new`` greedy steps with the KV cache after ``prompt``."""
    with torch.inference_mode():
        out = model(prompt, use_cache=True, logits_to_keep=1)
        cache, token = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
        tokens = []
        t0 = time.perf_counter()
        for _ in range(new):
            out = model(token, cache=cache, use_cache=True)
            cache, token = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(int(token))
        return time.perf_counter() - t0, tokens


def check_equal(models: dict[str, Any], ids: torch.Tensor, dtype: str) -> dict[str, Any]:
    """The two models' logits over ``ids``: their largest difference and greedy agreement."""
    with torch.inference_mode():
        a, b = (models[name](ids).logits[0].float() for name in ("unpatched", "patched"))
    check = {
        "tokens": ids.shape[1],
        "max_abs_logit_diff": float((a - b).abs().max()),
        "max_abs_logit": float(a.abs().max()),
        "greedy_agree": float((a.argmax(-1) == b.argmax(-1)).double().mean()),
    }
    if dtype == "float32" and check["max_abs_logit_diff"] > FP32_TOLERANCE:
        print(f"the patched model's logits differ from the unpatched model's: {check}")
        sys.exit(1)
    return check


def timed_call(phase: str, model: Any, clock: RopeClock, data: dict, new_tokens: int) -> dict:
    """One call of ``phase``: its seconds, RoPE's seconds in it, and (decode: ``new_tokens``
    steps) its tokens."""
    clock.reset()
    with clock.timing():
        if phase == "decode":
            seconds, tokens = decode(model, data["prompt"], new_tokens)
        else:
            t0 = time.perf_counter()
            prefill(model, data[phase])
            seconds, tokens = time.perf_counter() - t0, None
    return {"s": seconds, "cos_sin_s": clock.rotary_s, "apply_s": clock.apply_s, "tokens": tokens}


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run_phase(
    phase: str, models: dict, clocks: dict, data: dict, args: argparse.Namespace
) -> dict[str, Any]:
    """Warm-up, then interleaved repeats of both models; medians, spreads, paired ratios."""
    repeats = args.repeats_8k if phase == "prefill-8k" else args.repeats
    warmup = 0 if phase == "prefill-8k" else args.warmup
    for _ in range(warmup):
        for name in models:
            timed_call(phase, models[name], clocks[name], data, args.warmup_tokens)
    calls: dict[str, list[dict]] = {name: [] for name in models}
    for repeat in range(repeats):
        order = list(models) if repeat % 2 == 0 else list(reversed(models))
        for name in order:
            call = timed_call(phase, models[name], clocks[name], data, args.new_tokens)
            calls[name].append(call)
    row: dict[str, Any] = {"phase": phase, "repeats": repeats, "warmup": warmup}
    for name, done in calls.items():
        seconds = [c["s"] for c in done]
        steps = args.new_tokens if phase == "decode" else 1
        row[name] = {
            "s": spread(seconds),
            "rope_share": spread([(c["cos_sin_s"] + c["apply_s"]) / c["s"] for c in done]),
            "cos_sin_ms_per_step": spread([c["cos_sin_s"] * 1e3 / steps for c in done]),
            "apply_ms_per_step": spread([c["apply_s"] * 1e3 / steps for c in done]),
            "times_s": seconds,
        }
        if phase == "decode":
            row[name]["tokens_per_s"] = spread([args.new_tokens / s for s in seconds])
    paired = [p["s"] / u["s"] for p, u in zip(calls["patched"], calls["unpatched"])]
    row["ratio"] = row["patched"]["s"]["median"] / row["unpatched"]["s"]["median"]
    row["paired_ratio"] = spread(paired)
    row["level"] = min(paired) <= 1.0 <= max(paired)
    if phase == "decode":
        row["same_tokens"] = calls["patched"][0]["tokens"] == calls["unpatched"][0]["tokens"]
    return row


def run_dtype(path: Path, dtype: str, data: dict, args: argparse.Namespace) -> dict[str, Any]:
    """Both models in ``dtype``: the equality check, then every phase."""
    from posenc.integrations.transformers import patch

    unpatched, load_s = load_model(path, getattr(torch, dtype))
    models = {"unpatched": unpatched, "patched": patch(copy.deepcopy(unpatched))}
    clocks = {name: RopeClock(m, name == "patched") for name, m in models.items()}
    check = check_equal(models, data["prompt"], dtype)
    print(
        f"{dtype}: loaded in {load_s:.0f} s; max |logit difference| {check['max_abs_logit_diff']:.2e}"
        f" (largest |logit| {check['max_abs_logit']:.1f}), greedy agree "
        f"{100 * check['greedy_agree']:.1f}% over {check['tokens']} tokens"
    )
    rows = []
    for phase in args.phases:
        t0 = time.perf_counter()
        row = run_phase(phase, models, clocks, data, args)
        row["dtype"] = dtype
        rows.append(row)
        print(f"  {phase}: {time.perf_counter() - t0:.0f} s, load average {load_average()}")
    return {"dtype": dtype, "load_s": load_s, "check": check, "rows": rows}


def cell(s: dict[str, float], scale: float = 1.0, digits: int = 0) -> str:
    return (
        f"{s['median'] * scale:.{digits}f} ({s['min'] * scale:.{digits}f}-"
        f"{s['max'] * scale:.{digits}f})"
    )


def print_table(results: list[dict[str, Any]], new_tokens: int) -> None:
    print(
        "\n| dtype | phase | unpatched | patched | patched / unpatched | paired ratio "
        "(min-max) | RoPE share unpatched | RoPE share patched |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for result in results:
        for r in result["rows"]:
            if r["phase"] == "decode":
                u, p = (
                    cell(r[n]["tokens_per_s"], 1, 1) + " tok/s" for n in ("unpatched", "patched")
                )
            else:
                u, p = (cell(r[n]["s"], 1e3) + " ms" for n in ("unpatched", "patched"))
            ratio = r["ratio"]
            level = " level" if r["level"] else ""
            shares = [cell(r[n]["rope_share"], 100, 1) + "%" for n in ("unpatched", "patched")]
            print(
                f"| {result['dtype']} | {r['phase']} (x{r['repeats']}) | {u} | {p} | {ratio:.3f} | "
                f"{cell(r['paired_ratio'], 1, 3)}{level} | {shares[0]} | {shares[1]} |"
            )
    print(
        "\n| dtype | phase | cos/sin unpatched | cos/sin patched | apply unpatched | apply patched |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for result in results:
        for r in result["rows"]:
            cells = [
                cell(r[n][part], 1, 3) + " ms"
                for part in ("cos_sin_ms_per_step", "apply_ms_per_step")
                for n in ("unpatched", "patched")
            ]
            print(f"| {result['dtype']} | {r['phase']} | {' | '.join(cells)} |")
    print(
        f"\n(decode: {new_tokens} new tokens; ratios are of times, patched over unpatched, "
        "so above 1 is slower; share = time in the rotary module and apply over the call's time; "
        "the second table is RoPE's time per call (decode: per step): the rotary module, and "
        "the apply calls of all layers together)"
    )


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"load average {load_average()}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dtypes", nargs="+", default=["float32", "bfloat16"], choices=("float32", "bfloat16")
    )
    parser.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES)
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per model")
    parser.add_argument("--repeats-8k", type=int, default=2, help="prefill-8k's repeats")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls per model first")
    parser.add_argument("--prompt-tokens", type=int, default=256, help="decode's prompt")
    parser.add_argument("--new-tokens", type=int, default=256, help="decode's new tokens")
    parser.add_argument(
        "--warmup-tokens", type=int, default=16, help="new tokens of a decode warm-up call"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--out", default=str(RESULTS / "real_patch_speed.json"))
    args = parser.parse_args(argv)
    if min(args.repeats, args.repeats_8k, args.prompt_tokens, args.new_tokens) < 1:
        parser.error("--repeats, --repeats-8k and token counts must be >= 1")
    missing = missing_packages()
    if missing:
        print(f"skipped: {', '.join(missing)} not installed (pip install 'posenc[hf,gguf]')")
        return
    path = find_model("smollm2")
    if path is None:
        return
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    before, up_before, t0 = load_average(), uptime(), time.perf_counter()
    print(f"{up_before}\n{torch.get_num_threads()} thread(s), {path.name}\n")
    text = Path(sysconfig.get_paths()["stdlib"]) / "_pydecimal.py"
    ids = text_ids(load_tokenizer(path), text, 8192)
    data = {"prefill-1k": ids[:, :1024], "prefill-8k": ids, "prompt": ids[:, : args.prompt_tokens]}
    results = [run_dtype(path, dtype, data, args) for dtype in args.dtypes]
    print_table(results, args.new_tokens)
    up_after = uptime()
    print(f"\nbefore: {up_before}\nafter:  {up_after}\n{time.perf_counter() - t0:.0f} s in all")
    document = {
        "benchmark": "real_patch_speed",
        "date": datetime.date.today().isoformat(),
        "model": path.name,
        "machine": machine(),
        "uptime_before": up_before,
        "uptime_after": up_after,
        "load_average_before": before,
        "load_average_after": load_average(),
        "wall_s": time.perf_counter() - t0,
        "command": "python "
        + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "settings": vars(args),
        "results": results,
    }
    with open(args.out, "w") as f:
        json.dump(document, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
