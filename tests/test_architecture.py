"""The map's rules (ARCHITECTURE.md) checked on the code, so CI fails when one breaks.

One test per rule, parametrized by the top-level piece of the package (``rotary``, ``cli``,
...) or by each file a scan flags: a failure names the rule broken, then each file and line.

The rules:

1. the rooms table is import-linter's contracts (``pyproject.toml``, ``[tool.importlinter]``;
   ``lint-imports`` runs them alone): arrows point down its floors, the rooms of a floor
   import each other not at all, every top-level module is on a floor (``floors``); nothing
   imports ``posenc/__init__.py`` (``above-all``); no import cycle between the pieces of any
   package (``acyclic``), nor through a package's own ``__init__``; ``reference/`` needs
   only numpy and the standard library. Imports inside functions and under ``if
   TYPE_CHECKING:`` count;
2. no file over 500 lines (``.py`` and ``.c``), no function over 80 code lines (a Triton
   kernel aside);
3. the causal mask rule is derived in one place;
4. the layout tuple (``"half"``, ``"interleaved"``) is written in one place;
5. one builder: only ``registry.py`` turns a name into an encoding.

An allowance below is a place a rule's scan flags on purpose, with the reason; an allowance
that no longer matches anything fails too, so the lists stay true.
"""

from __future__ import annotations

import ast
import functools
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests import _architecture as A

SOURCES = A.read_sources()
MODULES = A.load_modules(SOURCES)
NAMES = sorted(MODULES)
PATHS = sorted(m.path for m in MODULES.values())
BY_PATH = {m.path: m for m in MODULES.values()}
ARCHITECTURE = A.ROOT / "ARCHITECTURE.md"
ROOMS, ROOM_PROBLEMS = A.parse_rooms(ARCHITECTURE.read_text(encoding="utf-8"))
GRAPH = A.import_graph()


def _short(name: str) -> str:
    return name.removeprefix(A.TOP + ".") if name != A.TOP else A.TOP


