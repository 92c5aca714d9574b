"""Fuzz every ``posenc`` subcommand and option with bad values: never a traceback.

The cases are generated: the subcommands and their options are read from the command's
own parser (typer's click tree), each option's type picks its mutations (wrong type,
negative, zero, non-finite, absurd sizes, empty strings; for ``--out`` a file, a folder
under a file and an unwritable folder), and one mutation is applied at a time to a small
valid invocation. Every case must end in exit code 0 (a value that is allowed), 2 with one
line ``posenc: error: ...`` (a user error), or, for the environment's refusals only, 1
with one line. A full disk (a tiny tmpfs, as root) is exit code 1 with one line and the
files of the earlier run left as they were.

Cases run in-process (``posenc.cli.main``) under an alarm, so a hang fails its case
instead of the suite; the console script itself is run for the reported hangs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command

from posenc.cli import _register, app, main

from ._command import console_script
from ._results import write_tiny_results

_register()
ROOT = get_command(app)
CASE_SECONDS = 30  # a case running longer is a hang

#: One small valid invocation per subcommand ({tmp}: the case's folder). A subcommand
#: without one fails test_every_subcommand_has_a_base, so new ones join the fuzz.
DRAW = "--dpi 20 --width 2 --height 2 --out {tmp}/x.png"
LENGTHGEN_TINY = (
    "--out {tmp}/lg --task copy --encodings none --train-len 8 --eval-lens 8 --steps 2 "
    "--batch-size 2 --dim 8 --layers 1 --heads 1 --eval-examples 2 --eval-tokens 64 "
    "--warmup 0 --extend none --finetune-steps 0 --quiet --no-plot"
)
BASE: dict[tuple[str, ...], list[str]] = {
    ("table",): "table sinusoidal --dim 4 --positions 0:4".split(),
    ("inspect",): "inspect sinusoidal --param dim=8 --length 16 --max-distance 4 --json".split(),
    ("plot", "table"): f"plot table -e sinusoidal --param dim=8 -p 0:8 {DRAW}".split(),
    ("plot", "similarity"): f"plot similarity -e sinusoidal --param dim=8 -p 0:8 {DRAW}".split(),
    ("plot", "decay"): f"plot decay -e sinusoidal --max-distance 8 {DRAW}".split(),
    ("plot", "bias"): f"plot bias -e alibi --param num_heads=2 -p 0:8 --max-heads 2 {DRAW}".split(),
    ("plot", "clock"): f"plot clock -e rope --param head_dim=8 -p 0:8 {DRAW}".split(),
    ("report",): "report --out {tmp}/r --quick --no-lengthgen".split(),
    ("lengthgen",): f"lengthgen {LENGTHGEN_TINY}".split(),
    ("extend",): "extend {tmp}/m.gguf --out {tmp}/e".split(),
    ("compare",): "compare {tmp}/results.json".split(),
    ("vectors",): "vectors --out {tmp}/v --cases alibi.*".split(),
    ("conformance",): (
        "conformance {tmp}/adapters.py:REFERENCE --vectors {tmp}/golden "
        "--cases sinusoidal.interleaved.*"
    ).split(),
}

# name -> (value, must the command refuse it?). Values that may be allowed (a negative
# seed, zero digits, a folder named "nan") must then run cleanly.
INT = {
    "type": ("x", True),
    "float": ("1.5", True),
    "empty": ("", True),
    "negative": ("-1", False),
    "zero": ("0", False),
    "huge": ("10000000000", False),
    "2pow64": (str(2**64), False),
    "1e400": ("1e400", True),
    "nan": ("nan", True),
    # what Python's int() takes and an option must not (a typo read as a number)
    "underscore": ("1_0", True),
    "plus": ("+1", True),
    "spaces": (" 1 ", True),
}
FLOAT = {
    "type": ("x", True),
    "empty": ("", True),
    "negative": ("-1", False),
    "zero": ("0", False),
    "nan": ("nan", True),
    "inf": ("inf", True),
    "-inf": ("-inf", True),
    "1e400": ("1e400", True),
    "huge": ("1e10", False),
    "underscore": ("1_0.5", True),
    "plus": ("+1", True),
}
TEXT = {
    "empty": ("", True),
    "blank": ("  ", True),
    "nan": ("nan", False),
    "inf": ("inf", False),
    "1e400": ("1e400", False),
    "negative": ("-1", False),
    "huge": ("10000000000", False),
    "range-huge": ("0:10000000000", False),
    "junk": ("%%", False),
}
PARAM = {
    "nan": ("dim=NaN", True),
    "inf": ("dim=Infinity", True),
    "1e400": ("dim=1e400", True),
    "2pow64": (f"dim={2**64}", True),
    "negative": ("dim=-1", True),
    "zero": ("dim=0", True),
    "huge": ("dim=10000000000", True),
    "no-equals": ("dim", True),
    "empty": ("", True),
    "bad-key": ("1=2", True),
}
# --out: (value, expected exit code)
OUT_DIR = {
    "empty": ("", 2),
    "blank": ("  ", 2),
    "file": ("{tmp}/a-file", 2),
    "under-file": ("{tmp}/a-file/sub", 2),
    "unwritable": ("{ro}/sub", 1),
}
OUT_FILE = {
    "empty": ("", 2),
    "blank": ("  ", 2),
    "dir": ("{tmp}", 2),
    "under-file": ("{tmp}/a-file/x.png", 2),
    "missing-dir": ("{tmp}/missing/x.png", 2),
    "suffix": ("{tmp}/x.txt", 2),
    "unwritable": ("{ro}/x.png", 1),
}


# `posenc conformance`'s adapters (SPEC): (value, must the command refuse it?). The file
# adapters.py and its neighbours are written by the stub_report fixture (_ADAPTERS).
SPEC = {
    **TEXT,
    "no-colon": ("{tmp}/adapters.py", True),
    "no-attr": ("{tmp}/adapters.py:", True),
    "no-module": (":REFERENCE", True),
    "missing-attr": ("{tmp}/adapters.py:NOPE", True),
    "not-adapter": ("{tmp}/adapters.py:np", True),
    "a-function": ("{tmp}/adapters.py:REFERENCE.fn", True),
    "attr-not-a-name": ("{tmp}/adapters.py:1x", True),
    "sequence-with-non-adapter": ("{tmp}/adapters.py:MIXED", True),
    "empty-sequence": ("{tmp}/adapters.py:EMPTY", True),
    "a-string": ("{tmp}/adapters.py:NAME", True),
    "duplicate-names": ("{tmp}/adapters.py:TWICE", True),
    "two-adapters": ("{tmp}/adapters.py:BOTH", False),
    "a-folder": ("{tmp}:REFERENCE", True),
    "missing-file": ("{tmp}/missing.py:REFERENCE", True),
    "not-python": ("{tmp}/a-file:REFERENCE", True),
    "fifo": ("{tmp}/fifo.py:REFERENCE", True),
    "raises-on-import": ("{tmp}/broken.py:REFERENCE", True),
    "syntax-error": ("{tmp}/syntax.py:REFERENCE", True),
    "missing-module": ("no_such_module_xyz:REFERENCE", True),
    "module-not-a-name": ("1x.y:REFERENCE", True),
    "installed-module-not-adapter": ("posenc.conformance:check", True),
    "factory-not-called": ("posenc.conformance.adapters:x_transformers_alibi", True),
}
# `posenc conformance --vectors`: (value, expected exit code).
VECTORS_DIR = {
    "empty": ("", 2),
    "blank": ("  ", 2),
    "file": ("{tmp}/a-file", 2),
    "under-file": ("{tmp}/a-file/sub", 2),
    "missing": ("{tmp}/missing", 2),
    "no-manifest": ("{tmp}", 2),
    "relative-missing": ("nan", 2),
}
# `posenc conformance --json`: (value, expected exit code).
JSON_OUT = {
    "empty": ("", 2),
    "blank": ("  ", 2),
    "dir": ("{tmp}", 2),
    "under-file": ("{tmp}/a-file/x.json", 2),
    "missing-dir": ("{tmp}/missing/x.json", 2),
    "suffix": ("{tmp}/x.txt", 2),
    "no-suffix": ("nan", 2),
    "unwritable": ("{ro}/x.json", 1),
    "fine": ("{tmp}/x.json", 0),
}


def _commands(group: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for name, command in sorted(group.commands.items()):
        if hasattr(command, "commands"):
            yield from _commands(command, (*prefix, name))
        else:
            yield (*prefix, name), command


COMMANDS = dict(_commands(ROOT))


def _flag(param: Any) -> str:
    names = [o for o in param.opts if o.startswith("--")] or list(param.opts)
    return max(names, key=len)


def _cases() -> Iterator[Any]:
    for path, command in COMMANDS.items():
        for param in command.params:
            kind = param.type_descriptor.annotation
            is_argument = param.param_type_name == "argument"
            option = param.name.upper() if is_argument else _flag(param)
            if kind is bool:
                muts: dict[str, tuple[str, Any]] = {"toggle": ("", False)}
            elif param.name == "out":
                table = OUT_FILE if path[0] == "plot" else OUT_DIR
                muts = {k: (v, code) for k, (v, code) in table.items()}
            elif param.name == "param":
                muts = PARAM
            elif path == ("conformance",) and param.name in ("specs", "vectors", "json_out"):
                muts = {"specs": SPEC, "vectors": VECTORS_DIR, "json_out": JSON_OUT}[param.name]
            else:
                muts = {int: INT, float: FLOAT}.get(kind, TEXT)
            for mutation, (value, expect) in muts.items():
                yield pytest.param(
                    path,
                    param.name,
                    option,
                    is_argument,
                    value,
                    expect,
                    id=f"{'-'.join(path)}:{option}:{mutation}",
                )


def _mutate(base: list[str], command: Any, name: str, option: str, is_arg: bool, value: str):
    """``base`` with one parameter set to ``value`` (a flag: turned the other way)."""
    argv = list(base)
    param = next(p for p in command.params if p.name == name)
    if is_arg:  # the first positional after the subcommand path
        argv[_depth(argv)] = value
        return argv
    if param.type_descriptor.annotation is bool:
        on, off = list(param.opts), list(param.secondary_opts)
        present = [a for a in argv if a in on or a in off]
        if not present:
            return [*argv, on[0]]
        argv.remove(present[0])
        other = off[:1] if present[0] in on else on[:1]
        return [*argv, *other]
    spots = [i for i, a in enumerate(argv) if a in param.opts]
    if spots:  # replace the (first) value
        argv[spots[0] + 1] = value
    else:
        argv += [option, value]
    return argv


def _depth(argv: list[str]) -> int:
    return 2 if argv[0] == "plot" else 1


class _Hang(BaseException):
    """Raised by the alarm: the case ran past CASE_SECONDS."""


@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    def ring(signum: int, frame: Any) -> None:
        raise _Hang(f"still running after {seconds} s")

    before = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    with _deadline(CASE_SECONDS), pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 0 if code is None else 1), out, err


def check_outcome(code: int, err: str, allowed: set[int]) -> None:
    assert "Traceback" not in err and "internal error" not in err, err
    assert code in allowed, f"exit code {code} not in {sorted(allowed)}; stderr: {err!r}"
    if code != 0:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("posenc: error: "), err


@contextlib.contextmanager
def _mounted(where: Path, options: str) -> Iterator[Path]:
    """A tmpfs at ``where`` (root only): skips the test when it cannot be mounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip() or proc.returncode}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


