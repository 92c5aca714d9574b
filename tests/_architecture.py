"""The map's rules read from the code, for ``tests/test_architecture.py``.

The imports between rooms are import-linter's (the contracts of ``pyproject.toml``'s
``[tool.importlinter]``, on grimp's graph); the rest is posenc's own, read with ``ast``.
Nothing here imports posenc, so a broken import graph is reported, not crashed on. The
scans work on a mapping ``{"posenc/x.py": source}`` (:func:`read_sources` reads the working
tree), so they can be run on the sources of any commit.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import grimp

if sys.version_info >= (3, 11):
    import tomllib
else:  # import-linter installs tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
TOP = "posenc"
#: Above every room: the package's own ``__init__`` (it re-exports the public names of
#: every room) and ``python -m posenc``.
ABOVE_ALL = (TOP, f"{TOP}.__main__")


@dataclass(frozen=True)
class Module:
    """One ``.py`` file of the package; a package is its ``__init__.py``."""

    name: str  # posenc.rotary.apply; posenc.rotary for rotary/__init__.py
    path: str  # src/posenc/rotary/apply.py
    is_package: bool
    source: str
    tree: ast.Module


# --- reading the package ------------------------------------------------------------------


def read_sources(src: Path = SRC, suffix: str = ".py") -> dict[str, str]:
    """``{"posenc/rotary/apply.py": text}`` for every file under ``src/posenc`` whose name
    ends in ``suffix``."""
    return {
        p.relative_to(src).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted((src / TOP).rglob(f"*{suffix}"))
    }


def load_modules(sources: dict[str, str]) -> dict[str, Module]:
    """Parse every file of ``sources`` (paths relative to ``src``) into a :class:`Module`."""
    modules = {}
    for rel, text in sources.items():
        parts = rel[: -len(".py")].split("/")
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        name = ".".join(parts)
        modules[name] = Module(name, f"src/{rel}", is_package, text, ast.parse(text, rel))
    return modules


@dataclass(frozen=True)
class _Index:
    nodes: list[ast.AST]  # every node, parents before children
    up: dict[ast.AST, ast.AST]  # each node's parent
    scopes: dict[ast.AST, list[ast.AST]]  # module / function -> its nodes, nested functions out


_INDEX: dict[int, tuple[ast.AST, _Index]] = {}
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def index(tree: ast.AST) -> _Index:
    """One walk of ``tree``: its nodes, their parents and scopes (kept per tree)."""
    cached = _INDEX.get(id(tree))
    if cached is not None and cached[0] is tree:
        return cached[1]
    nodes, up, scope_of = [tree], {}, {tree: tree}
    scopes: dict[ast.AST, list[ast.AST]] = {tree: []}
    for node in nodes:  # grows while it is read: a breadth-first walk
        inner = node if isinstance(node, SCOPES) else scope_of[node]
        for child in ast.iter_child_nodes(node):
            up[child] = node
            scope_of[child] = inner
            scopes.setdefault(inner, []).append(child)
            nodes.append(child)
        if isinstance(node, SCOPES):
            scopes.setdefault(node, [])
    result = _Index(nodes, up, scopes)
    _INDEX[id(tree)] = (tree, result)
    return result


def parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    """Each node's parent."""
    return index(tree).up


def enclosing_function(node: ast.AST, up: dict[ast.AST, ast.AST]) -> str:
    """The dotted name of the function or class ``node`` is in (``""`` at module level)."""
    names = []
    parent = up.get(node)
    while parent is not None:
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(parent.name)
        parent = up.get(parent)
    return ".".join(reversed(names))


# --- import-linter: the contracts and their graph ------------------------------------------

PYPROJECT = ROOT / "pyproject.toml"
STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}


def read_contracts(config: Path = PYPROJECT) -> list[dict[str, Any]]:
    """The contracts of ``config``'s ``[tool.importlinter]`` as written, read as TOML
    (import-linter's own reader would import import-linter into the test run, which takes
    longer than a whole ``lint-imports``)."""
    with config.open("rb") as f:
        return list(tomllib.load(f)["tool"]["importlinter"]["contracts"])