def _unit(name: str) -> str:
    """The top-level piece of posenc a module is in (``rotary`` for posenc.rotary.apply,
    ``__init__`` for posenc itself): the tests below are parametrized by it."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


UNITS: dict[str, list[str]] = {}
for _name in NAMES:
    UNITS.setdefault(_unit(_name), []).append(_name)
MAPPED_UNITS = sorted(u for u, names in UNITS.items() if set(names) - set(A.ABOVE_ALL))


# --- 1. the rooms table, as import-linter's contracts ---------------------------------------

CONTRACTS = {c.get("id", c["name"]): c for c in A.read_contracts()}
FLOORS = CONTRACTS.get("floors", {})


@functools.cache
def _lint() -> tuple[int, str]:
    return A.lint_result(_lint_run())


@functools.cache
def _lint_run() -> subprocess.Popen[str]:
    return A.start_lint_imports()


@pytest.fixture(autouse=True, scope="module")
def _lint_in_background(request: pytest.FixtureRequest) -> None:
    """``lint-imports`` runs beside the other tests of this file, started before the first
    and read by :func:`test_import_contracts_hold`, the last."""
    if any(item.name == "test_import_contracts_hold" for item in request.session.items):
        _lint_run()


def test_rooms_table_reads() -> None:
    """ARCHITECTURE.md's rooms table is in the form the other tests read: ``| floor | room
    | owns |``, floors integers from 0 (bottom), room cells backticked top-level modules or
    packages of ``posenc`` (``_errors``, ``rotary`` for the whole package: import-linter's
    layers are the children of ``posenc``), each on one row only and existing, and
    ``owns`` one short line."""
    problems = list(ROOM_PROBLEMS)
    if not ROOMS and not problems:
        problems.append(f"no rows under {A.ROOMS_HEADING!r}")
    seen: dict[str, int] = {}
    for room in ROOMS:
        for path in room.paths:
            if path in seen:
                problems.append(
                    f"line {room.line}: `{_short(path)}` is already on line {seen[path]}"
                )
            seen[path] = room.line
            if path not in MODULES:
                problems.append(f"line {room.line}: `{_short(path)}` is no module of src/posenc")
            elif path.count(".") != 1:
                problems.append(
                    f"line {room.line}: `{_short(path)}` is not a top-level module of posenc"
                )
        if len(room.owns) > 120:
            problems.append(
                f"line {room.line}: the owns cell has {len(room.owns)} characters (at most "
                "120: one line; the details go to the room's docstrings)"
            )
    assert not problems, "ARCHITECTURE.md's rooms table:\n" + "\n".join(problems)


def _placed(layers: list[str]) -> dict[str, tuple[int, str]]:
    """Each path of ``layers`` -> (its layer's place from the top, the layer as written)."""
    return {p: (i, layer) for i, layer in enumerate(layers) for p in A.parse_layer(layer)[1]}


def test_contracts_are_the_rooms_table() -> None:
    """The contract ``floors`` is ARCHITECTURE.md's rooms table, floor by floor (as
    :func:`_architecture.floor_layers` writes it: top first, ``__main__`` above all, the
    rooms of a floor ``|``), and its ``ignore_imports`` only let the paths of one room
    import each other. A room added, moved or renamed in the table is changed in
    ``pyproject.toml`` in the same commit; the message gives the lines to write."""
    want = A.floor_layers(ROOMS)
    have = [str(layer) for layer in FLOORS.get("layers", [])]
    problems = []
    if FLOORS.get("type") != "layers" or FLOORS.get("containers") != [A.TOP]:
        problems.append(f"no contract id = 'floors', type 'layers', containers ['{A.TOP}']")
    if [A.parse_layer(x) for x in have] != [A.parse_layer(x) for x in want]:
        wanted, had = _placed(want), _placed(have)
        for path in sorted(set(wanted) | set(had)):
            if path not in had:
                problems.append(f"`{path}` is in the table, on no layer of the contract")
            elif path not in wanted:
                problems.append(f"`{path}` is on layer {had[path][1]!r}, in no row of the table")
            elif wanted[path] != had[path]:
                problems.append(
                    f"`{path}`: layer {wanted[path][0] + 1} from the top, {wanted[path][1]!r}, "
                    f"in the table; layer {had[path][0] + 1}, {had[path][1]!r}, in the contract"
                )
        problems.append(
            "the table's layers, to paste:\nlayers = [\n"
            + "".join(f'    "{layer}",\n' for layer in want)
            + "]"
        )
    rooms = {p.removeprefix(A.TOP + "."): r for r in ROOMS for p in r.paths}
    for rule in FLOORS.get("ignore_imports", []):
        ends = [x.strip().removeprefix(A.TOP + ".").split(".")[0] for x in rule.split("->")]
        if len(ends) != 2 or ends[0] not in rooms or rooms[ends[0]] is not rooms.get(ends[1]):
            problems.append(
                f"ignore_imports {rule!r} is not between two paths of one room of the table"
            )
    assert not problems, (
        "pyproject.toml's [tool.importlinter] contract 'floors' is not ARCHITECTURE.md's rooms "
        "table:\n  " + "\n  ".join(problems)
    )


@pytest.mark.parametrize("unit", MAPPED_UNITS)
def test_every_module_is_on_the_map(unit: str) -> None:
    """Every module belongs to a room of the table: a new top-level module or package must
    be put on the map (a row, or a path added to a room's cell)."""
    missing = [
        f"  {MODULES[n].path}"
        for n in UNITS[unit]
        if n not in A.ABOVE_ALL and A.room_of(n, ROOMS) is None
    ]
    assert not missing, (
        f"rule 'every module is on the map' broken: in no room of ARCHITECTURE.md's table "
        f"({A.ROOMS_HEADING!r}); add `{unit}` to the room it belongs to, or a row of its "
        "own on the floor its imports allow (and to the contract 'floors' of "
        "pyproject.toml):\n" + "\n".join(missing)
    )


def test_no_cycle_through_own_package() -> None:
    """No module imports a package it is in (``from posenc.rotary import x`` inside
    ``rotary/``) whose ``__init__`` imports it back, however indirectly: the cycle that
    the ``acyclic`` contract cannot see, since it compares a package's children only."""
    found = [
        f"  {MODULES[importer].path}:{line}: imports {chain[0]}, whose __init__ imports it "
        f"back: {' -> '.join(chain)}"
        for importer, chain in A.cycles_through_own_package(GRAPH)
        for line in A.import_lines(GRAPH, importer, chain[0])
    ]
    assert not found, (
        "rule 'no import cycle' broken (import the module that defines the name, not the "
        "package that re-exports it):\n" + "\n".join(found)
    )


REFERENCE = f"{A.TOP}.reference"


def test_reference_needs_only_numpy() -> None:
    """``reference/`` is the oracle: numpy and the standard library only (never torch, never
    another posenc room), so it cannot share a mistake with the code it checks."""
    modules = sorted(m for m in GRAPH.modules if A.inside(m, REFERENCE))
    wrong = [
        f"  {MODULES[m].path}:{line}: imports {target}"
        for m in modules
        for target in sorted(GRAPH.find_modules_directly_imported_by(m))
        if not A.inside(target, REFERENCE) and target.split(".")[0] not in ("numpy", *A.STDLIB)
        for line in A.import_lines(GRAPH, m, target)
    ]
    assert modules, "src/posenc/reference is missing"
    assert not wrong, "rule 'reference is numpy only' broken:\n" + "\n".join(wrong)


# --- 2. sizes -----------------------------------------------------------------------------

MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80


#: Every file the size rule reads: the Python modules and the C kernels (``.c``, ``.h``).
SIZED = {
    f"src/{rel}": text
    for suffix in (".py", ".c", ".h")
    for rel, text in A.read_sources(suffix=suffix).items()
}

#: File name -> why that file may pass :data:`MAX_FILE_LINES` for now: only RoPE's C kernel,
#: to be split by idea where the C toolchain room takes it (issue 39). Delete the entry when
#: it is split, and add none.
OVER_500_LINES_FOR_NOW: dict[str, str] = {}  # file name -> why it is over, until it is split


def _lines(text: str) -> int:
    return len(text.splitlines())


def _file_unit(path: str) -> str:
    """The top-level piece of posenc a file is in: ``rotary`` for
    src/posenc/rotary/kernels/rope_cpu.c, ``_errors`` for src/posenc/_errors.py."""
    return path.split("/")[2].split(".")[0]


@pytest.mark.parametrize("unit", sorted({_file_unit(p) for p in SIZED}))
def test_file_at_most_500_lines(unit: str) -> None:
    """No source file over 500 lines, Python or C: a file that long is two ideas (split it
    by idea). The C kernels waiting to be split: :data:`OVER_500_LINES_FOR_NOW`."""
    long = [
        f"  {path}: {n} lines"
        for path, text in SIZED.items()
        if _file_unit(path) == unit
        and (n := _lines(text)) > MAX_FILE_LINES
        and path.rpartition("/")[2] not in OVER_500_LINES_FOR_NOW
    ]
    assert not long, (
        f"rule 'no file over {MAX_FILE_LINES} lines' broken (split each by idea, not by "
        "pushing lines into a neighbour):\n" + "\n".join(long)
    )


def test_size_allowances_are_used() -> None:
    """Every :data:`OVER_500_LINES_FOR_NOW` entry still names a file over the limit."""
    over = {p.rpartition("/")[2] for p, text in SIZED.items() if _lines(text) > MAX_FILE_LINES}
    stale = sorted(set(OVER_500_LINES_FOR_NOW) - over)
    assert not stale, f"OVER_500_LINES_FOR_NOW entries split or gone (delete them): {stale}"


@pytest.mark.parametrize("unit", sorted(UNITS))
def test_functions_at_most_80_code_lines(unit: str) -> None:
    """No function over 80 code lines (its docstring, blank and comment-only lines not
    counted; a ``@triton.jit`` kernel's body is exempt): give its steps names."""
    long = []
    for m in (MODULES[name] for name in UNITS[unit]):
        lines = m.source.splitlines()
        long += [
            f"  {m.path}:{f.lineno}: {f.name}: {n} code lines"
            for f in A.index(m.tree).nodes
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            and not A.triton_kernel(f)
            and (n := A.code_lines(f, lines)) > MAX_FUNCTION_LINES
        ]
    assert not long, (
        f"rule 'no function over {MAX_FUNCTION_LINES} code lines' broken (split each into "
        "named steps):\n" + "\n".join(long)
    )


# --- 3. the one mask rule -----------------------------------------------------------------

#: The causal rule (query ``i`` sees key ``j`` iff ``j <= i + (k - q)``) lives in exactly one
#: function of one of these names, wherever it is defined; attention's ``allowed_pairs``
#: and the families call it.
MASK_HOMES = ("causal_pairs", "allowed_pairs")

#: (file, function) -> why a rule over index pairs written there is not a second causal rule.
MASK_ALLOWED = {
    ("src/posenc/models/layers.py", "window_keep"): (
        "a layer's sliding window (keys fewer than `window` tokens away) is a rule of its "
        "own, a layer setting ANDed with the causal mask, not the causal rule"
    ),
    ("src/posenc/analysis/properties.py", "uniqueness"): (
        "triu(1) of an all-True [n, n] matrix picks each pair of distinct positions once "
        "(the table's rows compared); no attention mask"
    ),
    ("src/posenc/experiments/tasks/counting.py", "_values"): (
        "the counting task's interpreter: the increments after a variable's last set, "
        "over program steps (data generation, no attention)"
    ),
}


def _mask_findings() -> list[A.Finding]:
    return [f for m in MODULES.values() for f in A.pairwise_index_rules(m)]


MASK_FINDINGS = _mask_findings()


@pytest.mark.parametrize("path", sorted({f.path for f in MASK_FINDINGS}))
def test_one_mask_rule(path: str) -> None:
    """No second derivation of the causal rule: an order comparison between two index grids
    (``arange`` results, or ``x[:, None]`` against ``y[None, :]``), or a ``tril`` /
    ``triu``, is allowed only in the rule's home (:data:`MASK_HOMES`) or with a reason in
    :data:`MASK_ALLOWED`. Anything else computes which keys a query sees again: call
    ``posenc.positions.causal_pairs`` (or ``posenc.attend.paths.allowed_pairs``) instead.
    (Only the files where the scan flags something are listed here.)"""
    wrong = [
        f"  {f.where()}"
        for f in MASK_FINDINGS
        if f.path == path
        and f.function.rpartition(".")[2] not in MASK_HOMES
        and (f.path, f.function) not in MASK_ALLOWED
    ]
    assert not wrong, (
        "rule 'one mask rule' broken: a rule over (query, key) index pairs is derived here "
        "again; call the one causal rule (posenc.positions.causal_pairs, through "
        "posenc.attend.paths.allowed_pairs for masks) or, if this is another rule, add it to "
        "MASK_ALLOWED in tests/test_architecture.py with the reason:\n" + "\n".join(wrong)
    )


def test_mask_rule_has_one_home() -> None:
    """The causal rule is derived in exactly one function of :data:`MASK_HOMES`."""
    homes = sorted(
        {(f.path, f.function) for f in MASK_FINDINGS if f.function.rpartition(".")[2] in MASK_HOMES}
    )
    assert len(homes) == 1, (
        "rule 'one mask rule': the causal rule must be derived in exactly one of "
        f"{MASK_HOMES}, found {len(homes)}: {homes} (one should call the other)"
    )


def test_mask_allowances_are_used() -> None:
    """Every :data:`MASK_ALLOWED` entry still matches a flagged place (else delete it)."""
    used = {(f.path, f.function) for f in MASK_FINDINGS}
    stale = sorted(set(MASK_ALLOWED) - used)
    assert not stale, f"MASK_ALLOWED entries that match nothing any more: {stale}"


# --- 4. the one layout tuple --------------------------------------------------------------

#: The name of the one layout tuple (``("half", "interleaved")``); found wherever it is.
LAYOUT_NAME = "LAYOUTS"
LAYOUT_FINDINGS = {path: found for path in PATHS if (found := A.layout_literals(BY_PATH[path]))}
LAYOUT_HOMES = sorted(
    path for path, found in LAYOUT_FINDINGS.items() if any(n == LAYOUT_NAME for _, n in found)
)


def test_layout_tuple_defined_once() -> None:
    """Exactly one module-level ``LAYOUTS = ("half", "interleaved")`` literal in src (a
    re-export such as ``from ... import LAYOUTS`` is not a literal, and is fine)."""
    sites = [
        f.where() for found in LAYOUT_FINDINGS.values() for f, name in found if name == LAYOUT_NAME
    ]
    assert len(sites) == 1, (
        f"rule 'one layout tuple' broken: {len(sites)} definitions of {LAYOUT_NAME} (keep "
        "one, in the lowest module that needs it, and import it everywhere else):\n  "
        + "\n  ".join(sites)
    )


@pytest.mark.parametrize("path", sorted(LAYOUT_FINDINGS))
def test_layout_tuple_not_repeated(path: str) -> None:
    """A tuple, list or set literal holding both ``"half"`` and ``"interleaved"`` is only
    the one definition, a module-level ``LAYOUTS = (...)``, and beside it (same module) a
    ``Layout = Literal[...]`` type alias, the same tuple as a type: every other check of a
    layout uses the tuple (``layout in LAYOUTS``, ``check_choice(..., LAYOUTS)``) or the
    type. (Only files holding such a literal are listed here.)"""

    def allowed(name: str | None) -> bool:
        if name == LAYOUT_NAME:
            return True
        return name is not None and name.startswith("Literal:") and path in LAYOUT_HOMES

    wrong = [f"  {f.where()}" for f, name in LAYOUT_FINDINGS[path] if not allowed(name)]
    assert not wrong, (
        "rule 'one layout tuple' broken: the layouts are written out again; import the one "
        f"`{LAYOUT_NAME}` (or its `Layout` type) instead:\n" + "\n".join(wrong)
    )


# --- 5. the one builder -------------------------------------------------------------------

BUILDER = "src/posenc/registry.py"

#: (file, function) -> why a dynamic import there is not a second builder.
DYNAMIC_IMPORTS_ALLOWED = {
    ("src/posenc/__init__.py", "__getattr__"): (
        "a top-level name's own module imported on its first use (PEP 562), so that `import "
        "posenc` needs no torch; the table of names is fixed, and it builds nothing"
    ),
    ("src/posenc/_deprecated.py", "moved"): (
        "a moved name looked up in its new module for the deprecation warning; builds nothing"
    ),
    ("src/posenc/cli/conformance.py", "_module"): (
        "the module of an adapter the user names (`posenc conformance module:attr`), the "
        "implementation under test; builds no posenc encoding"
    ),
    ("src/posenc/conformance/adapters/_common.py", "torch_library"): (
        "the third-party library an adapter runs (rotary_embedding_torch, x_transformers), "
        "imported when its factory is called; never a posenc module"
    ),
    ("src/posenc/cli/_hf_inspect.py", "_family_rotary"): (
        "the transformers modeling module of a config's class (never a posenc module), to "
        "compare with the family's own rotary"
    ),
}


def _dynamic(path: str) -> list[A.Finding]:
    """Dynamic imports of ``path``, but those of a constant module outside posenc."""
    out = []
    for f in A.dynamic_imports(BY_PATH[path]):
        call = ast.parse(f.code, mode="eval").body
        first = call.args[0] if isinstance(call, ast.Call) and call.args else None
        if isinstance(first, ast.Constant) and str(first.value).split(".")[0] != A.TOP:
            continue  # importlib.import_module("click.exceptions")
        out.append(f)
    return out


DYNAMIC = {path: calls for path in PATHS if (calls := _dynamic(path))}


@pytest.mark.parametrize("path", sorted(DYNAMIC))
def test_one_builder_no_dynamic_import(path: str) -> None:
    """Only ``registry.py`` imports modules by a name computed at run time
    (``importlib.import_module``, ``__import__``): that is how it builds an encoding from a
    name, and a second such place would be a second builder. Reasoned exceptions:
    :data:`DYNAMIC_IMPORTS_ALLOWED`. (Only files with a dynamic import are listed here.)"""
    if path == BUILDER:
        return
    wrong = [
        f"  {f.where()}"
        for f in DYNAMIC[path]
        if (f.path, f.function) not in DYNAMIC_IMPORTS_ALLOWED
    ]
    assert not wrong, (
        "rule 'one builder' broken: a module imported by a run-time name outside "
        "registry.py; build encodings with posenc.registry.build (or add the place to "
        "DYNAMIC_IMPORTS_ALLOWED with the reason):\n" + "\n".join(wrong)
    )


def test_one_builder_registry_table_private() -> None:
    """Only ``registry.py`` reads its table ``_ENTRIES``; others use ``registry.get``,
    ``registry.names`` or ``registry.build``."""
    wrong = [
        f"  {f.where()}"
        for path in PATHS
        if path != BUILDER
        for f in A.registry_entry_reads(BY_PATH[path])
    ]
    assert not wrong, (
        "rule 'one builder' broken: the registry's private table read outside "
        "registry.py:\n" + "\n".join(wrong)
    )


def test_one_builder_no_class_called_by_name() -> None:
    """Outside ``registry.py`` a class looked up by name (``registry.get``,
    ``registry.class_of``) is read (its ``name``, ``kind``, parameters), never called:
    ``registry.build`` is the one place a name becomes a module."""
    wrong = [
        f"  {f.where()}"
        for path in PATHS
        if path != BUILDER
        for f in A.registry_class_calls(BY_PATH[path])
    ]
    assert not wrong, (
        "rule 'one builder' broken: an encoding class looked up by name is constructed "
        "outside registry.py; call posenc.registry.build instead:\n" + "\n".join(wrong)
    )


def _floor_of(room_path: str) -> int:
    room = A.room_of(f"{A.TOP}.{room_path}", ROOMS)
    return -1 if room is None else room.floor


#: The families: the rooms on the floor of ``rotary`` (sinusoidal and the other additive
#: ones, rotary, bias, contextual, gated); above the builder: the rooms over ``registry``.
FAMILY_FLOOR = _floor_of("rotary")
BUILDER_FLOOR = _floor_of("registry")

#: (importing file or package prefix, family module prefix) -> (names, or None for any;
#: why a room above the builder may import that family directly).
FAMILY_IMPORTS_ALLOWED: dict[tuple[str, str], tuple[frozenset[str] | None, str]] = {
    ("src/posenc/integrations/", f"{A.TOP}.rotary"): (
        None,
        "integrations turns transformers' rotary configs into RotaryEmbedding (scalings, "
        "layouts, partial rotary, M-RoPE): a translation the registry's names cannot express; "
        "it builds no encoding from a posenc name",
    ),
    ("src/posenc/extend/settings.py", f"{A.TOP}.rotary"): (
        frozenset({"SCALINGS"}),
        "`posenc extend` takes the names of the scalings it measures (and the fields that take "
        "the trained context) from the rotary scaling registry; it builds no encoding",
    ),
    ("src/posenc/cli/table.py", f"{A.TOP}.sinusoidal"): (
        frozenset({"sinusoidal_table", "LAYOUTS", "ORDERS"}),
        "`posenc table sinusoidal` prints the family's pure table function (and offers its "
        "layouts and orders as choices); no encoding module is built",
    ),
    ("src/posenc/cli/table.py", f"{A.TOP}.index"): (
        frozenset({"index_table"}),
        "`posenc table index` prints the family's pure table function; no module is built",
    ),
    ("src/posenc/cli/conformance.py", f"{A.TOP}.conformance"): (
        None,
        "conformance (floor 3) holds no encoding: golden vectors from the float64 reference "
        "and the check of another framework's implementation against them (NumPy only); "
        "`posenc vectors` and `posenc conformance` call it as functions",
    ),
    ("src/posenc/", f"{A.TOP}.remap"): (
        None,
        "remap (floor 3) holds no encoding: position maps (Self-Extend, STRING) built by their "
        "one builder, remap.position_map, and the attention that rotates each pair through the "
        "caller's rotary encoding; attention, patch and extend call it as a function",
    ),
}


@dataclass(frozen=True)
class _FamilyImport:
    """One import statement of a family module (grimp's edge, read back in the source)."""

    path: str  # the importer's file
    line: int
    target: str  # the family module it reaches
    names: frozenset[str]  # the names imported (the module itself for ``import x``)
    statement: str

    def where(self) -> str:
        return f"{self.path}:{self.line}: `{self.statement}`"


def _family_imports(module: str) -> list[_FamilyImport]:
    """The imports of ``module`` that reach a family module, with the names imported."""
    out = []
    for target in sorted(GRAPH.find_modules_directly_imported_by(module)):
        room = A.room_of(target, ROOMS)
        if room is None or room.floor != FAMILY_FLOOR:
            continue
        for line in A.import_lines(GRAPH, module, target):
            node = A.import_statement(MODULES[module], line)
            names = {a.name for a in node.names} if isinstance(node, ast.ImportFrom) else {target}
            path = MODULES[module].path
            out.append(_FamilyImport(path, line, target, frozenset(names), ast.unparse(node)))
    return out


ABOVE_BUILDER = sorted(
    m.name
    for m in MODULES.values()
    if m.name not in A.ABOVE_ALL
    and (room := A.room_of(m.name, ROOMS)) is not None
    and room.floor > BUILDER_FLOOR
)


def _matches(path: str, where: str) -> bool:
    return path == where or (where.endswith("/") and path.startswith(where))


def _family_allowance(e: _FamilyImport) -> bool:
    for (where, family), (allowed, _why) in FAMILY_IMPORTS_ALLOWED.items():
        if _matches(e.path, where) and A.inside(e.target, family):
            return allowed is None or e.names <= allowed
    return False


@pytest.mark.parametrize("unit", sorted({_unit(n) for n in ABOVE_BUILDER}))
def test_one_builder_no_family_import_above(unit: str) -> None:
    """The rooms above ``registry`` (attend, models, analysis, plot, integrations,
    experiments, report, cli) import no family module or concrete encoding class: they get
    an encoding from ``registry.build`` and use it through the kinds of ``_base``. Reasoned
    exceptions (a family's pure function used as such): :data:`FAMILY_IMPORTS_ALLOWED`."""
    wrong = [
        f"  {e.where()}: {', '.join(sorted(e.names))} from {e.target}"
        for module in ABOVE_BUILDER
        if _unit(module) == unit
        for e in _family_imports(module)
        if not _family_allowance(e)
    ]
    assert not wrong, (
        "rule 'one builder' broken: a room above the registry imports a family directly; "
        "build the encoding with posenc.registry.build and use it through its kind (or add "
        "the import to FAMILY_IMPORTS_ALLOWED with the reason):\n" + "\n".join(wrong)
    )


def test_builder_allowances_are_used() -> None:
    """Every allowance of rule 5 still matches something (else delete it)."""
    dynamic = {(f.path, f.function) for calls in DYNAMIC.values() for f in calls}
    stale: list[object] = [k for k in DYNAMIC_IMPORTS_ALLOWED if k not in dynamic]
    used = [e for module in ABOVE_BUILDER for e in _family_imports(module)]
    for key in FAMILY_IMPORTS_ALLOWED:
        where, family = key
        if not any(_matches(e.path, where) and A.inside(e.target, family) for e in used):
            stale.append(key)
    assert not stale, f"allowances that match nothing any more (delete them): {stale}"


# --- the checks themselves, on small made-up packages ---------------------------------------

_TABLE = """## The rooms, bottom to top

| floor | room | owns |
| --- | --- | --- |
| 0 | `_errors`, `_angles` | errors |
| 0 | `_layouts` | layouts |
| 1 | `models` | the model |
| 2 | `analysis`, `plot` | measures and pictures |
"""


def test_floor_layers_itself() -> None:
    """The table becomes the contract's layers, top first: rooms sharing a floor are
    independent (``|``, a room of two paths among them too), a floor of one room of
    several paths is ``:``; the order of paths within a layer does not matter."""
    rooms, problems = A.parse_rooms(_TABLE)
    layers = A.floor_layers(rooms)
    assert (problems, layers) == (
        [],
        ["__main__", "analysis : plot", "models", "_errors | _angles | _layouts"],
    )
    assert A.parse_layer("b | a") == A.parse_layer("a|b") == ("|", frozenset({"a", "b"}))
    assert A.parse_layer("a : b") != A.parse_layer("a | b")
    assert A.parse_layer(" models ") == ("", frozenset({"models"}))


def _write_package(root: Path, name: str, files: dict[str, str]) -> None:
    for rel, text in {"__init__.py": "", **files}.items():
        path = root / name / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.replace("{pkg}", name), encoding="utf-8")


