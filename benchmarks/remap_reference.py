"""posenc's remapped attention (Self-Extend, STRING) against the reference implementations,
whole logits of one tiny random Llama (not CI).

    python benchmarks/remap_reference.py --longlm DIR --string DIR
    python benchmarks/remap_reference.py --longlm DIR --string DIR --reference-only

``DIR`` is a checkout of each reference (datamllab/LongLM at :data:`REFERENCES`' commit, its
``SelfExtend.py`` and ``self_extend_patch/``; HKUNLP/STRING, its ``string_for_llama.py``);
the references are imported from there at run time, in a venv of their own
(``.cache/refvenv-longlm``: transformers 4.38.2; ``.cache/refvenv-string``: 4.43.3, the
versions their READMEs name), made once: ``torch==2.13.0`` first (the CPU wheel), then
transformers, safetensors, numpy. flash-attn and triton, which they import at module level,
are posenc's shims (``benchmarks/_reference_shims/``, flash-attn's documented semantics).
``benchmarks/_remap_reference_worker.py`` runs inside those venvs.

1. LongLM's venv builds the model (seeded; :data:`CONFIG`: trained context L = 64), saved
   with safetensors, and runs LongLM's eager ``self_extend_forward`` per case (``prefill``:
   one forward of all tokens; ``decode``: a prefill, then one token at a time through a
   ``DynamicCache``); STRING's venv runs ``replace_with_string`` and its forward, with its
   module global ``attention_factor`` (``0.1 ln 2 + 1``, a temperature on cos and sin that
   posenc's ``string`` does not apply) as shipped and set to 1.0. Each also runs the model
   unpatched (``plain``).
2. This venv (transformers 5.x, posenc) loads the same weights, ``patch(model)`` for
   ``plain`` and ``patch(model, scaling={"type": "self_extend" | "string", ...})`` per case,
   prefill and decode alike.
3. Every comparison is of whole logits ``[tokens, vocab]``: the largest absolute difference,
   and which rows (token positions) differ by more than :data:`TOL`, against the rows
   expected to (:func:`comparisons`). STRING's reference prefill counts the pair at offset
   exactly S twice (flash-attn's window ``[S, 0]`` includes offset S, and its shifted part
   includes it again): posenc differs from it at exactly the rows ``i >= S``. Its decode path
   counts it once, but needs more than S cached tokens (its slices assume ``kv > S``; at
   ``kv = S`` its empty part has ``lse = +inf`` and the merge gives 0), so it starts after a
   prefill of S + 1 tokens whose row S carries the double count: with the first layer alone
   posenc equals every decoded row, with both layers the decoded rows read row S's keys. A
   ``control`` (the reference remapped against its own plain model) differs from the first
   row whose offsets the map moves: a wrong map would be seen.

The JSON (``benchmarks/results/remap_reference.json``) holds every number, the cases, the
versions of both sides and the SHA-256 of the reference files that ran.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"
SHIMS = Path(__file__).parent / "_reference_shims"
WORKER = Path(__file__).parent / "_remap_reference_worker.py"
CACHE = ROOT / ".cache"

#: reference -> where it comes from and what its venv holds (the versions its README names).
REFERENCES: dict[str, dict[str, Any]] = {
    "longlm": {
        "repo": "datamllab/LongLM",
        "commit": "cdbbb061dc76438c46d7e1ddc500f8e4bf255574",
        "files": ["SelfExtend.py", "self_extend_patch/__init__.py", "self_extend_patch/Llama.py"],
        "requirements": ["transformers==4.38.2", "safetensors", "numpy"],
    },
    "string": {
        "repo": "HKUNLP/STRING",
        "commit": "216cc2f04cee147e8c3cfaa15723b182ecbe321e",
        "files": ["string_for_llama.py"],
        "requirements": ["transformers==4.43.3", "safetensors", "numpy"],
    },
}
TORCH = "torch==2.13.0"  # installed first: anything else may pull a CUDA build

#: The tiny random Llama (transformers ``LlamaConfig`` keys): trained context L = 64.
#: ``initializer_range`` 0.2 (not 0.02) makes attention peaked enough that a wrong map moves
#: the logits far above float32 rounding.
CONFIG: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.2,
    "tie_word_embeddings": False,
}
SEED = 0
TOKENS = 96  # 3 x the window of every case
#: A row differs when its largest absolute logit difference is above this (float32 logits
#: of order 1; the ``plain`` rows measure the floor both sides share).
TOL = 1e-4


@dataclass(frozen=True)
class Case:
    """One position map: its name, posenc's spec, and where decoding starts."""

    name: str
    reference: str
    spec: Mapping[str, Any]
    decode_from: int

    @property
    def window(self) -> int:
        """The first row with a pair in the remapped branch (W for Self-Extend, S for STRING)."""
        key = "neighbor_window" if self.spec["type"] == "self_extend" else "shift"
        return int(self.spec[key])

    def relative(self, i: int, j: int) -> float:
        """The relative position the map gives the pair (query ``i``, key ``j <= i``)."""
        d = i - j
        if self.spec["type"] == "self_extend":
            g, w = self.spec["group_size"], self.spec["neighbor_window"]
            return float(d) if d < w else i // g + w - w / g - j // g
        s, w = self.spec["shift"], self.spec["local_window"]
        return float(d) if d < s else float(d - s + w)

    def first_moved_row(self, tokens: int) -> int | None:
        """The first query row with a pair whose relative position the map changes (from it
        on, a remapped model's logits differ from the plain model's)."""
        for i in range(tokens):
            if any(self.relative(i, j) != i - j for j in range(i + 1)):
                return i
        return None

    def worker(self) -> dict[str, Any]:
        names = {"group_size", "neighbor_window", "shift", "local_window"}
        return {
            "name": self.name,
            "decode_from": self.decode_from,
            **{k: v for k, v in self.spec.items() if k in names},
        }


