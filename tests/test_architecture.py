"""The map's rules (ARCHITECTURE.md) checked on the code, so CI fails when one breaks.

One test per rule, parametrized by the top-level piece of the package (``rotary``, ``cli``,
...) or by each file a scan flags: a failure names the rule broken, then each file and line. Everything reads the sources with ``ast`` (``tests/_architecture.py``);
nothing here imports posenc, so a cycle is reported rather than crashed on.

The rules:

1. no import cycle (:func:`test_no_import_cycle`);
2. arrows point down the rooms table of ARCHITECTURE.md, every module is on it, and
   ``reference/`` needs only numpy and the standard library;
3. no file over 500 lines, no function over 80 code lines (a Triton kernel aside);
4. the causal mask rule is derived in one place;
5. the layout tuple (``"half"``, ``"interleaved"``) is written in one place;
6. one builder: only ``registry.py`` turns a name into an encoding.

An allowance below is a place a rule's scan flags on purpose, with the reason; an allowance
that no longer matches anything fails too, so the lists stay true.
"""

from __future__ import annotations

import ast

import pytest
from tests import _architecture as A

SOURCES = A.read_sources()
MODULES = A.load_modules(SOURCES)
NAMES = sorted(MODULES)
PATHS = sorted(m.path for m in MODULES.values())
BY_PATH = {m.path: m for m in MODULES.values()}
EDGES = A.module_edges(MODULES)
ARCHITECTURE = A.ROOT / "ARCHITECTURE.md"
ROOMS, ROOM_PROBLEMS = A.parse_rooms(ARCHITECTURE.read_text(encoding="utf-8"))


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


# --- 1. no import cycle -------------------------------------------------------------------

# Imports under ``if TYPE_CHECKING:`` are left out: they never run, so they cannot make an
# import cycle (that is what they are for). They do count for the arrows of rule 2.
RUNTIME_EDGES = [e for e in EDGES if not e.type_checking]
CYCLES = {
    name: component
    for component in A.strongly_connected(NAMES, RUNTIME_EDGES)
    if len(component) > 1
    for name in component
}


@pytest.mark.parametrize("unit", sorted(UNITS))
def test_no_import_cycle(unit: str) -> None:
    """No module needs itself to be imported, however indirectly.

    The graph has an arrow for every import of a posenc module, wherever it is written
    (module level or inside a function), relative imports resolved and ``from pkg import
    name`` read as the submodule ``pkg.name`` when there is one. Importing ``a.b.c`` from
    outside ``a.b`` also runs ``a/b/__init__.py`` first: an arrow to ``a.b``. A child
    importing from its own package (``from posenc.pkg import x``, ``from . import x``) is
    an arrow to the package's ``__init__`` (it has to have run), unless that ``__init__``
    only hands names on (imports, ``__all__``, literal constants, a PEP 562 ``__getattr__``;
    see ``_architecture.hands_names_on``): then the arrow goes to the module defining the
    name. Tarjan's strongly connected components of that graph must all be single modules.
    """
    found = []
    for component in {tuple(CYCLES[n]) for n in UNITS[unit] if n in CYCLES}:
        start = next(n for n in component if _unit(n) == unit)
        chain = A.shortest_cycle(start, set(component), RUNTIME_EDGES)
        steps = "\n".join(f"    {e.importer} -> {e.target}: {e.where()}" for e in chain)
        found.append(
            f"  {len(component)} modules import each other ({', '.join(component)}); "
            f"one cycle:\n{steps}"
        )
    assert not found, (
        "rule 'no import cycle' broken:\n" + "\n".join(found) + "\nBreak it by moving what "
        "both sides need into a lower module, or by importing the defining module instead "
        "of the package that re-exports it."
    )


# --- 2. arrows point down the rooms table -------------------------------------------------


def test_rooms_table_reads() -> None:
    """ARCHITECTURE.md's rooms table is in the form the other tests read: ``| floor | room
    | owns |``, floors integers from 0 (bottom), room cells backticked module paths relative
    to ``posenc`` (``_errors``, ``rotary`` for the whole package), each path on one row
    only and naming a module that exists, and ``owns`` one short line."""
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
        if len(room.owns) > 120:
            problems.append(
                f"line {room.line}: the owns cell has {len(room.owns)} characters (at most "
                "120: one line; the details go to the room's docstrings)"
            )
    assert not problems, "ARCHITECTURE.md's rooms table:\n" + "\n".join(problems)


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
        "own on the floor its imports allow:\n" + "\n".join(missing)
    )