@pytest.fixture(scope="module")
def read_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path | None]:
    """A folder no one may write in: a read-only tmpfs as root, mode 0o555 otherwise."""
    where = tmp_path_factory.mktemp("ro")
    if os.geteuid() != 0:
        where.chmod(0o555)
        yield where
        where.chmod(0o755)
        return
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if proc.returncode:
        yield None
        return
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def test_every_subcommand_has_a_base() -> None:
    assert set(COMMANDS) == set(BASE), "add a small valid invocation to BASE"


def _quick_report(out_dir: Any, **kwargs: Any) -> dict[str, Any]:
    """Stands in for the report builder in the fuzz: the real one takes seconds a run and
    is run by test_report.py and the full-disk test below; here only the options matter."""
    (Path(out_dir) / "index.html").write_text("<html></html>")
    return {
        "encodings": [],
        "figures": [],
        "seconds": {"total": 0.0},
        "lengthgen": {"status": "ok", "reason": None},
    }


def _quick_extend(settings: Any, *, out_dir: Any, **kwargs: Any) -> dict[str, Any]:
    """Stands in for ``run_extend`` in the fuzz: the real one loads a model (tests/extend
    and tests/cli/test_extend_cli.py run it on tiny ones); here only the options matter."""
    (Path(out_dir) / "index.html").write_text("<html></html>")
    return {
        "answer": {
            "lead": "measured nothing",
            "sentence": "measured nothing",
            "choice": {"scaling": "none", "factor": 1.0, "length": 16},
        },
        "lengths": [16],
        "trained_context": 16,
        "emit": {},
    }


