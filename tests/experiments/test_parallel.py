"""Seeds and worker processes: every (seed, encoding) unit gives the same numbers in a
worker as in this process, the summary holds the spread, and the seeds are checked."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from posenc import PosEncError
from posenc.experiments import run_study
from posenc.experiments.results import summarize
from posenc.experiments.settings import resolve
from posenc.experiments.train import TrainDiverged

from .schema import check_results
from .tiny import tiny_study

RUN: dict[str, Any] = dict(threads=1, plot=False)  # how every study here runs
#: the serial and the parallel study: RoPE extended by PI with a fine-tune, two seeds
EXTENDED: dict[str, Any] = dict(
    train_len=8, eval_lens=[8, 16], extend=["pi"], extend_factor=2.0, finetune_steps=2, steps=4
)
_TIMING = {"seconds", "tokens_per_second"}


def _numbers(results: dict[str, Any]) -> dict[str, Any]:
    """``results`` without what depends on the clock or on how the study ran."""
    out = json.loads(json.dumps(results))
    out.pop("seconds")
    out.pop("environment")
    for run in out["runs"]:
        for key in _TIMING:
            run["train"].pop(key, None)
    return out


@pytest.fixture(scope="module")
def serial() -> dict[str, Any]:
    study = tiny_study("lm", ["alibi", "rope", "learned"], seeds=[0, 1], **EXTENDED)
    return run_study(study, jobs=1, **RUN)


def test_each_run_carries_its_seed_and_units_keep_their_order(serial: dict[str, Any]) -> None:
    labels = ["alibi", "alibi", "rope", "rope+pi", "rope+pi+ft", "rope", "rope+pi", "rope+pi+ft"]
    labels += ["learned", "learned"]
    check_results(serial, task="lm", train_len=8, eval_lens=[8, 16], encodings=labels)
    assert [r["seed"] for r in serial["runs"]] == [0, 1, 0, 0, 0, 1, 1, 1, 0, 1]
    assert serial["seeds"] == [0, 1] and serial["settings"]["train"]["seed"] == 0


def test_seeds_give_different_models(serial: dict[str, Any]) -> None:
    alibi = [r for r in serial["runs"] if r["encoding"] == "alibi"]
    assert alibi[0]["train"]["final_loss"] != alibi[1]["train"]["final_loss"]
    assert alibi[0]["eval"]["8"]["loss"] != alibi[1]["eval"]["8"]["loss"]


def test_one_seed_of_several_equals_a_study_of_that_seed(serial: dict[str, Any]) -> None:
    one = run_study(
        tiny_study("lm", ["alibi"], seed=1, train_len=8, eval_lens=[8, 16], steps=4), **RUN
    )
    [run] = one["runs"]
    [same] = [r for r in serial["runs"] if r["encoding"] == "alibi" and r["seed"] == 1]
    assert _numbers({"runs": [run], "seconds": 0, "environment": 0}) == _numbers(
        {"runs": [same], "seconds": 0, "environment": 0}
    )


def test_summary_mean_min_max_per_encoding_and_length(serial: dict[str, Any]) -> None:
    summary = serial["summary"]
    assert list(summary) == ["alibi", "rope", "rope+pi", "rope+pi+ft", "learned"]
    for label, cells in summary.items():
        runs = [r for r in serial["runs"] if r["encoding"] == label]
        for length in ("8", "16"):
            values = [r["eval"][length].get("ppl") for r in runs]
            if label == "learned" and length == "16":  # a table of 8 rows cannot reach 16
                assert cells[length]["seeds"] == 0 and "max_len=8" in cells[length]["error"]
                continue
            assert cells[length]["seeds"] == 2
            assert cells[length]["ppl"] == {
                "mean": math.fsum(values) / 2,
                "min": min(values),
                "max": max(values),
            }
            losses = [r["eval"][length]["loss"] for r in runs]
            assert cells[length]["loss"]["min"] == min(losses)
    assert summarize(serial["runs"], serial["eval_lens"]) == summary


def test_workers_give_the_numbers_of_a_serial_run(serial: dict[str, Any], tmp_path: Path) -> None:
    events: list[tuple[str, str, int]] = []
    parallel = run_study(
        tiny_study("lm", ["alibi", "rope", "learned"], seeds="0,1", **EXTENDED),
        jobs=2,
        out_dir=tmp_path,
        on_event=lambda kind, fields: events.append((kind, fields["label"], fields["seed"])),
        **RUN,
    )
    assert _numbers(parallel) == _numbers(serial)
    assert parallel["environment"]["jobs"] == 2 and serial["environment"]["jobs"] == 1
    assert json.loads((tmp_path / "results.json").read_text()) == parallel
    # every unit's checkpoints, named by seed; every run's events came back from the workers
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == sorted(
        f"{label}.seed{s}.pt"
        for label in ("alibi", "rope", "rope+pi+ft", "learned")
        for s in (0, 1)
    )
    for kind in ("run", "eval", "done"):
        assert {(label, s) for k, label, s in events if k == kind} >= {
            (label, s) for label in ("alibi", "rope", "learned") for s in (0, 1)
        }


def test_a_damaged_checkpoint_of_one_seed_is_refused_before_any_worker_starts(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    (ckpt / "alibi.seed1.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(PosEncError, match=r"alibi\.seed1\.pt"):
        study = tiny_study("lm", ["alibi"], seeds=[0, 1], train_len=8, eval_lens=[8], steps=4)
        run_study(study, jobs=2, out_dir=tmp_path, resume=True, **RUN)


def test_a_failing_worker_stops_the_study_with_its_error() -> None:
    with pytest.raises(TrainDiverged, match="loss"):
        study = tiny_study(
            "lm", ["alibi", "rope"], seeds=[0, 1], train_len=8, eval_lens=[8], steps=4, lr=1e30
        )
        run_study(study, jobs=2, **RUN)


@pytest.mark.parametrize(
    ("options", "pattern"),
    [
        ({"seeds": []}, r"seeds must hold at least one seed"),
        ({"seeds": ""}, r"seeds must not hold an empty entry, got ''"),
        ({"seeds": [0, 0]}, r"seeds must be distinct, got \[0, 0\]"),
        ({"seeds": "0,x"}, r"seeds entries must be integers \(digits, an optional -\), got 'x'"),
        ({"seeds": [0.5]}, r"seeds entry"),
        ({"seeds": 3}, r"seeds must be a list of integers, got 3"),
        ({"seeds": [0], "seed": 1}, r"give seed or seeds, not both"),
        ({"seeds": list(range(1001))}, r"seeds must hold at most 1000 seeds, got 1001"),
        ({"jobs": 0}, r"jobs"),
        ({"jobs": True}, r"jobs"),
        ({"jobs": 2.0}, r"jobs"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_seeds_and_jobs_are_refused(options: dict[str, Any], pattern: str) -> None:
    run = {k: v for k, v in options.items() if k == "jobs"}  # the run's own
    given = {k: v for k, v in options.items() if k != "jobs"}
    with pytest.raises(PosEncError, match=pattern):
        study = tiny_study("lm", ["alibi"], train_len=8, eval_lens=[8], steps=4, **given)
        run_study(study, **run, **RUN)


def _study(encodings: list[str], **options: Any) -> Any:
    return resolve("lm", encodings, {"preset": "quick", **options}, 1)


@pytest.mark.parametrize(
    ("extend", "finetune_steps", "expected"),
    [
        # rope extends: its seeds go first (encoding-major units: none s0, none s1, rope s0, ...)
        (("pi", "yarn"), 0, [2, 3, 0, 1, 4, 5]),
        (("pi",), 5, [2, 3, 0, 1, 4, 5]),
        # nothing extends: every unit is the same work and keeps its place
        ((), 0, [0, 1, 2, 3, 4, 5]),
    ],
)
def test_workers_take_the_longest_units_first(
    extend: tuple[str, ...], finetune_steps: int, expected: list[int]
) -> None:
    from posenc.experiments.parallel import Unit, dispatch_order

    study = _study(
        ["none", "rope", "alibi"],
        steps=3,
        seeds=[0, 1],
        extend=list(extend),
        finetune_steps=finetune_steps,
    )
    units = [Unit(s, e, {"name": e}) for e in study.labels for s in study.seeds]
    assert dispatch_order(units, study) == expected
