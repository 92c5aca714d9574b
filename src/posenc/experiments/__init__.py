"""Experiments: train small models on built-in tasks and test them past their training length.

- :mod:`.tasks` / :mod:`.data`: ``lm`` (bytes of the standard library's sources) and the
  synthetic ``copy``, ``reverse``, ``recall``, ``addition``, all drawn from a seed;
- :mod:`.train`: AdamW with warmup + cosine, checkpoints and exact resume, DDP under torchrun;
- :mod:`.evaluate`: loss / perplexity or exact-match accuracy per eval length;
- :mod:`.extension`: RoPE context extension (PI, NTK, YaRN) of a trained model;
- :mod:`.settings` / :mod:`.lengthgen`: :class:`StudySettings`, a study's settings built from
  a preset and checked once, and :func:`run_study`, the whole comparison
  (``posenc lengthgen``);
- :mod:`.comparisons` / :mod:`.results`: the pairs a study compares, each over its seeds
  (paired differences, a 95 % t interval, a verdict), the ``results.json`` record, and
  reading one back (``posenc compare``); :mod:`.studies`: the named studies of the
  literature.

Nothing here is imported by ``import posenc``; ``run_study`` needs only torch (the figure
needs matplotlib, the progress bar rich).
"""

from posenc.experiments.lengthgen import DEFAULT_ENCODINGS, PRESETS, StudySettings, run_study
from posenc.experiments.tasks import TASKS, make_task

__all__ = ["DEFAULT_ENCODINGS", "PRESETS", "TASKS", "StudySettings", "make_task", "run_study"]
