"""The tasks of a length-generalization study: ``lm`` and six synthetic ones.

Every task turns ``(seed, step)`` into a training batch and ``(seed, length)``
into evaluation batches, with no hidden state (see :mod:`posenc.experiments.seeding`). A
batch is ``tokens [b, s]`` (int64) and ``targets [b, s]`` (int64; ``IGNORE`` where no
prediction is scored): ``targets[:, i]`` is what the model should predict after
reading ``tokens[:, : i + 1]``.

- ``lm`` (:mod:`.lm`): next-byte prediction on the stdlib corpus
  (:mod:`posenc.experiments.data`). Training windows start at random offsets of the train
  stream; evaluation cuts the validation stream into non-overlapping windows of the eval
  length (Press et al., 2022), every position scored.
- ``copy``, ``reverse``, ``recall``, ``addition`` (:mod:`.synthetic`): one small vocabulary
  of specials, digits and letters; see that module for each sequence.
- ``counting`` (:mod:`.counting`; CoPE's counting task, Golovneva et al., 2024): a program
  of ``v = 0 ;``, ``v ++;`` and ``pass;`` statements, then ``print v`` and the value,
  scored (:class:`CountingTask`; its own word vocabulary).
- ``flipflop`` (:mod:`.flipflop`; Liu et al., 2023): ``BOS`` then write/ignore/read
  instructions with bits, each read bit (the latest written one) scored
  (:class:`FlipFlopTask`; its own vocabulary).

Synthetic training draws each row's size ``n`` uniformly from ``1..n_max(L)``
(the largest that fits the training length ``L``) and pads on the right;
evaluation at length ``E`` uses the largest size that fits ``E``. Right padding
never changes a causal model's predictions before it. (``counting`` draws its
sizes with the paper's weights and cuts a program to fit; ``flipflop`` rows are
always full length: see their classes.)

:mod:`.base` holds what every task shares (:class:`Batch`, :class:`Task`, the cutting of an
eval set into a rank's batches), :mod:`.catalog` the names (:data:`TASKS`,
:func:`make_task`).
"""

from posenc.experiments.tasks.base import IGNORE, Batch, Task
from posenc.experiments.tasks.base import PAD as PAD
from posenc.experiments.tasks.catalog import TASKS, make_task
from posenc.experiments.tasks.counting import COUNTING_WORDS, CountingTask
from posenc.experiments.tasks.flipflop import FLIPFLOP_SPLITS, FLIPFLOP_WORDS, FlipFlopTask
from posenc.experiments.tasks.lm import LMTask
from posenc.experiments.tasks.synthetic import BOS as BOS
from posenc.experiments.tasks.synthetic import DIGIT0 as DIGIT0
from posenc.experiments.tasks.synthetic import EQ as EQ
from posenc.experiments.tasks.synthetic import LETTER_A as LETTER_A
from posenc.experiments.tasks.synthetic import PLUS as PLUS
from posenc.experiments.tasks.synthetic import SEP as SEP
from posenc.experiments.tasks.synthetic import SYNTHETIC_VOCAB as SYNTHETIC_VOCAB
from posenc.experiments.tasks.synthetic import AdditionTask, CopyTask, RecallTask, ReverseTask

# The vocabulary constants (PAD, BOS, ..., imported "as" themselves above) stay importable
# from here, outside __all__ as before.
__all__ = [
    "COUNTING_WORDS",
    "FLIPFLOP_SPLITS",
    "FLIPFLOP_WORDS",
    "IGNORE",
    "TASKS",
    "AdditionTask",
    "Batch",
    "CopyTask",
    "CountingTask",
    "FlipFlopTask",
    "LMTask",
    "RecallTask",
    "ReverseTask",
    "Task",
    "make_task",
]
