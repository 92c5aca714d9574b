"""The map's rules read from the code, for ``tests/test_architecture.py``.

Pure ``ast``: nothing here imports posenc, so a broken import graph is reported, not crashed
on. Everything works on a mapping ``{"posenc/x.py": source}`` (:func:`read_sources` reads
the working tree), so the same checks can be run on the sources of any commit.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

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


@dataclass(frozen=True)
class Edge:
    """``importer`` needs ``target`` to run: one import statement, or what it starts."""

    importer: str
    target: str
    path: str  # the importer's file
    line: int
    statement: str  # the import as written
    type_checking: bool  # under ``if TYPE_CHECKING:``: never runs
    why: str = ""  # empty: the statement names target; else how it reaches target

    def where(self) -> str:
        how = f" ({self.why})" if self.why else ""
        return f"{self.path}:{self.line}: `{self.statement}`{how}"


# --- reading the package ------------------------------------------------------------------


def read_sources(src: Path = SRC) -> dict[str, str]:
    """``{"posenc/rotary/apply.py": text}`` for every ``.py`` file under ``src/posenc``."""
    return {
        p.relative_to(src).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted((src / TOP).rglob("*.py"))
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


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def under_type_checking(node: ast.AST, up: dict[ast.AST, ast.AST]) -> bool:
    """Whether ``node`` sits in the body of an ``if TYPE_CHECKING:`` (code that never runs)."""
    child, parent = node, up.get(node)
    while parent is not None:
        if isinstance(parent, ast.If) and _is_type_checking(parent.test) and child in parent.body:
            return True
        child, parent = parent, up.get(parent)
    return False


def enclosing_function(node: ast.AST, up: dict[ast.AST, ast.AST]) -> str:
    """The dotted name of the function or class ``node`` is in (``""`` at module level)."""
    names = []
    parent = up.get(node)
    while parent is not None:
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(parent.name)
        parent = up.get(parent)
    return ".".join(reversed(names))


# --- the import graph ---------------------------------------------------------------------


def _owner(name: str, modules: dict[str, Module]) -> str | None:
    """The longest prefix of the dotted ``name`` that is a module of the package."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _from_base(module: Module, node: ast.ImportFrom) -> str:
    """The absolute module a ``from X import ...`` reads from, relative imports resolved."""
    if not node.level:
        return node.module or ""
    package = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def hands_names_on(module: Module) -> bool:
    """Whether a package ``__init__`` only hands names on, so that a child importing a name
    from it depends on the module defining that name and not on the ``__init__``.

    Only hands names on: every top-level statement is a docstring, an import, ``if
    TYPE_CHECKING:`` with imports, an assignment whose value is a literal of constants and
    names (``__all__``, ``__version__``, a table of deprecated names: nothing is called), or
    the PEP 562 ``def __getattr__`` / ``def __dir__`` (they run only when a missing name is
    looked up). Any other function or class definition, call, loop or ``try`` is code the
    ``__init__`` runs, and a child importing it for a name then depends on it.
    """

    literal = (ast.Constant, ast.Name, ast.Attribute, ast.Tuple, ast.List, ast.Set, ast.Dict)

    def plain_literal(value: ast.expr | None) -> bool:
        return value is None or all(
            isinstance(n, (*literal, ast.expr_context)) for n in ast.walk(value)
        )

    def hands_on(stmt: ast.stmt) -> bool:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            return True
        if isinstance(stmt, ast.Expr):
            return isinstance(stmt.value, ast.Constant)
        if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            return plain_literal(stmt.value)
        if isinstance(stmt, ast.If) and _is_type_checking(stmt.test):
            return all(isinstance(s, (ast.Import, ast.ImportFrom)) for s in stmt.body)
        if isinstance(stmt, ast.FunctionDef):
            return stmt.name in ("__getattr__", "__dir__")
        return False

    return module.is_package and all(hands_on(s) for s in module.tree.body)


def _defining_module(
    package: str, name: str, modules: dict[str, Module], seen: frozenset[str] = frozenset()
) -> str:
    """The module that defines ``name`` which ``package`` hands on (``package`` itself when
    it binds the name with no import, or imports it from outside posenc)."""
    if package in seen or package not in modules:
        return package
    for stmt in modules[package].tree.body:
        if not isinstance(stmt, ast.ImportFrom):
            continue
        base = _from_base(modules[package], stmt)
        for alias in stmt.names:
            if (alias.asname or alias.name) != name:
                continue
            if f"{base}.{alias.name}" in modules:
                return f"{base}.{alias.name}"
            if base in modules:
                if modules[base].is_package and hands_names_on(modules[base]):
                    return _defining_module(base, alias.name, modules, seen | {package})
                return base
            return package
    return package


