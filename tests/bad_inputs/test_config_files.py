"""``posenc inspect --hf-config FILE`` on bad files: the config dicts of the matrix with each
key mutated in turn (``_mutations._config_keys``), written to a file, and files that are bad
as files (not regular, too big, too deep, not JSON, not UTF-8, numbers past Python's digit
limit).

Every case ends in exit code 0 (an allowed value) or 2 with one line ``posenc: error: ...``
that names the key (for a mutated key) or ``--hf-config`` (for a bad file); never a
traceback, an internal error, a hang (the alarm) or an allocation the file asked for
(``POSENC_MAX_ALLOC_BYTES`` is set low, so one fails as an error naming no key).
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from posenc.cli import main

from ._mutations import KEY_NAMES, mutations
from ._targets_more import CONFIGS

CASE_SECONDS = 20


def _key_cases() -> Iterator[Any]:
    for family, make in CONFIGS.items():
        for kind, mutate, rule in mutations("config", make()):
            if kind not in KEY_NAMES:
                continue  # the dict as a whole (a list, a string) is not a file's content
            if "complex" in kind:
                continue  # JSON has no complex numbers: a file cannot hold one
            yield pytest.param(mutate, KEY_NAMES[kind], rule, id=f"{family}-{kind}")


def _dump(config: dict[str, Any]) -> str:
    def default(value: Any) -> Any:
        if isinstance(value, set):
            return sorted(value)
        raise TypeError(type(value).__name__)

    # NaN and infinity as JSON's extension literals (NaN, Infinity): Python writes and reads
    # them, and so do transformers' config files.
    return json.dumps(config, default=default)


class _Hang(Exception):
    pass


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    def ring(signum: int, frame: Any) -> None:
        raise _Hang(f"still running after {CASE_SECONDS} s")

    before = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
    try:
        with pytest.raises(SystemExit) as info:
            main(list(args))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
    out, err = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 0 if code is None else 1), out, err


def _names(message: str, name: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", message) is not None


def _refused(code: int, err: str) -> str:
    assert "Traceback" not in err and "internal error" not in err, err
    assert code == 2, f"exit code {code}; stderr: {err!r}"
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("posenc: error: "), err
    return lines[0]


@pytest.fixture(autouse=True)
def _small_allocations(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSENC_MAX_ALLOC_BYTES", str(2**28))


@pytest.mark.parametrize(("mutate", "key", "rule"), list(_key_cases()))
def test_a_mutated_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, mutate: Any, key: str, rule: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(_dump(mutate()))
    code, out, err = _run(capsys, "inspect", "--hf-config", str(path))
    if code == 0:
        assert rule != "raise", f"silently accepted a bad {key!r}: {out[:300]}"
        assert "nan" not in out.lower().split(), out[:300]
        return
    line = _refused(code, err)
    assert _names(line, key), f"the message does not name {key!r}: {line}"


def _deep(depth: int) -> str:
    return '{"model_type": "llama", "x": ' + "[" * depth + "]" * depth + "}"


BAD_FILES = {
    "empty": "",
    "not_json": "{model_type: llama",
    "a_list": "[1, 2, 3]",
    "a_number": "3",
    "deep_lists": _deep(100_000),
    "deep_dicts": '{"a": ' * 50_000 + "1" + "}" * 50_000,
    "digits_5000": '{"model_type": "llama", "hidden_size": ' + "9" * 5000 + "}",
    "nan_literal": '{"model_type": "llama", "hidden_size": NaN, "num_attention_heads": 4}',
    "duplicate_junk": '{"model_type": "llama"} trailing',
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_a_bad_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(BAD_FILES[name])
    code, _, err = _run(capsys, "inspect", "--hf-config", str(path))
    line = _refused(code, err)
    assert any(_names(line, n) for n in ("--hf-config", "hidden_size")), line


def test_not_utf8(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b'{"model_type": "\xff\xfe"}')
    code, _, err = _run(capsys, "inspect", "--hf-config", str(path))
    assert _names(_refused(code, err), "--hf-config")


def test_too_big(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    with path.open("w") as f:  # a valid config padded past any config's size
        f.write('{"model_type": "llama", "pad": "')
        f.write("x" * (64 * 2**20))
        f.write('"}')
    code, _, err = _run(capsys, "inspect", "--hf-config", str(path))
    assert _names(_refused(code, err), "--hf-config")


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "directory"])
def test_not_a_regular_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str) -> None:
    path = tmp_path / "config.json"
    if kind == "fifo":
        os.mkfifo(path)  # reading it would wait forever for a writer
    elif kind == "dev_zero":
        if not Path("/dev/zero").exists():
            pytest.skip("no /dev/zero")
        path.symlink_to("/dev/zero")  # reading it would never end
    else:
        path.mkdir()
    code, _, err = _run(capsys, "inspect", "--hf-config", str(path))
    assert _names(_refused(code, err), "--hf-config")


def test_the_valid_configs_inspect(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The base of every case above is itself a config that inspect reads."""
    for family, make in CONFIGS.items():
        path = tmp_path / f"{family}.json"
        path.write_text(_dump(make()))
        code, out, err = _run(capsys, "inspect", "--hf-config", str(path))
        assert code == 0, f"{family}: {err}"
        assert family in out, f"{family}: {out[:300]}"
