"""Named studies: the literature's findings on contextual and per-layer positions, each a
``posenc lengthgen`` run that fits two CPU cores (at most 10 minutes, 3 to 6 seeds: as
many as fit), with the settings of its paper for a GPU run of the same command under
``torchrun``. Each names the comparisons it exists to make (:mod:`.comparisons`), measured
over its seeds into ``results.json`` with a verdict.

``posenc lengthgen --study NAME --out DIR`` runs one (``--scale paper`` for the paper's
sizes); options given on the command line override the study's (:func:`with_study`). From
Python: ``run_study(StudySettings.from_options(**study_arguments("counting")), out_dir=...)``. Each study records what its
paper reported (:attr:`NamedStudy.paper_says`) and the check posenc's numbers are read against;
the README sets the measured numbers beside them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from posenc._errors import check_choice
from posenc.experiments.comparisons import Comparison

__all__ = ["SCALES", "STUDIES", "NamedStudy", "study_arguments", "with_study"]

#: ``"cpu"``: fits two CPU cores in at most 10 minutes; ``"paper"``: the paper's sizes.
SCALES = ("cpu", "paper")

_SEEDS = "0,1,2"


@dataclasses.dataclass(frozen=True)
class NamedStudy:
    """A study of the literature as ``run_study`` arguments.

    Attributes:
        name: what ``--study`` takes.
        task, encodings: the task and the encodings (registry names, variants, schedules).
        cpu, paper: the other ``run_study`` arguments at each scale.
        paper_says: the published finding, with its numbers and source.
        expect: what posenc's run is read against.
        paper_scale: which of the ``paper`` settings come from the paper, and which are
            posenc's choice where the paper (or its code) does not state them.
        comparisons: the comparisons the study exists to make (:mod:`.comparisons`), the
            paper's (with its direction) first; each run measures them over its seeds and
            writes them, with the verdict, into ``results.json``.
    """

    name: str
    task: str
    encodings: tuple[str, ...]
    cpu: dict[str, Any]
    paper: dict[str, Any]
    paper_says: str
    expect: str
    paper_scale: str
    comparisons: tuple[Comparison, ...] = ()


def _scale(lengths: tuple[int, ...], steps: int, optimizer: str, **more: Any) -> dict[str, Any]:
    """A study's settings at one scale: trained at ``lengths[0]`` and evaluated at
    ``lengths``, no RoPE extension, three seeds; ``more``: its own settings (``seeds``
    where more fit its time)."""
    return {
        "train_len": lengths[0],
        "eval_lens": lengths,
        "steps": steps,
        "optimizer": optimizer,
        "extend": (),
        "finetune_steps": 0,
        "seeds": _SEEDS,
        **more,
    }


def _cpu(lengths: tuple[int, ...], steps: int, **more: Any) -> dict[str, Any]:
    """At CPU scale: the preset's model, trained with Muon."""
    return _scale(lengths, steps, "muon", **more)


def _paper(
    lengths: tuple[int, ...],
    steps: int,
    *,
    size: tuple[int, int, int],
    batch: int,
    lr: float,
    **more: Any,
) -> dict[str, Any]:
    """At a paper's scale: a model of ``size`` (``dim, num_layers, num_heads``) trained
    with AdamW, ``batch`` sequences a step, peak learning rate ``lr``."""
    dim, num_layers, num_heads = size
    sizes = {"dim": dim, "num_layers": num_layers, "num_heads": num_heads}
    return _scale(lengths, steps, "adamw", batch_size=batch, lr=lr, **sizes, **more)


_LM_CPU = _cpu((64, 128, 256, 512), 700)

_GOLOVNEVA = "Golovneva et al. 2024, Table 3"
_LIU = "Liu et al. 2023"
_BARBERO = "Barbero et al. 2025, Table 2"
_SMOLLM3 = "SmolLM3 (NoPE every 4th layer)"
_LLAMA4 = "Llama 4 (NoPE every 4th, local RoPE layers, temperature)"
_GELBERG = "Gelberg et al. 2025"