CASES = (
    Case(
        "self_extend G=4 W=32",
        "longlm",
        {"type": "self_extend", "group_size": 4, "neighbor_window": 32},
        16,
    ),
    # G does not divide W: the group branch's query positions are fractional (W - W / G)
    Case(
        "self_extend G=3 W=32",
        "longlm",
        {"type": "self_extend", "group_size": 3, "neighbor_window": 32},
        16,
    ),
    # decoding starts at S + 1: the reference's decode reads keys [kv - S, kv) and [0, kv - S),
    # so it needs kv > S (with kv = S its empty part has lse = +inf and its merge gives 0)
    Case("string S=32 W=8", "string", {"type": "string", "shift": 32, "local_window": 8}, 33),
)


# --- the reference venvs ---------------------------------------------------------------------


def venv_python(name: str, cache: Path = CACHE) -> Path:
    return cache / f"refvenv-{name}" / "bin" / "python"


def ensure_venv(name: str, cache: Path = CACHE, log: Any = sys.stderr) -> Path:
    """The reference's venv (made once; a stamp file records what it holds)."""
    folder = cache / f"refvenv-{name}"
    wanted = [TORCH, *REFERENCES[name]["requirements"]]
    stamp = folder / ".posenc-stamp.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        return venv_python(name, cache)
    print(f"making {folder} ({', '.join(wanted)})", file=log, flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(folder)], check=True)
    python = str(venv_python(name, cache))
    pip = [python, "-m", "pip", "install", "-q"]
    subprocess.run([*pip, TORCH], check=True)
    subprocess.run([*pip, *REFERENCES[name]["requirements"]], check=True)
    folder.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps(wanted) + "\n")
    return venv_python(name, cache)


