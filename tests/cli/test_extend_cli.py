"""``posenc extend`` as a command: what it writes, ``--save``, and one-line errors."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

import transformers
from tests.extend._tiny import tiny_llama

from ._command import run

TEXT = Path(__file__).resolve().parents[2] / "src" / "posenc" / "rotary" / "module.py"


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("llama"))


def test_extend_writes_results_page_and_a_loadable_copy(
    capsys, llama: Path, tmp_path: Path
) -> None:
    out, saved = tmp_path / "out", tmp_path / "saved"
    code, stdout, err = run(
        capsys,
        "extend",
        str(llama),
        "--out",
        str(out),
        "--text",
        str(TEXT),
        "--scalings",
        "none,yarn",
        "--trials",
        "1",
        "--context",
        "256",
        "--save",
        str(saved),
        "--scaling",
        "yarn",
    )
    assert code in (0, None), err
    results = json.loads((out / "results.json").read_text())
    assert {r["key"] for r in results["records"]} == {
        "none-256-1",
        "yarn-256-2",
        "none-384-1",
        "yarn-384-1.5",
        "none-512-1",
        "yarn-512-2",
    }
    assert results["answer"]["lead"] in stdout and "wrote" in stdout
    lines = {line.split(": ", 1)[0]: line for line in stdout.splitlines() if ": " in line}
    for engine, item in results["emit"].items():  # every engine's command, or why not
        shown = item.get("command") or item.get("refused")
        if not shown:  # a setting that is files only (transformers' config): their paths
            shown = ", ".join(str(out / name) for name in item["files"])
        assert lines[engine] == f"{engine}: {shown}", lines.get(engine)
        for name in item.get("files", ()):
            assert (out / name).is_file()
    assert "saved yarn (factor 2) for 512 tokens" in stdout
    config = json.loads((saved / "config.json").read_text())
    assert config["rope_parameters"] == {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 2.0,
        "original_max_position_embeddings": 256,
    }
    assert config["max_position_embeddings"] == 512
    transformers.AutoModelForCausalLM.from_pretrained(saved)  # loads without posenc


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["extend", "/nonexistent/model"], "no such path"),
        (["extend", "MODEL", "--scalings", "none,,yarn"], "no empty entry"),
        (["extend", "MODEL", "--scalings", "rope"], "--scalings entries must be among"),
        (["extend", "MODEL", "--lengths", "1,abc"], "--lengths entries must be numbers, got 'abc'"),
        (["extend", "MODEL", "--lengths", "0.5,2"], "--lengths must be"),
        (["extend", "MODEL", "--to", "0.5"], "--to"),
        (["extend", "MODEL", "--dtype", "int8"], "--dtype must be one of"),
        (["extend", "MODEL", "--scaling", "rope"], "--scaling must be one of"),
        (["extend", "MODEL", "--context", "1e10"], "--context"),
        (["extend", "MODEL", "--emit", "tgi"], "--emit entries must be among"),
        (["extend", "MODEL", "--tasks", "niah"], "--tasks entries must be among"),
        (["extend", "MODEL", "--emit", "vllm", "--scaling", "dynamic"], "vllm"),
        (["extend", "MODEL", "--emit", "gguf", "--scaling", "yarn"], "gguf"),
        (["extend", "MODEL", "--emit", "vllm,ollama"], "ollama"),
        (["extend", "MODEL", "--bar", "0"], "--bar"),
        (["extend", "MODEL", "--scalings", "self_extend"], "--scalings entries must be among"),
        (["extend", "MODEL", "--scaling", "string", "--emit", "vllm"], "posenc only"),
        (["extend", "MODEL", "--scaling", "self-extend", "--emit", "sglang"], "llama-completion"),
        (["extend", "MODEL", "--scaling", "string", "--save", "S"], "--save cannot write string"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(
    capsys, llama: Path, args: list[str], match: str
) -> None:
    args = [str(llama) if a == "MODEL" else a for a in args]
    code, _, err = run(capsys, *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("posenc: error:") and match in lines[0], err


def test_a_model_with_no_rope_is_one_line(capsys, tmp_path: Path) -> None:
    from tests.extend._tiny import byte_tokenizer

    config = transformers.GPT2Config(
        vocab_size=260,
        n_embd=16,
        n_layer=1,
        n_head=2,
        n_positions=64,
        bos_token_id=256,
        eos_token_id=257,
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    byte_tokenizer().save_pretrained(tmp_path / "gpt2")
    capsys.readouterr()  # the saving's own progress lines
    code, _, err = run(capsys, "extend", str(tmp_path / "gpt2"), "--out", str(tmp_path / "o"))
    assert code == 2 and "no RoPE to scale" in err and len(err.strip().splitlines()) == 1, err


def test_a_model_whose_long_range_has_no_rope_is_told_on_one_line(capsys, tmp_path: Path) -> None:
    from tests.extend._tiny_hybrid import tiny_hybrid

    model = tiny_hybrid(tmp_path / "cohere2", "cohere2")
    capsys.readouterr()  # the saving's own progress lines
    args = ["--out", str(tmp_path / "o"), "--text", str(TEXT), "--trials", "0", "--to", "1.5"]
    code, stdout, err = run(capsys, "extend", str(model), *args, "--scalings", "none,string")
    assert code in (0, None), err
    notes = [line for line in stdout.splitlines() if line.startswith("note: ")]
    assert notes == [
        "note: cohere2: its full-attention layers have no RoPE; sliding-window RoPE layers are "
        "left as the config says, so no scaling or position map reaches the long range: only "
        "none (and config) are measured"
    ]
    results = json.loads((tmp_path / "o" / "results.json").read_text())
    assert {r["scaling"] for r in results["records"]} == {"none"}


# --- the factor search's progress line --------------------------------------------------------


def _told(**changes: object) -> dict:
    """A ``search`` event as ``run_search`` sends it: the fifth candidate, 3.2 minutes of 10."""
    info = {
        "done": 5,
        "nll": math.log(12.34),
        "generation": 0,
        "origin": "mutation",
        "seconds": 192.0,
        "budget": 600.0,
        "evaluations": None,
        "best": {"nll": math.log(11.9), "origin": "yarn"},
    }
    return {**info, **changes}


@pytest.mark.parametrize(
    ("changes", "line"),
    [
        (
            {},
            "search: candidate 5 of ~15 (mutation), ppl 12.34, best 11.9 (yarn), 3.2 of 10 min",
        ),
        (
            {"evaluations": 12},
            "search: candidate 5 of ~12 (mutation), ppl 12.34, best 11.9 (yarn), 3.2 of 10 min",
        ),
        (
            {"nll": None, "done": 1, "seconds": 0.0, "origin": "pi", "best": {"nll": None}},
            "search: candidate 1 (pi), ppl not finite, best not finite, 0.0 of 10 min",
        ),
        (
            {"done": 40, "seconds": 660.0, "nll": 800.0},
            "search: candidate 40 of ~40 (mutation), ppl e^800, best 11.9 (yarn), 11.0 of 10 min",
        ),
    ],
    ids=["estimate", "capped", "first-not-finite", "past-budget-overflow"],
)
def test_a_search_event_is_one_line(changes: dict, line: str) -> None:
    from posenc.cli.extend import _search_line

    assert _search_line(_told(**changes)) == line


@pytest.mark.parametrize("terminal", [False, True], ids=["log", "terminal"])
def test_the_progress_prints_a_line_per_evaluation(terminal: bool) -> None:
    from rich.console import Console

    from posenc.cli.extend import _progress, _search_line

    stream = io.StringIO()
    console = Console(file=stream, force_terminal=terminal, width=40, color_system=None)
    events = [_told(done=i, seconds=38.4 * i) for i in (1, 2, 3)]
    with _progress(console) as on_event:
        for info in events:
            on_event("search", info)
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\r", "\n", stream.getvalue())  # the live bars' codes
    # whole lines, never wrapped at the console's width
    assert [line.strip() for line in plain.splitlines() if line.strip()] == [
        _search_line(info) for info in events
    ]
