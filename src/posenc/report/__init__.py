"""``posenc report``: every registered encoding measured, drawn and compared on one page.

:func:`build_report` writes ``DIR/index.html`` (self-contained: figures embedded as PNG data
URIs), ``DIR/report.json`` (every number; schema in :mod:`posenc.report.schema`) and the
figures as ``DIR/*.png``. It uses the analysis, the plots and, when present, the
length-generalization experiments, so it sits at the top of the package with the CLI.
"""

from posenc.report.build import LENGTHGEN_SETTINGS, Settings, build_report, settings_for
from posenc.report.schema import REPORT_SCHEMA, SCHEMA_VERSION, validate_report

__all__ = [
    "LENGTHGEN_SETTINGS",
    "REPORT_SCHEMA",
    "SCHEMA_VERSION",
    "Settings",
    "build_report",
    "settings_for",
    "validate_report",
]
