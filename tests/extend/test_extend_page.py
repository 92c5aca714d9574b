"""``posenc extend``'s page as a user sees it, from hand-made ``results.json`` dicts in the
shape issue 40's contract gives them (none, linear, ntk, dynamic and yarn at L and 2L;
probes of four tasks or none; one document or three; with or without ``emit``; with or
without a factor search, ``results["search"]``).

The page leads with the answer's lead line; shows only what was measured (no probe
section, figure or file without probes, no empty section); orders two settings only where
the answer's verdicts do; names no machine path; keeps every title inside its figure.
The ``browser`` tests open the page in headless Chromium (``tests/_browser.py``):
every image decodes, no text runs past its box, the lead comes first in ``main``, and no
absolute path is in the text a user sees.
"""

from __future__ import annotations

import html
import io
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")

from tests._browser import in_browser, probe

from posenc._pages import number
from posenc.extend.answer import answer
from posenc.extend.page import write_page
from posenc.extend.page_figures import ppl_plot, probe_plot
from posenc.extend.page_search import search_plot
from posenc.extend.search import project, search_scaling, seed_factors
from posenc.integrations.spelling import to_rope_parameters

L = 512
TASKS = ("passkey", "multikey", "multivalue", "vartrack")
DOCS = ("typing.py", "argparse.py", "inspect.py")
LONG_NAME = "SmolLM2-135M-Instruct-extended-context-finetune.Q4_1-imatrix"  # 60 characters
assert len(LONG_NAME) == 60

#: Perplexity of each (scaling, length): none blows up past L, linear costs at L.
PPL = {
    ("none", 512): 5.90,
    ("linear", 512): 6.80,
    ("ntk", 512): 5.95,
    ("dynamic", 512): 5.90,
    ("yarn", 512): 5.97,
    ("none", 1024): 48.0,
    ("linear", 1024): 7.90,
    ("ntk", 1024): 6.05,
    ("dynamic", 1024): 6.30,
    ("yarn", 1024): 6.00,
    ("none", 768): 30.0,
    ("linear", 768): 7.10,
    ("ntk", 768): 5.99,
    ("dynamic", 768): 6.02,
    ("yarn", 768): 5.98,
    ("search", 512): 5.93,
    ("search", 1024): 5.99,
}
#: Probes answered of 4 per task: (passkey, multikey, multivalue, vartrack).
HITS = {
    ("none", 512): (4, 3, 2, 0),
    ("linear", 512): (4, 2, 2, 0),
    ("ntk", 512): (4, 3, 2, 0),
    ("dynamic", 512): (4, 3, 2, 0),
    ("yarn", 512): (4, 3, 2, 0),
    ("none", 1024): (0, 0, 0, 0),
    ("linear", 1024): (3, 1, 1, 0),
    ("ntk", 1024): (4, 3, 2, 0),
    ("dynamic", 1024): (4, 1, 2, 0),
    ("yarn", 1024): (4, 3, 2, 1),
}
_Z = 1.959964


