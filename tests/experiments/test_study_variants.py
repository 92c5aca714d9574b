"""Study variants (p-RoPE, DroPE), per-layer schedules, study-wide layer settings and the
tasks' own options: labels and specs, the models built, DroPE's drop in training and resume,
the study settings that reach the runs, flip-flop's extra splits, and ``posenc lengthgen``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import posenc
from posenc import PosEncError
from posenc.experiments import run_study
from posenc.experiments.distributed import Dist
from posenc.experiments.evaluate import evaluate
from posenc.experiments.models import (
    VARIANTS,
    ModelSettings,
    build_model,
    encoding_label,
    encoding_spec,
    split_spec,
)
from posenc.experiments.runner import Runner
from posenc.experiments.settings import make_study_task, resolve
from posenc.experiments.tasks import FlipFlopTask, make_task
from posenc.experiments.train import StepInfo, TrainSettings, train
from posenc.models import TinyTransformer
from posenc.models.schedules import local_global, nope_every

from .tiny import CLI_TINY as CLI_ARGS
from .tiny import check_one_line_error, run_cli, tiny_study

# --- encoding_label / encoding_spec ---------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "label", "config"),
    [
        (
            "prope-0.25",
            "prope-0.25",
            {"name": "rope", "scaling": {"type": "proportional"}, "rotary_fraction": 0.25},
        ),
        (
            "prope-0.75",
            "prope-0.75",
            {"name": "rope", "scaling": {"type": "proportional"}, "rotary_fraction": 0.75},
        ),
        ("drope", "drope", {"name": "rope", "drope_at": 0.85}),
        ("rope@nope-every-4", "rope@nope-every-4", {"name": "rope", "schedule": "nope-every-4"}),
        ("rope@local-global", "rope@local-global", {"name": "rope", "schedule": "local-global"}),
        ("cope@local-global", "cope@local-global", {"name": "cope", "schedule": "local-global"}),
        ("alibi@nope-every-2", "alibi@nope-every-2", {"name": "alibi", "schedule": "nope-every-2"}),
        ("nope@nope-every-2", "none@nope-every-2", {"name": "none", "schedule": "nope-every-2"}),
        (" rope@nope-every-4 ", "rope@nope-every-4", {"name": "rope", "schedule": "nope-every-4"}),
        (
            "prope-0.75@nope-every-4",
            "prope-0.75@nope-every-4",
            {
                "name": "rope",
                "scaling": {"type": "proportional"},
                "rotary_fraction": 0.75,
                "schedule": "nope-every-4",
            },
        ),
        (
            "drope@local-global",
            "drope@local-global",
            {"name": "rope", "drope_at": 0.85, "schedule": "local-global"},
        ),
        (
            "t5@nope-every-2",
            "t5@nope-every-2",
            {
                "name": "t5",
                "schedule": "nope-every-2",
                "max_distance": 16,
                "causal": True,
                "num_buckets": 16,
            },
        ),
        (
            {"name": "drope", "drope_at": 0.5},
            "drope",
            {"name": "rope", "drope_at": 0.5},
        ),
        (
            {"name": "rope@nope-every-2", "base": 500.0},
            "rope@nope-every-2",
            {"name": "rope", "base": 500.0, "schedule": "nope-every-2"},
        ),
    ],
    ids=[
        "prope-0.25",
        "prope-0.75",
        "drope",
        "rope-nope-every-4",
        "rope-local-global",
        "cope-local-global",
        "alibi-nope-every-2",
        "nope-alias",
        "spaces-stripped",
        "variant-with-schedule",
        "drope-with-schedule",
        "t5-completed-with-schedule",
        "dict-variant-override",
        "dict-with-schedule",
    ],
)
def test_labels_and_specs(spec: Any, label: str, config: dict[str, Any]) -> None:
    assert encoding_label(spec) == label
    assert encoding_spec(spec, train_len=16) == config


def test_every_variant_has_a_label_spec_and_description() -> None:
    assert list(VARIANTS) == ["prope-0.25", "prope-0.75", "drope"]
    for name, (encoding, extra, about) in VARIANTS.items():
        assert encoding_label(name) == name
        spec = encoding_spec(name, train_len=8)
        assert spec == {**encoding, **extra}
        assert split_spec(spec) == (encoding, extra)
        assert isinstance(about, str) and about


def test_the_spec_of_a_variant_is_a_fresh_dict(monkeypatch) -> None:
    """A spec is the caller's to complete (a study adds ``drope_at``, ``build_model`` the
    ``rotary_dim``): changing it, nested dicts included, must not change :data:`VARIANTS`."""
    import copy

    # Mutations below land in this copy, which monkeypatch puts back after the test.
    monkeypatch.setitem(VARIANTS, "prope-0.75", copy.deepcopy(VARIANTS["prope-0.75"]))
    spec = encoding_spec("prope-0.75", train_len=8)
    spec["rotary_fraction"] = 0.1
    assert encoding_spec("prope-0.75", train_len=8)["rotary_fraction"] == 0.75
    spec["scaling"]["type"] = "linear"
    # fails: encoding_spec copies VARIANTS shallowly, the "scaling" dict is shared
    assert encoding_spec("prope-0.75", train_len=8)["scaling"] == {"type": "proportional"}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "rope@every-3",
            r"the schedule after '@' must be one of 'nope-every-4', 'nope-every-2', "
            r"'llama4', 'local-global', got 'every-3' \(in 'rope@every-3'\)",
        ),
        ("rope@", r"the schedule after '@' must be one of .*got '' \(in 'rope@'\)"),
        ("drope@nope-every-3", r"got 'nope-every-3' \(in 'drope@nope-every-3'\)"),
        ("fancy", r"encoding name must be one of 'none', .*got 'fancy'"),
        ("prope-x", r"encoding name must be one of 'none', .*got 'prope-x'"),
        ("fancy@nope-every-4", r"encoding name must be one of 'none', .*got 'fancy'"),
        ({"base": 10.0}, r"encoding must be a registry name or a config dict, got \{'base'"),
        (3, "encoding must be a registry name or a config dict, got 3"),
    ],
    ids=[
        "unknown-schedule",
        "empty-schedule",
        "variant-unknown-schedule",
        "unknown-name",
        "unknown-variant",
        "unknown-name-with-schedule",
        "dict-without-name",
        "not-a-spec",
    ],
)
def test_bad_encodings_are_refused(spec: Any, message: str) -> None:
    with pytest.raises(PosEncError, match=message):
        encoding_label(spec)
    with pytest.raises(PosEncError, match=message):
        encoding_spec(spec, train_len=16)


# --- build_model ----------------------------------------------------------------------------


def _build(
    name: Any, *, dim: int = 32, heads: int = 2, layers: int = 1, **kw: Any
) -> TinyTransformer:
    settings = ModelSettings(dim=dim, num_layers=layers, num_heads=heads)
    return build_model(
        11, encoding_spec(name, train_len=16), settings, max_len=16, seed=0, train_len=16, **kw
    )


@pytest.mark.parametrize(
    ("variant", "dim", "heads"),
    [
        ("prope-0.75", 32, 2),  # head_dim 16: 12 rotated
        ("prope-0.25", 32, 2),  # head_dim 16: 4
        ("prope-0.75", 24, 2),  # head_dim 12: 9 -> 8 (whole pairs)
        ("prope-0.25", 24, 2),  # head_dim 12: 3 -> 2
        ("prope-0.75", 16, 2),  # head_dim 8: 6
    ],
    ids=["0.75-hd16", "0.25-hd16", "0.75-hd12", "0.25-hd12", "0.75-hd8"],
)
def test_prope_rotates_the_highest_frequencies_of_full_rope(
    variant: str, dim: int, heads: int
) -> None:
    model = _build(variant, dim=dim, heads=heads)
    head_dim = dim // heads
    fraction = VARIANTS[variant][1]["rotary_fraction"]
    rotary_dim = 2 * int(fraction * head_dim // 2)
    enc = model.encoding
    assert type(enc) is posenc.RotaryEmbedding
    assert enc.to_config() == {
        "name": "rope",
        "head_dim": head_dim,
        "base": 10000.0,
        "rotary_dim": rotary_dim,
        "layout": "half",
        "scaling": {"factor": 1.0, "type": "proportional"},
        "sections": None,
    }
    full = posenc.RotaryEmbedding(head_dim).inv_freq
    assert torch.equal(enc.inv_freq, full[: rotary_dim // 2])


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"name": "rope", "rotary_fraction": 1.5}, r"rotary_fraction must be <= 1\.0, got 1\.5"),
        ({"name": "rope", "rotary_fraction": -0.5}, r"rotary_fraction must be >= 0\.0, got -0\.5"),
        ({"name": "rope", "rotary_fraction": 0.1}, "rotary_dim must be >= 2, got 0"),
    ],
    ids=["above-one", "negative", "no-whole-pair"],
)
def test_bad_rotary_fractions_are_refused(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(PosEncError, match=message):
        build_model(11, spec, ModelSettings(dim=32, num_heads=2), max_len=16, seed=0)


def test_nope_every_4_leaves_the_rotary_encoding_out_of_the_4th_layer() -> None:
    model = _build("rope@nope-every-4", dim=16, layers=4)
    kinds = [type(model.layer_encoding(i)) for i in range(4)]
    assert kinds == [posenc.RotaryEmbedding] * 3 + [posenc.NoPositionalEncoding]
    assert all(model.layer_encoding(i) is model.encoding for i in range(3))
    assert [layer.get("encoding") for layer in model.to_config()["layers"]] == [
        None,
        None,
        None,
        {"name": "none"},
    ]


def test_a_schedule_is_sized_by_train_len() -> None:
    model = _build("rope@local-global", dim=16, layers=2)
    assert [layer["window"] for layer in model.to_config()["layers"]] == [4, 4]  # 16 // 4


@pytest.mark.parametrize(
    ("name", "layers"),
    [("rope", 3), ("rope@nope-every-4", 4), ("prope-0.75@nope-every-2", 2)],
    ids=["no-schedule", "nope-every-4", "variant-nope-every-2"],
)
def test_layer_settings_reach_every_block_and_merge_with_a_schedule(name: str, layers: int) -> None:
    plain = _build(name, dim=16, layers=layers)
    assert [block.attn.q_norm for block in plain.blocks] == [None] * layers
    temperature = {"type": "ssmax", "init": 0.43}
    model = _build(name, dim=16, layers=layers, layer={"qk_norm": True, "temperature": temperature})
    assert all(isinstance(block.attn.q_norm, nn.RMSNorm) for block in model.blocks)
    assert all(isinstance(block.attn.k_norm, nn.RMSNorm) for block in model.blocks)
    got = model.to_config()["layers"]
    expected = plain.to_config()["layers"] or [{}] * layers
    assert got == [
        {"window": None, **layer, "qk_norm": True, "temperature": temperature} for layer in expected
    ]
    assert [type(e) for e in map(model.layer_encoding, range(layers))] == [
        type(e) for e in map(plain.layer_encoding, range(layers))
    ]


def test_a_variant_keeps_its_settings_under_local_global() -> None:
    """Library bug: local-global's layer specs (``{"name": "rope", "base": ...}``) replace
    the model's encoding in every layer, so ``prope-0.75@local-global`` is plain RoPE in
    every layer (and ``alibi@local-global`` never uses ALiBi), while the run record reports
    the unused model encoding (``rotary_dim`` 12)."""
    model = _build("prope-0.75@local-global", dim=32, layers=2)
    for i in range(2):
        config = model.layer_encoding(i).to_config()
        assert (config["rotary_dim"], config["scaling"]) == (
            12,
            {"factor": 1.0, "type": "proportional"},
        )


# --- DroPE: TinyTransformer.drop_rotary -----------------------------------------------------


def _tiny(encoding: Any = "rope", *, layers: Any = None, num_layers: int = 1, seed: int = 0):
    torch.manual_seed(seed)
    return TinyTransformer(
        41,
        dim=16,
        num_layers=num_layers,
        num_heads=2,
        encoding=encoding,
        dropout=0.1,
        max_len=24,
        layers=layers,
    )


@pytest.mark.parametrize(
    ("encoding", "layers", "num_layers"),
    [
        ("rope", None, 1),
        ("xpos", None, 1),
        ("rope", nope_every(4, 4), 4),
        ("rope", local_global(3, ratio=1, window=4), 3),
        ("alibi", local_global(2, ratio=1, window=4), 2),  # the layers' RoPE, the bias unused
    ],
    ids=["rope", "xpos", "rope-nope-every-4", "rope-local-global", "layer-rope-only"],
)
def test_drop_rotary_turns_every_rotary_module_into_nope(encoding, layers, num_layers) -> None:
    model = _tiny(encoding, layers=layers, num_layers=num_layers)
    before = model.to_config()
    rotary_model_encoding = isinstance(model.encoding, posenc.RotaryEmbedding)
    x = torch.randint(0, 41, (2, 9))
    assert model.drop_rotary() is True
    assert model.drop_rotary() is False  # nothing left to drop
    kinds = {type(model.layer_encoding(i)) for i in range(num_layers)}
    assert kinds == {posenc.NoPositionalEncoding}
    config = model.to_config()
    if rotary_model_encoding:
        assert config["encoding"] == {"name": "none"}
    else:
        assert config["encoding"] == before["encoding"]
    if layers is None:
        assert config["layers"] is None
    else:
        assert [layer.get("encoding") for layer in config["layers"]] == [
            {"name": "none"} if "encoding" in layer else None for layer in before["layers"]
        ]
    # The dropped model computes what a NoPE model with the same weights computes.
    nope = TinyTransformer.from_config({**config, "encoding": "none"})
    nope.load_state_dict(model.state_dict())
    model.eval(), nope.eval()
    with torch.no_grad():
        assert torch.equal(model(x), nope(x))
    # And its config builds it again.
    assert TinyTransformer.from_config(config).to_config() == config


@pytest.mark.parametrize("encoding", ["none", "sinusoidal", "alibi", "t5"])
def test_drop_rotary_leaves_other_encodings_alone(encoding: str) -> None:
    model = _tiny(encoding)
    before = model.to_config()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert model.drop_rotary() is False
    assert model.to_config() == before
    _assert_state_equal(model.state_dict(), state)


# --- DroPE in training ----------------------------------------------------------------------


def _settings(**kw: Any) -> TrainSettings:
    base = dict(steps=7, batch_size=4, seq_len=12, lr=1e-2, warmup=2, checkpoint_every=3, seed=5)
    return TrainSettings(**{**base, **kw})


def _assert_state_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _stop_after(k: int):
    def hook(info: StepInfo) -> None:
        if info.step == k:
            raise KeyboardInterrupt

    return hook


def _trained(encoding: str = "rope", **kw: Any) -> TinyTransformer:
    """A model built (from seed 0: the global generator too, for dropout) and trained."""
    model = _tiny(encoding)
    train(model, make_task("copy"), _settings(checkpoint_every=0, **kw))
    return model


@pytest.mark.parametrize("drope_step", [0, 3, 6], ids=["at-0", "at-3", "at-6"])
def test_the_model_trains_with_rope_before_drope_step_and_without_after(drope_step: int) -> None:
    model = _tiny()
    seen: list[tuple[int, str]] = []  # after each step: which encoding the next step has
    train(
        model,
        make_task("copy"),
        _settings(drope_step=drope_step, checkpoint_every=0),
        on_step=lambda info: seen.append((info.step, model.encoding.to_config()["name"])),
    )
    # Steps 0 .. drope_step - 1 ran with RoPE; the drop comes before step drope_step.
    assert seen == [(n, "rope" if n <= drope_step else "none") for n in range(1, 8)]
    assert model.to_config()["encoding"] == {"name": "none"}


@pytest.mark.parametrize(("stop", "name"), [(3, "rope"), (4, "none")], ids=["k", "k+1"])
def test_k_steps_run_with_rope_and_the_next_one_without(stop: int, name: str) -> None:
    model = _tiny()
    with pytest.raises(KeyboardInterrupt):
        train(
            model,
            make_task("copy"),
            _settings(drope_step=3, checkpoint_every=0),
            on_step=_stop_after(stop),
        )
    assert model.encoding.to_config()["name"] == name


def test_drope_step_0_trains_a_nope_model() -> None:
    """RoPE has no weights: dropped before the first step, the run is NoPE's, bit for bit."""
    dropped = _trained("rope", drope_step=0)
    nope = _trained("none")
    _assert_state_equal(dropped.state_dict(), nope.state_dict())
    assert dropped.to_config() == nope.to_config()


