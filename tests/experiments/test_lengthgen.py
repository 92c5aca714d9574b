"""run_study: a tiny study per task, the extension runs, resume, and every bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from posenc import PosEncError
from posenc.experiments import PRESETS, run_study
from posenc.experiments.settings import resolve
from posenc.models import TinyTransformer

from .schema import check_results
from .tiny import tiny_study


@pytest.mark.parametrize(
    ("task", "train_len", "encodings"),
    [
        ("lm", 8, ["none", "sinusoidal", "learned", "rope", "alibi", "t5"]),
        ("copy", 9, ["none", "learned", "rope"]),
        ("reverse", 9, ["alibi", "t5"]),
        ("recall", 9, ["rope", "sinusoidal"]),
        ("addition", 9, ["none", "alibi"]),
    ],
)
def test_a_tiny_study_per_task(
    tmp_path: Path, task: str, train_len: int, encodings: list[str]
) -> None:
    eval_lens = [train_len, 2 * train_len]
    study = tiny_study(task, encodings, train_len=train_len, eval_lens=eval_lens)
    results = run_study(study, out_dir=tmp_path)
    check_results(results, task=task, train_len=train_len, eval_lens=eval_lens, encodings=encodings)
    assert json.loads((tmp_path / "results.json").read_text()) == results
    assert (tmp_path / "lengthgen.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for run in results["runs"]:
        cells = run["eval"]
        if run["encoding"] == "learned":  # a table of train_len rows cannot reach 2L
            assert cells[str(2 * train_len)] == {
                "error": f"positions must be in [0, max_len) with max_len={train_len}, got "
                f"values from 0 to {2 * train_len - 1}"
            }
            assert "error" not in cells[str(train_len)]
        else:
            assert not any("error" in c for c in cells.values())
        if run["encoding"] == "t5":
            assert run["config"]["max_distance"] == train_len
            assert run["config"]["causal"] is True


def test_rope_extensions_with_and_without_a_fine_tune(tmp_path: Path) -> None:
    study = tiny_study(train_len=8, eval_lens=[8, 32], extend="pi,ntk,yarn", finetune_steps=2)
    results = run_study(study, out_dir=tmp_path)
    labels = [
        "rope",
        "rope+pi",
        "rope+pi+ft",
        "rope+ntk",
        "rope+ntk+ft",
        "rope+yarn",
        "rope+yarn+ft",
    ]
    check_results(results, task="lm", train_len=8, eval_lens=[8, 32], encodings=labels)
    runs = {r["encoding"]: r for r in results["runs"]}
    assert runs["rope+pi"]["config"]["scaling"] == {"type": "linear", "factor": 4.0}
    assert runs["rope+ntk"]["config"]["scaling"] == {"type": "ntk", "factor": 4.0}
    yarn = runs["rope+yarn"]["config"]["scaling"]
    assert (yarn["type"], yarn["factor"], yarn["original_max_position"]) == ("yarn", 4.0, 8)
    assert runs["rope+pi+ft"]["train"]["steps"] == 2
    assert runs["rope+pi+ft"]["train"]["seq_len"] == 32
    # The extended model is the trained one with another encoding: same weights, so its
    # loss differs from the base model's only through the scaling.
    assert runs["rope+pi"]["eval"]["8"]["loss"] != runs["rope"]["eval"]["8"]["loss"]
    assert results["settings"]["extend_factor"] == 4.0


def test_extension_models_load_the_trained_weights(tmp_path: Path) -> None:
    study = tiny_study("copy", train_len=9, eval_lens=[9, 18], checkpoint_every=1, extend=["ntk"])
    run_study(study, out_dir=tmp_path)
    state = torch.load(tmp_path / "checkpoints" / "rope.pt", weights_only=True)
    config = json.loads(state["config"])["model"]
    config["encoding"]["scaling"] = {"type": "ntk", "factor": 2.0}
    model = TinyTransformer.from_config(config)
    model.load_state_dict(state["model"])  # strict: RoPE has no parameters
    assert model.encoding.to_config()["scaling"]["factor"] == 2.0
    assert model.encoding.scaling.type == "ntk"
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, state["model"][name]), name


def test_random_positions_train_and_evaluate(tmp_path: Path) -> None:
    study = tiny_study(
        "copy", ["learned", "rope"], train_len=9, eval_lens=[9, 18, 27], random_positions=18
    )
    results = run_study(study)
    learned = results["runs"][0]
    assert learned["config"]["max_len"] == 18  # the table covers [0, L_max)
    assert "error" not in learned["eval"]["18"] and "error" in learned["eval"]["27"]
    assert results["settings"]["train"]["random_positions"] == 18


def test_an_interrupted_study_resumes_to_the_same_results(tmp_path: Path) -> None:
    study = tiny_study(
        "lm", ["alibi", "rope"], train_len=8, eval_lens=[8, 16], checkpoint_every=2, steps=5
    )
    whole = run_study(study, out_dir=tmp_path / "whole")

    def kill_during_rope(kind: str, fields: dict) -> None:
        if kind == "step" and fields["label"] == "rope" and fields["info"].step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_study(study, out_dir=tmp_path / "cut", on_event=kill_during_rope)
    assert not (tmp_path / "cut" / "results.json").exists()
    trained: list[str] = []
    resumed = run_study(
        study,
        out_dir=tmp_path / "cut",
        resume=True,
        on_event=lambda kind, f: (
            trained.append(f"{f['label']}:{f['info'].step}") if kind == "step" else None
        ),
    )
    assert trained == ["rope:3", "rope:4", "rope:5"]  # alibi was done; rope resumes after 2
    for a, b in zip(whole["runs"], resumed["runs"]):
        assert a["eval"] == b["eval"]
        assert a["train"]["final_loss"] == b["train"]["final_loss"]
    assert resumed["runs"][1]["train"]["resumed_from"] == 2


def test_presets() -> None:
    for preset in PRESETS.values():
        assert preset["eval_lens"][0] == preset["train_len"]
    quick = PRESETS["quick"]
    assert quick["steps"] <= 200 and not quick["extend"] and not quick["finetune_steps"]


def _corrupt(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            dict(task="sort"),
            r"task must be one of 'lm', 'copy', 'reverse', 'recall', "
            r"'addition', 'counting', 'flipflop', got 'sort'",
        ),
        (dict(encodings=["rope", "fancy"]), r"encoding name must be one of 'none', .*got 'fancy'"),
        (dict(encodings=[]), "encodings must name at least one encoding"),
        (dict(encodings=["rope", "rope"]), "encodings must be distinct, got 'rope' twice"),
        (dict(eval_lens=[8, 0]), "eval_lens entry must be >= 1, got 0"),
        (dict(eval_lens=[]), r"eval_lens must hold at least one length, got \[\]"),
        (dict(steps=0), "steps must be >= 1, got 0"),
        (dict(train_len=0), "train_len must be >= 1, got 0"),
        (dict(task="addition", train_len=5), "train_len must be >= 6, got 5"),
        (dict(task="copy", eval_lens=[9, 2]), "eval_lens entry must be >= 3, got 2"),
        (dict(batch_size=0), "batch_size must be >= 1, got 0"),
        (dict(random_positions=4), "random_positions must be >= 8, got 4"),
        (dict(extend=["pi"], encodings=["alibi"]), "extend needs 'rope' among the encodings"),
        (dict(extend=["zoom"]), r"extend must be one of 'pi', 'ntk', 'yarn', got 'zoom'"),
        (dict(finetune_steps=3), "finetune_steps needs extend"),
        (dict(extend=["pi"], eval_lens=[8]), "extend needs an eval length beyond train_len"),
        (
            dict(encodings=[{"name": "t5", "max_distance": 64}]),
            r"t5 max_distance must be <= train_len \(8\): buckets past the training length are "
            r"never trained, got 64",
        ),
        (dict(device="tpu"), "device must be one of 'cpu', 'cuda', got 'tpu'"),
        (dict(preset="huge"), "preset must be one of 'default', 'quick', got 'huge'"),
        (dict(resume=True), "resume needs out_dir"),
        (dict(dim=10, num_heads=4), r"dim must be divisible by num_heads \(4\), got 10"),
        (
            dict(encodings=["rope", "axial_rope"]),
            r"encoding 'axial_rope' cannot run on token sequences here: k_positions must be",
        ),
        (dict(encodings=["mrope"]), r"cannot build 'mrope' .*missing .*'sections'"),
    ],
)
def test_bad_inputs_are_refused_before_training(kwargs: dict, message: str) -> None:
    options = {"task": "lm", "encodings": ["rope"], "train_len": 8, "eval_lens": [8, 16], **kwargs}
    run = {k: options.pop(k) for k in ("device", "resume") if k in options}  # the run's own
    events: list[str] = []
    with pytest.raises(PosEncError, match=message):
        run_study(tiny_study(**options), **run, on_event=lambda kind, f: events.append(kind))
    assert events == []


def test_unwritable_out_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(PosEncError, match=r"out_dir '.*file/out' cannot be created"):
        run_study(tiny_study(train_len=8, eval_lens=[8]), out_dir=blocker / "out")


@pytest.mark.parametrize("damage", ["config", "corrupt"])
def test_bad_checkpoints_are_refused_before_training(tmp_path: Path, damage: str) -> None:
    args = dict(task="lm", encodings=["none", "rope"], train_len=8, eval_lens=[8])
    run_study(tiny_study(**args), out_dir=tmp_path)
    if damage == "corrupt":
        _corrupt(tmp_path / "checkpoints" / "rope.pt")
        message = r"checkpoint '.*rope\.pt' is truncated or corrupt"
        changed = args
    else:
        message = (
            r"checkpoint '.*none\.pt' was written by a different configuration "
            r"\(train: .*\"steps\": 3.* != .*\"steps\": 4"
        )
        changed = {**args, "steps": 4}
    events: list[str] = []
    with pytest.raises(PosEncError, match=message):
        run_study(
            tiny_study(**changed),
            out_dir=tmp_path,
            resume=True,
            on_event=lambda k, f: events.append(k),
        )
    assert events == []


def test_numpy_integers_are_plain_ints_in_the_results(tmp_path: Path) -> None:
    """``checkpoint_every=np.int64(0)`` used to reach json.dumps as a NumPy scalar."""
    import numpy as np

    study = tiny_study(
        "copy",
        ["none"],
        train_len=np.int64(8),
        eval_lens=[np.int64(8)],
        checkpoint_every=np.int64(0),
        seed=np.int64(2),
        steps=np.int64(2),
        batch_size=np.int32(2),
        dim=np.int64(16),
    )
    results = run_study(study, out_dir=tmp_path)
    train = results["settings"]["train"]
    assert train["checkpoint_every"] == 0 and type(train["checkpoint_every"]) is int
    assert json.loads((tmp_path / "results.json").read_text())["settings"]["train"] == train


def _resolved(encodings, world_size: int = 1, **options):
    """``resolve``: the default preset with ``options`` over it, for ``world_size``
    processes."""
    return resolve("lm", encodings, {"preset": "default", "seed": 0, **options}, world_size)


def _study(world_size: int = 1, **options):
    return _resolved(["none", "rope", "learned"], world_size, **options)


def test_the_memory_estimate_lets_the_documented_studies_run() -> None:
    from posenc.experiments.settings import study_bytes

    assert study_bytes(_study()) < 1e9  # the README's default study: well under a GB
    big = _study(8, steps=20000, train_len=512, eval_lens=[512, 4096], dim=512, num_layers=8)
    assert study_bytes(big, world_size=8) < 40e9  # the torchrun example, per 80 GB GPU
    huge = _study(dim=4096, num_layers=512, num_heads=8)
    assert study_bytes(huge) > 1e12


def test_a_study_over_max_bytes_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(PosEncError, match=r"this study needs about [\d.]+ [MG]B of memory per"):
        run_study(tiny_study("copy", ["none"]), out_dir=tmp_path / "out", max_bytes=1000)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("encodings", "options", "extend", "finetune"),
    [
        (["sinusoidal", "alibi"], {}, (), 0),  # no RoPE: the preset's extension is skipped
        (["sinusoidal", "alibi"], {"train_len": 64, "eval_lens": [64, 512]}, (), 0),
        (["rope"], {"extend": []}, (), 0),  # --extend none: no fine-tune either
        (["rope"], {"eval_lens": [64]}, (), 0),  # nothing past train_len to extend to
        (["rope", "alibi"], {}, ("pi", "ntk", "yarn"), 40),  # the preset, as before
        (["rope"], {"extend": ["ntk"], "finetune_steps": 5}, ("ntk",), 5),
    ],
    ids=["no-rope", "issue-example", "extend-none", "no-longer-eval", "preset", "explicit"],
)
def test_explicit_choices_win_over_the_preset(encodings, options, extend, finetune) -> None:
    study = _resolved(encodings, **options)
    assert study.extend == extend and study.finetune_steps == finetune


@pytest.mark.parametrize(
    ("encodings", "options", "message"),
    [
        (["alibi"], {"extend": ["pi"]}, "extend needs 'rope' among the encodings"),
        (["rope"], {"extend": [], "finetune_steps": 10}, "finetune_steps needs extend"),
        (["rope"], {"extend": ["pi"], "eval_lens": [64]}, "extend needs an eval length beyond"),
    ],
    ids=["extend-without-rope", "finetune-without-extend", "extend-without-longer-eval"],
)
def test_only_conflicts_the_caller_wrote_are_errors(encodings, options, message) -> None:
    with pytest.raises(PosEncError, match=message):
        _resolved(encodings, **options)