def wilson(p: float, n: int) -> tuple[float, float]:
    """The 95 % Wilson interval of a mean score ``p`` over ``n`` probes."""
    centre = (p + _Z**2 / (2 * n)) / (1 + _Z**2 / n)
    half = _Z / (1 + _Z**2 / n) * math.sqrt(p * (1 - p) / n + _Z**2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def _scores(hits: tuple[int, ...]) -> dict[str, dict[str, Any]]:
    out = {}
    for task, k in zip(TASKS, hits):
        low, high = wilson(k / 4, 4)
        out[task] = {"score": k / 4, "probes": 4, "low": low, "high": high}
    return out


def _probes(length: int, hits: tuple[int, ...]) -> list[dict[str, Any]]:
    rows = []
    for task, k in zip(TASKS, hits):
        for i in range(4):
            rows.append(
                {
                    "id": f"h{i // 2}-{task}-{i % 2}",
                    "task": task,
                    "haystack": i // 2,
                    "depth": (0.25, 0.75)[i % 2],
                    "answers": [f"{task}-answer-{i}"],
                    "output": f"{task}-answer-{i}" if i < k else "I do not know",
                    "score": 1.0 if i < k else 0.0,
                }
            )
    return rows


def _record(scaling: str, length: int, factor: float, docs: int, probes: bool) -> dict[str, Any]:
    ppl = PPL[scaling, length]
    width = L // 4
    grow = 1.0 if scaling != "none" or length == L else 8.0
    buckets = [
        {
            "start": a,
            "stop": min(a + width, length),
            "ppl": ppl * (0.8 + 0.05 * i) * (grow if a >= L else 1.0),
        }
        for i, a in enumerate(range(0, length, width))
    ]
    names = DOCS[:docs]
    hits = HITS.get((scaling, length))
    key = f"{scaling}-{length}-{factor:g}"
    same_as = "none-512-1" if key == "dynamic-512-2" else None
    shared = (
        f"{scaling}-{2 * L}-{factor:g}"
        if length == L and scaling in ("linear", "ntk", "yarn")
        else None
    )
    return {
        "key": key,
        "scaling": scaling,
        "factor": factor,
        "length": length,
        "rope": None if scaling == "none" else {"type": scaling, "factor": factor},
        "same_as": same_as,
        "shared_pass": shared,
        "ppl": ppl,
        "ppl_last_quarter": ppl * 1.1,
        "by_bucket": buckets,
        "ppl_by_document": {n: ppl * (0.97 + 0.03 * i) for i, n in enumerate(names)},
        "ppl_by_bucket_document": {
            n: [b["ppl"] * (0.97 + 0.03 * i) for b in buckets] for i, n in enumerate(names)
        },
        "probes": _probes(length, hits) if probes and hits else [],
        "scores": _scores(hits) if probes and hits else {},
        "tokens": docs * (length - 1),
        "seconds_ppl": length / 100,
        "seconds_probes": length / 50 if probes else 0.0,
        "seconds": length / 100 + (length / 50 if probes else 0.0),
        "peak_bytes": length * 2**20,
        "base_bytes": 100 * 2**20,
    }


def _answer(results: dict[str, Any], *, docs: int, buckets: bool, quick: bool) -> dict:
    """The answer for ``results``: its ``settings`` (and ``tasks`` where probes ran) as
    :func:`posenc.extend.answer.answer` finds them; the lead, the ranges and the verdicts
    between settings set by hand, so that the page's orderings follow known verdicts."""
    computed = answer(results)
    probes = results["settings"]["trials"] > 0
    spread = docs > 1 or buckets
    pairing = "document" if docs > 1 else ("bucket" if buckets else "document")
    top = 768 if quick else 1024
    f = 1.5 if quick else 2.0
    if quick:
        lead = "up to 512: none; up to 768: yarn factor 1.5 (or ntk factor 1.5, dynamic factor 1.5)"
        ranges = [
            {"up_to": 512, "scaling": "none", "factor": 1.0, "or": []},
            {
                "up_to": 768,
                "scaling": "yarn",
                "factor": 1.5,
                "or": [["ntk", 1.5], ["dynamic", 1.5]],
            },
        ]
    else:
        lead = "up to 512: none (or dynamic factor 2); up to 1024: yarn factor 2 (or ntk factor 2)"
        ranges = [
            {"up_to": 512, "scaling": "none", "factor": 1.0, "or": [["dynamic", 2.0]]},
            {"up_to": 1024, "scaling": "yarn", "factor": 2.0, "or": [["ntk", 2.0]]},
        ]
    if not probes:
        lead += " (by perplexity alone: no probe ran)"
    others = {"ntk": "level", "dynamic": "better", "linear": "better", "none": "better"}
    verdicts = {
        f"{s}-{top}-{1 if s == 'none' else f:g}": (v if spread else "level")
        for s, v in others.items()
        if (s, top) in PPL
    }
    per_length = [
        {
            "length": L,
            "best": "none",
            "factor": 1.0,
            "ppl": PPL["none", L],
            "level_with_best": ["none"],
            "pairing": None,
            "verdicts": {},
            "intervals": {},
        },
        {
            "length": top,
            "best": "yarn",
            "factor": f,
            "ppl": PPL["yarn", top],
            "level_with_best": ["yarn"]
            + [k.split("-")[0] for k, v in verdicts.items() if v == "level"],
            "pairing": pairing,
            "verdicts": verdicts,
            "intervals": {
                k: ([0.5, 2.0] if v == "better" else [-0.1, 0.2]) if spread else None
                for k, v in verdicts.items()
            },
        },
    ]
    cost = [
        {
            "scaling": s,
            "factor": f,
            "ppl": PPL[s, L],
            "ppl_none": PPL["none", L],
            "verdict": (v if spread else "level"),
            "interval": ([0.3, 1.1] if v == "worse" else [-0.02, 0.1]) if spread else None,
            "pairing": pairing,
        }
        for s, v in (("linear", "worse"), ("ntk", "level"), ("dynamic", "level"), ("yarn", "worse"))
        if not quick
    ]
    return {
        "lead": lead,
        "sentence": lead,
        "ranges": ranges,
        "choice": {"scaling": "yarn", "factor": f, "length": top},
        "tasks": computed["tasks"] if probes else {},
        "settings": computed["settings"],
        "per_length": per_length,
        "cost_at_L": cost,
        "rule": "Two settings are ordered by the one rule: better where the whole 95% "
        "interval of the paired differences is on one side of 0, level where it holds 0.",
    }


def _emit(model: str, refused: bool) -> dict[str, Any]:
    rope = {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 2.0,
        "original_max_position_embeddings": L,
    }
    overrides = json.dumps({"rope_parameters": rope}, separators=(",", ":"))
    emit: dict[str, Any] = {
        "transformers": {
            "files": ["emit/transformers/config.json"],
            "command": None,
            "settings": {"rope_parameters": rope, "max_position_embeddings": L},
            "warnings": [],
            "checked": "read back through rotary_from_config: equal to the module measured",
        },
        "vllm": {
            "files": ["emit/vllm/command.txt"],
            "command": f"vllm serve {model} --hf-overrides '{overrides}' --max-model-len 1024",
            "settings": {"hf_overrides": {"rope_parameters": rope}, "max_model_len": 1024},
            "warnings": [
                "vLLM reads attn_factor as a multiple of YaRN's temperature, not "
                "transformers' attention_factor (vllm get_rope)"
            ],
            "checked": "every key is one vLLM reads for yarn",
        },
        "llama.cpp": {
            "files": ["emit/llama.cpp/command.txt"],
            "command": f"llama-server -m {model}.gguf -c 1024 --rope-scaling yarn "
            "--rope-scale 2 --yarn-orig-ctx 512",
            "settings": {"flags": ["--rope-scaling", "yarn", "--rope-scale", "2"], "env": {}},
            "warnings": [
                "llama-server caps a slot at the trained context unless YaRN flags "
                "change freq_scale (llama.cpp #17459)"
            ],
            "checked": "the flags lift the trained-context cap",
        },
        "ollama": {
            "files": ["emit/ollama/Modelfile"],
            "command": f"ollama create {model}-yarn -f emit/ollama/Modelfile",
            "settings": {"modelfile": f"FROM ./{model}.yarn-2.gguf\nPARAMETER num_ctx 1024\n"},
            "warnings": ["ollama's MLX runner ignores YaRN (ollama #18262)"],
            "checked": "the Modelfile names the GGUF copy",
        },
    }
    emit["gguf"] = (
        {"refused": "gguf: the model is not a .gguf file, so there is nothing to copy"}
        if refused
        else {
            "files": [f"{model}.yarn-2.gguf"],
            "command": f"llama-server -m {model}.yarn-2.gguf -c 1024",
            "settings": {
                "metadata": {"llama.context_length": 1024, "llama.rope.scaling.type": "yarn"}
            },
            "warnings": [],
            "checked": "read back through rotary_from_gguf; tensor data SHA-256 equal",
        }
    )
    return emit


DIM = 64  # the hand-made search's rotary channels: 32 bands
#: The hand-made search: each seed's validation perplexity, the best so far after each of
#: its six evaluations (a population of 4: generation 1 from the fifth), the best's.
SEEDS_PPL = {"pi": 9.8, "ntk": 8.6, "yarn": 8.9}
HISTORY = [9.8, 8.6, 8.6, 8.6, 8.1, 8.1]


def search_record(**changes: Any) -> dict[str, Any]:
    """``results["search"]`` as ``search_export.Searched.record`` has it, for a search at
    ``2L`` scored on 768 tokens: the seeds' factors are posenc's (projected as the search
    scores them), the best a band-wise mean of NTK's and YaRN's; ``changes`` replace
    fields."""
    raw = seed_factors(DIM, 1e4, 2.0, L)
    seeds = {k: project(v, 4.0).tolist() for k, v in raw.items()}
    best = project((raw["ntk"] + raw["yarn"]) / 2, 4.0).tolist()
    params = to_rope_parameters(search_scaling(best, L, 1024), base=1e4, rotary_dim=DIM)
    checked = (
        "{}: the searched factors read back equal; cos/sin over positions 0..1023 within "
        "0 of the measured module's (allowed {})"
    )
    record = {
        "validation": {"name": "_pydecimal.py", "sha256": "12" * 32, "tokens": 768},
        "length": 768,
        "target": 1024,
        "factor": 2.0,
        "seed": 0,
        "population": 4,
        "minutes": 3.0,
        "seconds": 150.0,
        "evaluated": 6,
        "generations": 2,
        "stopped": "budget",
        "seeds": dict(SEEDS_PPL),
        "best": {"ppl": 8.1, "origin": "crossover", "generation": 1, "long_factor": best},
        "best_ppl_by_evaluation": list(HISTORY),
        "bands": {"wavelength": [2 * math.pi * 1e4 ** (2 * i / DIM) for i in range(DIM // 2)]}
        | seeds,
        "export": {
            "transformers": {
                "files": ["search/config.json"],
                "command": "transformers.AutoConfig.from_pretrained('search/')",
                "settings": {"rope_parameters": params, "max_position_embeddings": 1024},
                "warnings": [],
                "checked": checked.format("transformers' config.json", "1e-06"),
            },
            "gguf": {
                "files": ["search/tiny-llama.search.gguf"],
                "command": "llama-server -m search/tiny-llama.search.gguf -c 1024",
                "settings": {"metadata": {"llama.rope.scaling.type": "longrope"}},
                "warnings": [],
                "checked": checked.format("the GGUF copy", "0.0001"),
            },
        },
    }
    return record | changes


def make_results(
    root: Path,
    *,
    docs: int = 3,
    probes: bool = True,
    emit: bool = True,
    buckets: bool = True,
    quick: bool = False,
    name: str | None = None,
    layer_types: list | None = None,
    search: bool = False,
) -> dict[str, Any]:
    """A ``results.json`` as the contract has it, for a model kept under ``root``."""
    model_path = root / "models" / "tiny-llama"
    if quick:
        units = [("none", L, 1.0)] + [
            (s, 768, 1.5) for s in ("none", "linear", "ntk", "dynamic", "yarn")
        ]
    else:
        units = [("none", L, 1.0)] + [(s, L, 2.0) for s in ("linear", "ntk", "dynamic", "yarn")]
        units += [("none", 1024, 1.0)] + [
            (s, 1024, 2.0) for s in ("linear", "ntk", "dynamic", "yarn")
        ]
    units = [(s, n, 1.0 if s == "none" else f) for s, n, f in units]
    units += [("search", n, 2.0) for n in (L, 1024)] if search else []
    records = [_record(s, n, f, docs, probes and not quick) for s, n, f in units]
    for r in records:
        if not buckets:
            r.pop("ppl_by_bucket_document")
    settings = {
        "model": str(model_path),
        "to": 1.5 if quick else 2.0,
        "multiples": [1.5] if quick else [1.0, 2.0],
        "scalings": ["none", "linear", "ntk", "dynamic", "yarn", "config"],
        "texts": [str(root / "texts" / d) for d in DOCS[:docs]],
        "documents": docs,
        "depths": [0.25, 0.75],
        "trials": 2 if probes and not quick else 0,
        "seed": 0,
        "dtype": "float32",
        "device": "cpu",
        "context": None,
        "quick": quick,
        "tasks": list(TASKS),
        "bar": 0.9,
        "ppl_tolerance": 0.1,
        "emit": ["transformers", "vllm", "llama.cpp", "gguf", "ollama"] if emit else [],
    }
    results: dict[str, Any] = {
        "posenc": "0.9.0",
        "model": {
            "path": str(model_path),
            "name": name if name is not None else str(model_path),  # transformers' _name_or_path
            "model_type": "llama",
            "parameters": 1_234_567,
            "files": {"config.json": "ab" * 32, "model.safetensors": "cd" * 32},
        },
        "trained_context": L,
        "layer_types_scaled": layer_types if layer_types is not None else [None],
        "settings": settings,
        "lengths": [768] if quick else [512, 1024],
        "estimated_peak_bytes": 3 * 2**30,
        "documents": [{"name": d, "sha256": "ef" * 32, "tokens": 20_000} for d in DOCS[:docs]],
        "device": "cpu",
        "threads": 2,
        "records": records,
    }
    if search:
        results["search"] = search_record()
    results["answer"] = _answer(results, docs=docs, buckets=buckets, quick=quick)
    if emit:
        results["emit"] = _emit(Path(results["model"]["path"]).name, refused=docs == 1)
    return results


VARIANTS = {
    "three-docs": {},
    "one-doc-buckets": {"docs": 1},
    "one-doc-no-spread": {"docs": 1, "buckets": False, "emit": False},
    "no-probes": {"probes": False, "emit": False},
    "quick": {"quick": True, "docs": 1, "buckets": False, "emit": False},
    "long-name": {"name": LONG_NAME, "layer_types": ["full_attention"]},
    "search": {"search": True, "probes": False, "name": LONG_NAME},
}


Page = tuple[dict[str, Any], list[Path], str]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``built(variant)``: its results, the paths ``write_page`` wrote and the page's text,
    written once per variant into a folder of its own (``root/out``, the model and texts
    under ``root``)."""
    cache: dict[str, Page] = {}

    def build(variant: str) -> Page:
        if variant not in cache:
            root = tmp_path_factory.mktemp(variant)
            results = make_results(root, **VARIANTS[variant])
            out = root / "out"
            out.mkdir()
            paths = write_page(results, out)
            cache[variant] = (results, paths, paths[-1].read_text(encoding="utf-8"))
        return cache[variant]

    return build


def _text(page: str) -> str:
    """The page without its embedded images."""
    return re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page)


# --- what leads, and what is shown only when measured -------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_page_leads_with_the_answer(built: Any, variant: str) -> None:
    results, _, page = built(variant)
    lead = html.escape(results["answer"]["lead"])
    assert f'<main><p class="answer" id="lead"><b>{lead}</b></p>' in page
    chosen = results["answer"]["choice"]
    where = " (below: the setting for each engine)" if results.get("emit") else ""
    name = f"yarn (factor {chosen['factor']:g})"
    assert (
        f'<p class="lead">The setting chosen to write: {name} for {chosen["length"]} tokens'
        f"{where}.</p>" in page
    )


@pytest.mark.parametrize(
    ("variant", "files"),
    [
        ("three-docs", ["ppl_by_position.png", "probes.png", "index.html"]),
        ("no-probes", ["ppl_by_position.png", "index.html"]),
        ("quick", ["ppl_by_position.png", "index.html"]),
        ("search", ["ppl_by_position.png", "search.png", "index.html"]),
    ],
)
def test_a_figure_only_of_what_was_measured(built: Any, variant: str, files: list) -> None:
    _, paths, page = built(variant)
    assert [p.name for p in paths] == files
    assert sorted(p.name for p in paths[0].parent.iterdir()) == sorted(files)
    assert page.count("data:image/png;base64,") == len(files) - 1
    probes = "probes.png" in files
    for marker in ('id="probes"', 'id="bars"', "seconds, probes", 'data-file="probes.png"'):
        assert (marker in page) is probes, marker
    searched = "search.png" in files
    for marker in ('id="search"', 'href="#search"', 'data-file="search.png"'):
        assert (marker in page) is searched, marker
    assert "passkey" not in _text(page).split('id="model"')[0] or probes


def test_a_figure_an_earlier_run_left_is_removed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for stale in ("probes.png", "passkey.png", "search.png"):
        (out / stale).write_bytes(b"an earlier run's figure")
    write_page(make_results(tmp_path, **VARIANTS["quick"]), out)
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "ppl_by_position.png"]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_no_section_table_or_list_is_empty(built: Any, variant: str) -> None:
    _, _, page = built(variant)
    sections = re.findall(r"<section id=\"([^\"]+)\">(.*?)</section>", page, re.S)
    assert sections
    for name, body in sections:
        assert re.search(r"<td|<li|<img|<pre", body), name
    for table in re.findall(r"<table[^>]*>(.*?)</table>", page, re.S):
        assert "<td" in table
    assert not re.search(r"<ul[^>]*></ul>|<tbody></tbody>|<p[^>]*></p>", page)
    for table in re.findall(r"<table>(.*?)</table>", page, re.S):  # no column left empty
        rows = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in table.split("<tr>")[2:]]
        assert all(any(row[i] for row in rows) for i in range(len(rows[0])))
    nav = re.findall(r'<a href="#([^"]+)">', page)
    assert nav == [name for name, _ in sections]


# --- each table, row by row -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("variant", "row"),
    [
        ("three-docs", ("yarn", 2, 1024, "held at every length measured (512, 1024)")),
        ("three-docs", ("ntk", 2, 1024, "held at every length measured (512, 1024)")),
        ("three-docs", ("dynamic", 2, 512, "at 1024 tokens: multikey")),
        ("three-docs", ("linear", 2, "-", "at 512 tokens: multikey, perplexity")),
        (
            "three-docs",
            ("none", 1, 512, "at 1024 tokens: passkey, multikey, multivalue, perplexity"),
        ),
        ("no-probes", ("dynamic", 2, 1024, "held at every length measured (512, 1024)")),
        ("no-probes", ("none", 1, 512, "at 1024 tokens: perplexity")),
        ("quick", ("yarn", 1.5, 768, "held at every length measured (768)")),
        ("quick", ("linear", 1.5, "-", "at 768 tokens: perplexity")),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v[:2])),
)
def test_the_effective_length_of_each_setting(built: Any, variant: str, row: tuple) -> None:
    _, _, page = built(variant)
    scaling, factor, effective, failed = row
    assert (
        f'<tr><td class="text">{scaling}</td><td>{factor:g}</td><td>{effective}</td>'
        f'<td class="text wrap">{failed}</td></tr>'
    ) in page


@pytest.mark.parametrize("task", TASKS)
def test_the_bar_of_each_task(built: Any, task: str) -> None:
    results, _, page = built("three-docs")
    b = results["answer"]["tasks"][task]
    verdict = "yes" if b["included"] else "no: " + b["reason"]
    assert (
        f'<tr><td class="text">{task}</td><td>{b["baseline"]:.2f}</td>'
        f"<td>[{b['low']:.2f}, {b['high']:.2f}]</td><td>4</td><td>{b['bar']:.2f}</td>"
        f'<td class="{"yes" if b["included"] else "no"} text wrap">{html.escape(verdict)}</td></tr>'
    ) in page


@pytest.mark.parametrize(
    ("scaling", "factor", "length", "holds"),
    [
        ("yarn", 2, 1024, "holds"),
        ("dynamic", 2, 1024, "fails: multikey"),
        ("none", 1, 1024, "fails: passkey, multikey, multivalue, perplexity"),
    ],
)
def test_the_probe_scores_with_their_intervals(
    built: Any, scaling: str, factor: int, length: int, holds: str
) -> None:
    _, _, page = built("three-docs")
    cells = ""
    for k in HITS[scaling, length]:
        low, high = wilson(k / 4, 4)
        cells += f"<td>{k / 4:.2f} [{low:.2f}, {high:.2f}], 4 probes</td>"
    css = "yes" if holds == "holds" else "no"
    assert (
        f'<tr><td class="text">{scaling}</td><td>{factor}</td><td>{length}</td>'
        f'<td class="{css} text wrap">{holds}</td>{cells}</tr>'
    ) in page


def test_a_wilson_interval_reads_as_the_brief_writes_it(built: Any) -> None:
    _, _, page = built("three-docs")
    low, high = wilson(0.75, 4)
    assert f"0.75 [{low:.2f}, {high:.2f}], 4 probes" == "0.75 [0.30, 0.95], 4 probes"
    assert "<td>0.75 [0.30, 0.95], 4 probes</td>" in page


# --- perplexity: an order only where the verdicts give one ----------------------------------


def _ppl_row(r: dict, verdict: str, css: str, note: str | None) -> str:
    """A perplexity row; ``note`` None: the table has no note column."""
    return (
        f'<tr><td class="text">{r["scaling"]}</td><td>{r["factor"]:g}</td><td>{r["length"]}</td>'
        f"<td>{r['ppl']:.4g}</td><td>{r['ppl_last_quarter']:.4g}</td>"
        f'<td class="{css + " " if css else ""}text wrap">{verdict}</td>'
        + ("" if note is None else f'<td class="text wrap">{note}</td>')
        + "</tr>"
    )


@pytest.mark.parametrize(
    ("variant", "key", "verdict", "css"),
    [
        (
            "three-docs",
            "yarn-1024-2",
            "better than none, linear (factor 2), dynamic (factor 2); level with ntk (factor 2)",
            "yes",
        ),
        ("three-docs", "ntk-1024-2", "level with yarn (factor 2)", "level"),
        ("three-docs", "linear-1024-2", "worse than yarn (factor 2)", "no"),
        ("three-docs", "linear-512-2", "worse than none at L", "no"),
        ("three-docs", "ntk-512-2", "level with none at L", "level"),
        ("one-doc-buckets", "none-1024-1", "worse than yarn (factor 2)", "no"),
        ("one-doc-no-spread", "yarn-1024-2", "level with every other", "level"),
        ("one-doc-no-spread", "linear-1024-2", "level with yarn (factor 2)", "level"),
        ("one-doc-no-spread", "yarn-512-2", "level with none at L", "level"),
        ("quick", "yarn-768-1.5", "level with every other", "level"),
        ("quick", "none-512-1", "the only setting at this length", ""),
    ],
)
def test_perplexity_orders_only_by_the_verdicts(
    built: Any, variant: str, key: str, verdict: str, css: str
) -> None:
    results, _, page = built(variant)
    r = next(r for r in results["records"] if r["key"] == key)
    note = (
        f"same rotary tables as {r['same_as']}: its numbers"
        if r["same_as"]
        else f"from the forward pass of {r['shared_pass']}"
        if r["shared_pass"]
        else ""
    )
    noted = any(x["same_as"] or x["shared_pass"] for x in results["records"])
    assert _ppl_row(r, verdict, css, note if noted else None) in page


@pytest.mark.parametrize("variant", ["one-doc-no-spread", "quick"])
def test_one_document_without_a_spread_orders_nothing(built: Any, variant: str) -> None:
    _, _, page = built(variant)
    text = _text(page).split('<section id="perplexity">')[1].split("</section>")[0]
    table = text.split("<table>")[1]
    assert "better" not in table and "worse" not in table
    assert re.findall(r'<td class="(yes|no) text wrap">', table) == []
    assert "no spread, so every pair is level" in text
    assert "better" not in _text(page).split('id="cost"')[1].split("</ul>")[0]


@pytest.mark.parametrize(
    ("variant", "line"),
    [
        ("three-docs", "<li>1024 tokens: paired by document (3 documents)</li>"),
        (
            "one-doc-buckets",
            "<li>1024 tokens: paired by position bucket (8 buckets of one document)</li>",
        ),
        (
            "one-doc-no-spread",
            "<li>1024 tokens: one document and no buckets to pair: no spread, so every pair is level</li>",
        ),
        ("three-docs", "<li>512 tokens: one setting measured: nothing to compare</li>"),
    ],
)
def test_each_length_says_how_it_was_paired(built: Any, variant: str, line: str) -> None:
    _, _, page = built(variant)
    assert line in page


def test_the_cost_at_L_states_its_interval(built: Any) -> None:
    _, _, page = built("three-docs")
    assert (
        "<li>linear (factor 2) at L (512 tokens): ppl 6.8 against 5.9 with none: <b>worse</b> "
        "(paired by document (3 documents): 95% interval of the difference +0.3 to +1.1)</li>"
    ) in page


# --- the setting for each engine --------------------------------------------------------------


def test_each_engine_shows_its_command_files_warnings_and_check(built: Any) -> None:
    results, _, page = built("three-docs")
    emit = results["emit"]
    assert page.index('id="engines"') > page.index('id="cost"')
    for name, e in emit.items():
        slug = re.sub(r"[^a-z0-9]+", "-", name)
        block = page.split(f'id="engine-{slug}"><h3>{name}</h3>')[1].split('<div class="demo')[0]
        if e.get("command"):
            assert f'<pre class="command">{html.escape(e["command"])}</pre>' in block
        assert "<p>Files: " + ", ".join(f"<code>{f}</code>" for f in e["files"]) + "</p>" in block
        for w in e["warnings"]:
            assert f'<li class="no"><b>warning</b>: {html.escape(w)}</li>' in block
        assert f'<p class="verdict">Checked: {html.escape(e["checked"])}</p>' in block


def test_a_refused_engine_says_why_in_one_line(built: Any) -> None:
    results, _, page = built("one-doc-buckets")
    reason = results["emit"]["gguf"]["refused"]
    assert (
        f'<div class="demo engine" id="engine-gguf"><h3>gguf</h3><p class="absent"><b>Refused:'
        f"</b> {html.escape(reason)}</p></div>"
    ) in page


@pytest.mark.parametrize("variant", ["one-doc-no-spread", "no-probes", "quick"])
def test_no_engine_section_without_emit(built: Any, variant: str) -> None:
    _, _, page = built(variant)
    assert 'id="engines"' not in page and "engine-" not in page


# --- the model and the settings: a table, no machine path -------------------------------------


def _pair(key: str, value: str) -> str:
    return (
        f'<tr><th class="text" scope="row">{html.escape(key)}</th>'
        f'<td class="text wrap">{html.escape(value)}</td></tr>'
    )


#: Per variant, rows of the model-and-settings table: what it names, and the value shown.
_MODEL_ROWS = {
    "three-docs": {
        "model": "tiny-llama",
        "parameters": "1,234,567",
        "file": "config.json: SHA-256 " + "ab" * 8,
        "document": "argparse.py: 20,000 tokens, SHA-256 " + "ef" * 8,
        "text files": "typing.py, argparse.py, inspect.py",
        "trained context given": "no: the config's (512)",
        "probe tasks": "passkey, multikey, multivalue, vartrack",
        "needle depths": "0.25, 0.75",
        "quick run": "no",
        "engines written": "transformers, vllm, llama.cpp, gguf, ollama",
    },
    "no-probes": {"engines written": "none"},
    "long-name": {"model": LONG_NAME, "layer types scaled": "full_attention"},
}


@pytest.mark.parametrize(
    ("variant", "key", "value"),
    [(variant, key, value) for variant, rows in _MODEL_ROWS.items() for key, value in rows.items()],
)
def test_the_model_and_settings_are_a_two_column_table(
    built: Any, variant: str, key: str, value: str
) -> None:
    _, _, page = built(variant)
    assert _pair(key, value) in page


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_no_machine_path_and_no_raw_dict(built: Any, variant: str) -> None:
    results, paths, page = built(variant)
    text = _text(page)
    assert (
        str(paths[-1].parent.parent) not in text
        and "/models/" not in text
        and "/texts/" not in text
    )
    assert not re.search(r"(?<![\w.~-])/(tmp|home|root|work|usr|var|Users)/", text)
    assert "[None]" not in text and "{'" not in text and "None" not in text
    if results["layer_types_scaled"] == [None]:
        assert "layer types" not in text


def test_an_absolute_path_left_in_a_string_is_cut_to_its_name(tmp_path: Path) -> None:
    results = make_results(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    model = results["model"]["path"]
    results["emit"]["vllm"]["command"] = f"vllm serve {model} --max-model-len 1024"
    results["emit"]["transformers"]["files"] = [str(out / "emit" / "config.json")]
    page = _text(write_page(results, out)[-1].read_text())
    assert str(tmp_path) not in page
    assert '<pre class="command">vllm serve tiny-llama --max-model-len 1024</pre>' in page
    assert "<p>Files: <code>emit/config.json</code></p>" in page


# --- the figures: only measured panels, titles inside -------------------------------------------


def _inside(fig: Any) -> bool:
    fig.draw_without_rendering()
    title, frame = fig._suptitle.get_window_extent(), fig.bbox
    return frame.x0 <= title.x0 and title.x1 <= frame.x1 and title.y1 <= frame.y1


@pytest.mark.parametrize("variant", ["long-name", "quick", "three-docs"])
@pytest.mark.parametrize("name", ["tiny", LONG_NAME, LONG_NAME.replace("-", "") * 2])
def test_the_perplexity_title_fits_at_any_name_length(
    tmp_path: Path, variant: str, name: str
) -> None:
    results = make_results(tmp_path, **{**VARIANTS[variant], "name": name})
    fig = ppl_plot(results)
    try:
        assert _inside(fig)
        lengths = sorted({r["length"] for r in results["records"]})
        assert [ax.get_title() for ax in fig.axes] == [f"{n} tokens" for n in lengths]
        assert all(ax.get_lines() for ax in fig.axes)  # no empty panel
        assert name[:20] in fig._suptitle.get_text().replace("\n", "") or len(name) > 80
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_the_probe_figure_has_a_panel_per_task_with_its_intervals(tmp_path: Path) -> None:
    results = make_results(tmp_path, name=LONG_NAME)
    fig = probe_plot(results)
    try:
        assert _inside(fig)
        assert [ax.get_title() for ax in fig.axes] == list(TASKS)
        for ax in fig.axes:
            assert ax.containers  # error bars: one container per setting drawn
        legend = [t.get_text() for t in fig.legends[0].get_texts()]
        assert legend == [
            "none",
            "linear (factor 2)",
            "ntk (factor 2)",
            "dynamic (factor 2)",
            "yarn (factor 2)",
        ]
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


@pytest.mark.parametrize("variant", ["no-probes", "quick"])
def test_no_probe_figure_without_probes(tmp_path: Path, variant: str) -> None:
    assert probe_plot(make_results(tmp_path, **VARIANTS[variant])) is None


@pytest.mark.parametrize("variant", ["three-docs", "quick", "search"])
def test_every_embedded_image_decodes(built: Any, variant: str) -> None:
    import base64

    import matplotlib.image

    _, _, page = built(variant)
    images = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
    assert images
    for data in images:
        pixels = matplotlib.image.imread(io.BytesIO(base64.b64decode(data)), format="png")
        assert pixels.shape[0] > 100 and pixels.shape[1] > 100


@pytest.mark.parametrize("file", ["ppl_by_position.png", "probes.png", "index.html"])
def test_a_page_killed_mid_write_keeps_each_file_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, file: str
) -> None:
    results = make_results(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    for name in ("ppl_by_position.png", "probes.png", "index.html"):
        (out / name).write_bytes(b"the previous run's " + name.encode())
    replace = os.replace

    def killed(src: Any, dst: Any) -> None:
        if Path(dst).name == file:
            raise KeyboardInterrupt  # a kill between the temporary file and its rename
        replace(src, dst)

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_page(results, out)
    assert (out / file).read_bytes() == b"the previous run's " + file.encode()
    assert sorted(p.name for p in out.iterdir()) == [
        "index.html",
        "ppl_by_position.png",
        "probes.png",
    ]


# --- the factor search -------------------------------------------------------------------------

_SAID = (
    "An evolutionary search over one rescale factor per rotary frequency pair (32 pairs; "
    "\u03bbi \u2265 1, non-decreasing from high to low frequency, at most 4, twice target/L), "
    "started from PI, NTK and YaRN and evolved by mutation and crossover (LongRoPE, Ding et al. "
    "2024), from seed 0. Each candidate was scored by the perplexity of _pydecimal.py, a "
    "standard-library source none of the evaluation documents is, over its first 768 tokens "
    "(1.5 L; the evaluation runs to 1024). It scored 6 candidates in 2 generations, in 2.5 of "
    "3 minutes (stopped: the next candidate would have run past the budget). The best came "
    "from a crossover (generation 1), with validation perplexity 8.1 against PI 9.8, NTK 8.6 "
    "and YaRN 8.9. The units search measure it on the evaluation documents like every other "
    "setting (above: the effective length and perplexity). LongRoPE's starting-token window "
    "(n\u0302) is not searched: the longrope of transformers, vLLM and llama.cpp cannot "
    "express it. This budget fits 2 CPU threads: a proxy scoring length (768 of 1024 tokens), "
    "one validation document, a population of 4. A full-size search (scored at the target "
    "length, a larger population, more generations) belongs on a GPU."
)


def _search_page(root: Path, device: str = "cpu", **changes: Any) -> str:
    """The page of the ``search`` variant with ``results["search"]`` changed by ``changes``
    and the run on ``device``."""
    results = make_results(root, **VARIANTS["search"])
    results["search"] = search_record(**changes)
    results["device"] = device
    out = root / "out"
    out.mkdir()
    return write_page(results, out)[-1].read_text(encoding="utf-8")


def _said(page: str) -> str:
    """The search section's paragraph as a user reads it (tags dropped)."""
    lead = page.split('<section id="search">')[1].split('<p class="lead">')[1].split("</p>")[0]
    return html.unescape(re.sub(r"<[^>]+>", "", lead))


def test_the_search_section_says_what_was_searched_and_found(built: Any) -> None:
    _, _, page = built("search")
    assert _said(page) == _SAID
    assert page.index('id="search"') > page.index('id="cost"')


_ONE = search_record()["bands"]["pi"]


@pytest.mark.parametrize(
    ("device", "changes", "sentences"),
    [
        (
            "cpu",
            {
                "evaluated": 1,
                "generations": 1,
                "seconds": 20.0,
                "minutes": 0.5,
                "seeds": {"pi": 9.8},
                "best": {"ppl": 9.8, "origin": "pi", "generation": 0, "long_factor": _ONE},
                "best_ppl_by_evaluation": [9.8],
            },
            [
                "It scored 1 candidate in 1 generation, in 0.333 of 0.5 minutes (stopped: the "
                "next candidate would have run past the budget).",
                "The best came from the PI seed itself (generation 0), with validation "
                "perplexity 9.8 against PI 9.8 (NTK and YaRN not scored within the budget).",
            ],
        ),
        (
            "cpu",
            {"seeds": {"pi": None, "ntk": 8.6, "yarn": 8.9}, "stopped": "exhausted"},
            [
                "(stopped: no new candidate could be drawn)",
                "against PI not finite, NTK 8.6 and YaRN 8.9.",
            ],
        ),
        (
            "cuda:0",
            {"stopped": "evaluations"},
            [
                "(stopped: the cap on candidates scored was reached)",
                "It ran on cuda:0: a proxy scoring length (768 of 1024 tokens), one validation "
                "document, a population of 4.",
            ],
        ),
        (
            "cpu",
            {"length": 1024},
            [
                "over its first 1024 tokens (2 L; the evaluation runs to 1024).",
                "This budget fits 2 CPU threads: one validation document, a population of 4. "
                "A full-size search (a larger population, more generations) belongs on a GPU.",
            ],
        ),
    ],
    ids=["budget-after-one", "a-seed-not-finite", "on-a-gpu", "at-the-target-length"],
)
def test_the_search_section_says_only_what_the_record_holds(
    tmp_path: Path, device: str, changes: dict, sentences: list[str]
) -> None:
    said = _said(_search_page(tmp_path, device, **changes))
    for sentence in sentences:
        assert sentence in said, said
    assert ("belongs on a GPU" in said) is (device == "cpu")


def test_the_factor_of_each_band_beside_the_seeds(built: Any) -> None:
    results, _, page = built("search")
    found = results["search"]
    bands, best = found["bands"], found["best"]["long_factor"]
    table = page.split('<section id="search">')[1].split("<details>")[1].split("</details>")[0]
    rows = [
        f"<tr><td>{i}</td><td>{number(w)}</td><td>{number(best[i], 4)}</td>"
        + "".join(f"<td>{number(bands[k][i], 4)}</td>" for k in ("pi", "ntk", "yarn"))
        + "</tr>"
        for i, w in enumerate(bands["wavelength"])
    ]
    head = (
        "<thead><tr><th>band</th><th>wavelength (tokens)</th><th>best</th><th>PI</th>"
        "<th>NTK</th><th>YaRN</th></tr></thead>"
    )
    assert table == (
        '<summary>the factor of each band</summary><div class="scroll"><table>'
        + head
        + "".join(rows)
        + "</table></div>"
    )
    assert len(rows) == DIM // 2


def test_the_export_and_its_read_back_close_the_section(built: Any) -> None:
    results, _, page = built("search")
    export = results["search"]["export"]
    section = page.split('<section id="search">')[1].split("</section>")[0]
    assert section.endswith(
        '<h3>Where the best candidate was written</h3><ul id="search-export">'
        "<li><code>search/config.json</code>: rope_type longrope, short factors all 1, the 32 "
        "long factors, original_max_position_embeddings 512, factor 2. Checked: "
        + html.escape(export["transformers"]["checked"])
        + "</li><li><code>search/tiny-llama.search.gguf</code>: the GGUF copy with the tensors "
        "<code>rope_factors_long</code> and <code>rope_factors_short</code>. Checked: "
        + html.escape(export["gguf"]["checked"])
        + "</li></ul>"
    )


def _lines(ax: Any) -> dict[str, tuple[list, list]]:
    return {
        line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
        for line in ax.get_lines()
    }


@pytest.mark.parametrize("record", ["whole", "no-bands", "no-history"])
def test_the_search_figure_draws_what_the_record_holds(tmp_path: Path, record: str) -> None:
    results = make_results(tmp_path, **VARIANTS["search"])
    found = results["search"]
    if record == "no-bands":
        del found["bands"]
    if record == "no-history":
        found["best_ppl_by_evaluation"] = [None]
    fig = search_plot(results)
    try:
        assert _inside(fig)
        titles = {
            "whole": ["factor per band", "best validation perplexity by evaluation"],
            "no-bands": ["best validation perplexity by evaluation"],
            "no-history": ["factor per band"],
        }[record]
        assert [ax.get_title() for ax in fig.axes] == titles
        for ax, title in zip(fig.axes, titles):
            lines = _lines(ax)
            if title == "factor per band":
                waves = found["bands"]["wavelength"]
                assert ax.get_xscale() == "log"
                assert lines["best found"] == (waves, found["best"]["long_factor"])
                for key, label in (("pi", "PI"), ("ntk", "NTK"), ("yarn", "YaRN")):
                    assert lines[label] == (waves, found["bands"][key])
            else:
                assert lines["best so far"] == (list(range(1, 7)), HISTORY)
                for key, label in (("pi", "PI"), ("ntk", "NTK"), ("yarn", "YaRN")):
                    assert lines[label][1] == [SEEDS_PPL[key]] * 2
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_no_search_figure_without_its_data(tmp_path: Path) -> None:
    results = make_results(tmp_path)
    assert search_plot(results) is None
    results["search"] = search_record(bands={}, best_ppl_by_evaluation=[])
    assert search_plot(results) is None


# --- in a real browser ------------------------------------------------------------------------

_FINDINGS = """
  const images = Array.from(document.images);
  const wide = el => el.scrollWidth > el.clientWidth + 1;
  const inScroll = el => el.closest(".scroll") !== null;
  const boxes = Array.from(document.querySelectorAll("main *")).filter(el => {
    const style = getComputedStyle(el);
    return style.display !== "inline" && el.clientWidth > 0 && !inScroll(el)
      && style.overflowX !== "auto";
  });
  const root = document.documentElement;
  const main = document.querySelector("main");
  const found = {
    images: images.length,
    broken: images.filter(im => !(im.complete && im.naturalWidth > 0)).map(im => im.alt),
    page_overflow: root.scrollWidth > root.clientWidth,
    overflowing: boxes.filter(wide).map(el => el.tagName + "." + el.className),
    bare_tables: Array.from(document.querySelectorAll("table")).filter(t => !inScroll(t)).length,
    wide_pre: Array.from(document.querySelectorAll("pre")).filter(wide).length,
    first: main.firstElementChild.id,
    first_text: main.firstElementChild.textContent,
    text: document.body.innerText,
  };"""


@in_browser
@pytest.mark.parametrize(
    ("variant", "width"),
    [("long-name", 800), ("quick", 1280), ("search", 800), ("search", 1280)],
)
def test_the_page_in_a_browser(built: Any, tmp_path: Path, variant: str, width: int) -> None:
    results, paths, _ = built(variant)
    found = probe(paths[-1], tmp_path, _FINDINGS, width=width)
    assert found["images"] == len(paths) - 1 and found["broken"] == []
    assert not found["page_overflow"] and found["overflowing"] == [] and found["wide_pre"] == 0
    assert found["bare_tables"] == 0
    assert found["first"] == "lead" and found["first_text"] == results["answer"]["lead"]
    assert str(paths[-1].parent.parent) not in found["text"] and "/tmp/" not in found["text"]


@in_browser
def test_the_probe_sees_overflow_a_bare_table_and_a_broken_image(tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text(
        '<html><body><main><p id="first" style="white-space:nowrap">' + "x" * 400 + "</p>"
        '<img alt="bad" src="data:image/png;base64,AAAA"><table><tr><td>1</td></tr></table>'
        '<pre style="white-space:pre">' + "y" * 400 + "</pre></main></body></html>"
    )
    found = probe(page, tmp_path, _FINDINGS, width=800)
    assert found["broken"] == ["bad"] and found["page_overflow"]
    assert "P." in found["overflowing"] and found["wide_pre"] == 1 and found["bare_tables"] == 1
    assert found["first"] == "first"
