"""The report's study findings: per-seed ratios, the literature's checks, the comparison
with Press et al. and its sentence, on results whose answers are known by construction."""

from __future__ import annotations

import math
from typing import Any

import pytest

from posenc.experiments.results import comparisons_record, summarize
from posenc.report.literature import PRESS_2022, press_ratios
from posenc.report.study import (
    LENGTHGEN_SETTINGS,
    PRESS_COMPARISONS,
    checks,
    comparison,
    ratios,
)
from posenc.report.study_figure import draw_headline

LENS = [64, 128, 256, 512]


def _results(ppl: dict[str, list[list[float | None]]]) -> dict[str, Any]:
    """A run_study-shaped result: ``ppl[label][seed]`` lists the perplexity at each of
    LENS (None: the cell errored, as a learned table past L)."""
    runs = []
    for label, per_seed in ppl.items():
        for seed, values in enumerate(per_seed):
            cells = {}
            for length, p in zip(LENS, values):
                cells[str(length)] = (
                    {"error": "positions must be in [0, max_len)"}
                    if p is None
                    else {"loss": math.log(p), "ppl": p}
                )
            runs.append({"encoding": label, "seed": seed, "eval": cells, "train": {}})
    seeds = sorted({r["seed"] for r in runs})
    record = {
        "task": "lm",
        "metric": "ppl",
        "train_len": 64,
        "eval_lens": LENS,
        "seeds": seeds,
        "runs": runs,
        "summary": summarize(runs, LENS),
    }
    record["comparisons"] = comparisons_record(record, PRESS_COMPARISONS)
    return record


AS_IN_THE_PAPER = {  # three seeds each
    "sinusoidal": [[8.0, 12.0, 16.0, 28.0], [8.8, 12.1, 17.6, 30.8], [8.4, 12.2, 16.8, 29.0]],
    "rope": [[7.0, 8.0, 10.0, 12.6], [7.2, 8.1, 10.2, 13.0], [7.1, 8.05, 10.1, 12.8]],
    "t5": [[7.5, 7.6, 8.0, 9.0], [7.4, 7.5, 7.9, 9.0], [7.45, 7.55, 7.95, 9.0]],
    "alibi": [[8.0, 7.9, 7.9, 7.8], [8.2, 8.1, 8.0, 8.0], [8.1, 8.0, 7.95, 7.9]],
    "learned": [[8.5, None, None, None], [8.6, None, None, None], [8.55, None, None, None]],
    "none": [[9.0, 9.2, 9.5, 10.0], [9.1, 9.3, 9.6, 10.1], [9.05, 9.25, 9.55, 10.05]],
}


def test_ratios_are_each_seeds_own_model_against_itself() -> None:
    r = ratios(_results(AS_IN_THE_PAPER))
    sin = r["sinusoidal"]["512"]
    each = [28 / 8, 30.8 / 8.8, 29.0 / 8.4]
    assert sin == {"mean": math.fsum(each) / 3, "min": min(each), "max": max(each)}
    assert r["rope"]["64"] == {"mean": 1.0, "min": 1.0, "max": 1.0}
    assert r["alibi"]["512"]["min"] == 7.8 / 8.0 and r["alibi"]["512"]["max"] == 8.0 / 8.2
    assert list(r["learned"]) == ["64"]  # no ratio where the model cannot run


def test_every_check_holds_on_the_literatures_picture() -> None:
    results = _results(AS_IN_THE_PAPER)
    found = checks(results, ratios(results), quick=False)
    assert [c["holds"] for c in found] == [True] * 6, found
    claims = " / ".join(c["claim"] for c in found)
    for part in ("below 9", "ALiBi stays within 10%", "sinusoidal degrades", "RoPE degrades"):
        assert part in claims
    assert "T5's bias lies in between" in claims and "learned absolute" in claims
    assert found[-1]["detail"] == "refused at 128, 256, 512"


@pytest.mark.parametrize(
    ("label", "seed", "values", "failing"),
    [
        # one seed rises 12%: ALiBi and T5 are no longer apart beyond the spread either
        ("alibi", 1, [8.2, 8.1, 8.0, 9.2], ("ALiBi stays within 10%", "T5's bias")),
        ("rope", None, [7.0, 7.0, 7.0, 8.8], "RoPE degrades"),  # every seed only 1.26x
        ("sinusoidal", 1, [9.5, 12.0, 16.0, 30.0], "the models have learned"),
        ("t5", 0, [7.5, 9.0, 15.0, 30.0], "T5's bias lies in between"),
        ("learned", 0, [8.5, 8.6, None, None], "learned absolute"),
    ],
)
def test_a_check_fails_when_its_numbers_say_so(
    label: str, seed: int | None, values: list[float | None], failing: str | tuple[str, ...]
) -> None:
    """``seed`` None: every seed's values."""
    ppl = {k: [list(v) for v in vs] for k, vs in AS_IN_THE_PAPER.items()}
    for s in range(3) if seed is None else (seed,):
        ppl[label][s] = values
    results = _results(ppl)
    found = {c["claim"]: c["holds"] for c in checks(results, ratios(results), quick=False)}
    parts = (failing,) if isinstance(failing, str) else failing
    assert [claim for claim, holds in found.items() if not holds] == [
        claim for claim in found if any(part in claim for part in parts)
    ]


def test_quick_checks_expect_a_smaller_rise_and_no_perplexity_bound() -> None:
    ppl = {k: v for k, v in AS_IN_THE_PAPER.items() if k in ("sinusoidal", "rope", "alibi")}
    ppl["rope"] = [[7.0, 7.2, 7.6, 8.2], [7.0, 7.1, 7.6, 8.1]]  # 1.16x: enough for --quick
    results = _results(ppl)
    quick = checks(results, ratios(results), quick=True)
    assert [c["holds"] for c in quick] == [True, True, True]
    full = {c["claim"]: c["holds"] for c in checks(results, ratios(results), quick=False)}
    assert full["RoPE degrades past L: at least 1.3x by 8L (mean over the seeds)"] is False


