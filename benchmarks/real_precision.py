"""RoPE's angle precision on real checkpoints: transformers' float32 angles against posenc's.

    python benchmarks/real_precision.py                    # SmolLM2-135M and Gemma 3 270M
    python benchmarks/real_precision.py --models smollm2 --offsets 0 1000000 --out run.json

Each model (a GGUF file fetched by ``python scripts/fetch_models.py smollm2 gemma3``; a model
not fetched is skipped with that command) is loaded once in float32 and once in float64
(``from_pretrained(folder, gguf_file=name, dtype=...)``: the quantized weights dequantized
into plain ``nn.Linear`` layers of that dtype, checked below). The same text, the first
``--tokens`` (1024) tokens of ``--text`` (the standard library's ``_pydecimal.py``) as the
model's tokenizer splits it (its BOS included), runs at ``position_ids = arange(n) +
offset`` for each ``--offsets`` value (0, 1e5, 1e6), given explicitly, under four settings:

- ``fp32``: transformers' own float32 model (its angles ``p * w`` in float32);
- ``fp32 posenc``: the same model given to ``posenc.integrations.transformers.patch``
  (float64 angles reduced to ``[-pi, pi)`` before rounding; cos/sin and the rotation in
  float32), unpatched after;
- ``fp64``: the float64 model unpatched: float64 arithmetic except the angles, which
  transformers' rotary module computes in float32 whatever the model's dtype
  (``position_ids.float() * inv_freq.float()``, ``inv_freq`` itself float32), so this row
  shows what the float32 angles alone change;
- ``truth``: the float64 model patched by posenc: float64 angles reduced before rounding,
  float64 cos/sin and rotation. The other three are compared to it.

Neither float64 setting is float64 everywhere: transformers' RMSNorm (Llama's and Gemma 3's)
normalizes in float32 whatever the dtype, so the truth carries float32 rounding there. Its
size is measured: RoPE scores depend on position differences only and the causal mask on
token order, so in exact arithmetic a common offset changes nothing, and the truth at each
offset is compared with the truth at the first (``truth_vs_offset_0``: the largest per-token
loss difference and the greedy tokens that differ).

Per setting: perplexity of the text (next-token loss averaged over the ``n - 1`` predicted
tokens, computed in float64 from the logits), ``|ppl - ppl_truth|``, the fraction of the
``n`` positions whose greedy token (argmax) differs from the truth's (and the largest top-2
margin of the truth among those positions: a mismatch under a near-tie is rounding, not a
different answer), and the largest and mean ``|logit - logit_truth|``. The rotary tables
themselves are checked too: the largest error of transformers' float32 cos/sin and of
posenc's against a NumPy float64 reference (``cos(p * w)``, ``w = theta ** (-2i / d)``) at
the same positions, per layer type. SmolLM2's context is 8192 and Gemma 3's 32768: offsets
1e5 and 1e6 are far past them as absolute positions, but the distances between the tokens
are those of offset 0, so any change of the outputs there is rounding of the angles.

About 12 minutes on the project's 2 shared cores (load average 5 to 6): a third of it loading
the four models, the rest 24 forwards of 1024 tokens (float64 ones included).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"
CACHE = Path(os.environ.get("POSENC_MODEL_CACHE", ROOT / ".cache"))
FILES = {
    "smollm2": "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma3/gemma-3-270m-q4_k_m.gguf",
}
SETTINGS = ("fp32", "fp32 posenc", "fp64", "truth")
CHUNK = 128  # positions per log-softmax (Gemma's 262k-token vocabulary: 256 MB in float64)


# --- models and text ----------------------------------------------------------------------


def find_model(name: str) -> Path | None:
    """The GGUF file of ``name`` under ``.cache/models`` (``POSENC_MODEL_CACHE`` names another
    cache root), or None (then print how to fetch it)."""
    path = CACHE / "models" / FILES[name]
    if path.is_file():
        return path
    print(f"skipped {name}: {path} not found; fetch it with python scripts/fetch_models.py {name}")
    return None


def missing_packages() -> list[str]:
    """The packages loading a GGUF checkpoint needs that are not installed."""
    import importlib.util

    return [m for m in ("transformers", "gguf", "accelerate") if not importlib.util.find_spec(m)]


def load_model(path: Path, dtype: torch.dtype) -> tuple[Any, float]:
    """``(model, seconds)``: the GGUF checkpoint in ``dtype``, eval mode."""
    import transformers

    t0 = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=dtype
    ).eval()
    return model, time.perf_counter() - t0


def load_tokenizer(path: Path) -> Any:
    import transformers

    return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def check_plain(model: Any, dtype: torch.dtype) -> None:
    """Every parameter in ``dtype`` and every linear layer a plain ``nn.Linear`` (the weights
    dequantized, so the model computes in ``dtype``); exits otherwise."""
    bad = {p.dtype for p in model.parameters()} - {dtype}
    linears = {type(m).__name__ for m in model.modules() if "Linear" in type(m).__name__}
    if bad or linears - {"Linear"}:
        print(f"the {dtype} model is not plain: parameter dtypes {bad}, linear layers {linears}")
        sys.exit(1)


def text_ids(tokenizer: Any, text: Path, n: int) -> torch.Tensor:
    """The first ``n`` tokens of ``text`` as ``tokenizer`` splits it by default, ``[1, n]``."""
    ids = tokenizer(text.read_text(encoding="utf-8"))["input_ids"]
    if len(ids) < n:
        raise SystemExit(f"{text} has {len(ids)} tokens, fewer than --tokens {n}")
    return torch.tensor(ids[:n])[None]


def rope_thetas(config: Any) -> dict[str | None, float]:
    """``{layer_type: rope_theta}`` of a plain-RoPE config (None: one set for all layers)."""
    params = config.rope_parameters
    per_type = params if "rope_theta" not in params else {None: params}
    for kind, p in per_type.items():
        if p.get("rope_type", "default") != "default":
            raise SystemExit(f"layer type {kind}: rope_type {p['rope_type']} has no reference here")
    return {kind: float(p["rope_theta"]) for kind, p in per_type.items()}


# --- measurements -------------------------------------------------------------------------


def rotary_call(module: Any, positions: torch.Tensor, kind: str | None, dim: int) -> np.ndarray:
    """cos and sin of a rotary module at ``positions`` (its float32 table), ``[2, n, dim / 2]``:
    transformers' modules return ``[1, n, dim]`` (the halves repeated), posenc's ``[1, n, dim
    / 2]``."""
    x = torch.zeros(1, dtype=torch.float32)
    out = module(x, positions) if kind is None else module(x, positions, kind)
    return torch.stack([t[0, :, : dim // 2] for t in out]).double().numpy()


def table_errors(model: Any, positions: torch.Tensor, thetas: dict, dim: int) -> dict[str, Any]:
    """The largest ``|cos - cos(p w)|`` / ``|sin - sin(p w)|`` of ``model.model.rotary_emb``'s
    float32 table at ``positions`` against NumPy float64, per layer type."""
    p = positions[0].numpy().astype(np.float64)
    out = {}
    for kind, theta in thetas.items():
        w = theta ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
        ref = np.stack([np.cos(p[:, None] * w), np.sin(p[:, None] * w)])
        got = rotary_call(model.model.rotary_emb, positions, kind, dim)
        out[str(kind)] = float(np.abs(got - ref).max())
    return out


def forward_logits(model: Any, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(ids, position_ids=positions, use_cache=False).logits[0]


def summarize(logits: torch.Tensor, ids: torch.Tensor) -> dict[str, Any]:
    """Perplexity (float64) and the greedy tokens of ``logits [n, vocab]``."""
    nll, greedy = [], []
    targets = ids[0, 1:]
    for start in range(0, logits.shape[0], CHUNK):
        block = logits[start : start + CHUNK]
        greedy.append(block.argmax(-1))
        logp = block.double().log_softmax(-1)[: targets.shape[0] - start]
        picked = logp.gather(-1, targets[start : start + logp.shape[0], None])
        nll.append(-picked[:, 0])
    token_nll = torch.cat(nll)
    mean_nll = float(token_nll.mean())
    return {"ppl": float(np.exp(mean_nll)), "token_nll": token_nll, "greedy": torch.cat(greedy)}


def compare(logits: torch.Tensor, summary: dict, truth: dict) -> dict[str, Any]:
    """``summary`` (of ``logits``) against the truth's: perplexity, greedy tokens, logits."""
    t_logits, t_greedy = truth["logits"], truth["greedy"]
    worst, total = 0.0, 0.0
    for start in range(0, logits.shape[0], CHUNK):
        diff = (logits[start : start + CHUNK].double() - t_logits[start : start + CHUNK]).abs()
        worst, total = max(worst, float(diff.max())), total + float(diff.sum())
    differs = summary["greedy"] != t_greedy
    margins = truth["margins"][differs]
    return {
        "ppl": summary["ppl"],
        "abs_ppl_diff": abs(summary["ppl"] - truth["ppl"]),
        "greedy_differs": int(differs.sum()),
        "greedy_differs_fraction": float(differs.double().mean()),
        "max_truth_margin_where_differs": float(margins.max()) if margins.numel() else None,
        "max_abs_logit_diff": worst,
        "mean_abs_logit_diff": total / logits.numel(),
    }