def checkout_files(name: str, checkout: Path) -> dict[str, str]:
    """SHA-256 of the reference files that run; SystemExit naming the flag if one is missing."""
    out = {}
    for rel in REFERENCES[name]["files"]:
        path = checkout / rel
        if not path.is_file():
            repo, commit = REFERENCES[name]["repo"], REFERENCES[name]["commit"]
            raise SystemExit(
                f"--{name} {checkout}: {rel} is missing; make a checkout with "
                f"`git clone https://github.com/{repo} DIR && git -C DIR checkout {commit}`"
            )
        out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def run_reference(
    name: str, checkout: Path, model: Path, out: Path, ids: Sequence[int], build: bool
) -> None:
    """Run the worker in the reference's venv: ``out/<name>.npz`` and ``out/<name>.json``."""
    job = {
        "reference": name,
        "checkout": str(checkout.resolve()),
        "shims": str(SHIMS),
        "model": str(model),
        "out": str(out),
        "ids": list(ids),
        "seed": SEED,
        "config": CONFIG,
        "build": build,
        "threads": 1,
        "cases": [c.worker() for c in CASES if c.reference == name],
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-job.json"
    path.write_text(json.dumps(job, indent=1) + "\n")
    env = {**os.environ, "PYTHONNOUSERSITE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    env.pop("PYTHONPATH", None)
    subprocess.run([str(venv_python(name)), str(WORKER), str(path)], check=True, env=env)


def load_reference(name: str, out: Path) -> dict[str, Any]:
    """What the worker wrote: ``{"logits": {entry: [tokens, vocab]}, "record": {...}}``."""
    with np.load(out / f"{name}.npz") as data:
        logits = {k: data[k] for k in data.files}
    return {"logits": logits, "record": json.loads((out / f"{name}.json").read_text())}


# --- posenc's side ---------------------------------------------------------------------------


def posenc_logits(model_dir: Path, ids: Sequence[int]) -> dict[str, np.ndarray]:
    """The same weights in this venv's transformers, patched by posenc: ``plain`` and, per
    case, ``<name>/prefill`` and ``<name>/decode`` (STRING also ``<name>/decode/1 layer``,
    the first layer alone, and ``plain/1 layer``)."""
    from posenc.integrations.transformers import patch, unpatch

    model = _load(model_dir)
    one = _load(model_dir, layers=1)
    out = {"plain": _prefill(patch(model), ids), "plain/1 layer": _prefill(patch(one), ids)}
    unpatch(model)
    unpatch(one)
    for case in CASES:
        patch(model, scaling=dict(case.spec))
        try:
            out[f"{case.name}/prefill"] = _prefill(model, ids)
            out[f"{case.name}/decode"] = _decode(model, ids, case.decode_from)
        finally:
            unpatch(model)
        if case.reference == "string":
            patch(one, scaling=dict(case.spec))
            try:
                out[f"{case.name}/decode/1 layer"] = _decode(one, ids, case.decode_from)
            finally:
                unpatch(one)
    return out


def _load(model_dir: Path, layers: int | None = None) -> Any:
    import torch
    import transformers

    transformers.logging.set_verbosity_error()  # the first layer alone: layer 2's weights unused
    extra = {} if layers is None else {"num_hidden_layers": layers}
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, **extra
    )
    return model.eval()


def _prefill(model: Any, ids: Sequence[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits[0].float().numpy()


def _decode(model: Any, ids: Sequence[int], start: int) -> np.ndarray:
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        out = model(torch.tensor([list(ids[:start])]), cache=cache, use_cache=True)
        rows = [out.logits[0].float().numpy()]
        for p in range(start, len(ids)):
            out = model(torch.tensor([[ids[p]]]), cache=cache, use_cache=True)
            rows.append(out.logits[0].float().numpy())
    return np.concatenate(rows)


# --- comparisons -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """Reference entry ``theirs`` against ``ours`` (``posenc:<entry>``, or the reference's
    own entry for a control); ``expect``: the rows ``[a, b)`` expected to differ (None: none),
    all of them, or (``exact=False``) its first and any others of them."""

    reference: str
    case: str
    theirs: str
    ours: str
    expect: tuple[int, int] | None
    note: str
    exact: bool = True  # False: the differing rows lie in ``expect`` and include its first


def comparisons(cases: Sequence[Case] = CASES, tokens: int = TOKENS) -> list[Comparison]:
    """Every comparison the run makes, in table order."""
    rows = [
        Comparison(r, "plain", "plain", "posenc:plain", None, "no map: the floor of two versions")
        for r in ("longlm", "string")
    ]
    for c in cases:
        moved = c.first_moved_row(tokens)
        control = None if moved is None else (moved, tokens)
        if c.reference == "longlm":
            for path in ("prefill", "decode"):
                e = f"{c.name}/{path}"
                rows.append(Comparison("longlm", c.name, e, f"posenc:{e}", None, path))
            rows.append(
                Comparison(
                    "longlm",
                    c.name,
                    f"{c.name}/prefill",
                    "plain",
                    control,
                    "control: the reference against its plain model",
                )
            )
            continue
        n, s = c.name, c.window
        rows += [
            Comparison(
                "string",
                n,
                f"{n}/factor1/prefill",
                f"posenc:{n}/prefill",
                (s, tokens),
                "prefill (attention_factor 1): offset S counted twice at rows >= S",
            ),
            Comparison(
                "string",
                n,
                f"{n}/factor1/decode/1 layer",
                f"posenc:{n}/decode/1 layer",
                (s, s + 1),
                f"decode, first layer alone (attention_factor 1): rows < {c.decode_from} "
                f"from its prefill, the rest decoded",
            ),
            Comparison(
                "string",
                n,
                f"{n}/factor1/decode",
                f"posenc:{n}/decode",
                (s, tokens),
                f"decode, both layers (attention_factor 1): row {s}'s double count reaches "
                "the decoded rows through layer 2's keys",
                exact=False,
            ),
            Comparison(
                "string",
                n,
                f"{n}/shipped/prefill",
                f"posenc:{n}/prefill",
                (1, tokens),
                "prefill, attention_factor as shipped (0.1 ln 2 + 1 on cos and sin)",
            ),
            Comparison(
                "string",
                n,
                f"{n}/factor1/decode/1 layer",
                "plain/1 layer",
                control,
                "control: the reference (first layer) against its plain model",
            ),
        ]
    return rows


def row_ranges(rows: Sequence[int]) -> str:
    """``[3, 4, 5, 9]`` -> ``"3-5, 9"``; ``"none"`` when empty."""
    spans: list[list[int]] = []
    for r in sorted(rows):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans) or "none"


def compare(
    theirs: np.ndarray, ours: np.ndarray, expect: tuple[int, int] | None = None, tol: float = TOL
) -> dict[str, Any]:
    """Whole logits ``[tokens, vocab]``: the largest absolute difference per row, the rows
    above ``tol``, and the largest difference on the rows expected equal (outside
    ``expect``) and on those expected to differ."""
    if theirs.shape != ours.shape:
        raise ValueError(f"logits shapes differ: {theirs.shape} and {ours.shape}")
    per_row = np.abs(theirs.astype(np.float64) - ours.astype(np.float64)).max(axis=1)
    inside = np.zeros(per_row.size, dtype=bool)
    if expect is not None:
        inside[expect[0] : expect[1]] = True
    return {
        "max_abs": float(per_row.max()),
        "max_abs_expected_equal": float(per_row[~inside].max()) if (~inside).any() else None,
        "max_abs_expected_different": float(per_row[inside].max()) if inside.any() else None,
        "rows_differing": [int(i) for i in np.flatnonzero(per_row > tol)],
        "rows": int(per_row.size),
        "per_row_max_abs": [float(x) for x in per_row],
    }


def verdict(differing: Sequence[int], expect: tuple[int, int] | None, exact: bool = True) -> bool:
    """Whether the rows that differ are the expected ones: exactly ``[a, b)``, or (not
    ``exact``) some of them, ``a`` among them."""
    want = expected_rows(expect)
    if exact or not want:
        return list(differing) == want
    return bool(differing) and differing[0] == want[0] and set(differing) <= set(want)


def expected_rows(expect: tuple[int, int] | None) -> list[int]:
    return [] if expect is None else list(range(*expect))


def evaluate(
    rows: Sequence[Comparison],
    logits: Mapping[str, Mapping[str, np.ndarray]],
    tol: float = TOL,
) -> list[dict[str, Any]]:
    """Each comparison measured; ``pass`` when the rows that differ are exactly the
    expected ones."""
    out = []
    for row in rows:
        theirs = logits[row.reference][row.theirs]
        side, _, key = row.ours.partition(":")
        ours = logits[side][key] if key else logits[row.reference][side]
        measured = compare(theirs, ours, row.expect, tol)
        ok = verdict(measured["rows_differing"], row.expect, row.exact)
        out.append({**asdict(row), **measured, "pass": ok})
    return out


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.2e}"


def table(results: Sequence[Mapping[str, Any]]) -> str:
    """The comparisons as a Markdown table: which rows differ against which were expected,
    and the largest difference on each side of that line."""
    head = (
        "| reference | case | compared | rows differing | expected | max abs diff, rows "
        "expected equal | max abs diff, rows expected to differ | verdict |"
    )
    lines = [head, "| --- | --- | --- | --- | --- | ---: | ---: | --- |"]
    for r in results:
        want = row_ranges(expected_rows(r["expect"]))
        cells = [
            r["reference"],
            r["case"],
            r["note"],
            f"{row_ranges(r['rows_differing'])} (of {r['rows']})",
            want if r.get("exact", True) else f"within {want}",
            _number(r["max_abs_expected_equal"]),
            _number(r["max_abs_expected_different"]),
            "PASS" if r["pass"] else "FAIL",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- the run ---------------------------------------------------------------------------------


def token_ids(
    seed: int = SEED, tokens: int = TOKENS, vocab: int = CONFIG["vocab_size"]
) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(0, vocab, tokens)]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--longlm", type=Path, required=True, help="a checkout of LongLM")
    parser.add_argument("--string", type=Path, required=True, help="a checkout of STRING")
    parser.add_argument(
        "--work", type=Path, default=CACHE / "remap-reference", help="model and logits"
    )
    parser.add_argument("--reference-only", action="store_true", help="skip posenc's side")
    parser.add_argument("--reuse", action="store_true", help="reuse the reference logits")
    parser.add_argument("--out", type=Path, default=RESULTS / "remap_reference.json")
    args = parser.parse_args(argv)
    for name in REFERENCES:
        if not getattr(args, name).is_dir():
            parser.error(f"--{name} {getattr(args, name)} is not a folder")
    return args


def _posenc_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for name in ("posenc", "transformers", "torch", "numpy"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    files = {name: checkout_files(name, getattr(args, name)) for name in REFERENCES}
    ids = token_ids()
    model = args.work / "model"
    sides: dict[str, Any] = {}
    for name in REFERENCES:
        if not (args.reuse and (args.work / f"{name}.npz").is_file()):
            ensure_venv(name)
            build = name == "longlm" and not (args.reuse and (model / "config.json").is_file())
            run_reference(name, getattr(args, name), model, args.work, ids, build)
        sides[name] = load_reference(name, args.work)
        print(f"{name}: {', '.join(sides[name]['record']['entries'])}", flush=True)
    if args.reference_only:
        return 0
    import torch
    from _record import record_head

    torch.set_num_threads(1)
    logits = {name: side["logits"] for name, side in sides.items()}
    logits["posenc"] = posenc_logits(model, ids)
    results = evaluate(comparisons(), logits)
    print(table(results))
    ok = all(r["pass"] for r in results)
    print(f"\n{'PASS' if ok else 'FAIL'}: every comparison as expected (tol {TOL:g})")
    record = {
        **record_head("remap_reference"),
        "config": CONFIG,
        "seed": SEED,
        "tokens": len(ids),
        "tol": TOL,
        "cases": [asdict(c) for c in CASES],
        "references": {
            name: {**REFERENCES[name], "sha256": files[name], **sides[name]["record"]}
            for name in REFERENCES
        },
        "posenc_versions": _posenc_versions(),
        "seconds": time.perf_counter() - started,
        "results": results,
        "pass": ok,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