def test_a_late_drop_changes_the_last_steps_only() -> None:
    kept = _trained()
    dropped = _trained(drope_step=6)
    at_the_end = _trained(drope_step=7)  # nothing trains after the drop
    assert not torch.equal(kept.blocks[0].attn.qkv.weight, dropped.blocks[0].attn.qkv.weight)
    _assert_state_equal(kept.state_dict(), at_the_end.state_dict())


@pytest.mark.parametrize(
    ("drope_step", "stop", "saved", "layers", "num_layers"),
    [
        (2, 5, 3, None, 1),  # checkpoint at 3, after the drop: dropped before loading
        (3, 5, 3, None, 1),  # checkpoint exactly at the drop
        (5, 4, 3, None, 1),  # killed before the drop: the resumed run drops it
        (2, 5, 3, nope_every(2, 2), 2),  # per-layer encodings
        (2, 5, 3, local_global(2, ratio=1, window=4), 2),  # two RoPE modules, both dropped
    ],
    ids=["after-drop", "at-drop", "before-drop", "nope-every-2", "local-global"],
)
def test_a_run_killed_around_the_drop_resumes_bit_for_bit(
    tmp_path: Path, drope_step: int, stop: int, saved: int, layers, num_layers: int
) -> None:
    task = make_task("copy")
    settings = _settings(drope_step=drope_step)
    config = {"label": "drope"}

    def model(seed: int = 0) -> TinyTransformer:
        return _tiny(layers=layers, num_layers=num_layers, seed=seed)

    whole = model()
    done = train(whole, task, settings, checkpoint=tmp_path / "whole.pt", config=config)

    path = tmp_path / "killed.pt"
    first = model()
    with pytest.raises(KeyboardInterrupt):
        train(first, task, settings, checkpoint=path, config=config, on_step=_stop_after(stop))
    assert torch.load(path, weights_only=True)["data"] == {"next_step": saved}
    torch.manual_seed(123)
    resumed_model = model(seed=99)  # RoPE again: the checkpoint's weights replace these
    steps_seen: list[tuple[int, str]] = []
    resumed = train(
        resumed_model,
        task,
        settings,
        checkpoint=path,
        config=config,
        resume=True,
        on_step=lambda info: steps_seen.append(
            (info.step, resumed_model.encoding.to_config()["name"])
        ),
    )
    assert steps_seen == [(n, "rope" if n <= drope_step else "none") for n in range(4, 8)]
    _assert_state_equal(whole.state_dict(), resumed_model.state_dict())
    assert resumed_model.to_config() == whole.to_config()
    assert whole.to_config()["encoding"] == {"name": "none"}
    assert resumed.final_loss == done.final_loss and resumed.resumed_from == saved
    saved_whole = torch.load(tmp_path / "whole.pt", weights_only=True)
    saved_resumed = torch.load(path, weights_only=True)
    _assert_state_equal(saved_whole["model"], saved_resumed["model"])
    for index in saved_whole["optimizer"]["state"]:
        _assert_state_equal(
            saved_whole["optimizer"]["state"][index], saved_resumed["optimizer"]["state"][index]
        )