def truth_of(logits: torch.Tensor, ids: torch.Tensor) -> dict[str, Any]:
    summary = summarize(logits, ids)
    top2 = torch.cat([b.topk(2, -1).values for b in logits.split(CHUNK)])
    return {**summary, "logits": logits, "margins": top2[:, 0] - top2[:, 1]}


def run_offset(models: dict, ids: torch.Tensor, offset: int) -> tuple[dict, dict]:
    """The four settings at ``offset``: each one's numbers against the truth's, and the
    truth's per-token loss and greedy tokens."""
    from posenc.integrations.transformers import patch, unpatch

    positions = torch.arange(ids.shape[1])[None] + offset
    times = {}
    t0 = time.perf_counter()
    truth = truth_of(forward_logits(patch(models["fp64"]), ids, positions), ids)
    unpatch(models["fp64"])
    times["truth"] = time.perf_counter() - t0
    rows = {}
    for setting in SETTINGS[:-1]:
        model = models["fp64" if setting == "fp64" else "fp32"]
        t0 = time.perf_counter()
        if setting.endswith("posenc"):
            patch(model)
        try:
            logits = forward_logits(model, ids, positions)
        finally:
            if setting.endswith("posenc"):
                unpatch(model)
        rows[setting] = compare(logits, summarize(logits, ids), truth)
        times[setting] = time.perf_counter() - t0
        del logits
    rows["truth"] = {"ppl": truth["ppl"], "abs_ppl_diff": 0.0}
    row = {"offset": offset, "settings": rows, "forward_s": times}
    return row, {"token_nll": truth["token_nll"], "greedy": truth["greedy"]}