def _targets(
    module: Module, node: ast.Import | ast.ImportFrom, modules: dict[str, Module]
) -> Iterator[tuple[str, str]]:
    """``(target, why)`` for each posenc module one import statement names."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            target = _owner(alias.name, modules) if alias.name.split(".")[0] == TOP else None
            if target:
                yield target, ""
        return
    base = _from_base(module, node)
    if base.split(".")[0] != TOP:
        return
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        owner = _owner(base, modules)
        if owner is None:
            continue
        inside = module.name.startswith(owner + ".")
        if sub in modules:
            yield sub, ""
            if inside and owner == base and not hands_names_on(modules[owner]):
                # the name is looked up in the package first: its __init__ must have run
                why = f"reads `{alias.name}` from {modules[owner].path}, which runs code"
                yield owner, why
            continue
        if inside and modules[owner].is_package and hands_names_on(modules[owner]):
            # a child reading a name its own package only hands on: the defining module
            defining = _defining_module(owner, alias.name, modules)
            why = f"`{alias.name}` is defined in {defining}" if defining != owner else ""
            yield defining, why
        elif inside and modules[owner].is_package:
            why = f"reads `{alias.name}` from {modules[owner].path}, which runs code"
            yield owner, why
        else:
            yield owner, ""


def module_edges(modules: dict[str, Module]) -> list[Edge]:
    """Every import of a posenc module by a posenc module, wherever it is written (module
    level, inside functions, under ``if TYPE_CHECKING:``), plus the package ``__init__``s
    each import runs first: ``import posenc.a.b`` from outside ``posenc.a`` runs
    ``posenc/a/__init__.py`` before ``b`` (the top ``posenc`` has always run already)."""
    edges = []
    for module in modules.values():
        up = parents(module.tree)
        for node in index(module.tree).nodes:
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            tc = under_type_checking(node, up)
            statement = ast.unparse(node)
            for target, why in _targets(module, node, modules):
                pieces = target.split(".")
                for k in range(2, len(pieces)):  # the packages above target, below the top
                    package = ".".join(pieces[:k])
                    if module.name != package and not module.name.startswith(package + "."):
                        run = f"importing {target} first runs {modules[package].path}"
                        edges.append(
                            Edge(module.name, package, module.path, node.lineno, statement, tc, run)
                        )
                if target != module.name:
                    edges.append(
                        Edge(module.name, target, module.path, node.lineno, statement, tc, why)
                    )
    unique: dict[tuple[str, str, int, bool], Edge] = {}
    for e in edges:  # one edge per statement and target, the statement's own arrow first
        key = (e.importer, e.target, e.line, e.type_checking)
        if key not in unique or (unique[key].why.startswith("importing ") and not e.why):
            unique[key] = e
    return list(unique.values())


def strongly_connected(nodes: list[str], edges: list[Edge]) -> list[list[str]]:
    """Tarjan's strongly connected components of the graph (each sorted)."""
    adjacent: dict[str, list[str]] = {n: [] for n in nodes}
    for e in edges:
        adjacent[e.importer].append(e.target)
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in nodes:
        if root in order:
            continue
        work = [(root, iter(adjacent[root]))]  # iterative: no recursion limit
        order[root] = low[root] = len(order)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in order:
                    order[child] = low[child] = len(order)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(adjacent[child])))
                elif child in on_stack:
                    low[node] = min(low[node], order[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == order[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                components.append(sorted(component))
    return components


def shortest_cycle(start: str, members: set[str], edges: list[Edge]) -> list[Edge]:
    """The shortest chain of imports from ``start`` back to itself inside ``members``."""
    out: dict[str, list[Edge]] = {}
    for e in edges:
        if e.importer in members and e.target in members:
            out.setdefault(e.importer, []).append(e)
    came: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for e in out.get(node, []):
                if e.target == start:
                    chain = [e]
                    while chain[0].importer != start:
                        chain.insert(0, came[chain[0].importer])
                    return chain
                if e.target not in came:
                    came[e.target] = e
                    nxt.append(e.target)
        frontier = nxt
    return []


def external_imports(module: Module) -> Iterator[tuple[int, str, str]]:
    """``(line, top-level package, statement)`` of every import of something outside posenc."""
    for node in index(module.tree).nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != TOP:
                    yield node.lineno, alias.name.split(".")[0], ast.unparse(node)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] != TOP:
                yield node.lineno, node.module.split(".")[0], ast.unparse(node)


STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}


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
