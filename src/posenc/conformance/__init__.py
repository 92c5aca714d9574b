"""Golden vectors from posenc's float64 reference, and a check that runs any implementation
(in any framework, through a small :class:`Adapter`) against them and says in words where
it departs from the convention it claims.

NumPy and the standard library only: this package works where torch is not installed.

    >>> from posenc import reference
    >>> from posenc.conformance import Adapter, check
    >>> def my_table(positions, dim, *, base):  # [sin | cos] halves, exponent 2i/d
    ...     return reference.sinusoidal_table(positions, dim, base=base, layout="half")
    >>> mine = Adapter("mine", "table", "sinusoidal", my_table, convention={"layout": "half"})
    >>> check(mine).ok
    True

Cases (:func:`build_cases`) are computed in float64 from :mod:`posenc.reference`;
:func:`write_vectors` stores them (``manifest.json`` + ``vectors.npz``) for projects that
do not install posenc, :func:`load_vectors` reads them back, refusing a malformed file in
one line.
"""

from posenc.conformance._api import (
    DTYPES,
    FAMILIES,
    OPERATIONS,
    Adapter,
    CaseResult,
    Report,
    Unsupported,
)
from posenc.conformance.cases import Case, build_cases
from posenc.conformance.check import check
from posenc.conformance.vectors import Vectors, load_vectors, write_vectors

__all__ = [
    "DTYPES",
    "FAMILIES",
    "OPERATIONS",
    "Adapter",
    "Case",
    "CaseResult",
    "Report",
    "Unsupported",
    "Vectors",
    "build_cases",
    "check",
    "load_vectors",
    "write_vectors",
]