def shift_check(truth: dict[str, Any], first: dict[str, Any]) -> dict[str, Any]:
    """The truth at this offset against the truth at the first one: RoPE's scores depend on
    position differences only, so in exact arithmetic a common offset changes nothing."""
    return {
        "max_abs_token_nll_diff": float((truth["token_nll"] - first["token_nll"]).abs().max()),
        "greedy_differs": int((truth["greedy"] != first["greedy"]).sum()),
    }


def run_model(name: str, args: argparse.Namespace) -> dict[str, Any] | None:
    """Every offset on model ``name`` (None when its file is not fetched)."""
    from posenc.integrations.transformers import patch, unpatch

    path = find_model(name)
    if path is None:
        return None
    models, load_s = {}, {}
    for key, dtype in (("fp32", torch.float32), ("fp64", torch.float64)):
        models[key], load_s[key] = load_model(path, dtype)
        check_plain(models[key], dtype)
    ids = text_ids(load_tokenizer(path), args.text, args.tokens)
    config = models["fp32"].config
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    thetas = rope_thetas(config)
    print(
        f"{name}: {path.name}, context {config.max_position_embeddings}, head_dim {dim}, "
        f"rope_theta {thetas}; loaded in {load_s['fp32']:.0f} s (float32), "
        f"{load_s['fp64']:.0f} s (float64)"
    )
    offsets: list[dict[str, Any]] = []
    first: dict[str, Any] | None = None
    for offset in args.offsets:
        positions = torch.arange(args.tokens)[None] + offset
        tables = {"fp32": table_errors(models["fp32"], positions, thetas, dim)}
        try:
            tables["fp32 posenc"] = table_errors(patch(models["fp32"]), positions, thetas, dim)
        finally:
            unpatch(models["fp32"])
        row, truth = run_offset(models, ids, offset)
        first = first or truth
        row["truth_vs_offset_" + str(args.offsets[0])] = shift_check(truth, first)
        row["table_max_abs_error"] = tables
        offsets.append(row)
        print(
            f"  offset {offset}: {', '.join(f'{k} {v:.0f} s' for k, v in row['forward_s'].items())}"
        )
    return {
        "model": name,
        "file": path.name,
        "context": config.max_position_embeddings,
        "head_dim": dim,
        "rope_theta": {str(k): v for k, v in thetas.items()},
        "tokens": args.tokens,
        "load_s": load_s,
        "offsets": offsets,
    }