#: The adapter files `posenc conformance`'s base invocation and SPEC mutations name: the
#: float64 reference itself, rounded to float32 (it passes), and files that cannot be used.
_ADAPTERS = {
    "adapters.py": """
import numpy as np

from posenc import reference
from posenc.conformance import Adapter


def table(positions, dim, *, base):
    return reference.sinusoidal_table(positions, dim, base=base).astype(np.float32)


REFERENCE = Adapter("reference", "table", "sinusoidal", table, convention={"layout": "interleaved"})
OTHER = Adapter("reference-64", "table", "sinusoidal", reference.sinusoidal_table, dtype="float64")
BOTH = (REFERENCE, OTHER)
TWICE = [REFERENCE, REFERENCE]
MIXED = [REFERENCE, 3]
EMPTY = []
NAME = "REFERENCE"
""",
    "broken.py": "raise RuntimeError('an adapter file that fails\\non import')\n",
    "syntax.py": "def (\n",
}


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sinusoidal golden vectors, written once (`posenc conformance --vectors`)."""
    from posenc.conformance import write_vectors

    return write_vectors(tmp_path_factory.mktemp("golden"), cases="sinusoidal.*")


@pytest.fixture
def stub_report(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, golden: Path) -> None:
    import posenc.extend.run
    import posenc.report.build

    monkeypatch.setattr(posenc.report.build, "build_report", _quick_report)
    monkeypatch.setattr(posenc.extend.run, "run_extend", _quick_extend)
    (tmp_path / "m.gguf").write_bytes(b"")  # the model extend's base invocation names
    write_tiny_results(tmp_path / "results.json")  # the study compare's reads
    shutil.copytree(golden, tmp_path / "golden")  # what conformance's base checks against
    for name, source in _ADAPTERS.items():
        (tmp_path / name).write_text(source)
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo.py")


@pytest.mark.parametrize("path", list(BASE), ids=["-".join(p) for p in BASE])
def test_the_base_invocations_run(capsys, tmp_path, monkeypatch, stub_report, path) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, [a.format(tmp=tmp_path) for a in BASE[path]])
    assert code == 0, err


@pytest.mark.parametrize(("path", "name", "option", "is_arg", "value", "expect"), list(_cases()))
def test_fuzz(
    capsys, tmp_path, monkeypatch, read_only, stub_report, path, name, option, is_arg, value, expect
):
    monkeypatch.chdir(tmp_path)  # relative outputs ("nan", "-1") land in the case's folder
    (tmp_path / "a-file").write_text("x")
    if "{ro}" in value:
        if read_only is None:
            pytest.skip("no read-only folder: a read-only tmpfs could not be mounted")
        value = value.replace("{ro}", str(read_only))
    value = value.replace("{tmp}", str(tmp_path))
    base = [a.format(tmp=tmp_path) for a in BASE[path]]
    argv = _mutate(base, COMMANDS[path], name, option, is_arg, value)
    code, _, err = run(capsys, argv)
    if isinstance(expect, int) and not isinstance(expect, bool):
        allowed = {expect}  # --out cases: the exact exit code
    else:
        allowed = {2} if expect else {0, 2}
    check_outcome(code, err, allowed)


#: The position maps' names in every option that takes a scaling: (extra arguments, exit
#: code). A map an engine or --save cannot carry is refused before anything runs.
MAP_CASES = {
    "scalings-both": (["--scalings", "none,self-extend,string"], 0),
    "scalings-underscore": (["--scalings", "self_extend"], 2),
    "scalings-type-name": (["--scalings", "none,STRING"], 2),
    "scaling-self-extend": (["--scaling", "self-extend"], 0),
    "scaling-string": (["--scaling", "string"], 0),
    "self-extend-llama.cpp": (["--scaling", "self-extend", "--emit", "llama.cpp"], 0),
    "self-extend-vllm": (["--scaling", "self-extend", "--emit", "vllm"], 2),
    "string-llama.cpp": (["--scaling", "string", "--emit", "llama.cpp"], 2),
    "string-transformers": (["--scaling", "string", "--emit", "transformers"], 2),
    "self-extend-save": (["--scaling", "self-extend", "--save", "{tmp}/saved"], 2),
    "string-save": (["--scaling", "string", "--save", "{tmp}/saved"], 2),
}


@pytest.mark.parametrize(("extra", "expect"), list(MAP_CASES.values()), ids=list(MAP_CASES))
def test_extend_takes_the_position_maps_names(
    capsys, tmp_path, monkeypatch, stub_report, extra, expect
) -> None:
    monkeypatch.chdir(tmp_path)
    base = [a.format(tmp=tmp_path) for a in BASE[("extend",)]]
    code, _, err = run(capsys, [*base, *(a.format(tmp=tmp_path) for a in extra)])
    check_outcome(code, err, {expect})
    assert not (tmp_path / "saved").exists()
    if expect:  # refused before anything ran (the stand-in run writes the page)
        assert not (tmp_path / "e" / "index.html").exists()


@pytest.mark.parametrize(
    ("argv", "estimate", "named"),
    [
        (["table", "sinusoidal", "--dim", "10000000000"], "168 TB", "--dim 10000000000"),
        (["inspect", "rope", "--length", "100000"], "803 GB", "--length 100000"),
        (
            ["plot", "decay", "-e", "rope", "--max-distance", "1000000", "--out", "x.png"],
            "65.5 GB",
            "--max-distance 1000000",
        ),
        (
            ["plot", "decay", "-e", "alibi", "--max-distance", "1000000", "--out", "x.png"],
            "80.1 TB",
            "--max-distance 1000000",
        ),
        (
            ["plot", "similarity", "-e", "rope", "-p", "0:100000", "--out", "x.png"],
            "803 GB",
            "--positions '0:100000'",
        ),
        (
            ["inspect", "alibi", "--param", "num_heads=100000"],
            "210 GB",
            "--param num_heads=100000 with --length 512",
        ),
        (
            ["inspect", "t5", "--param", "max_distance=10000000000"],
            "5.12 TB",
            "--param max_distance=10000000000",
        ),
        (
            ["plot", "bias", "-e", "alibi", "--param", "num_heads=100000", "--out", "x.png"],
            "52.4 GB",
            "--param num_heads=100000 with --positions (not given: 256 positions)",
        ),
    ],
    ids=[
        "table-dim-1e10",
        "inspect-length-1e5",
        "plot-decay-rope-1e6",
        "plot-decay-alibi-1e6",
        "plot-similarity-1e5",
        "inspect-param-num-heads-1e5",
        "inspect-param-max-distance-1e10",
        "plot-bias-param-num-heads-1e5",
    ],
)
def test_reported_hangs_refuse_with_the_estimate(
    capsys, tmp_path, monkeypatch, argv, estimate, named
):
    """A memory refusal gives the estimate and names the option (or --param key) that asks
    for it, first thing on the line."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, argv)
    check_outcome(code, err, {2})
    assert f"needs about {estimate} of memory, over the limit of" in err
    assert err.startswith(f"posenc: error: {named}"), err


