"""``posenc inspect --hf-config``: what a hostile or huge config.json gets (issue 24).

Every size the file sets is estimated before anything is built and refused in one line
naming the key; the file is read only when it is a regular file under the cap, its JSON
parsed without recursing past a depth; Phi-3.5's LongRoPE factor lists print summarised.
"""

from __future__ import annotations

import json
import os
import resource
import sys

import pytest

import posenc.cli._hf_inspect as hf_inspect
from posenc.cli._hf_inspect import CONFIG_MAX_BYTES, MAX_DEPTH, MAX_LAYERS

from ._command import run

LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}
GPTJ = {"model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_positions": 2048, "rotary_dim": 64}


def _write(tmp_path, config, name="config.json"):
    path = tmp_path / name
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return str(path)


def _one_line(code, out, err, *words):
    assert code == 2 and out == "", (code, out, err)
    assert err.startswith("posenc: error: --hf-config ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word in err, (word, err)


@pytest.fixture
def nothing_built(monkeypatch):
    """rotary_from_config and the family's rotary must not run: the refusal comes first."""

    def refuse(*args, **kwargs):
        raise AssertionError("built before the sizes were checked")

    monkeypatch.setattr(hf_inspect, "rotary_from_config", refuse)
    monkeypatch.setattr(hf_inspect, "_family_rotary", refuse)


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({**LLAMA, "head_dim": 100_000_000}, ["head_dim=100000000", "needs about 25.6 GB"]),
        ({**LLAMA, "hidden_size": 10**12}, ["hidden_size=1000000000000"]),
        ({**LLAMA, "head_dim": 16, "rotary_dim": 10**9}, ["rotary_dim=1000000000"]),
        ({**LLAMA, "qk_rope_head_dim": 10**10}, ["qk_rope_head_dim=10000000000"]),
        ({**LLAMA, "head_dim": 10**40}, ["head_dim=" + "1" + "0" * 40]),
        ({"model_type": "llama", "text_config": {**LLAMA, "head_dim": 10**9}}, ["head_dim="]),
        (
            {"model_type": "gemma3_text", **LLAMA, "head_dim": 16, "num_hidden_layers": 10**8},
            [f"num_hidden_layers must be at most {MAX_LAYERS}", "got 100000000"],
        ),
        ({**GPTJ, "n_layer": 10**7}, ["n_layer must be at most"]),
    ],
    ids=[
        "head_dim-1e8",
        "hidden_size-1e12",
        "rotary_dim-1e9",
        "qk_rope_head_dim-1e10",
        "head_dim-1e40",
        "text_config-head_dim-1e9",
        "num_hidden_layers-1e8",
        "gptj-n_layer-1e7",
    ],
)
def test_a_huge_size_is_refused_before_anything_is_built(
    capsys, tmp_path, nothing_built, config, words
):
    code, out, err = run(capsys, "inspect", "--hf-config", _write(tmp_path, config))
    _one_line(code, out, err, *words)


def test_the_family_table_is_measured_on_the_meta_device(capsys, tmp_path, monkeypatch):
    """GPT-J's rotary module tabulates n_positions x rotary_dim, a table posenc does not
    build: it is measured on the meta device (nothing allocated) and refused over the
    command's limit, naming both keys. Here the limit is 2 MB and the table 5.12 MB."""
    import posenc.cli._checks

    path = _write(tmp_path, {**GPTJ, "n_positions": 20_000})
    code, out, err = run(capsys, "inspect", "--hf-config", path)
    assert code == 0 and "max |cos/sin error|" in out, err
    monkeypatch.setattr(posenc.cli._checks, "byte_limit", lambda cap=None: 2 * 10**6)
    code, out, err = run(capsys, "inspect", "--hf-config", path)
    _one_line(code, out, err, "n_positions=20000, rotary_dim=64", "GPTJRotaryEmbedding")
    assert "its [20000, 64] table needs about 20.5 MB of memory, over the limit of 2 MB" in err


def test_the_library_refusal_names_the_option_too(capsys, tmp_path):
    """A refusal of rotary_from_config (GPT-J's n_positions = 1e8) reads
    ``--hf-config PATH: ...``, naming the key as the library does."""
    path = _write(tmp_path, {**GPTJ, "n_positions": 100_000_000})
    code, out, err = run(capsys, "inspect", "--hf-config", path)
    _one_line(code, out, err, f"--hf-config {path!r}: ", "n_positions", "100000000")


