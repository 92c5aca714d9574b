"""posenc where torch is not installed, and the lazy top level that makes it possible.

Without torch: a child process whose ``sys.modules`` holds None for torch (and for every
optional dependency, transformers included) before it imports posenc stands for an install
of NumPy, typer and rich alone; it runs every probe below once (:func:`torchless`), and each
test reads its own answer. ``import posenc``, the float64 reference, the conformance check,
the checks and files under them and the commands ``vectors`` and ``conformance`` work there,
with the same results as with torch; every part that needs torch (a room, a top-level name, a
subcommand) says so in one line. ``.ci/torch-free`` proves the same in a fresh venv.

With torch: every top-level name is its module's object, the type checkers' imports are the
table ``__getattr__`` reads, ``import posenc`` imports no torch, and transformers' spelling
reader is installed however ``posenc.rotary`` is reached.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import pkgutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import posenc
from posenc import _lazy
from posenc.cli._main import TORCH_COMMANDS

ROOT = Path(__file__).resolve().parents[1]
INIT = ROOT / "src" / "posenc" / "__init__.py"

#: What the child process has not: torch and every optional dependency of posenc.
BLOCKED = (
    "torch",
    "transformers",
    "triton",
    "matplotlib",
    "gguf",
    "accelerate",
    "kernels",
    "scipy",
    "psutil",
    "rotary_embedding_torch",
    "x_transformers",
)
NEEDS_TORCH = "{} needs torch, which is not installed: pip install torch"

#: The public rooms of posenc (top-level packages and modules) that need torch.
TORCH_ROOMS = sorted(
    f"posenc.{m.name}"
    for m in pkgutil.iter_modules(posenc.__path__)
    if not m.name.startswith("_") and not _lazy.torch_free(f"posenc.{m.name}")
)
#: The top-level names that need torch (all but the error type and the reference).
TORCH_NAMES = sorted(n for n in posenc.__all__ if n not in ("PosEncError", "reference"))
#: The modules promised to import without torch, those that exist.
TORCH_FREE = sorted(m for m in _lazy.TORCH_FREE if importlib.util.find_spec(m) is not None)

#: The checks of plain and NumPy values, evaluated with torch and without: the same answers.
CHECKS = {
    "int from numpy": "_errors.check_int('n', np.int64(7), min=1)",
    "int refused, a float": "_errors.check_int('n', np.float64(3.0))",
    "int refused, an array": "_errors.check_int('n', np.arange(2))",
    "int over 64 bits": "_errors.check_int('n', 1 << 70)",
    "float from numpy": "_errors.check_float('x', np.float32(0.5), min=0.0)",
    "float refused, not finite": "_errors.check_float('x', float('inf'))",
    "float refused, a bool": "_errors.check_float('x', np.bool_(True))",
    "bool from numpy": "_errors.check_bool('flag', np.bool_(False))",
    "choice": "_errors.check_choice('layout', 'half', ('half', 'interleaved'))",
    "choice refused": "_errors.check_choice('layout', 'flax ', ('half', 'interleaved'))",
    "describe an array": "_errors.describe(np.zeros((2, 3), dtype=np.float32))",
    "describe a scalar": "_errors.describe(np.int64(3))",
    "field rule": "_fields.integer(_fields.At('manifest', 'dim'), 64, 1)",
    "field refused": "_fields.integer(_fields.At('manifest', 'dim'), 'x', 1)",
    "file refused, a folder": "_files.read_regular('.', what='manifest', max_bytes=10)",
}

#: Arrays of the float64 reference, computed without torch and with: equal, element for element.
ARRAYS = {
    "sinusoidal interleaved": "reference.sinusoidal_table(np.arange(9), 16)",
    "sinusoidal half": "reference.sinusoidal_table(np.arange(9), 16, layout='half')",
    "rope frequencies, yarn": (
        "reference.rope_frequencies(32, scaling={'type': 'yarn', 'factor': 4.0, "
        "'original_max_position': 512})[0]"
    ),
    "alibi slopes, 12 heads": "reference.alibi_slopes(12)",
}

PROBE = """
import contextlib, importlib, io, json, sys, traceback
for _m in BLOCKED:
    sys.modules[_m] = None
import numpy as np
import posenc
from posenc import _errors, _fields, _files, reference

spec = json.loads(sys.argv[1])
out = {"imports": {}, "names": {}, "checks": {}, "cli": {}}

def outcome(call):
    try:
        value = call()
    except BaseException as e:  # noqa: BLE001 - every outcome is the answer
        return [type(e).__name__, str(e)]
    return ["ok", repr(value) if not hasattr(value, "__name__") else value.__name__]

for name in spec["imports"]:
    out["imports"][name] = outcome(lambda: importlib.import_module(name))
for name in spec["names"]:
    out["names"][name] = outcome(lambda: getattr(posenc, name))