_CYCLE_CASES = {
    "a child reads a name from its package, whose __init__ imports the child": (
        {"p/__init__.py": "from {pkg}.p.c import g\nX = 1\n", "p/c.py": "from {pkg}.p import X\n"},
        True,
    ),
    "the same, written with relative imports": (
        {"p/__init__.py": "from .c import g\nX = 1\n", "p/c.py": "from . import X\n"},
        True,
    ),
    "an import inside a function closes the cycle": (
        {
            "p/__init__.py": "def f():\n    from {pkg}.p.c import g\n",
            "p/c.py": "from {pkg}.p import f\n",
        },
        True,
    ),
    "an import under TYPE_CHECKING closes it too": (
        {
            "p/__init__.py": "from {pkg}.p.c import g\n",
            "p/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from {pkg}.p import X\n",
        },
        True,
    ),
    "a child importing its sibling, not the package": (
        {
            "p/__init__.py": "from {pkg}.p.c import g\n",
            "p/c.py": "from {pkg}.p.d import h\n",
            "p/d.py": "def h():\n    pass\n",
        },
        False,
    ),
    "a child reading its package, whose __init__ never imports it": (
        {"p/__init__.py": "X = 1\n", "p/c.py": "from {pkg}.p import X\n"},
        False,
    ),
}


