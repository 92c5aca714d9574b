"""A pytest plugin: the golden vectors as a session fixture, and an assertion.

Use it with ``pytest -p posenc.conformance.pytest_plugin`` or, in a ``conftest.py``,
``pytest_plugins = ["posenc.conformance.pytest_plugin"]``::

    from posenc.conformance import Adapter
    from posenc.conformance.pytest_plugin import assert_conforms

    def test_my_rope(posenc_vectors):
        assert_conforms(Adapter("mine", "rotate", "rope", my_rope, convention={"layout": "half"}),
                        posenc_vectors, cases="rope.rotate.half.*")

``--posenc-vectors DIR`` makes the fixture load a directory ``posenc vectors`` wrote instead
of building the cases in memory (once per session either way).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from posenc._errors import PosEncError
from posenc.conformance._api import Adapter, Report
from posenc.conformance.check import check
from posenc.conformance.vectors import Vectors, as_vectors, load_vectors

__all__ = ["assert_conforms", "posenc_vectors", "pytest_addoption"]


def pytest_addoption(parser: Any) -> None:
    """``--posenc-vectors DIR``: the vectors the ``posenc_vectors`` fixture loads."""
    group = parser.getgroup("posenc")
    group.addoption(
        "--posenc-vectors",
        default=None,
        metavar="DIR",
        help="golden vectors written by 'posenc vectors' (default: built in memory)",
    )


@pytest.fixture(scope="session")
def posenc_vectors(request: Any) -> Vectors:
    """The golden vectors, built (or loaded from ``--posenc-vectors``) once per session."""
    path = request.config.getoption("--posenc-vectors", default=None)
    return Vectors.build() if path is None else load_vectors(path)


def assert_conforms(
    adapter: Adapter | Sequence[Adapter],
    vectors: Vectors | str | Path | None = None,
    cases: str | Sequence[str] | None = None,
    expect: Mapping[str, str | None] | None = None,
) -> Report:
    """Check ``adapter`` (:func:`~posenc.conformance.check`) and raise ``AssertionError``
    carrying the report's table unless every case passed or was skipped.

    ``expect`` maps case names to the deviation expected of them (words, or None for any
    failure): those cases must fail, with those words; the others must not fail. Returns
    the report.

    Raises:
        PosEncError: bad ``vectors`` or ``cases`` (as :func:`~posenc.conformance.check`),
            or ``expect`` not a mapping of the names of cases in ``vectors`` to a string or
            None.
        AssertionError: a case failed that was not expected to, or an expected failure
            did not happen (or not with its words).
    """
    picked = as_vectors(vectors)
    names = set(picked.names())
    expected = _expectations(expect, names)
    report = check(adapter, picked, cases=cases)
    wrong = []
    for r in report.results:
        if r.case in expected:
            words = expected[r.case]
            if r.status != "fail" or (words is not None and r.deviation != words):
                wrong.append(
                    f"{r.case}: expected to fail with {words!r}, got {r.status} {r.deviation!r}"
                )
        elif r.status == "fail":
            wrong.append(f"{r.case}: failed")
    missing = set(expected) - {r.case for r in report.results}
    wrong += [f"{name}: expected to fail, but it did not run" for name in sorted(missing)]
    if wrong:
        raise AssertionError("posenc conformance:\n" + "\n".join(wrong) + "\n\n" + str(report))
    return report


def _expectations(expect: Any, names: set[str]) -> dict[str, str | None]:
    """``expect`` as a dict, refused unless it is None or a mapping of names in ``names``
    to a non-empty string or None."""
    if expect is None:
        return {}
    if not isinstance(expect, Mapping):
        raise PosEncError(
            "expect must be a mapping of case name to the deviation expected (words, or None "
            f"for any failure), got {type(expect).__name__}"
        )
    out: dict[str, str | None] = {}
    for name, words in expect.items():
        if not isinstance(name, str) or name not in names:
            example = f" (e.g. {min(names)!r})" if names else ""
            raise PosEncError(
                f"expect keys must be names of the vectors' cases{example}, got {name!r}"
            )
        if words is not None and (not isinstance(words, str) or not words.strip()):
            raise PosEncError(
                f"expect[{name!r}] must be the deviation's words (a non-empty string) or None, "
                f"got {words!r}"
            )
        out[name] = words
    return out
