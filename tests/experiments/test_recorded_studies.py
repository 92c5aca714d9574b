"""The studies' results the pages quote (docs/studies/*/results.json, measured 2026-12-02)
read again by this code: the same summary, comparisons and verdicts, and the pages say
what those verdicts say. A change that moves a verdict fails here until the pages follow."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from posenc.experiments.results import load_results, refresh_results
from posenc.experiments.studies import STUDIES, study_arguments
from posenc.report.study import PRESS_COMPARISONS, comparison, ratios

ROOT = Path(__file__).resolve().parents[2]
STUDY_DIR = ROOT / "docs" / "studies"
RECORDED = sorted(p.name for p in STUDY_DIR.iterdir() if (p / "results.json").is_file())

#: How the pages write each status.
WORDS = {
    "reproduced": "reproduced",
    "partly": "reproduced in part",
    "level at this scale": "level at this scale",
    "not reproduced": "not reproduced",
}


def test_every_study_and_the_report_are_recorded() -> None:
    assert set(STUDIES) | {"report", "flipflop-5-seeds"} == set(RECORDED)


@pytest.mark.parametrize("name", RECORDED)
def test_this_code_reads_the_recorded_numbers_the_same(name: str) -> None:
    data = load_results(STUDY_DIR / name)
    again = refresh_results(data, comparisons=PRESS_COMPARISONS if name == "report" else None)
    assert again["summary"] == data["summary"]
    assert again["comparisons"] == data["comparisons"]


def _table_row(page: str, name: str) -> list[str]:
    row = next(line for line in page.splitlines() if line.startswith(f"| `{name}` "))
    return [cell.strip() for cell in row.strip("|").split("|")]


@pytest.mark.parametrize("name", list(STUDIES))
def test_the_pages_say_what_the_verdicts_say(name: str) -> None:
    data = load_results(STUDY_DIR / name)
    status = data["comparisons"]["verdict"]["status"]
    seeds = len(data["seeds"])
    assert seeds == len(str(study_arguments(name)["seeds"]).split(","))  # the default run
    docs = _table_row((ROOT / "docs" / "contextual.md").read_text(), name)
    assert docs[1] == str(seeds) and docs[-1].startswith(WORDS[status]), docs
    readme = _table_row((ROOT / "README.md").read_text(), name)
    assert readme[0].startswith(f"`{name}` ({seeds}, ")
    assert re.match(rf"\*\*({'in part' if status == 'partly' else WORDS[status]})\*\*", readme[-1])


def test_the_readme_quotes_the_reports_sentence() -> None:
    results = load_results(STUDY_DIR / "report")
    sentence = comparison(results, ratios(results))["sentence"]
    assert f"> {sentence}\n" in (ROOT / "README.md").read_text()