def _limited(megabytes: int):
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (megabytes << 20, megabytes << 20))

    return limit


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS as on Linux")
@pytest.mark.parametrize(
    "config",
    [{**LLAMA, "head_dim": 100_000_000}, {**GPTJ, "n_positions": 100_000_000}],
    ids=["llama-head_dim-1e8", "gptj-n_positions-1e8"],
)
def test_the_reported_configs_refuse_in_bounded_memory_and_time(tmp_path, config):
    """The issue's reproductions, through the console script under a 6 GiB address-space
    limit and 120 s: they took 57 s and 13.7 GB before."""
    import subprocess
    from pathlib import Path

    script = Path(sys.executable).parent / "posenc"
    proc = subprocess.run(
        [str(script), "inspect", "--hf-config", _write(tmp_path, config)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=_limited(6 << 10),
    )
    _one_line(proc.returncode, proc.stdout, proc.stderr, "100000000")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[" * 100_000 + "]" * 100_000, [f"over {MAX_DEPTH} levels deep"]),
        ('{"a": ' + "[" * 500 + "]" * 500 + "}", [f"over {MAX_DEPTH} levels deep"]),
        ('{"model_type": "llama", "head_dim": ' + "7" * 5000 + "}", ["integer of over"]),
        ("\xff\xfe{}", ["not UTF-8 text"]),
    ],
    ids=["lists-1e5-deep", "lists-500-deep", "integer-5000-digits", "not-utf8"],
)
def test_bad_json_is_one_line_naming_the_option(capsys, tmp_path, text, words):
    path = tmp_path / "config.json"
    path.write_bytes(text.encode("latin-1"))
    code, out, err = run(capsys, "inspect", "--hf-config", str(path))
    _one_line(code, out, err, *words)


def test_a_file_over_the_cap_is_refused_before_it_is_read(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA) + " " * CONFIG_MAX_BYTES)  # valid JSON, too large
    code, out, err = run(capsys, "inspect", "--hf-config", str(path))
    _one_line(code, out, err, f"more than the {CONFIG_MAX_BYTES} bytes")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("option", ["--hf-config", "--gguf"])
def test_a_fifo_or_a_device_is_refused_not_read(capsys, tmp_path, option):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer forever
    code, out, err = run(capsys, "inspect", option, str(fifo))
    assert (code, out) == (2, "") and err.startswith(
        f"posenc: error: {option} must be a regular file"
    )
    assert "a FIFO" in err and err.count("\n") == 1
    link = tmp_path / "zero.json"
    link.symlink_to("/dev/zero")  # read whole, it never ends
    code, out, err = run(capsys, "inspect", option, str(link))
    assert (code, out) == (2, "") and "must be a regular file, got a character device" in err, err
    code, out, err = run(capsys, "inspect", option, str(tmp_path))
    assert (code, out) == (2, "") and "must be a regular file, got a directory" in err, err


def _phi35_like(tmp_path) -> tuple[str, list[float], list[float]]:
    """A Phi-3.5-mini-like config written by transformers' Phi3Config: LongRoPE with 48
    short and 48 long factors (head_dim 96)."""
    from transformers import Phi3Config

    short = [round(1.0 + 0.04 * k, 2) for k in range(48)]
    long = [1.0 + 1.25 * k for k in range(48)]
    config = Phi3Config(
        hidden_size=3072,
        num_attention_heads=32,
        num_hidden_layers=2,
        max_position_embeddings=131072,
        original_max_position_embeddings=4096,
        rope_scaling={"type": "longrope", "short_factor": short, "long_factor": long},
    )
    return _write(tmp_path, config.to_json_string()), short, long


def test_phi35_longrope_factors_print_summarised_and_whole_in_json(capsys, tmp_path):
    path, short, long = _phi35_like(tmp_path)
    code, out, err = run(capsys, "inspect", "--hf-config", path)
    assert code == 0, err
    lines = out.splitlines()
    assert max(map(len, lines)) <= 160, max(lines, key=len)
    assert "    short_factor: 48 values in [1, 2.88]: 1, 1.04, 1.08, 1.12, ..." in lines
    assert "    long_factor: 48 values in [1, 59.75]: 1, 2.25, 3.5, 4.75, ..." in lines
    scaling = next(line for line in lines if line.startswith("  scaling: "))
    assert scaling.startswith("  scaling: LongRopeScaling(original_max_position=4096, ")
    code, out, err = run(capsys, "inspect", "--hf-config", path, "--json")
    params = json.loads(out)["layers"]["all"]["scaling_parameters"]
    assert params["short_factor"] == short and params["long_factor"] == long  # whole lists