@pytest.mark.parametrize("unit", MAPPED_UNITS)
def test_arrows_point_down(unit: str) -> None:
    """A module imports only modules of its own room or of a lower floor: never another
    room of its floor, never a higher floor, never ``posenc`` itself. Imports inside
    functions and under ``if TYPE_CHECKING:`` count (a type named is still a dependency)."""
    wrong = []
    for module in UNITS[unit]:
        room = A.room_of(module, ROOMS)
        if room is None:
            continue  # test_every_module_is_on_the_map fails
        for e in EDGES:
            if e.importer != module:
                continue
            target = A.room_of(e.target, ROOMS)
            if target is room or (target is not None and target.floor < room.floor):
                continue
            if e.target in A.ABOVE_ALL:
                how = f"{e.target} is above every room"
            elif target is None:
                how = f"{e.target} is on no floor of the map"
            else:
                level = "its own floor" if target.floor == room.floor else "a higher floor"
                how = f"{e.target} is in room `{target.label}`, floor {target.floor}: {level}"
            wrong.append(
                f"  {e.where()}: {module} is in room `{room.label}`, floor {room.floor}; {how}"
            )
    assert not wrong, (
        "rule 'arrows point down' broken: a module may import its own room and lower floors "
        "of ARCHITECTURE.md's table only:\n" + "\n".join(wrong)
    )


REFERENCE = [n for n in NAMES if n == f"{A.TOP}.reference" or n.startswith(f"{A.TOP}.reference.")]


def test_reference_needs_only_numpy() -> None:
    """``reference/`` is the oracle: numpy and the standard library only (never torch, never
    another posenc room), so it cannot share a mistake with the code it checks."""
    wrong = []
    for module in REFERENCE:
        m = MODULES[module]
        wrong += [
            f"  {m.path}:{line}: `{statement}`"
            for line, package, statement in A.external_imports(m)
            if package != "numpy" and package not in A.STDLIB
        ]
        wrong += [
            f"  {e.where()}" for e in EDGES if e.importer == module and e.target not in REFERENCE
        ]
    assert REFERENCE, "src/posenc/reference is missing"
    assert not wrong, "rule 'reference is numpy only' broken:\n" + "\n".join(wrong)


# --- 3. sizes -----------------------------------------------------------------------------

MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80


@pytest.mark.parametrize("unit", sorted(UNITS))
def test_file_at_most_500_lines(unit: str) -> None:
    """No source file over 500 lines: a file that long is two ideas (split it by idea)."""
    long = [
        f"  {m.path}: {n} lines"
        for m in (MODULES[name] for name in UNITS[unit])
        if (n := len(m.source.splitlines())) > MAX_FILE_LINES
    ]
    assert not long, (
        f"rule 'no file over {MAX_FILE_LINES} lines' broken (split each by idea, not by "
        "pushing lines into a neighbour):\n" + "\n".join(long)
    )


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


# --- 4. the one mask rule -----------------------------------------------------------------

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


# --- 5. the one layout tuple --------------------------------------------------------------

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


# --- 6. the one builder -------------------------------------------------------------------

BUILDER = "src/posenc/registry.py"