def test_a_finished_run_with_drope_step_at_the_end_resumes_as_it_ended(tmp_path: Path) -> None:
    """``drope_step == steps`` is allowed (``Runner.train_settings`` gives it for
    ``drope_at=1`` and when ``round(drope_at * steps)`` rounds up, e.g. 0.85 * 3 steps): an
    uninterrupted run and the same run resumed from its finished checkpoint must end with
    the same model (the variant's docs: "evaluated as NoPE")."""
    task = make_task("copy")
    settings = _settings(steps=3, drope_step=3, checkpoint_every=1)
    fresh = _tiny()
    train(fresh, task, settings, checkpoint=tmp_path / "c.pt", config={})
    again = _tiny()
    train(again, task, settings, checkpoint=tmp_path / "c.pt", config={}, resume=True)
    assert again.to_config() == fresh.to_config()  # fails: resumed 'none', fresh 'rope'
    assert fresh.to_config()["encoding"] == {"name": "none"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(drope_step=8), "drope_step must be <= 7, got 8"),
        (dict(drope_step=-1), "drope_step must be >= 0, got -1"),
        (dict(drope_step=1.5), "drope_step must be an integer"),
    ],
    ids=["past-the-end", "negative", "not-an-integer"],
)
def test_bad_drope_steps_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(PosEncError, match=message):
        _settings(**kwargs)