# --- output -------------------------------------------------------------------------------


def print_tables(results: list[dict[str, Any]]) -> None:
    print(
        "\n| model | offset | setting | ppl | abs ppl diff to truth | greedy differs | "
        "max abs logit diff | mean abs logit diff |"
    )
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for result in results:
        for row in result["offsets"]:
            for setting, r in row["settings"].items():
                if setting == "truth":
                    print(
                        f"| {result['model']} | {row['offset']:g} | truth | {r['ppl']:.4f} |"
                        + truth_note(row)
                    )
                    continue
                margin = r["max_truth_margin_where_differs"]
                where = f" (truth margin <= {margin:.2g})" if margin is not None else ""
                print(
                    f"| {result['model']} | {row['offset']:g} | {setting} | {r['ppl']:.4f} | "
                    f"{r['abs_ppl_diff']:.2e} | {r['greedy_differs']} / {result['tokens']} "
                    f"({100 * r['greedy_differs_fraction']:.1f}%){where} | "
                    f"{r['max_abs_logit_diff']:.2e} | {r['mean_abs_logit_diff']:.2e} |"
                )
    print("\n| model | offset | layer type | transformers fp32 cos/sin max error | posenc fp32 |")
    print("| --- | ---: | --- | ---: | ---: |")
    for result in results:
        for row in result["offsets"]:
            tables = row["table_max_abs_error"]
            for kind in tables["fp32"]:
                print(
                    f"| {result['model']} | {row['offset']:g} | {kind} | "
                    f"{tables['fp32'][kind]:.2e} | {tables['fp32 posenc'][kind]:.2e} |"
                )


def truth_note(row: dict[str, Any]) -> str:
    """The truth row's cells: how it compares with the truth at the first offset."""
    key = next(k for k in row if k.startswith("truth_vs_offset_"))
    check = row[key]
    return (
        f" vs the truth at offset {key.rsplit('_', 1)[1]}: | greedy differs "
        f"{check['greedy_differs']} | max abs token-loss diff {check['max_abs_token_nll_diff']:.1e} | |"
    )


def machine() -> dict[str, Any]:
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
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        info["cpu"] = f"{names[0]} x {len(names)}" if names else platform.processor()
    except OSError:
        info["cpu"] = platform.processor()
    return info


def load_average() -> tuple[float, ...] | None:
    return os.getloadavg() if hasattr(os, "getloadavg") else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(FILES), choices=list(FILES))
    parser.add_argument("--offsets", nargs="+", type=int, default=[0, 100_000, 1_000_000])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument(
        "--text", type=Path, default=Path(sysconfig.get_paths()["stdlib"]) / "_pydecimal.py"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument(
        "--out",
        default=str(RESULTS / "real_precision.json"),
        help="the JSON file (default: benchmarks/results/real_precision.json)",
    )
    args = parser.parse_args(argv)
    if args.tokens < 2 or min(args.offsets) < 0:
        parser.error("--tokens must be >= 2 and --offsets >= 0")
    missing = missing_packages()
    if missing:
        print(f"skipped: {', '.join(missing)} not installed (pip install 'posenc[hf,gguf]')")
        return
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    before, t0 = load_average(), time.perf_counter()
    print(f"load average {before}, {torch.get_num_threads()} thread(s); text {args.text}\n")
    results = [r for r in (run_model(name, args) for name in args.models) if r is not None]
    if not results:
        print("nothing measured: no model fetched (python scripts/fetch_models.py smollm2 gemma3)")
        return
    print_tables(results)
    after = load_average()
    print(f"\nload average before {before}, after {after}; {time.perf_counter() - t0:.0f} s")
    document = {
        "benchmark": "real_precision",
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "load_average_before": before,
        "load_average_after": after,
        "wall_s": time.perf_counter() - t0,
        "command": "python "
        + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "results": results,
    }
    with open(args.out, "w") as f:
        json.dump(document, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
