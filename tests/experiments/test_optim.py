"""The study's optimizers: which parameters Muon takes, that the pair steps exactly as
torch's two optimizers would, and checkpoints of a Muon run."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from posenc import PosEncError
from posenc.experiments.checkpoint import load_checkpoint, save_checkpoint
from posenc.experiments.optim import OPTIMIZERS, MuonAdamW, hidden_matrices, make_optimizer
from posenc.experiments.tasks import make_task
from posenc.experiments.train import TrainSettings, load_resumable, run_config, train
from posenc.models import TinyTransformer


def _model(encoding: str = "t5") -> TinyTransformer:
    torch.manual_seed(0)
    return TinyTransformer(
        41, dim=16, num_layers=2, num_heads=2, encoding=encoding, dropout=0.0, max_len=24
    )


def _names(model: nn.Module, params: list[torch.Tensor]) -> list[str]:
    ids = {id(p) for p in params}
    return [n for n, p in model.named_parameters() if id(p) in ids]


@pytest.mark.parametrize("encoding", ["t5", "learned", "rope"])
def test_muon_takes_the_hidden_matrices_and_adamw_the_rest(encoding: str) -> None:
    model = _model(encoding)
    opt = make_optimizer("muon", model, lr=1e-2, weight_decay=0.01)
    assert isinstance(opt, MuonAdamW)
    muon = _names(model, opt.muon.param_groups[0]["params"])
    assert muon == [
        f"blocks.{i}.{name}.weight"
        for i in range(2)
        for name in ("attn.qkv", "attn.proj", "fc", "out")
    ]
    decay, vectors = (_names(model, g["params"]) for g in opt.adamw.param_groups)
    extra = {"t5": ["encoding.weight"], "learned": ["encoding.weight"], "rope": []}[encoding]
    assert sorted(decay) == sorted(["embed.weight", *extra])  # the tied output, the encoding
    assert all(n.endswith("bias") or ".norm" in n or n.startswith("norm") for n in vectors)
    every = sorted(muon + decay + vectors)
    assert every == sorted(n for n, _ in model.named_parameters())  # each exactly once
    assert opt.param_groups == [*opt.adamw.param_groups, *opt.muon.param_groups]


def test_the_pair_steps_as_torchs_muon_and_adamw_would() -> None:
    model = _model()
    twin = copy.deepcopy(model)
    pair = make_optimizer("muon", model, lr=3e-2, weight_decay=0.01)
    assert isinstance(pair, MuonAdamW)
    twin_params = dict(twin.named_parameters())
    name_of = {id(p): n for n, p in model.named_parameters()}
    muon = torch.optim.Muon(
        [twin_params[name_of[id(p)]] for p in pair.muon.param_groups[0]["params"]],
        lr=3e-2,
        weight_decay=0.01,
        adjust_lr_fn="match_rms_adamw",
    )
    adamw = torch.optim.AdamW(
        [
            {"params": [twin_params[name_of[id(p)]] for p in g["params"]], "weight_decay": wd}
            for g, wd in zip(pair.adamw.param_groups, (0.01, 0.0))
        ],
        lr=3e-2,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    tokens = torch.randint(0, 41, (3, 10))
    for _ in range(3):
        for m, steps in ((model, (pair.step,)), (twin, (adamw.step, muon.step))):
            m.zero_grad(set_to_none=True)
            m(tokens).float().logsumexp(-1).mean().backward()
            for step in steps:
                step()
    for (name, a), b in zip(model.state_dict().items(), twin.state_dict().values()):
        assert torch.equal(a, b), name


def test_muon_needs_transformer_blocks_and_known_names() -> None:
    with pytest.raises(PosEncError, match=r"optimizer 'muon' needs a model with transformer"):
        make_optimizer("muon", nn.Linear(4, 4), lr=1e-2, weight_decay=0.0)
    with pytest.raises(PosEncError, match=r"optimizer must be one of 'adamw', 'muon', got 'sgd'"):
        make_optimizer("sgd", _model(), lr=1e-2, weight_decay=0.0)
    assert OPTIMIZERS == ("adamw", "muon")
    assert hidden_matrices(_model())  # TinyTransformer has them


def _settings(**kw) -> TrainSettings:
    base = dict(steps=4, batch_size=4, seq_len=12, lr=1e-2, warmup=1, seed=3)
    return TrainSettings(**{**base, **kw})


def test_a_muon_checkpoint_is_checked_before_it_is_loaded(tmp_path: Path) -> None:
    task, settings, config = make_task("copy"), _settings(optimizer="muon"), {"label": "t5"}
    path = tmp_path / "run.pt"
    train(_model(), task, settings, checkpoint=path, config=config)
    full = run_config(config, settings, 1)
    state = load_resumable(path, _model(), None, full)
    assert sorted(state["optimizer"]) == ["adamw", "muon"]

    def damaged(change) -> Path:
        bad = dict(torch.load(path, weights_only=True))
        bad["optimizer"] = copy.deepcopy(bad["optimizer"])
        change(bad["optimizer"])
        out = tmp_path / "bad.pt"
        save_checkpoint(out, bad)
        return out

    def shrink(opt) -> None:
        opt["muon"]["state"][0]["momentum_buffer"] = torch.zeros(1)

    with pytest.raises(
        PosEncError, match=r"optimizer\['muon'\]\['state'\]\[0\]\['momentum_buffer'\]"
    ):
        load_resumable(damaged(shrink), _model(), None, full)
    with pytest.raises(PosEncError, match=r"a dict of the 'adamw' and 'muon' states"):
        load_resumable(damaged(lambda opt: opt.pop("muon")), _model(), None, full)


def test_a_checkpoint_from_before_the_setting_resumes_as_adamw(tmp_path: Path) -> None:
    task, settings, config = make_task("copy"), _settings(), {"label": "t5"}
    path = tmp_path / "run.pt"
    train(_model(), task, settings, checkpoint=path, config=config)
    state = dict(torch.load(path, weights_only=True))
    old = json.loads(state["config"])
    del old["train"]["optimizer"]  # what posenc wrote before TrainSettings.optimizer
    state["config"] = json.dumps(old, sort_keys=True)
    save_checkpoint(path, state)
    load_checkpoint(path, config=run_config(config, settings, 1))  # accepted: AdamW
    with pytest.raises(PosEncError, match="different configuration"):
        load_checkpoint(path, config=run_config(config, _settings(optimizer="muon"), 1))