def test_drope_step_is_plain_int_and_recorded() -> None:
    import numpy as np

    settings = _settings(drope_step=np.int64(4))
    assert settings.drope_step == 4 and type(settings.drope_step) is int
    assert settings.to_dict()["drope_step"] == 4
    assert _settings().to_dict()["drope_step"] is None


class _NoRotary(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(41, 41)

    def forward(self, tokens: torch.Tensor, positions: Any = None) -> torch.Tensor:
        return self.embed(tokens)


def test_drope_step_needs_a_model_that_can_drop() -> None:
    with pytest.raises(
        PosEncError,
        match=r"drope_step needs a model with drop_rotary\(\) \(a TinyTransformer\), got _NoRotary",
    ):
        train(_NoRotary(), make_task("copy"), _settings(drope_step=1, checkpoint_every=0))
    train(_NoRotary(), make_task("copy"), _settings(checkpoint_every=0))  # no drope: fine


# --- Runner / run_study ---------------------------------------------------------------------

RUN: dict[str, Any] = dict(plot=False, jobs=1)  # how every study here runs


def _study(task: str, encodings: Any, **options: Any):
    """The tiny study at 4 steps (a drop at half of them is step 2)."""
    return tiny_study(task, encodings, **{"steps": 4, **options})


def _resolved(task: str, encodings: Any, **options: Any):
    return resolve(task, encodings, {"preset": "quick", "seed": 0, **options}, 1)


def _ckpt_train(out: Path, label: str) -> dict[str, Any]:
    state = torch.load(out / "checkpoints" / f"{label}.pt", weights_only=True)
    return json.loads(state["config"])


def test_a_study_with_drope_records_it_as_nope(tmp_path: Path) -> None:
    study = _study("copy", ["rope", "drope"], train_len=9, eval_lens=[9, 18])
    results = run_study(study, out_dir=tmp_path, **RUN)
    runs = {run["encoding"]: run for run in results["runs"]}
    assert list(runs) == ["rope", "drope"]
    assert runs["drope"]["config"] == {"name": "none"}
    assert runs["rope"]["config"]["name"] == "rope"
    assert runs["drope"]["eval"] != runs["rope"]["eval"]
    assert list(results["summary"]) == ["rope", "drope"]
    # 0.85 * 4 steps rounds to 3: the checkpoint's run config says so, and the model's.
    drope = _ckpt_train(tmp_path, "drope")
    assert drope["train"]["drope_step"] == 3
    assert drope["model"]["encoding"]["name"] == "rope"  # the config the run was built with
    assert _ckpt_train(tmp_path, "rope")["train"]["drope_step"] is None
    assert results["settings"]["train"]["drope_step"] is None  # the study's, not a run's


@pytest.mark.parametrize(
    ("drope_at", "steps"), [(None, 3), (1.0, 4)], ids=["0.85-of-3-rounds-up", "drope-at-1"]
)
def test_drope_is_evaluated_as_nope_when_the_drop_is_the_last_step(drope_at, steps) -> None:
    """Library bug: ``Runner.train_settings`` gives ``drope_step == steps`` here, and
    ``train`` only drops at the start of step ``drope_step``, which never runs: the model is
    evaluated (and recorded) with RoPE."""
    study = _study("copy", ["drope"], train_len=9, eval_lens=[9], drope_at=drope_at, steps=steps)
    results = run_study(study, **RUN)
    assert results["runs"][0]["config"] == {"name": "none"}


@pytest.mark.parametrize(
    ("drope_at", "steps", "drope_step"),
    [(None, 4, 3), (0.5, 4, 2), (0.0, 4, 0), (1.0, 4, 4), (0.85, 20, 17)],
    ids=["default", "half", "zero", "one", "default-20-steps"],
)
def test_drope_at_sets_the_drop_step(drope_at, steps: int, drope_step: int) -> None:
    study = _resolved("copy", ["rope", "drope"], drope_at=drope_at, steps=steps)
    rope_spec, drope_spec = study.specs
    assert drope_spec["drope_at"] == (0.85 if drope_at is None else drope_at)
    assert "drope_at" not in rope_spec
    runner = Runner(study, make_study_task(study), Dist(), None, False, None)
    assert runner.train_settings(rope_spec) is study.train
    assert runner.train_settings(drope_spec).to_dict() == {
        **study.train.to_dict(),
        "drope_step": drope_step,
    }


def test_drope_at_reaches_the_run(tmp_path: Path) -> None:
    study = _study("copy", ["drope"], train_len=9, eval_lens=[9], drope_at=0.5)
    run_study(study, out_dir=tmp_path, **RUN)
    assert _ckpt_train(tmp_path, "drope")["train"]["drope_step"] == 2


def test_a_study_resumed_past_the_drop_gives_the_same_results(tmp_path: Path) -> None:
    study = _study(
        "copy", ["drope"], train_len=9, eval_lens=[9, 18], checkpoint_every=2, drope_at=0.25
    )
    whole = run_study(study, out_dir=tmp_path / "whole", **RUN)

    def kill(kind: str, fields: dict) -> None:
        if kind == "step" and fields["info"].step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_study(study, out_dir=tmp_path / "cut", on_event=kill, **RUN)
    resumed = run_study(study, out_dir=tmp_path / "cut", resume=True, **RUN)
    assert resumed["runs"][0]["train"]["resumed_from"] == 2  # drop at 1, checkpoint at 2
    assert resumed["runs"][0]["eval"] == whole["runs"][0]["eval"]
    assert resumed["runs"][0]["config"] == whole["runs"][0]["config"] == {"name": "none"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            dict(encodings=["rope", "prope-0.75"], drope_at=0.5),
            r"drope_at sets the 'drope' variant's drop, got no 'drope' among the encodings "
            r"\(rope, prope-0\.75\)",
        ),
        (dict(encodings=["drope"], drope_at=1.5), r"drope_at must be <= 1\.0, got 1\.5"),
        (dict(encodings=["drope"], drope_at=-0.1), r"drope_at must be >= 0\.0, got -0\.1"),
        (
            dict(task="lm", num_vars=2),
            "num_vars is an option of the 'counting' task, got task 'lm'",
        ),
        (
            dict(task="copy", eval_split="dense"),
            "eval_split is an option of the 'flipflop' task, got task 'copy'",
        ),
        (dict(task="counting", num_vars=6), "num_vars must be <= 5, got 6"),
        (dict(task="counting", num_vars=0), "num_vars must be >= 1, got 0"),
        (
            dict(task="flipflop", eval_split="medium"),
            "eval_split must be one of 'train', 'sparse', 'dense', got 'medium'",
        ),
        (
            dict(encodings=["rope@nope-every-4"], num_layers=2),
            r"rope@nope-every-4 needs at least 4 layers \(NoPE on every 4th\), got num_layers=2",
        ),
        (
            dict(encodings=["none", "drope@nope-every-4"], num_layers=3),
            r"drope@nope-every-4 needs at least 4 layers .*got num_layers=3",
        ),
        (
            dict(temperature="hot"),
            r"\['temperature'\]\['type'\] must be one of 'llama4', 'ssmax', got 'hot'",
        ),
        (
            dict(temperature={"type": "ssmax", "scale": 2.0}),
            r"\['temperature'\] of type 'ssmax' has unknown keys \['scale'\]",
        ),
        (dict(temperature=3), r"\['temperature'\] must be a dict with a 'type'"),
        (dict(qk_norm="yes"), "qk_norm must be True or False, got 'yes'"),
        (dict(encodings=["rope@every-3"]), r"the schedule after '@' must be one of"),
        (
            dict(encodings=["rope@nope-every-2", "rope@nope-every-2"]),
            "encodings must be distinct, got 'rope@nope-every-2' twice",
        ),
        (
            dict(encodings=["nope@nope-every-2", "none@nope-every-2"]),
            "encodings must be distinct, got 'none@nope-every-2' twice",
        ),
    ],
    ids=[
        "drope-at-without-drope",
        "drope-at-above-one",
        "drope-at-negative",
        "num-vars-for-lm",
        "eval-split-for-copy",
        "num-vars-too-many",
        "num-vars-zero",
        "unknown-eval-split",
        "nope-every-4-2-layers",
        "drope-nope-every-4-3-layers",
        "unknown-temperature",
        "temperature-unknown-key",
        "temperature-not-a-dict",
        "qk-norm-not-a-bool",
        "unknown-schedule",
        "schedule-twice",
        "alias-twice",
    ],
)
def test_bad_study_settings_are_refused_before_training(
    tmp_path: Path, kwargs: dict, message: str
) -> None:
    options = {"task": "copy", "encodings": ["rope"], "train_len": 9, "eval_lens": [9], **kwargs}
    events: list[str] = []
    with pytest.raises(PosEncError, match=message):
        run_study(
            _study(**options),
            out_dir=tmp_path / "out",
            on_event=lambda kind, f: events.append(kind),
            **RUN,
        )
    assert events == []
    assert not (tmp_path / "out").exists()