where = dict(np=np, _errors=_errors, _fields=_fields, _files=_files, reference=reference)
for label, expr in spec["checks"].items():
    out["checks"][label] = outcome(lambda: eval(expr, where))
np.savez(spec["arrays_out"], **{k: eval(e, where) for k, e in spec["arrays"].items()})
from posenc.cli import main
for label, argv in spec["cli"].items():
    err, std = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
        try:
            main(argv)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    out["cli"][label] = [code, std.getvalue(), err.getvalue()]
out["blocked"] = {m: sys.modules.get(m, "gone") is None for m in BLOCKED}
out["modules"] = sorted(m for m, v in sys.modules.items() if m.startswith("posenc") and v)
print(json.dumps(out))
"""


def _cli_runs(tmp: Path) -> dict[str, list[str]]:
    runs = {"help": ["--help"]}
    for command in TORCH_COMMANDS:
        runs[command] = [command, "--help"] if command != "table" else [command, "sinusoidal"]
    return runs


@pytest.fixture(scope="module")
def torchless(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The child process's answers to every probe (one run for the whole file)."""
    tmp = tmp_path_factory.mktemp("torchless")
    spec = {
        "imports": [*TORCH_ROOMS, "posenc.rotary.apply", "posenc.cli.table", *TORCH_FREE],
        "names": [*TORCH_NAMES, "PosEncError", "reference", "ALiBi", "no_such_name"],
        "checks": CHECKS,
        "arrays": ARRAYS,
        "arrays_out": str(tmp / "arrays.npz"),
        "cli": _cli_runs(tmp),
    }
    code = f"BLOCKED = {BLOCKED!r}\n{PROBE}"
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr
    answers: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    answers["arrays"] = dict(np.load(tmp / "arrays.npz"))
    return answers


# --- without torch ------------------------------------------------------------------------


def test_no_blocked_module_was_imported(torchless: dict[str, Any]) -> None:
    """The child never imported torch nor any optional dependency (each is still None)."""
    assert torchless["blocked"] == dict.fromkeys(BLOCKED, True)


@pytest.mark.parametrize("module", TORCH_FREE)
def test_torch_free_module_imports(torchless: dict[str, Any], module: str) -> None:
    """Each module promised torch-free (``posenc._lazy.TORCH_FREE``) imports without it."""
    assert torchless["imports"][module] == ["ok", module]


@pytest.mark.parametrize("module", [*TORCH_ROOMS, "posenc.rotary.apply", "posenc.cli.table"])
def test_torch_room_says_it_needs_torch(torchless: dict[str, Any], module: str) -> None:
    """Importing a room that needs torch is one line naming the room (its package for a
    module inside one: ``posenc.rotary`` for ``posenc.rotary.apply``)."""
    room = module if module.startswith("posenc.cli") else ".".join(module.split(".")[:2])
    assert torchless["imports"][module] == ["ModuleNotFoundError", NEEDS_TORCH.format(room)]


@pytest.mark.parametrize("name", TORCH_NAMES)
def test_torch_name_says_it_needs_torch(torchless: dict[str, Any], name: str) -> None:
    """``posenc.RotaryEmbedding`` (and every top-level name that needs torch) is one line."""
    assert torchless["names"][name] == ["ModuleNotFoundError", NEEDS_TORCH.format(f"posenc.{name}")]


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("PosEncError", ["ok", "PosEncError"]),
        ("reference", ["ok", "posenc.reference"]),
        ("ALiBi", ["AttributeError", "module 'posenc' has no attribute 'ALiBi'"]),
        ("no_such_name", ["AttributeError", "module 'posenc' has no attribute 'no_such_name'"]),
    ],
)
def test_torch_free_names(torchless: dict[str, Any], name: str, want: list[str]) -> None:
    """The error type and the reference are there; an unknown name (a deprecated class
    name too: its module needs torch) is an ``AttributeError``, as ``hasattr`` expects."""
    assert torchless["names"][name] == want


def _outcome(expr: str) -> list[str]:
    from posenc import _errors, _fields, _files, reference

    where = dict(np=np, _errors=_errors, _fields=_fields, _files=_files, reference=reference)
    try:
        value = eval(expr, where)
    except Exception as e:
        return [type(e).__name__, str(e)]
    return ["ok", repr(value)]