#: The long-context studies at a 1B-class size of posenc's choice (no paper fixes one).
_LONG_CONTEXT_PAPER = _paper(
    (4096, 8192, 16384, 32768), 20000, size=(2048, 16, 16), batch=256, lr=3e-4
)

STUDIES: dict[str, NamedStudy] = {
    s.name: s
    for s in (
        NamedStudy(
            name="counting",
            task="counting",
            encodings=("cope", "t5", "sinusoidal", "learned"),
            cpu=_cpu((64, 128, 256), 800, num_vars=1, seeds="0,1,2,3,4"),
            paper=_paper((512, 1024), 15600, size=(256, 4, 4), batch=64, lr=7e-5, num_vars=3),
            paper_says=(
                "Golovneva et al. 2024, Table 3 (4 layers, width 256, sequences of up to 512 "
                "tokens): test error with 1 / 3 / 5 variables: absolute 5.3 / 67.6 / 71.5 %, "
                "relative 1.1 / 17.8 / 22.4 %, CoPE 0.0 / 1.2 / 7.4 %."
            ),
            expect="error: CoPE < relative (T5) < absolute (sinusoidal, learned)",
            paper_scale=(
                "all from the released run.sh: 4 layers, width 256, 4 heads, block size 512, "
                "batch 64, lr 7e-5, 100 epochs of 10k examples (15 600 steps); posenc's "
                "TinyTransformer is pre-norm where the paper's is post-norm, without dropout"
            ),
            comparisons=(
                *(
                    Comparison(a, b, "error", "L", expect="better", source=_GOLOVNEVA)
                    for a, b in (("cope", "t5"), ("t5", "sinusoidal"), ("t5", "learned"))
                ),
                Comparison("cope", "t5", "error", "past"),
                Comparison("t5", "sinusoidal", "error", "past"),
            ),
        ),
        NamedStudy(
            name="flipflop",
            task="flipflop",
            encodings=("rope", "alibi", "none", "cope", "fox"),
            cpu=_cpu((64, 128, 256), 600, eval_examples=1024),
            paper=_paper(
                (512, 1024), 10000, size=(512, 6, 8), batch=16, lr=3e-4, eval_examples=10000
            ),
            paper_says=(
                "Liu et al. 2023 (flip-flop language modelling, trained on FFL(0.8) at length "
                "512): Transformers reach near-zero read error in distribution but keep a long "
                "tail of sporadic read errors on the sparse split FFL(0.98), which a 1-layer "
                "LSTM does not make."
            ),
            expect=(
                "sparse-split read errors for the static encodings; CoPE and forgetting "
                "attention at most half of RoPE's"
            ),
            paper_scale=(
                "the paper's sequence length (512) and splits (train FFL(0.8), sparse 0.98, "
                "dense 0.1); the model size, steps and lr are posenc's choice"
            ),
            comparisons=(
                *(
                    Comparison(
                        e,
                        e,
                        "read_error@sparse",
                        "L",
                        expect="worse",
                        b_metric="read_error@train",
                        source=_LIU,
                    )
                    for e in ("rope", "alibi", "none")
                ),
                Comparison("cope", "rope", "read_error", "all"),
                Comparison("fox", "rope", "read_error", "all"),
            ),
        ),
        NamedStudy(
            name="prope",
            task="lm",
            encodings=("none", "rope", "prope-0.25", "prope-0.75"),
            cpu={**_LM_CPU, "seeds": "0,1,2,3,4,5"},
            paper=_paper((2048,), 10000, size=(2048, 18, 8), batch=512, lr=3e-4),
            paper_says=(
                "Barbero et al. 2025, Table 2 (Gemma 2B): validation perplexity NoPE 4.8594, "
                "RoPE 4.4627, 0.25-RoPE 4.5302, 0.75-RoPE 4.4414."
            ),
            expect="ppl at L: 0.75-RoPE <= RoPE < 0.25-RoPE < NoPE",
            paper_scale=(
                "a Gemma-2B-sized model (18 layers, width 2048, 8 heads) as the paper's; its "
                "data, sequence length, steps and lr are posenc's choice"
            ),
            comparisons=tuple(
                Comparison(a, b, "ppl", "L", expect="better", source=_BARBERO)
                for a, b in (("prope-0.75", "rope"), ("rope", "prope-0.25"), ("prope-0.25", "none"))
            ),
        ),
        NamedStudy(
            name="nope-layers",
            task="lm",
            encodings=("rope", "rope@nope-every-4", "rope@llama4", "none"),
            cpu={**_LM_CPU, "num_layers": 4},
            paper=dict(_LONG_CONTEXT_PAPER),
            paper_says=(
                "Llama 4 and SmolLM3 leave RoPE out of every 4th layer (NoPE), Llama 4 with "
                "local attention on its RoPE layers, for their long contexts."
            ),
            expect="ppl(8L) / ppl(L): NoPE-every-4th below all-RoPE; ppl at L about equal",
            paper_scale="a 1B-class model of posenc's choice (no paper fixes one)",
            comparisons=(
                Comparison(
                    "rope@nope-every-4", "rope", "ppl_growth", "longest", "better", source=_SMOLLM3
                ),
                Comparison(
                    "rope@llama4", "rope", "ppl_growth", "longest", "better", source=_LLAMA4
                ),
                Comparison("rope@nope-every-4", "rope", "ppl", "L"),
                Comparison("rope@llama4", "rope", "ppl", "L"),
            ),
        ),
        NamedStudy(
            name="drope",
            task="lm",
            encodings=("rope", "drope"),
            cpu={**_LM_CPU, "extend": ("yarn",), "seeds": "0,1,2,3,4"},
            paper={**_LONG_CONTEXT_PAPER, "extend": ("yarn",)},
            paper_says=(
                "Gelberg et al. 2025 (DroPE): a model trained with RoPE, RoPE dropped late and "
                "the model recalibrated briefly, beats RoPE + YaRN on zero-shot retrieval past "
                "the training context."
            ),
            expect="ppl past L: DroPE below RoPE + YaRN (no fine-tune)",
            paper_scale="a 1B-class model of posenc's choice; the paper starts from pretrained LMs",
            comparisons=(
                Comparison("drope", "rope+yarn", "ppl", "past", "better", source=_GELBERG),
                Comparison("drope", "rope+yarn", "ppl", "L"),
            ),
        ),
    )
}