def test_a_variant_too_narrow_for_the_heads_is_refused_before_training() -> None:
    events: list[str] = []
    with pytest.raises(PosEncError, match="rotary_dim must be >= 2, got 0"):
        # head_dim 4: a quarter is one channel, no whole pair
        study = _study("copy", ["rope", "prope-0.25"], train_len=9, eval_lens=[9], dim=8)
        run_study(study, on_event=lambda kind, f: events.append(kind), **RUN)
    assert events == []


@pytest.mark.parametrize(
    ("main_split", "others"),
    [("dense", ["train", "sparse"]), ("train", ["sparse", "dense"]), (None, ["train", "dense"])],
    ids=["dense", "train", "default-sparse"],
)
def test_eval_split_is_the_main_split_and_the_others_are_under_splits(
    main_split, others: list[str]
) -> None:
    eval_lens = [9, 13]
    args = dict(train_len=9, eval_lens=eval_lens)
    results = run_study(_study("flipflop", ["rope"], eval_split=main_split, **args), **RUN)
    assert results["settings"]["task_options"] == (
        {} if main_split is None else {"eval_split": main_split}
    )
    evals = results["runs"][0]["eval"]
    for length in map(str, eval_lens):
        cell = evals[length]
        assert list(cell["splits"]) == others
        main = {k: v for k, v in cell.items() if k != "splits"}
        assert set(main) == {"loss", "accuracy", "token_accuracy", "examples"}
        for split in others:
            assert set(cell["splits"][split]) == set(main)
    # The summary is of the main split.
    summary = results["summary"]["rope"]["9"]
    assert summary["loss"]["mean"] == evals["9"]["loss"]
    if main_split is not None:  # the main metrics are another split's than the default's
        default = run_study(_study("flipflop", ["rope"], **args), **RUN)["runs"][0]["eval"]
        for length in map(str, eval_lens):
            assert evals[length]["splits"]["sparse"] == {
                k: v for k, v in default[length].items() if k != "splits"
            }
            assert default[length]["splits"][main_split] == {
                k: v for k, v in evals[length].items() if k != "splits"
            }