@pytest.mark.parametrize("label", sorted(CHECKS))
def test_checks_answer_as_with_torch(
    torchless: dict[str, Any], label: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each check of a plain or NumPy value gives the same value or the same one-line error
    without torch as with it."""
    monkeypatch.chdir(tmp_path)  # the child ran in a folder of its own too
    assert torchless["checks"][label] == _outcome(CHECKS[label])


@pytest.mark.parametrize("label", sorted(ARRAYS))
def test_reference_arrays_as_with_torch(torchless: dict[str, Any], label: str) -> None:
    """The float64 reference computes the same arrays without torch, bit for bit."""
    from posenc import reference

    want = eval(ARRAYS[label], {"np": np, "reference": reference})
    np.testing.assert_array_equal(torchless["arrays"][label], want, strict=True)


def test_help_lists_the_numpy_commands(torchless: dict[str, Any]) -> None:
    """``posenc --help`` works, lists ``vectors`` and ``conformance`` and names the
    commands that need torch."""
    code, out, err = torchless["cli"]["help"]
    assert (code, err) == (0, "")
    assert "vectors" in out and "conformance" in out
    named = ", ".join(TORCH_COMMANDS)
    assert f"{named} need torch: pip install torch" in " ".join(out.split())


@pytest.mark.parametrize("command", TORCH_COMMANDS)
def test_torch_command_is_one_line(torchless: dict[str, Any], command: str) -> None:
    """Every other subcommand (with ``--help`` or arguments) exits 2 with one line."""
    code, out, err = torchless["cli"][command]
    want = "posenc: error: " + NEEDS_TORCH.format(f"posenc {command}") + "\n"
    assert (code, out, err) == (2, "", want)


def test_no_torch_room_was_loaded(torchless: dict[str, Any]) -> None:
    """After every probe, the child had loaded torch-free modules of posenc only."""
    assert [m for m in torchless["modules"] if not _lazy.torch_free(m)] == []


# --- with torch ---------------------------------------------------------------------------


def _type_checking_imports() -> dict[str, str]:
    """name -> module of the imports under ``if TYPE_CHECKING:`` in posenc/__init__.py."""
    tree = ast.parse(INIT.read_text(encoding="utf-8"))
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    found = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom), ast.unparse(node)
        for alias in node.names:
            module = f"{node.module}.{alias.name}" if node.module == "posenc" else node.module
            found[alias.asname or alias.name] = str(module)
    return found


def test_type_checking_imports_are_the_table() -> None:
    """What type checkers and the API pages read is what ``__getattr__`` imports: the same
    module for every name, and every name of ``__all__``."""
    subpackages = {n: f"posenc.{n}" for n in ("models", "positions", "reference")}
    assert _type_checking_imports() == {**posenc._HOME, **subpackages}
    assert sorted(_type_checking_imports()) == sorted(posenc.__all__)


@pytest.mark.parametrize("name", sorted(posenc.__all__))
def test_top_level_name_is_its_modules(name: str) -> None:
    """Each name of ``__all__`` resolves to its module's own object (a subpackage to the
    module itself), and ``dir(posenc)`` lists it."""
    home = posenc._HOME.get(name)
    want = (
        importlib.import_module(f"posenc.{name}")
        if home is None
        else getattr(importlib.import_module(home), name)
    )
    assert getattr(posenc, name) is want
    assert name in dir(posenc)


@pytest.mark.parametrize("old", ["ALiBi", "FIRE", "Kerple", "ShawRelative"])
def test_deprecated_names_still_warn(old: str) -> None:
    """The old class names still resolve, with a warning pointing at the caller."""
    from posenc import bias

    with pytest.warns(DeprecationWarning, match=f"posenc.{old} is deprecated") as caught:
        cls = getattr(posenc, old)
    assert cls is bias._RENAMED[old]
    assert [w.filename for w in caught] == [__file__]


def test_unknown_name_is_attribute_error() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not hasattr(posenc, "no_such_name")
        assert not hasattr(posenc, "__no_such_dunder__")
        assert not hasattr(posenc, "_repr_mimebundle_")  # what IPython asks a module


def test_torch_commands_are_the_registered_ones() -> None:
    """``TORCH_COMMANDS`` (refused without torch) are the commands the torch modules
    register: all of them but the NumPy ones."""
    from posenc.cli._app import app
    from posenc.cli._main import register_commands

    register_commands()
    names = {c.name or c.callback.__name__ for c in app.registered_commands if c.callback}
    names |= {g.name for g in app.registered_groups if g.name}  # posenc plot ...
    assert names - {"vectors", "conformance"} == set(TORCH_COMMANDS)


FRESH = """
import sys
import posenc, posenc.reference
before = sorted(m for m in ("torch", "numpy") if m in sys.modules)
from posenc.rotary.module import RotaryEmbedding
from posenc.integrations import spelling
from posenc.rotary.scalings import foreign
rope = RotaryEmbedding(8, scaling={"rope_type": "linear", "factor": 2.0})
print(before, foreign._reader[0] is spelling.read_transformers, rope.scaling)
"""


def test_fresh_import_needs_no_torch_and_installs_the_reader() -> None:
    """A fresh ``import posenc`` (and its reference) imports no torch; reaching
    ``RotaryEmbedding`` through its own module still installs transformers' spelling reader
    (``import posenc`` did, when it imported everything)."""
    proc = subprocess.run(
        [sys.executable, "-c", FRESH], capture_output=True, text=True, timeout=300, check=True
    )
    assert proc.stdout.split("\n")[0] == ("['numpy'] True LinearScaling(factor=2.0, type='linear')")
