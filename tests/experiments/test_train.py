"""Training: deterministic, and a killed run resumed equals an uninterrupted one bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.experiments._training import assert_state_equal, kill_and_resume

from posenc import PosEncError
from posenc.experiments.tasks import make_task
from posenc.experiments.train import StepInfo, TrainDiverged, TrainSettings, train
from posenc.models import TinyTransformer


def _model(encoding: str = "rope", seed: int = 0, dropout: float = 0.1) -> TinyTransformer:
    torch.manual_seed(seed)
    return TinyTransformer(
        41, dim=16, num_layers=1, num_heads=2, encoding=encoding, dropout=dropout, max_len=24
    )


def _settings(**kw) -> TrainSettings:
    base = dict(steps=7, batch_size=4, seq_len=12, lr=1e-2, warmup=2, checkpoint_every=3, seed=5)
    return TrainSettings(**{**base, **kw})


@pytest.mark.parametrize(
    ("encoding", "random_positions", "optimizer"),
    [
        ("rope", None, "adamw"),
        ("learned", 24, "adamw"),
        ("t5", None, "adamw"),
        ("rope", None, "muon"),
        ("t5", None, "muon"),  # T5's bias table trains with AdamW, the blocks with Muon
    ],
)
def test_resumed_run_equals_uninterrupted_run_bit_for_bit(
    tmp_path: Path, encoding: str, random_positions: int | None, optimizer: str
) -> None:
    task = make_task("copy")
    settings = _settings(random_positions=random_positions, optimizer=optimizer)
    config = {"label": encoding}

    whole = _model(encoding)
    done = train(whole, task, settings, checkpoint=tmp_path / "whole.pt", config=config)

    steps_seen: list[int] = []
    resumed_model, resumed = kill_and_resume(
        _model(encoding),
        lambda: _model(encoding, seed=99),  # other weights: the checkpoint replaces them
        task,
        settings,
        tmp_path / "killed.pt",
        config=config,
        stop=5,
        saved=3,  # the last checkpoint is from step 3; steps 4-5 are lost with the process
        on_step=lambda info: steps_seen.append(info.step),
    )
    assert steps_seen == [4, 5, 6, 7]  # no step lost, none repeated twice in the result
    assert_state_equal(whole.state_dict(), resumed_model.state_dict())
    assert resumed.final_loss == done.final_loss
    assert resumed.resumed_from == 3 and done.resumed_from is None
    saved_whole = torch.load(tmp_path / "whole.pt", weights_only=True)["optimizer"]
    saved_resumed = torch.load(tmp_path / "killed.pt", weights_only=True)["optimizer"]
    parts = ("adamw", "muon") if optimizer == "muon" else (None,)
    for part in parts:
        whole_state = saved_whole[part]["state"] if part else saved_whole["state"]
        resumed_state = saved_resumed[part]["state"] if part else saved_resumed["state"]
        assert whole_state.keys() == resumed_state.keys() and whole_state
        for index in whole_state:
            assert_state_equal(whole_state[index], resumed_state[index])


def test_training_is_deterministic_and_learns() -> None:
    task = make_task("copy")
    settings = _settings(steps=30, checkpoint_every=0, lr=3e-2)
    a, b = _model(dropout=0.0), _model(dropout=0.0)
    losses: list[float] = []
    result = train(a, task, settings, on_step=lambda info: losses.append(info.loss))
    train(b, task, settings)
    assert_state_equal(a.state_dict(), b.state_dict())
    assert result.steps == 30 and result.seconds > 0 and result.tokens_per_second > 0
    assert result.final_loss == pytest.approx(sum(losses[-10:]) / 10)
    assert sum(losses[-5:]) < sum(losses[:5])  # copying letters: loss falls from ln(26)


def test_a_finished_checkpoint_is_not_trained_again(tmp_path: Path) -> None:
    task = make_task("reverse")
    settings = _settings(steps=3)
    model = _model()
    first = train(model, task, settings, checkpoint=tmp_path / "r.pt", config={})
    again_model = _model(seed=4)
    calls: list[StepInfo] = []
    again = train(
        again_model,
        task,
        settings,
        checkpoint=tmp_path / "r.pt",
        config={},
        resume=True,
        on_step=calls.append,
    )
    assert calls == []
    assert_state_equal(model.state_dict(), again_model.state_dict())
    assert again.final_loss == first.final_loss and again.seconds == first.seconds


def test_resume_refuses_another_configuration(tmp_path: Path) -> None:
    task = make_task("copy")
    train(_model(), task, _settings(steps=3), checkpoint=tmp_path / "c.pt", config={"label": "a"})
    for steps, label, difference in (
        (4, "a", r"train: .*\"steps\": 3"),
        (3, "b", r'label: "a" != "b"\)'),
    ):
        with pytest.raises(PosEncError, match=rf"different configuration \({difference}"):
            train(
                _model(),
                task,
                _settings(steps=steps),
                checkpoint=tmp_path / "c.pt",
                config={"label": label},
                resume=True,
            )
    saved = json.loads(torch.load(tmp_path / "c.pt", weights_only=True)["config"])
    assert saved["world_size"] == 1 and saved["train"]["steps"] == 3


def test_a_diverging_run_stops_with_an_error() -> None:
    model = _model(dropout=0.0)
    with torch.no_grad():
        model.embed.weight.fill_(float("nan"))
    with pytest.raises(TrainDiverged, match="training loss became nan at step 1; lower the lr"):
        train(model, make_task("copy"), _settings(steps=2))


def test_bad_settings() -> None:
    with pytest.raises(PosEncError, match="optimizer must be one of 'adamw', 'muon', got 'sgd'"):
        _settings(optimizer="sgd")
    with pytest.raises(PosEncError, match="steps must be >= 1, got 0"):
        _settings(steps=0)
    with pytest.raises(PosEncError, match="random_positions must be >= 12, got 8"):
        _settings(random_positions=8)
    with pytest.raises(PosEncError, match=r"lr must be > 0\.0, got 0\.0"):
        _settings(lr=0.0)