def test_num_vars_reaches_the_counting_task(tmp_path: Path) -> None:
    study = _resolved("counting", ["rope"], num_vars=2)
    assert study.task_options == (("num_vars", 2),)
    assert make_study_task(study).num_vars == 2
    assert make_study_task(_resolved("counting", ["rope"])).num_vars == 3
    study = _study("counting", ["rope"], train_len=12, eval_lens=[12], num_vars=2)
    results = run_study(study, **RUN)
    assert results["settings"]["task_options"] == {"num_vars": 2}


def test_a_nope_every_4_study_with_4_layers_runs(tmp_path: Path) -> None:
    study = _study("copy", ["rope@nope-every-4"], train_len=9, eval_lens=[9], num_layers=4, steps=2)
    results = run_study(study, out_dir=tmp_path, **RUN)
    assert [run["encoding"] for run in results["runs"]] == ["rope@nope-every-4"]
    layers = _ckpt_train(tmp_path, "rope@nope-every-4")["model"]["layers"]
    assert [layer.get("encoding") for layer in layers] == [None, None, None, {"name": "none"}]


_SSMAX = {"type": "ssmax", "init": 0.43}
_LLAMA4 = {"type": "llama4", "floor_scale": 8192.0, "attn_scale": 0.1}


@pytest.mark.parametrize(
    ("kwargs", "layer"),
    [
        ({}, {}),
        (dict(qk_norm=False), {}),
        (dict(qk_norm=True), {"qk_norm": True}),
        (dict(temperature="ssmax"), {"temperature": _SSMAX}),
        (dict(temperature="llama4"), {"temperature": _LLAMA4}),
        (
            dict(temperature={"type": "ssmax", "init": 0.5}),
            {"temperature": {**_SSMAX, "init": 0.5}},
        ),
        (dict(qk_norm=True, temperature="ssmax"), {"qk_norm": True, "temperature": _SSMAX}),
    ],
    ids=["none", "qk-norm-false", "qk-norm", "ssmax", "llama4", "ssmax-dict", "both"],
)
def test_layer_settings_are_recorded_and_reach_every_layer(
    tmp_path: Path, kwargs: dict, layer: dict
) -> None:
    study = _study(
        "copy", ["rope@nope-every-2"], train_len=9, eval_lens=[9], num_layers=2, steps=1, **kwargs
    )
    results = run_study(study, out_dir=tmp_path, **RUN)
    assert results["settings"]["layer"] == layer
    assert json.loads((tmp_path / "results.json").read_text())["settings"]["layer"] == layer
    layers = _ckpt_train(tmp_path, "rope@nope-every-2")["model"]["layers"]
    defaults = {"window": None, "qk_norm": False, "temperature": None}
    assert layers == [{**defaults, **layer}, {"encoding": {"name": "none"}, **defaults, **layer}]