@pytest.mark.parametrize("case", sorted(_CYCLE_CASES))
def test_cycle_check_itself(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """:func:`_architecture.cycles_through_own_package` sees the cycles through a package's
    own ``__init__`` it is meant to (grimp's graph holds imports inside functions and under
    ``TYPE_CHECKING``), and only those."""
    files, cyclic = _CYCLE_CASES[case]
    name = f"posenc_arch_case_{sorted(_CYCLE_CASES).index(case)}"
    _write_package(tmp_path, name, files)
    monkeypatch.syspath_prepend(str(tmp_path))
    found = A.cycles_through_own_package(A.import_graph(name), root=name)
    assert [importer for importer, _ in found] == ([f"{name}.p.c"] if cyclic else [])


def _module(source: str) -> A.Module:
    return A.load_modules({"posenc/m.py": source})["posenc.m"]


def test_mask_scan_itself() -> None:
    """Rule 3's scan flags a causal rule written again (as ``allowed_counts`` did at
    171c321) and a ``tril``, and passes a single grid compared with a bound."""
    causal = (
        "def f(q_len, k_len):\n"
        "    i = torch.arange(q_len)[:, None] + (k_len - q_len)\n"
        "    ok = torch.arange(k_len)[None, :] <= i\n"
        "    tri = torch.ones(3, 3).tril()\n"
        "    first = torch.arange(4) < width[..., None]\n"
        "    n = torch.arange(4).max()\n"
        "    return n <= k_len\n"
    )
    found = A.pairwise_index_rules(_module(causal))
    assert [(f.line, f.function) for f in found] == [(3, "f"), (4, "f")]


def test_builder_scan_itself() -> None:
    """Rule 5's scans see a registry class called and the private table read."""
    source = (
        "def f(name):\n"
        "    cls = registry.class_of(name)\n"
        "    kind = cls.kind\n"
        "    a = cls(dim=4)\n"
        "    b = registry.get(name)(dim=4)\n"
        "    return getattr(registry, '_ENTRIES'), registry._ENTRIES\n"
    )
    module = _module(source)
    assert [f.line for f in A.registry_class_calls(module)] == [4, 5]
    assert [f.line for f in A.registry_entry_reads(module)] == [6, 6]


def test_layout_scan_itself() -> None:
    """Rule 4's scan finds the layouts in any literal, and tells the definition (and its
    ``Literal`` type beside it) from a repeat."""
    source = (
        'Layout = Literal["half", "interleaved"]\n'
        'LAYOUTS = ("half", "interleaved")\n'
        'MODES = ("half", "interleaved", "other")\n'
        'def f(x):\n    return x in ["interleaved", "half"]\n'
    )
    found = [(f.line, name) for f, name in A.layout_literals(_module(source))]
    assert sorted(found) == [(1, "Literal:Layout"), (2, "LAYOUTS"), (3, "MODES"), (5, None)]


# --- last: the import contracts, whose run went on beside the tests above ------------------


def test_import_contracts_hold() -> None:
    """``lint-imports`` keeps every contract of ``[tool.importlinter]``: the floors of the
    rooms table (``floors``), nothing importing ``posenc/__init__.py`` (``above-all``), no
    cycle between the children of any package (``acyclic``). A module may import its own
    room and the floors below; to import a room beside or above it, move what it needs
    down (or the module up) and say so in ARCHITECTURE.md's table."""
    status, report = _lint()
    report = report[max(report.find("Contracts\n"), 0) :]  # from its summary, past the logo
    broken = [c["name"] for c in CONTRACTS.values() if A.broken(report, c["name"])]
    assert status == 0, f"import-linter: contracts broken: {broken or '(see its report)'}\n{report}"
