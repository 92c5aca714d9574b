"""StudySettings: built once from a preset and the options, frozen, recorded in results.json,
handed whole to run_study; the loose-option call of run_study and the old name warn."""

from __future__ import annotations

import dataclasses
import json
import pickle
import warnings
from pathlib import Path

import pytest

from posenc import PosEncError
from posenc.experiments import PRESETS, StudySettings, run_study
from posenc.experiments.settings import STUDY_OPTIONS, resolve

from .tiny import TINY, run_cli, tiny_study


def test_from_options_fills_the_preset_and_checks_once() -> None:
    study = StudySettings.from_options("copy", "rope,alibi", preset="quick", steps=20)
    quick = PRESETS["quick"]
    assert study.task == "copy" and study.labels == ("rope", "alibi")
    assert study.train_len == study.train.seq_len == quick["train_len"]
    assert study.eval_lens == tuple(quick["eval_lens"])
    assert (study.train.steps, study.train.warmup, study.train.seed) == (20, 2, 0)
    assert (study.model.dim, study.model.num_layers) == (quick["dim"], quick["num_layers"])
    assert study.seeds == (0,) and study.extend == () and study.finetune_steps == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        study.train_len = 64
    assert pickle.loads(pickle.dumps(study)) == study  # it travels to the worker processes


def test_resolve_is_from_options_checked_for_the_processes() -> None:
    options = {"preset": "quick", "steps": 20, "batch_size": 12}
    assert resolve("copy", ["rope"], options, 1) == StudySettings.from_options(
        "copy", ["rope"], preset="quick", steps=20, batch_size=12
    )
    assert options == {"preset": "quick", "steps": 20, "batch_size": 12}  # left as it was
    with pytest.raises(PosEncError, match=r"batch_size must be divisible by the number of "):
        resolve("copy", ["rope"], options, 8)


def test_an_unknown_option_is_refused_by_name() -> None:
    with pytest.raises(PosEncError, match=r"study options must be among train_len, .*got 'stesp'"):
        StudySettings.from_options("copy", ["rope"], stesp=3)
    assert "seeds" in STUDY_OPTIONS and "out_dir" not in STUDY_OPTIONS


def test_results_json_records_the_settings(tmp_path: Path) -> None:
    study = tiny_study("copy", ["none"], train_len=9, eval_lens=[9], seeds="0,1")
    results = run_study(study, out_dir=tmp_path, plot=False)
    assert results["settings"] == study.to_record()
    assert json.loads((tmp_path / "results.json").read_text())["settings"] == study.to_record()
    record = study.to_record()
    assert list(record) == [
        "model", "train", "seeds", "extend", "extend_factor", "finetune_steps", "eval_tokens",
        "eval_examples", "task_options", "layer",
    ]  # fmt: skip
    assert record["seeds"] == [0, 1] and record["train"]["seed"] == 0
    assert record["eval_tokens"] is None and record["eval_examples"] == TINY["eval_examples"]
    lm = tiny_study("lm", ["rope"]).to_record()
    assert lm["eval_tokens"] == TINY["eval_tokens"] and lm["eval_examples"] is None


def test_the_loose_option_call_warns_and_runs_the_same_study() -> None:
    options = dict(TINY, train_len=9, eval_lens=[9])
    with pytest.warns(DeprecationWarning, match=r"run_study\(task, encodings, \*\*options\)"):
        loose = run_study("copy", ["none"], plot=False, **options)
    with pytest.warns(DeprecationWarning):
        keywords = run_study(task="copy", encodings=["none"], plot=False, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        whole = run_study(StudySettings.from_options("copy", ["none"], **options), plot=False)
    for results in (loose, keywords):
        assert results["settings"] == whole["settings"]
        assert [r["eval"] for r in results["runs"]] == [r["eval"] for r in whole["runs"]]


def test_settings_and_loose_options_together_are_refused() -> None:
    study = tiny_study()
    with pytest.raises(
        PosEncError,
        match=r"^settings is a StudySettings: run_study takes no study options besides, got \[.steps=.\]",
    ):
        run_study(study, steps=3)
    with pytest.raises(PosEncError, match=r"got \[\"\[.rope.\]\"\]"):
        run_study(study, ["rope"])


def test_the_old_name_study_warns() -> None:
    import posenc.experiments.settings as settings

    with pytest.warns(DeprecationWarning, match="Study is now StudySettings"):
        assert settings.Study is StudySettings


def test_cli_eval_lens_are_multiples_of_the_named_studys_train_len(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """``--study NAME --scale paper --eval-lens L,2L``: L is the study's train_len (512)."""
    seen: list[StudySettings] = []

    def stop(settings: StudySettings, **run) -> dict:
        seen.append(settings)
        raise PosEncError("stopped before training")

    monkeypatch.setattr("posenc.experiments.lengthgen.run_study", stop)
    argv = ["lengthgen", "--study", "counting", "--scale", "paper", "--eval-lens", "L,2L"]
    code, _, err = run_cli([*argv, "--out", str(tmp_path / "out"), "--quiet"], capsys)
    assert code == 2 and "stopped before training" in err
    [study] = seen
    assert (study.train_len, study.eval_lens, study.model.dim) == (512, (512, 1024), 256)