def start_lint_imports() -> subprocess.Popen[str]:
    """Start ``lint-imports`` on the contracts of this repository's ``pyproject.toml``,
    reading ``src/posenc`` (first on the path: the working tree, not an installed copy) and
    writing no cache; :func:`lint_result` waits for it."""
    path = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p)
    command = "from importlinter.cli import lint_imports_command as c; c()"
    return subprocess.Popen(
        [sys.executable, "-c", command, "--no-cache"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path, "COLUMNS": "200", "NO_COLOR": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def lint_result(run: subprocess.Popen[str]) -> tuple[int, str]:
    """The exit status and the report of a ``lint-imports`` run (waited for once)."""
    report, _ = run.communicate(timeout=300)
    return run.returncode, report


def broken(report: str, name: str) -> bool:
    """Whether ``lint-imports``' report marks the contract named ``name`` broken."""
    return re.search(rf"^{re.escape(name)}\s+BROKEN\s*$", report, re.MULTILINE) is not None


def import_graph(package: str = TOP) -> grimp.ImportGraph:
    """import-linter's graph of ``package`` (grimp; imports inside functions and under ``if
    TYPE_CHECKING:`` included, as the contracts see them), with the packages it imports from
    outside as single nodes (``numpy``, ``math``)."""
    return grimp.build_graph(package, include_external_packages=True, cache_dir=None)


def inside(name: str, package: str) -> bool:
    """``name`` is ``package`` or a module under it."""
    return name == package or name.startswith(package + ".")


def cycles_through_own_package(
    graph: grimp.ImportGraph, root: str = TOP
) -> list[tuple[str, list[str]]]:
    """``(importer, chain back)`` for each module of ``root`` that imports a package it is
    in whose ``__init__`` imports it back, however indirectly: the one import cycle that the
    ``acyclic_siblings`` contract does not see (it compares the children of a package,
    never a package with its own children)."""
    found = []
    for importer in sorted(m for m in graph.modules if inside(m, root)):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if importer.startswith(imported + "."):
                chain = graph.find_shortest_chain(importer=imported, imported=importer)
                if chain:
                    found.append((importer, list(chain)))
    return found


def import_lines(graph: grimp.ImportGraph, importer: str, imported: str) -> list[int]:
    """The lines of ``importer`` that import ``imported`` (each one once)."""
    details = graph.get_import_details(importer=importer, imported=imported)
    return sorted({d["line_number"] for d in details})


def import_statement(module: Module, line: int) -> ast.Import | ast.ImportFrom:
    """The import statement of ``module`` that starts on ``line``."""
    return next(
        node
        for node in index(module.tree).nodes
        if isinstance(node, (ast.Import, ast.ImportFrom)) and node.lineno == line
    )


# --- the rooms table ------------------------------------------------------------------------

ROOMS_HEADING = "## The rooms, bottom to top"


@dataclass(frozen=True)
class Room:
    """One row of ARCHITECTURE.md's rooms table."""

    floor: int
    paths: tuple[str, ...]  # dotted, absolute: ("posenc._errors", "posenc._angles")
    owns: str
    line: int  # in ARCHITECTURE.md

    @property
    def label(self) -> str:
        return ", ".join(p.removeprefix(TOP + ".") for p in self.paths)


def parse_rooms(text: str) -> tuple[list[Room], list[str]]:
    """The rooms of the table under :data:`ROOMS_HEADING`, and the problems found reading
    it (a row not in the form ``| floor | `path`, `path` | owns |``)."""
    lines = text.splitlines()
    try:
        start = next(i for i, s in enumerate(lines) if s.strip() == ROOMS_HEADING)
    except StopIteration:
        return [], [f"ARCHITECTURE.md has no section {ROOMS_HEADING!r}"]
    rooms: list[Room] = []
    problems: list[str] = []
    seen_header = False
    for number, raw in enumerate(lines[start + 1 :], start + 2):
        s = raw.strip()
        if s.startswith("## "):
            break
        if not s.startswith("|"):
            if seen_header and rooms:
                break  # the table ended
            continue
        cells = [c.strip() for c in s.strip("|").split("|")]
        if not seen_header:
            seen_header = True
            if [c.lower() for c in cells] != ["floor", "room", "owns"]:
                problems.append(f"line {number}: the header must be | floor | room | owns |")
            continue
        if set("".join(cells)) <= set("-: "):
            continue  # the separator row
        if len(cells) != 3 or not re.fullmatch(r"\d+", cells[0]):
            problems.append(f"line {number}: not `| floor (an integer) | room | owns |`: {s}")
            continue
        paths = re.findall(r"`([^`]*)`", cells[1])
        rest = re.sub(r"`[^`]*`", "", cells[1]).replace(",", "").strip()
        bad = [p for p in paths if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", p)]
        if not paths or rest or bad:
            problems.append(
                f"line {number}: the room cell must be backticked module paths relative to "
                f"posenc, separated by ', ' (like `_errors`, `_angles` or `rotary`): {cells[1]}"
            )
            continue
        rooms.append(Room(int(cells[0]), tuple(f"{TOP}.{p}" for p in paths), cells[2], number))
    return rooms, problems


def room_of(name: str, rooms: list[Room]) -> Room | None:
    """The room of module ``name``: the room with the longest path that is ``name`` or a
    package above it (None: no room holds it)."""
    best, length = None, -1
    for room in rooms:
        for p in room.paths:
            if (name == p or name.startswith(p + ".")) and len(p) > length:
                best, length = room, len(p)
    return best


def floor_layers(rooms: list[Room]) -> list[str]:
    """The ``layers`` of the contract ``floors`` that the rooms table asks for, top floor
    first, ``__main__`` above every room: the paths of a floor of several rooms are
    independent (``a | b``: import-linter cannot nest a room of two paths among them, so an
    import between that room's own paths goes to the contract's ``ignore_imports``); a
    floor of one room is its paths, ``a : b``."""
    layers = [m.removeprefix(TOP + ".") for m in ABOVE_ALL if m != TOP]
    for floor in sorted({r.floor for r in rooms}, reverse=True):
        on = [r for r in rooms if r.floor == floor]
        paths = [p.removeprefix(TOP + ".") for r in on for p in r.paths]
        layers.append((" | " if len(on) > 1 else " : ").join(paths))
    return layers


def parse_layer(layer: str) -> tuple[str, frozenset[str]]:
    """A layer of a layers contract as ``(joiner, paths)``: ``"|"`` (independent), ``":"``,
    or ``""`` for a layer of one path."""
    joiner = "|" if "|" in layer else ":" if ":" in layer else ""
    paths = layer.split(joiner) if joiner else [layer]
    return joiner, frozenset(p.strip() for p in paths)


# --- scans of the code ----------------------------------------------------------------------


def _is_arange(node: ast.AST) -> TypeGuard[ast.Call]:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == "arange") or (
        isinstance(f, ast.Name) and f.id == "arange"
    )


def _broadcast(node: ast.AST, axis: str) -> bool:
    """``x[..., :, None]`` (``axis="rows"``) or ``x[..., None, :]`` (``axis="cols"``)."""
    if not isinstance(node, ast.Subscript) or not isinstance(node.slice, ast.Tuple):
        return False
    elts = node.slice.elts
    if len(elts) < 2:
        return False
    a, b = elts[-2], elts[-1]

    def none(e: ast.expr) -> bool:
        return isinstance(e, ast.Constant) and e.value is None

    def full(e: ast.expr) -> bool:
        return isinstance(e, ast.Slice) and e.lower is e.upper is e.step is None

    return (full(a) and none(b)) if axis == "rows" else (none(a) and full(b))


ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


@dataclass(frozen=True)
class Finding:
    """One place a scan flags."""

    path: str
    line: int
    function: str  # dotted; "" at module level
    code: str

    def where(self) -> str:
        inside = f" (in {self.function})" if self.function else ""
        return f"{self.path}:{self.line}{inside}: {self.code}"


#: Methods that keep an index grid an index grid (elementwise, or a view of it).
ELEMENTWISE = frozenset(
    "to float double long int add sub neg unsqueeze view reshape expand expand_as flip".split()
)


def _grid_refs(node: ast.AST, grids: set[str]) -> set[str]:
    """The index grids ``node`` is an elementwise function of: ``arange`` calls and names
    in ``grids``, reached through arithmetic, indexing and :data:`ELEMENTWISE` methods (a
    reduction such as ``.max()`` or ``.sum()`` ends a grid)."""
    if _is_arange(node):
        return {f"arange@{node.lineno}:{node.col_offset}"}
    if isinstance(node, ast.Name):
        return {node.id} if node.id in grids else set()
    if isinstance(node, ast.BinOp):
        return _grid_refs(node.left, grids) | _grid_refs(node.right, grids)
    if isinstance(node, ast.UnaryOp):
        return _grid_refs(node.operand, grids)
    if isinstance(node, ast.Subscript):
        return _grid_refs(node.value, grids)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr in ELEMENTWISE:
            return _grid_refs(node.func.value, grids)
    return set()


def pairwise_index_rules(module: Module) -> list[Finding]:
    """Places that derive a rule over (query, key) pairs from index grids: an order
    comparison (``<``, ``<=``, ``>``, ``>=``) between two index grids (``arange`` calls, or
    names assigned from elementwise arithmetic on one, in the same function), or between a
    row grid ``x[:, None]`` and a column grid ``y[None, :]``; and every ``tril`` / ``triu``
    (``torch.tril``, ``x.triu(1)``, ``tril_indices``, ...)."""
    up = parents(module.tree)
    found = []
    for nodes in index(module.tree).scopes.values():
        grids: set[str] = set()
        changed = True
        while changed:  # names assigned from a grid, to a fixed point
            changed = False
            for node in nodes:
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target, value = node.targets[0], node.value
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    target, value = node.target, node.value
                else:
                    continue
                if isinstance(target, ast.Name) and target.id not in grids:
                    if _grid_refs(value, grids):
                        grids.add(target.id)
                        changed = True
        for node in nodes:
            if not isinstance(node, (ast.Compare, ast.Call)):
                continue
            hit = False
            if isinstance(node, ast.Compare) and any(isinstance(o, ORDER) for o in node.ops):
                sides = [node.left, *node.comparators]
                refs = set().union(*(_grid_refs(side, grids) for side in sides))
                outer = any(_broadcast(side, "rows") for side in sides) and any(
                    _broadcast(side, "cols") for side in sides
                )
                hit = len(refs) >= 2 or outer
            elif isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                hit = name in ("tril", "triu", "tril_indices", "triu_indices", "tril_", "triu_")
            if hit:
                function = enclosing_function(node, up)
                found.append(Finding(module.path, node.lineno, function, ast.unparse(node)))
    return sorted(found, key=lambda f: f.line)


def _module_level_name(node: ast.AST, module: Module) -> str | None:
    """The name ``node`` is the whole value of, in a module-level ``NAME = node``."""
    up = parents(module.tree)
    parent = up.get(node)
    if isinstance(parent, (ast.Assign, ast.AnnAssign)) and up.get(parent) is module.tree:
        targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
        if len(targets) == 1 and isinstance(targets[0], ast.Name) and parent.value is node:
            return targets[0].id
    return None


def layout_literals(module: Module) -> list[tuple[Finding, str | None]]:
    """Every tuple, list or set literal holding both ``"half"`` and ``"interleaved"``, with
    what it defines: ``NAME`` for a module-level ``NAME = (...)``, ``"Literal:Alias"`` for a
    module-level type alias ``Alias = Literal[...]``, None for anything else."""
    up = parents(module.tree)
    found = []
    for node in index(module.tree).nodes:
        if not isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            continue
        values = {e.value for e in node.elts if isinstance(e, ast.Constant)}
        if not {"half", "interleaved"} <= values:
            continue
        parent = up.get(node)
        assigned = _module_level_name(node, module)
        if isinstance(parent, ast.Subscript) and parent.slice is node:
            literal = parent.value
            if (isinstance(literal, ast.Name) and literal.id == "Literal") or (
                isinstance(literal, ast.Attribute) and literal.attr == "Literal"
            ):
                alias = _module_level_name(parent, module)
                assigned = None if alias is None else f"Literal:{alias}"
        finding = Finding(module.path, node.lineno, enclosing_function(node, up), ast.unparse(node))
        found.append((finding, assigned))
    return found


def dynamic_imports(module: Module) -> list[Finding]:
    """Every ``importlib.import_module(...)``, ``import_module(...)`` and ``__import__(...)``
    call, and every ``importlib.util.find_spec`` of a posenc module."""
    up = parents(module.tree)
    found = []
    for node in index(module.tree).nodes:
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        posenc_spec = (
            name == "find_spec"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and str(node.args[0].value).split(".")[0] == TOP
        )
        if name in ("import_module", "__import__") or posenc_spec:
            found.append(
                Finding(module.path, node.lineno, enclosing_function(node, up), ast.unparse(node))
            )
    return found


def _registry_lookup(node: ast.AST) -> bool:
    """``registry.get(...)`` / ``registry.class_of(...)`` (or ``_load``): a class by name."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("get", "class_of", "_load")
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "registry"
    )


def registry_class_calls(module: Module) -> list[Finding]:
    """Every call of a class looked up in the registry: ``registry.get(name)(...)``, or
    ``cls(...)`` where ``cls = registry.class_of(...)`` in the same function (building the
    encoding outside ``registry.build``)."""
    up = parents(module.tree)
    found = []
    for nodes in index(module.tree).scopes.values():
        classes = {
            t.id
            for n in nodes
            if isinstance(n, ast.Assign) and _registry_lookup(n.value)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        for n in nodes:
            if isinstance(n, ast.Call) and (
                _registry_lookup(n.func) or (isinstance(n.func, ast.Name) and n.func.id in classes)
            ):
                found.append(
                    Finding(module.path, n.lineno, enclosing_function(n, up), ast.unparse(n))
                )
    return sorted(found, key=lambda f: f.line)


def registry_entry_reads(module: Module) -> list[Finding]:
    """Every read of the registry's private table ``_ENTRIES`` (``registry._ENTRIES``, the
    name imported, or ``"_ENTRIES"`` spelled as a string for ``getattr``)."""
    up = parents(module.tree)
    found = []
    for node in index(module.tree).nodes:
        if (
            (isinstance(node, ast.Attribute) and node.attr == "_ENTRIES")
            or (isinstance(node, ast.Constant) and node.value == "_ENTRIES")
            or (isinstance(node, ast.ImportFrom) and any(a.name == "_ENTRIES" for a in node.names))
        ):
            found.append(
                Finding(module.path, node.lineno, enclosing_function(node, up), ast.unparse(node))
            )
    return found


def code_lines(function: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> int:
    """A function's code lines: from ``def`` to its end, minus its docstring, blank lines and
    comment-only lines (the count of ``python3 /tmp/longfuncs.py``)."""
    body = function.body
    doc = (
        body[0]
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
        else None
    )
    skip = set(range(doc.lineno, (doc.end_lineno or doc.lineno) + 1)) if doc else set()
    return sum(
        1
        for i in range(function.lineno, (function.end_lineno or function.lineno) + 1)
        if i not in skip and lines[i - 1].strip() and not lines[i - 1].strip().startswith("#")
    )


def triton_kernel(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Decorated with ``@triton.jit`` (or ``@triton.jit(...)``): a kernel body, exempt."""
    for d in function.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if ast.unparse(target) in ("triton.jit", "jit"):
            return True
    return False