def study_arguments(name: str, scale: str = "cpu") -> dict[str, Any]:
    """``run_study`` keyword arguments of the study ``name`` at ``scale``.

    Examples:
        >>> args = study_arguments("counting")
        >>> args["task"], args["encodings"], args["num_vars"]
        ('counting', ['cope', 't5', 'sinusoidal', 'learned'], 1)
    """
    study = STUDIES[check_choice("study", name, tuple(STUDIES))]
    settings = study.cpu if check_choice("scale", scale, SCALES) == "cpu" else study.paper
    return {"task": study.task, "encodings": list(study.encodings), **settings}


def with_study(name: str, scale: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` (``task``, ``encodings`` and the settings' options; None: not given)
    with the study ``name`` at ``scale`` filling each one left None, as ``posenc lengthgen
    --study`` does; one seed given (``seed``) replaces the study's seeds.

    Examples:
        >>> options = with_study("counting", "cpu", {"task": None, "steps": 3, "seed": 4})
        >>> options["task"], options["steps"], options["num_vars"], "seeds" in options
        ('counting', 3, 1, False)
    """
    named = study_arguments(name, scale)
    if options.get("seed") is not None:  # one seed asked for: the study's seeds give way
        named.pop("seeds", None)
    out = dict(options)
    for key, value in named.items():
        if out.get(key) is None:
            out[key] = value
    return out