def test_press_ratios_are_the_tables_numbers() -> None:
    table = PRESS_2022["ppl"]
    r = press_ratios()
    assert r["sinusoidal"][4512 / 512] == table[4512]["sinusoidal"] / table[512]["sinusoidal"]
    assert r["alibi"][1.0] == 1.0 and r["alibi"][4512 / 512] < 1.0  # ALiBi improves
    for method in ("sinusoidal", "rope", "t5"):
        assert r[method][4512 / 512] > 1.3 > r["alibi"][4512 / 512]


def test_comparison_pairs_each_multiple_with_the_nearest_row_of_the_table() -> None:
    results = _results(AS_IN_THE_PAPER)
    comp = comparison(results, ratios(results))
    assert [(c["ours"], c["theirs_len"]) for c in comp["columns"]] == [
        (2.0, 1012),
        (4.0, 2512),
        (8.0, 4512),
    ]
    assert [r["encoding"] for r in comp["rows"]] == ["sinusoidal", "rope", "t5", "alibi"]
    rope = comp["rows"][1]["cells"][-1]
    assert rope["theirs"] == PRESS_2022["ppl"][4512]["rope"] / PRESS_2022["ppl"][512]["rope"]
    assert rope["ours"] == ratios(results)["rope"]["512"]
    sentence = comp["sentence"]
    assert comp["status"] == "reproduced"
    assert [(v["a"], v["b"], v["length"], v["verdict"]) for v in comp["verdicts"]] == [
        (a, b, n, "better")
        for a, b in (("alibi", "t5"), ("t5", "rope"), ("rope", "sinusoidal"))
        for n in (128, 256, 512)
    ]
    assert sentence.startswith(
        "Agrees with Press et al.: their order of the growth, alibi < t5 < rope < sinusoidal, "
        "each pair beyond the seeds' spread at every length past L (to 8L, theirs 8.8L)"
    )
    assert "ALiBi stays flat in every seed" in sentence and "Level at this scale" not in sentence
    assert "Differs: the rise of the others is smaller here" in sentence


def test_the_sentence_says_when_the_order_differs() -> None:
    ppl = dict(AS_IN_THE_PAPER)
    ppl["rope"] = [[7.0, 9.0, 20.0, 40.0], [7.0, 9.1, 20.4, 42.0], [7.0, 9.0, 20.2, 41.0]]
    results = _results(ppl)
    comp = comparison(results, ratios(results))
    sentence = comp["sentence"]
    assert comp["status"] == "not reproduced"
    assert sentence.startswith("Agrees with Press et al. at 8L (theirs 8.8L): ALiBi below T5")
    assert "T5 below RoPE at 8L" in sentence  # still as theirs
    assert "Differs: RoPE above sinusoidal at 8L" in sentence
    assert "mixed in size" in sentence  # rope's rise is larger here, the others' smaller


def test_overlapping_seeds_are_called_level_and_never_ordered() -> None:
    """T5 and RoPE whose seeds overlap: a mean below is not an order."""
    ppl = dict(AS_IN_THE_PAPER)
    ppl["t5"] = [[7.5, 8.0, 9.0, 12.0], [7.4, 7.9, 9.5, 13.5], [7.45, 7.9, 9.3, 13.9]]
    ppl["rope"] = [[7.0, 8.0, 10.0, 11.9], [7.2, 8.1, 10.2, 13.3], [7.1, 8.0, 10.1, 12.6]]
    results = _results(ppl)
    comp = comparison(results, ratios(results))
    t5 = ratios(results)["t5"]["512"]
    rope = ratios(results)["rope"]["512"]
    assert t5["mean"] < rope["mean"] and t5["max"] > rope["min"]  # below on average, overlapping
    assert comp["status"] == "partly"
    sentence = comp["sentence"]
    assert "Level at this scale: T5 level with RoPE at 8L" in sentence
    assert "T5 below RoPE" not in sentence and "t5 < rope" not in sentence
    found = {c["claim"]: c["holds"] for c in checks(results, ratios(results), quick=False)}
    assert not found[
        "T5's bias lies in between at 8L: flatter than RoPE, steeper than ALiBi, "
        "each beyond the seeds' spread (95% interval)"
    ]


def test_headline_figure_draws_ours_with_bands_and_theirs_dashed() -> None:
    results = _results(AS_IN_THE_PAPER)
    fig = draw_headline(results, ratios(results), dpi=40)
    left, right = fig.axes
    assert [line.get_label() for line in left.get_lines()][:6] == list(AS_IN_THE_PAPER)
    assert len(left.collections) == 6  # a min-max band per encoding
    theirs = [line for line in right.get_lines() if "(Press et al.)" in str(line.get_label())]
    assert len(theirs) == 4 and all(line.get_linestyle() == "--" for line in theirs)
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_the_report_settings_train_several_seeds_past_8L() -> None:
    for quick, settings in LENGTHGEN_SETTINGS.items():
        assert len(settings["seeds"]) >= (2 if quick else 3)
        assert max(settings["eval_lens"]) >= 8 * min(settings["eval_lens"])
        assert {"sinusoidal", "rope", "alibi"} <= set(settings["encodings"])
    assert {"none", "learned", "t5"} <= set(LENGTHGEN_SETTINGS[False]["encodings"])
    assert LENGTHGEN_SETTINGS[False]["extend"] and not LENGTHGEN_SETTINGS[False]["finetune_steps"]
