"""The named studies (posenc.experiments.studies): each resolves to a valid study at both
scales, the CPU one within the 2-core budget's settings, and ``--study`` fills only what the
command line leaves out."""

from __future__ import annotations

import json

import pytest

from posenc import PosEncError
from posenc.cli import main
from posenc.experiments.settings import resolve
from posenc.experiments.studies import SCALES, STUDIES, study_arguments

OPTION_KEYS = {
    "train_len", "eval_lens", "steps", "batch_size", "dim", "num_layers", "num_heads", "lr",
    "warmup", "optimizer", "random_positions", "extend", "extend_factor", "finetune_steps",
    "checkpoint_every", "eval_tokens", "eval_examples", "seed", "seeds", "num_vars",
    "eval_split", "qk_norm", "temperature", "drope_at",
}  # fmt: skip


#: The seeds of each study on two CPU cores (benchmarks: the wall times in docs/contextual.md).
CPU_SEEDS = {"counting": 5, "flipflop": 3, "prope": 6, "nope-layers": 3, "drope": 5}


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("name", list(STUDIES))
def test_every_study_resolves(name, scale):
    args = study_arguments(name, scale)
    task, encodings = args.pop("task"), args.pop("encodings")
    assert set(args) <= OPTION_KEYS
    options = {key: args.get(key) for key in OPTION_KEYS}
    study = resolve(task, encodings, {"preset": "default", **options}, 1)
    assert study.task == STUDIES[name].task
    assert list(study.labels) == list(STUDIES[name].encodings)
    # three seeds at the paper's scale; on two CPU cores as many as fit in 10 minutes
    assert study.seeds == ((0, 1, 2) if scale == "paper" else tuple(range(CPU_SEEDS[name])))
    if scale == "cpu":  # the CPU budget: small models, short sequences
        assert study.model.dim <= 64 and study.train_len <= 64
        assert study.train.steps <= 800


@pytest.mark.parametrize("name", list(STUDIES))
def test_every_study_compares_its_own_runs_and_the_paper_first(name):
    """A comparison naming a label the study does not train would be left out silently."""
    study = STUDIES[name]
    args = study_arguments(name)
    labels = set(study.encodings) | {f"rope+{m}" for m in args.get("extend", ())}
    assert study.comparisons
    for c in study.comparisons:
        assert {c.a, c.b} <= labels, c
    claims = [c.expect is not None for c in study.comparisons]
    assert claims[0] and claims == sorted(claims, reverse=True)  # the paper's first
    assert all(c.source for c in study.comparisons if c.expect is not None)


def test_study_texts_name_their_numbers():
    for study in STUDIES.values():
        assert study.paper_says and study.expect and study.paper_scale
    assert "67.6" in STUDIES["counting"].paper_says
    assert "4.4414" in STUDIES["prope"].paper_says


def test_unknown_study_and_scale_are_refused():
    with pytest.raises(PosEncError, match="study must be one of 'counting'"):
        study_arguments("sorting")
    with pytest.raises(PosEncError, match="scale must be one of 'cpu', 'paper'"):
        study_arguments("counting", "laptop")


def _run(tmp_path, capsys, *argv):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(["lengthgen", "--out", str(out), "--quiet", *argv])
    printed = capsys.readouterr()
    return exit_info.value.code, printed.out + printed.err, out


def test_cli_study_fills_what_the_command_leaves_out(tmp_path, capsys):
    code, output, out = _run(
        tmp_path,
        capsys,
        "--study", "counting", "--steps", "3", "--seed", "4", "--dim", "16", "--heads", "2",
        "--eval-lens", "64", "--encodings", "cope,t5", "--no-plot", "--eval-examples", "8",
    )  # fmt: skip
    assert code == 0, output
    data = json.loads((out / "results.json").read_text())
    assert data["task"] == "counting" and data["seeds"] == [4]  # --seed wins over the study's
    assert [r["encoding"] for r in data["runs"]] == ["cope", "t5"]
    assert data["settings"]["task_options"] == {"num_vars": 1}  # the study's
    assert data["settings"]["train"]["steps"] == 3 and data["settings"]["model"]["dim"] == 16


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--study", "sorting"], "--study must be one of 'counting'"),
        (["--study", "counting", "--scale", "huge"], "--scale must be one of 'cpu', 'paper'"),
        (["--scale", "paper"], "--scale sets the size of a --study"),
    ],
    ids=["study", "scale", "scale-without-study"],
)
def test_cli_bad_study_options(tmp_path, capsys, argv, match):
    code, output, _ = _run(tmp_path, capsys, *argv)
    assert code == 2
    assert match in output


@pytest.mark.parametrize("p", [0.5, 1.0, 0.125])
def test_prope_of_any_fraction(p):
    from posenc.experiments.models import ModelSettings, build_model, encoding_label, encoding_spec

    name = f"prope-{p}"
    assert encoding_label(name) == name
    spec = encoding_spec(f"{name}@local-global", train_len=64)
    model = build_model(41, spec, ModelSettings(dim=64, num_heads=2, num_layers=2), max_len=64,
                        seed=0, train_len=64)  # fmt: skip
    head_dim = 32
    for i in range(2):  # the schedule keeps the fraction in every layer
        enc = model.layer_encoding(i)
        assert enc.rotary_dim == 2 * int(p * head_dim // 2)
        assert enc.to_config()["scaling"]["type"] == "proportional"
    assert [model.layer_encoding(i).base for i in range(2)] == [1e4, 1e4]


@pytest.mark.parametrize("name", ["prope-0", "prope-1.5", "prope--1"])
def test_prope_fraction_out_of_range_is_refused(name):
    from posenc.experiments.models import encoding_label

    with pytest.raises(PosEncError, match=r"the fraction of prope-<p> must be in \(0, 1\]"):
        encoding_label(name)
