"""``posenc vectors`` and ``posenc conformance``: golden vectors written, an implementation
checked against them. NumPy and typer only (no torch).

    posenc vectors --out golden/
    posenc vectors --out golden/ --cases 'sinusoidal.*' --cases '*@far'
    posenc conformance my_adapters.py:ADAPTERS --vectors golden/
    posenc conformance mypkg.posenc_adapters:rope --cases 'rope.rotate.half.*' --json out.json

An adapter is given as ``module:attr`` (an importable module) or ``path/to/file.py:attr``
(a file, imported by path); ``attr`` (dotted for nested names) is an
:class:`~posenc.conformance.Adapter` or a sequence of them. Exit code 0: every case passed
or was skipped; 1: a mismatch; 2: bad input (one line on stderr).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from posenc._errors import PosEncError
from posenc.cli._app import app, fail
from posenc.cli._checks import (
    check_out_dir,
    check_out_file,
    check_regular_file,
    option,
    text,
    write_option_file,
)

__all__ = ["conformance", "load_adapters", "vectors"]

_FILE_MAX_BYTES = 16 << 20  # an adapter file is Python source, far below this


def _attribute(obj: Any, dotted: str, spec: str) -> Any:
    for part in dotted.split("."):
        if not part.isidentifier():
            raise PosEncError(f"SPEC attribute must be a dotted Python name, got {spec!r}")
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PosEncError(f"SPEC {spec!r}: {part!r} not found") from None
    return obj


def _module(target: str, spec: str) -> Any:
    """The module ``target`` names: a ``.py`` file (or a path) imported by location, else
    an importable module name."""
    if target.endswith(".py") or "/" in target or "\\" in target:
        check_regular_file("SPEC", target)
        size = Path(target).stat().st_size
        if size > _FILE_MAX_BYTES:
            raise PosEncError(
                f"SPEC file {target!r} is {size} bytes, more than the {_FILE_MAX_BYTES} it can be"
            )
        name = f"_posenc_adapters_{abs(hash(str(Path(target).resolve())))}"
        loader = importlib.util.spec_from_file_location(name, target)
        if loader is None or loader.loader is None:
            raise PosEncError(f"SPEC file {target!r} cannot be imported (not Python source)")
        module = importlib.util.module_from_spec(loader)
        sys.modules[name] = module
        try:
            loader.loader.exec_module(module)
        except PosEncError:
            raise
        except Exception as e:
            sys.modules.pop(name, None)
            message = " ".join(str(e).split())[:200]
            raise PosEncError(
                f"SPEC file {target!r} failed to import: {type(e).__name__}: {message}"
            ) from None
        return module
    if not all(part.isidentifier() for part in target.split(".")):
        raise PosEncError(f"SPEC module must be a dotted Python name or a .py file, got {spec!r}")
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as e:
        raise PosEncError(f"SPEC {spec!r}: module {e.name!r} not found") from None
    except Exception as e:
        message = " ".join(str(e).split())[:200]
        raise PosEncError(
            f"SPEC {spec!r} failed to import: {type(e).__name__}: {message}"
        ) from None


def load_adapters(spec: str) -> list[Any]:
    """The adapters ``spec`` (``module:attr`` or ``file.py:attr``) names.

    Raises:
        PosEncError: a malformed spec, a module or file that cannot be imported, a missing
            attribute, or one that is not an Adapter or a sequence of them.
    """
    from posenc.conformance import Adapter

    text("SPEC")(spec)
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise PosEncError(f"SPEC must be 'module:attr' or 'path/to/file.py:attr', got {spec!r}")
    value = _attribute(_module(target, spec), attr, spec)
    if isinstance(value, Adapter):
        return [value]
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and value:
        for i, item in enumerate(value):
            if not isinstance(item, Adapter):
                raise PosEncError(
                    f"SPEC {spec!r} item {i} must be a posenc.conformance.Adapter, "
                    f"got {type(item).__name__}"
                )
        return list(value)
    raise PosEncError(
        f"SPEC {spec!r} must name an Adapter or a non-empty sequence of them, "
        f"got {type(value).__name__}"
    )


OutDir = Annotated[
    str,
    option(
        "Directory to write manifest.json, vectors.npz, README.md into.",
        text("--out"),
        "--out",
        "-o",
    ),
]
Cases = Annotated[
    list[str] | None,
    option(
        "Glob on case names (repeatable), e.g. 'sinusoidal.*' or '*@far'. Default: every case.",
        text("--cases"),
        "--cases",
    ),
]
Specs = Annotated[
    list[str],
    typer.Argument(
        help="Adapters: 'module:attr' or 'path/to/file.py:attr' (repeatable).", show_default=False
    ),
]
VectorsDir = Annotated[
    str | None,
    option(
        "Directory written by 'posenc vectors' (default: the cases built in memory).",
        text("--vectors"),
        "--vectors",
    ),
]
JsonOut = Annotated[
    str | None, option("Also write the results as JSON to this file.", text("--json"), "--json")
]


@app.command("vectors")
def vectors(out: OutDir, cases: Cases = None) -> None:
    """Write posenc's golden vectors (float64 reference, every encoding, near and far
    positions) into a directory: manifest.json, vectors.npz and README.md."""
    from posenc.conformance import write_vectors

    try:
        check_out_dir(out, create=False)
        folder = write_vectors(out, cases=cases)
    except PosEncError as e:
        fail(str(e))
        return
    count = len(json.loads((folder / "manifest.json").read_text(encoding="utf-8"))["cases"])
    typer.echo(f"wrote {count} cases to {str(folder)!r}")


@app.command("conformance")
def conformance(
    specs: Specs,
    vectors: VectorsDir = None,
    cases: Cases = None,
    json_out: JsonOut = None,
) -> None:
    """Check implementations (adapters) against the golden vectors: a table of cases, and
    in words how a mismatch departs from the convention. Exit 1 on a mismatch."""
    from posenc.conformance import check

    try:
        json_path = None if json_out is None else check_out_file(json_out, ("json",), "--json")
        adapters = [a for spec in specs for a in load_adapters(spec)]
        report = check(adapters, vectors, cases=cases)
    except PosEncError as e:
        fail(str(e))
        return
    typer.echo(str(report))
    if json_path is not None:
        data = json.dumps(report.to_json(), indent=1) + "\n"
        write_option_file("--json", json_path, data.encode("utf-8"))
    if not report.ok:
        raise typer.Exit(code=1)