def test_the_console_script_refuses_without_a_traceback() -> None:
    """The installed script (not only main in-process), on a case that used to hang."""
    proc = console_script("table", "sinusoidal", "--dim", "10000000000", timeout=60)
    check_outcome(proc.returncode, proc.stderr, {2})
    assert "needs about" in proc.stderr


def _fill(folder: Path, leave: int = 0) -> None:
    """Fill ``folder``'s file system, then free about ``leave`` bytes."""
    filler = folder / "filler"
    with contextlib.suppress(OSError), open(filler, "wb", buffering=0) as f:
        while True:
            f.write(b"\0" * 65536)
    if leave:
        size = filler.stat().st_size
        with open(filler, "r+b") as f:
            f.truncate(max(0, size - leave))


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "filler"
    }


LENGTHGEN = [*BASE[("lengthgen",)], "--checkpoint-every", "1"]


@pytest.mark.parametrize("leave", [0, 6000], ids=["full", "half-a-checkpoint"])
def test_a_full_disk_during_lengthgen_is_one_line_exit_1(capsys, tmp_path, leave) -> None:
    with _mounted(tmp_path / "disk", "size=1m") as disk:
        argv = [a.format(tmp=disk) for a in LENGTHGEN]
        code, _, err = run(capsys, argv)
        assert code == 0, err
        before = _snapshot(disk / "lg")
        assert "results.json" in before and "checkpoints/none.pt" in before
        _fill(disk, leave)
        code, _, err = run(capsys, [*argv, "--seed", "1"])
        check_outcome(code, err, {1})
        assert "No space left on device" in err and str(disk / "lg") in err
        assert _snapshot(disk / "lg") == before  # the earlier results are intact
        assert not list((disk / "lg").rglob("*.tmp"))  # no temporary file left behind
        (disk / "filler").unlink()
        code, _, err = run(capsys, [*argv, "--seed", "1"])  # room again: it runs
        assert code == 0, err


def test_a_full_disk_during_report_is_one_line_exit_1(capsys, tmp_path) -> None:
    with _mounted(tmp_path / "disk", "size=1m") as disk:
        earlier = disk / "r"  # an earlier report's files (the real ones take seconds)
        earlier.mkdir()
        for name in ("index.html", "report.json", "table_sinusoidal.png"):
            (earlier / name).write_bytes(name.encode() * 100)
        before = _snapshot(earlier)
        _fill(disk)
        code, _, err = run(capsys, ["report", "--out", str(earlier), "--quick", "--no-lengthgen"])
        check_outcome(code, err, {1})
        assert f"No space left on device: '{earlier}/" in err
        assert _snapshot(earlier) == before
        assert not list(earlier.rglob("*.tmp"))


def test_the_tmpfs_helpers_clean_up(tmp_path) -> None:
    """The mount is gone after the with block (a lazy unmount), so tmp_path can be removed."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    with _mounted(tmp_path / "disk", "size=64k") as disk:
        (disk / "f").write_bytes(b"x")
    assert not (tmp_path / "disk" / "f").exists()
