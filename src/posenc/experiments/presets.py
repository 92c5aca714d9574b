"""The presets of a length-generalization study, the options a study takes, and their
bounds: the data :class:`~posenc.experiments.settings.StudySettings` is built from."""

from __future__ import annotations

from typing import Any

__all__ = [
    "DEFAULT_ENCODINGS",
    "MAX_COUNT",
    "MAX_EVAL_TOKENS",
    "MAX_LENGTH",
    "MAX_SEEDS",
    "PRESETS",
    "STUDY_OPTIONS",
]

#: Bounds on what a study loops over (steps, examples) and on its lengths: far beyond any
#: study a tiny model is for, and a refusal instead of a run that never ends.
MAX_COUNT = 10**7
MAX_LENGTH = 2**20
MAX_EVAL_TOKENS = 10**9  # the largest eval_tokens (bytes an lm study scores per length)
MAX_SEEDS = 1000  # seeds of one study: each trains every encoding once more

DEFAULT_ENCODINGS = ("none", "sinusoidal", "learned", "rope", "alibi", "t5")

#: Settings of a study unless given explicitly. "default" is the documented lm study (6
#: encodings trained until their perplexity at L is below about 9 per byte, and 6 RoPE
#: extensions: about 5 CPU-minutes a seed); "quick" is a small study for a first look
#: (about 10 CPU-seconds for the 6 default encodings).
PRESETS: dict[str, dict[str, Any]] = {
    "default": {
        "train_len": 64,
        "eval_lens": (64, 128, 256, 512),
        "steps": 1100,
        "batch_size": 32,
        "dim": 64,
        "num_layers": 2,
        "num_heads": 4,
        "lr": 1e-2,
        "optimizer": "adamw",
        "eval_tokens": 32768,
        "eval_examples": 256,
        "extend": ("pi", "ntk", "yarn"),
        "finetune_steps": 40,
        "checkpoint_every": 100,
    },
    "quick": {
        "train_len": 32,
        "eval_lens": (32, 64, 128),
        "steps": 150,
        "batch_size": 16,
        "dim": 32,
        "num_layers": 1,
        "num_heads": 2,
        "lr": 1e-2,
        "optimizer": "adamw",
        "eval_tokens": 4096,
        "eval_examples": 64,
        "extend": (),
        "finetune_steps": 0,
        "checkpoint_every": 0,
    },
}


#: The options :meth:`StudySettings.from_options` takes (and ``run_study`` took one by one
#: before). None, or an option left out, means the preset's value; ``warmup``,
#: ``random_positions``, ``extend_factor``, the seeds, the task's options (``num_vars``,
#: ``eval_split``), the layers' (``qk_norm``, ``temperature``) and ``drope_at`` have no
#: preset value (see :meth:`StudySettings.from_options`).
STUDY_OPTIONS = (
    # the presets'
    "train_len", "eval_lens", "steps", "batch_size", "dim", "num_layers", "num_heads", "lr",
    "optimizer", "extend", "finetune_steps", "checkpoint_every", "eval_tokens", "eval_examples",
    # no preset value
    "warmup", "random_positions", "extend_factor", "seed", "seeds", "num_vars", "eval_split",
    "qk_norm", "temperature", "drope_at",
)  # fmt: skip
