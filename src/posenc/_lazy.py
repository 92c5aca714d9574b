"""What ``import posenc`` leaves for later: the import hooks of a package that needs no torch
to be imported.

``import posenc`` imports no torch: each top-level name imports its module on first use
(PEP 562, in ``posenc/__init__.py``). Two hooks on ``sys.meta_path`` keep that honest:

- where torch is not installed (:data:`TORCH_MISSING`), :class:`NeedsTorch` stops the import
  of any part of posenc that needs it before a line of it runs, with one line,
  ``ModuleNotFoundError: posenc.rotary needs torch, which is not installed: pip install
  torch``; the parts that need only NumPy (:data:`TORCH_FREE`: the float64 reference, the
  conformance check, the checks and files under them, the command's frame and its NumPy
  commands) import as ever;
- :func:`after_import` runs a function once a module is imported, however it is reached:
  the package puts transformers' spelling reader into the rotary room this way (the rotary
  room cannot import :mod:`posenc.integrations`, above it; every way to ``RotaryEmbedding``
  imports ``posenc.rotary``).

A finder here answers only for its own module names and otherwise leaves the search to the
finders after it, so an import that has nothing to do with posenc goes on as ever.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

__all__ = [
    "TORCH_FREE",
    "TORCH_MISSING",
    "NeedsTorch",
    "after_import",
    "install_needs_torch",
    "needs_torch",
    "torch_free",
]


def _torch_missing() -> bool:
    """Whether torch cannot be imported here: not installed (or blocked, ``sys.modules["torch"]
    = None``); a torch already imported is there, whatever its spec says."""
    if sys.modules.get("torch") is not None:
        return False
    try:
        return importlib.util.find_spec("torch") is None
    except (ImportError, ValueError):  # a broken entry in sys.modules: as good as missing
        return True


#: Whether torch is missing in this process (read once, when posenc is first imported).
TORCH_MISSING = _torch_missing()

#: The modules of posenc that import without torch (a package here takes its submodules):
#: the float64 reference and the conformance check, the checks and files they use, and the
#: command's frame with its NumPy commands (``posenc vectors``, ``posenc conformance``).
TORCH_FREE = frozenset(
    {
        "posenc",
        "posenc.__main__",
        "posenc._deprecated",
        "posenc._errors",
        "posenc._fields",
        "posenc._files",
        "posenc._layouts",
        "posenc._lazy",
        "posenc._version",
        "posenc.cli",
        "posenc.cli._app",
        "posenc.cli._checks",
        "posenc.cli._main",
        "posenc.cli.conformance",
        "posenc.conformance",
        "posenc.reference",
    }
)
_TORCH_FREE_PACKAGES = ("posenc.conformance.", "posenc.reference.")


def torch_free(name: str) -> bool:
    """Whether the posenc module ``name`` imports without torch (:data:`TORCH_FREE`)."""
    return name in TORCH_FREE or name.startswith(_TORCH_FREE_PACKAGES)


def needs_torch(what: str) -> ModuleNotFoundError:
    """The one-line error of ``what`` (``"posenc.rotary"``, ``"posenc table"``) where torch
    is not installed; its ``name`` is ``"torch"``, the module missing."""
    return ModuleNotFoundError(
        f"{what} needs torch, which is not installed: pip install torch", name="torch"
    )


def _find_after(
    finder: object, fullname: str, path: Sequence[str] | None, target: ModuleType | None
) -> ModuleSpec | None:
    """The spec the finders after ``finder`` on ``sys.meta_path`` give ``fullname``."""
    finders = list(sys.meta_path)
    start = next((i + 1 for i, f in enumerate(finders) if f is finder), 0)
    for other in finders[start:]:
        find = getattr(other, "find_spec", None)
        spec = find(fullname, path, target) if find is not None else None
        if spec is not None:
            return spec
    return None


class NeedsTorch:
    """A ``sys.meta_path`` finder, installed only where torch is missing: the import of a
    posenc module that needs torch raises :func:`needs_torch` (a module that does not exist
    is left to the usual ``No module named ...``)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        """None (the other finders decide) unless ``fullname`` is a posenc module that needs
        torch; then the one-line ``ModuleNotFoundError``."""
        if not fullname.startswith("posenc.") or torch_free(fullname):
            return None
        if _find_after(self, fullname, path, target) is None:
            return None
        raise needs_torch(fullname)


def install_needs_torch() -> None:
    """Put :class:`NeedsTorch` first on ``sys.meta_path`` (once) when torch is missing."""
    if TORCH_MISSING and not any(isinstance(f, NeedsTorch) for f in sys.meta_path):
        sys.meta_path.insert(0, NeedsTorch())


class _ThenLoader:
    """A module's own loader, followed by ``then()`` once the module has run; every other
    attribute is the loader's (``get_source``, ``get_resource_reader``, ...)."""

    def __init__(self, loader: Any, then: Callable[[], object]) -> None:
        self._loader, self._then = loader, then

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._then()

    def __getattr__(self, name: str) -> Any:
        if name in ("_loader", "_then"):  # not set yet (a copy): no recursion
            raise AttributeError(name)
        return getattr(self._loader, name)


class _AfterImport:
    """A ``sys.meta_path`` finder that gives the module ``name`` a loader running ``then()``
    once the module is imported (:func:`after_import`)."""

    def __init__(self, name: str, then: Callable[[], object]) -> None:
        self.name, self.then = name, then

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        """None for any other module; for ``name``, the spec the other finders give, its
        loader followed by ``then()``."""
        if fullname != self.name:
            return None
        spec = _find_after(self, fullname, path, target)
        if spec is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ThenLoader(spec.loader, self.then)  # type: ignore[assignment]
        return spec


def after_import(name: str, then: Callable[[], object]) -> None:
    """Run ``then()`` each time the module ``name`` is imported (or reloaded), right after
    its own code, however the import is reached; at once if it is imported already. Installing
    the same ``name`` again replaces its function."""
    sys.meta_path[:] = [
        f for f in sys.meta_path if not (isinstance(f, _AfterImport) and f.name == name)
    ]
    sys.meta_path.insert(0, _AfterImport(name, then))
    if sys.modules.get(name) is not None:
        then()