# --- evaluate: flip-flop's extra splits -----------------------------------------------------


@pytest.mark.parametrize(
    ("main_split", "train_p_ignore"),
    [("sparse", 0.8), ("dense", 0.8), ("train", 0.8), ("sparse", 0.5)],
    ids=["sparse", "dense", "train", "sparse-p0.5"],
)
def test_flipflop_splits_equal_evaluating_each_split_directly(
    main_split: str, train_p_ignore: float
) -> None:
    torch.manual_seed(0)
    task = FlipFlopTask(train_p_ignore=train_p_ignore, eval_split=main_split, eval_examples=8)
    model = TinyTransformer(task.vocab_size, dim=16, num_layers=1, num_heads=2, encoding="rope")
    train(model, task, _settings(steps=3, seq_len=9, checkpoint_every=0))
    lengths = [9, 17]
    results = evaluate(model, task, lengths, train_len=9, seed=3, max_tokens=40)
    others = [s for s in ("train", "sparse", "dense") if s != main_split]
    for split_name, split_task in task.extra_splits().items():
        assert (split_task.eval_split, split_task.train_p_ignore) == (split_name, train_p_ignore)
        assert split_task.eval_examples == 8
    for length in map(str, lengths):
        assert list(results[length]["splits"]) == others
    for split in [main_split, *others]:
        direct = evaluate(
            model,
            FlipFlopTask(train_p_ignore=train_p_ignore, eval_split=split, eval_examples=8),
            lengths,
            train_len=9,
            seed=3,
            max_tokens=40,
        )
        for length in map(str, lengths):
            main = {k: v for k, v in direct[length].items() if k != "splits"}
            if split == main_split:
                assert main == {k: v for k, v in results[length].items() if k != "splits"}
            else:
                assert results[length]["splits"][split] == main