#: (file, function) -> why a dynamic import there is not a second builder.
DYNAMIC_IMPORTS_ALLOWED = {
    ("src/posenc/_deprecated.py", "moved"): (
        "a moved name looked up in its new module for the deprecation warning; builds nothing"
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
    ("src/posenc/attend/cope_fused.py", f"{A.TOP}.rotary.kernels.cpu"): (
        frozenset({"build"}),
        "the fused CoPE path compiles its C loop with the rotary fast path's compile-and-"
        "cache (one private cache directory, one set of ownership and hash checks); no "
        "encoding is built",
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
}


def _family_imports(module: str) -> list[tuple[A.Edge, frozenset[str]]]:
    """The imports of ``module`` that reach a family module, with the names imported."""
    out = []
    for e in EDGES:
        if e.importer != module or e.why.startswith("importing "):
            continue  # a package __init__ a deeper import runs: the deeper one is counted
        room = A.room_of(e.target, ROOMS)
        if room is None or room.floor != FAMILY_FLOOR:
            continue
        node = ast.parse(e.statement).body[0]
        names = frozenset(a.name for a in getattr(node, "names", []))
        out.append((e, names if isinstance(node, ast.ImportFrom) else frozenset({e.target})))
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


def _family_allowance(e: A.Edge, names: frozenset[str]) -> bool:
    for (where, family), (allowed, _why) in FAMILY_IMPORTS_ALLOWED.items():
        if _matches(e.path, where) and (e.target == family or e.target.startswith(family + ".")):
            return allowed is None or names <= allowed
    return False


@pytest.mark.parametrize("unit", sorted({_unit(n) for n in ABOVE_BUILDER}))
def test_one_builder_no_family_import_above(unit: str) -> None:
    """The rooms above ``registry`` (attend, models, analysis, plot, integrations,
    experiments, report, cli) import no family module or concrete encoding class: they get
    an encoding from ``registry.build`` and use it through the kinds of ``_base``. Reasoned
    exceptions (a family's pure function used as such): :data:`FAMILY_IMPORTS_ALLOWED`."""
    wrong = [
        f"  {e.where()}: {', '.join(sorted(names))} from {e.target}"
        for module in ABOVE_BUILDER
        if _unit(module) == unit
        for e, names in _family_imports(module)
        if not _family_allowance(e, names)
    ]
    assert not wrong, (
        "rule 'one builder' broken: a room above the registry imports a family directly; "
        "build the encoding with posenc.registry.build and use it through its kind (or add "
        "the import to FAMILY_IMPORTS_ALLOWED with the reason):\n" + "\n".join(wrong)
    )


def test_builder_allowances_are_used() -> None:
    """Every allowance of rule 6 still matches something (else delete it)."""
    dynamic = {(f.path, f.function) for calls in DYNAMIC.values() for f in calls}
    stale: list[object] = [k for k in DYNAMIC_IMPORTS_ALLOWED if k not in dynamic]
    used = [(e, names) for module in ABOVE_BUILDER for e, names in _family_imports(module)]
    for key in FAMILY_IMPORTS_ALLOWED:
        where, family = key
        hits = [
            names
            for e, names in used
            if _matches(e.path, where) and (e.target == family or e.target.startswith(family + "."))
        ]
        if not hits:
            stale.append(key)
    assert not stale, f"allowances that match nothing any more (delete them): {stale}"


# --- the checks themselves, on small made-up packages ---------------------------------------

_CYCLE_CASES = {
    "a function-level import closes a cycle": (
        {"posenc/a.py": "from posenc import b\n", "posenc/b.py": "def f():\n    import posenc.a\n"},
        True,
    ),
    "a child importing a name from its package's __init__ that runs code": (
        {
            "posenc/p/__init__.py": "from posenc.p.c import g\n\ndef f():\n    return 1\n",
            "posenc/p/c.py": "def g():\n    from posenc.p import f\n",
        },
        True,
    ),
    "a child importing a sibling through its package's __init__ that runs code": (
        {
            "posenc/p/__init__.py": "X = len([])\n\ndef f():\n    from posenc.p.c import g\n",
            "posenc/p/c.py": "from posenc.p import d\n",
            "posenc/p/d.py": "",
        },
        True,
    ),
    "a child importing a name its package only hands on (to the defining module)": (
        {
            "posenc/p/__init__.py": '"""Doc."""\nfrom posenc.p.c import g\nfrom posenc.p.d import h\n'
            '__all__ = ["g", "h"]\n\ndef __getattr__(name):\n    raise AttributeError(name)\n',
            "posenc/p/c.py": "from posenc.p import h\n",
            "posenc/p/d.py": "def h():\n    pass\n",
        },
        False,
    ),
    "importing a module runs its package's __init__ first": (
        {
            "posenc/a.py": "from posenc.p.c import g\n",
            "posenc/p/__init__.py": "from posenc.p.c import g\nfrom posenc.p.d import h\n",
            "posenc/p/c.py": "def g():\n    pass\n",
            "posenc/p/d.py": "from posenc.a import g\n",
        },
        True,
    ),
    "relative imports are resolved": (
        {
            "posenc/p/__init__.py": "",
            "posenc/p/c.py": "from .d import h\n",
            "posenc/p/d.py": "from . import c\n",
        },
        True,
    ),
    "imports under TYPE_CHECKING never run": (
        {
            "posenc/a.py": "from posenc import b\n",
            "posenc/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from posenc.a import x\n",
        },
        False,
    ),
}


@pytest.mark.parametrize("case", sorted(_CYCLE_CASES))
def test_cycle_check_itself(case: str) -> None:
    """The graph of rule 1 sees the cycles it is meant to, and only those."""
    sources, cyclic = _CYCLE_CASES[case]
    sources = {"posenc/__init__.py": "", **sources}
    modules = A.load_modules(sources)
    edges = [e for e in A.module_edges(modules) if not e.type_checking]
    components = [c for c in A.strongly_connected(sorted(modules), edges) if len(c) > 1]
    assert bool(components) == cyclic, (case, components)


def _module(source: str) -> A.Module:
    return A.load_modules({"posenc/m.py": source})["posenc.m"]


def test_mask_scan_itself() -> None:
    """Rule 4's scan flags a causal rule written again (as ``allowed_counts`` did at
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
    """Rule 6's scans see a registry class called and the private table read."""
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
    """Rule 5's scan finds the layouts in any literal, and tells the definition (and its
    ``Literal`` type beside it) from a repeat."""
    source = (
        'Layout = Literal["half", "interleaved"]\n'
        'LAYOUTS = ("half", "interleaved")\n'
        'MODES = ("half", "interleaved", "other")\n'
        'def f(x):\n    return x in ["interleaved", "half"]\n'
    )
    found = [(f.line, name) for f, name in A.layout_literals(_module(source))]
    assert sorted(found) == [(1, "Literal:Layout"), (2, "LAYOUTS"), (3, "MODES"), (5, None)]
