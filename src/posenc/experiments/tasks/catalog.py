"""Every task by name (:data:`TASKS`) and :func:`make_task`, which builds one with its options."""

from __future__ import annotations

from posenc._errors import PosEncError, check_choice, check_int
from posenc.experiments.presets import MAX_COUNT, MAX_EVAL_TOKENS
from posenc.experiments.tasks.base import Task
from posenc.experiments.tasks.counting import CountingTask
from posenc.experiments.tasks.flipflop import FlipFlopTask
from posenc.experiments.tasks.lm import LMTask
from posenc.experiments.tasks.synthetic import SYNTHETIC_TASKS

__all__ = ["TASKS", "make_task"]

TASKS: dict[str, type[Task]] = {
    "lm": LMTask,
    **SYNTHETIC_TASKS,  # copy, reverse, recall, addition
    "counting": CountingTask,
    "flipflop": FlipFlopTask,
}


def make_task(
    name: str,
    *,
    eval_tokens: int = 32768,
    eval_examples: int = 256,
    num_vars: int | None = None,
    eval_split: str | None = None,
) -> Task:
    """The task called ``name`` (one of :data:`TASKS`).

    ``num_vars`` (``counting``) and ``eval_split`` (``flipflop``) are passed to the task
    that takes them, None meaning its default; given to another task, they are an error.

    Examples:
        >>> task = make_task("copy")
        >>> batch = task.train_batch(0, 2, 9, seed=0)
        >>> batch.tokens.shape, task.size_for(9)
        (torch.Size([2, 9]), 4)
        >>> make_task("flipflop", eval_split="dense").eval_p_ignore
        0.1
    """
    check_choice("task", name, tuple(TASKS))
    eval_tokens = check_int("eval_tokens", eval_tokens, min=1, max=MAX_EVAL_TOKENS)
    eval_examples = check_int("eval_examples", eval_examples, min=1, max=MAX_COUNT)
    for option, value, owner in (
        ("num_vars", num_vars, "counting"),
        ("eval_split", eval_split, "flipflop"),
    ):
        if value is not None and name != owner:
            raise PosEncError(f"{option} is an option of the {owner!r} task, got task {name!r}")
    if name == "lm":
        return LMTask(eval_tokens=eval_tokens)
    if name == "counting":
        return CountingTask(
            num_vars=3 if num_vars is None else num_vars, eval_examples=eval_examples
        )
    if name == "flipflop":
        return FlipFlopTask(
            eval_split="sparse" if eval_split is None else eval_split, eval_examples=eval_examples
        )
    return SYNTHETIC_TASKS[name](eval_examples=eval_examples)