def test_other_tasks_have_no_splits() -> None:
    task = make_task("copy", eval_examples=4)
    assert task.extra_splits() == {}
    torch.manual_seed(0)
    model = TinyTransformer(task.vocab_size, dim=16, num_layers=1, num_heads=2, encoding="rope")
    results = evaluate(model, task, [9], train_len=9)
    assert set(results["9"]) == {"loss", "accuracy", "token_accuracy", "examples"}


# --- posenc lengthgen -----------------------------------------------------------------------

# the tiny run, at 4 steps (a drop at half of them is step 2), in this process
CLI_TINY = [*CLI_ARGS[:1], "4", *CLI_ARGS[2:], "--no-plot", "--jobs", "1"]


def test_cli_counting_with_num_vars_and_the_new_options(tmp_path: Path, capsys) -> None:
    argv = ["lengthgen", "--task", "counting", "--num-vars", "2", "--encodings", "rope,drope"]
    argv += ["--train-len", "12", "--eval-lens", "L", "--out", str(tmp_path)]
    argv += ["--qk-norm", "--temperature", "ssmax", "--drope-at", "0.5"]
    code, _, err = run_cli([*argv, *CLI_TINY], capsys)
    assert code == 0, err
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["task"] == "counting"
    assert results["settings"]["task_options"] == {"num_vars": 2}
    assert results["settings"]["layer"] == {"qk_norm": True, "temperature": _SSMAX}
    assert [(r["encoding"], r["config"]["name"]) for r in results["runs"]] == [
        ("rope", "rope"),
        ("drope", "none"),
    ]
    assert _ckpt_train(tmp_path, "drope")["train"]["drope_step"] == 2


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (
            ["--task", "flipflop", "--eval-split", "medium"],
            "--eval-split must be one of 'train', 'sparse', 'dense', got 'medium'",
        ),
        (["--temperature", "hot"], "--temperature must be one of 'llama4', 'ssmax', got 'hot'"),
        (["--task", "counting", "--num-vars", "6"], "--num-vars must be <= 5, got 6"),
        (["--num-vars", "2"], "num_vars is an option of the 'counting' task, got task 'lm'"),
        (["--eval-split", "dense"], "eval_split is an option of the 'flipflop' task, got task"),
        (["--encodings", "drope", "--drope-at", "2"], r"--drope-at must be <= 1\.0, got 2\.0"),
        (["--drope-at", "0.5"], "drope_at sets the 'drope' variant's drop, got no 'drope'"),
        (["--encodings", "rope@nope-every-4"], r"rope@nope-every-4 needs at least 4 layers"),
        (["--encodings", "rope@every-3"], r"the schedule after '@' must be one of"),
        (["--encodings", "prope-x"], r"encoding name must be one of .*got 'prope-x'"),
    ],
    ids=[
        "eval-split-medium",
        "temperature-hot",
        "num-vars-6",
        "num-vars-for-lm",
        "eval-split-for-lm",
        "drope-at-2",
        "drope-at-without-drope",
        "nope-every-4-1-layer",
        "unknown-schedule",
        "unknown-variant",
    ],
)
def test_cli_bad_new_options_are_one_line_and_exit_code_2(
    tmp_path: Path, capsys, args: list[str], pattern: str
) -> None:
    base = ["lengthgen", "--task", "lm", "--encodings", "rope", "--train-len", "8"]
    base += ["--eval-lens", "8", "--out", str(tmp_path / "out"), *CLI_TINY]
    code, _, err = run_cli(base + args, capsys)
    check_one_line_error(code, err, pattern)
    assert not (tmp_path / "out").exists()


def test_cli_help_names_the_variants_and_schedules(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "240")
    code, out, _ = run_cli(["lengthgen", "--help"], capsys)
    assert code == 0
    flat = " ".join(out.replace("│", " ").split())
    for text in (
        "variants (prope-0.25, prope-0.75, drope), each optionally NAME@SCHEDULE "
        "(nope-every-4, nope-every-2, llama4, local-global)",
        "--num-vars",
        "--eval-split",
        "--qk-norm",
        "--temperature",
        "--drope-at",
    ):
        assert text in flat, text
