"""The classic order-sensitivity demonstrations, computed: why transformers need positions.

Two sentences with the same words in another order ("tom chase jerry", "jerry chase tom")
go through the simplest models, and the numbers say whether the model can tell them apart:

(a) mean-pooled token embeddings: the two means are equal (a sum does not see order);
(b) adding the naive index ``p`` first: still equal (the same positions are added to both),
    and a large position swamps the token: ``E[tom] + PE(100)`` and ``E[jerry] + PE(100)``
    point almost the same way;
(c) one self-attention layer without positions: each word's output is the same wherever
    it stands (the outputs permute with the inputs);
(d) with sinusoidal positions added to the embeddings, rotary in attention, or ALiBi in
    causal attention, the outputs differ (so does causal attention alone: the mask itself
    carries order). A symmetric bias in bidirectional attention cannot tell a sentence from
    its reverse: every distance ``|i - j|`` is preserved.

Attention runs through :func:`posenc.attention`, the library's own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from posenc._errors import PosEncError, check_int
from posenc.analysis._encodings import additive_table, resolve_encoding
from posenc.analysis._results import Result

# The widest embedding the demonstration builds (its projections are dim x dim).
MAX_DIM = 1 << 12

__all__ = [
    "ATTENTION_SETTINGS",
    "AttentionDemo",
    "OrderSensitivity",
    "PoolingDemo",
    "SwampingDemo",
    "order_sensitivity",
]

# (label, encoding config without sizes, where it acts, causal). Sizes are filled in.
ATTENTION_SETTINGS: tuple[tuple[str, str | None, str, bool], ...] = (
    ("no positions", None, "none", False),
    ("sinusoidal added to embeddings", "sinusoidal", "embeddings", False),
    ("RoPE in attention", "rope", "attention", False),
    ("ALiBi in causal attention", "alibi", "attention", True),
    ("no positions, causal mask", None, "none", True),
    ("symmetric ALiBi, bidirectional", "alibi-symmetric", "attention", False),
)


@dataclasses.dataclass(frozen=True)
class PoolingDemo(Result):
    """Mean pooling of (token + position) embeddings: can it tell the sentences apart?"""

    encoding: str
    pooled_distance: float
    scale: float
    tells_apart: bool


@dataclasses.dataclass(frozen=True)
class SwampingDemo(Result):
    """A large naive index next to two different tokens: the tokens become alike."""

    position: int
    position_norm: float
    token_norm: float
    ratio: float
    words: tuple[str, str]
    token_cosine: float
    encoded_cosine: float


@dataclasses.dataclass(frozen=True)
class AttentionDemo(Result):
    """One self-attention layer on both sentences.

    ``word_distances[w]``: ``||out_a[w] - out_b[w]||``, the output for word ``w`` in the
    first sentence against its output in the second. ``permutation_equivariant``: every
    such distance is below ``1e-5`` times the outputs' rms norm.
    """

    label: str
    encoding: str
    where: str
    causal: bool
    word_distances: dict[str, float]
    max_word_distance: float
    scale: float
    permutation_equivariant: bool

    choices: ClassVar[dict[str, tuple[str, ...]]] = {
        **Result.choices,
        "where": ("none", "embeddings", "attention"),
    }

    def _check(self) -> None:
        """``max_word_distance`` is the largest of ``word_distances`` (one per word)."""
        if not self.word_distances:
            raise PosEncError("word_distances must hold one distance per word, got none")
        largest = max(self.word_distances.values())
        if self.max_word_distance != largest:
            raise PosEncError(
                f"max_word_distance must be the largest of word_distances ({largest}), got "
                f"{self.max_word_distance}"
            )


@dataclasses.dataclass(frozen=True)
class OrderSensitivity(Result):
    """Demonstrations (a) to (d) on two orderings of the same words."""

    sentences: tuple[str, str]
    vocabulary: tuple[str, ...]
    dim: int
    num_heads: int
    seed: int
    mean_pooling: PoolingDemo
    index_pooling: PoolingDemo
    index_swamping: SwampingDemo
    attention: tuple[AttentionDemo, ...]

    def _check(self) -> None:
        """``sentences`` are two orderings of ``vocabulary``, the words of every demo."""
        words, _ = _words(self.sentences)
        if self.vocabulary != tuple(sorted(words)):
            raise PosEncError(
                f"vocabulary must be the sentences' words, sorted ({sorted(words)}), got "
                f"{list(self.vocabulary)}"
            )
        for demo in self.attention:
            if sorted(demo.word_distances) != sorted(words):
                raise PosEncError(
                    f"attention demos must measure the sentences' words {sorted(words)}, got "
                    f"{sorted(demo.word_distances)} in {demo.label!r}"
                )


def _words(sentences: Sequence[str]) -> tuple[list[str], list[str]]:
    if isinstance(sentences, str) or len(sentences) != 2:
        raise PosEncError(f"sentences must be two strings, got {sentences!r}")
    a, b = (str(s).split() for s in sentences)
    if len(a) < 2 or sorted(a) != sorted(b) or len(set(a)) != len(a):
        raise PosEncError(
            "sentences must be two orderings of the same >= 2 distinct words, "
            f"got {sentences[0]!r} and {sentences[1]!r}"
        )
    return a, b


def _cosine(x: torch.Tensor, y: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(x, y, dim=0))


def _attention_encoding(name: str | None, num_heads: int, head_dim: int) -> Any:
    if name is None or name == "sinusoidal":
        return None
    if name == "rope":
        return resolve_encoding({"name": "rope", "head_dim": head_dim})
    if name == "alibi":
        return resolve_encoding({"name": "alibi", "num_heads": num_heads})
    return resolve_encoding({"name": "alibi", "num_heads": num_heads, "causal": False})


def _self_attention(
    x: torch.Tensor,
    weights: torch.Tensor,
    *,
    num_heads: int,
    encoding: Any,
    causal: bool,
) -> torch.Tensor:
    """One attention layer with projections ``weights [3, d, d]``: ``[s, d]`` -> ``[s, d]``."""
    from posenc.attend import attention

    s, d = x.shape
    q, k, v = (
        (x @ w).reshape(1, s, num_heads, d // num_heads).transpose(1, 2)  # [1, h, s, d/h]
        for w in weights
    )
    out = attention(q, k, v, encoding=encoding, causal=causal)  # [1, h, s, d/h]
    return out.transpose(1, 2).reshape(s, d)


@torch.no_grad()
def order_sensitivity(
    sentences: Sequence[str] = ("tom chase jerry", "jerry chase tom"),
    *,
    dim: int = 16,
    num_heads: int = 2,
    swamp_position: int = 100,
    seed: int = 0,
) -> OrderSensitivity:
    """Run demonstrations (a) to (d) (see the module docs) and return their numbers.

    Args:
        sentences: two orderings of the same distinct words (split on whitespace).
        dim: embedding size (random ``N(0, 1)`` token embeddings).
        num_heads: attention heads (``dim`` must be divisible by it).
        swamp_position: the position of demonstration (b)'s swamping.
        seed: seed of the embeddings and the attention projections.

    Examples:
        >>> from posenc.analysis import order_sensitivity
        >>> r = order_sensitivity()
        >>> r.mean_pooling.tells_apart, r.index_pooling.tells_apart
        (False, False)
        >>> [(a.label, a.permutation_equivariant) for a in r.attention][:3]
        [('no positions', True), ('sinusoidal added to embeddings', False), ('RoPE in attention', False)]
    """
    words_a, words_b = _words(sentences)
    dim = check_int("dim", dim, min=2, max=MAX_DIM)
    num_heads = check_int("num_heads", num_heads, min=1)
    if dim % (2 * num_heads):
        raise PosEncError(
            f"dim must be divisible by 2 * num_heads ({2 * num_heads}) so heads can rotate, "
            f"got {dim}"
        )
    swamp_position = check_int("swamp_position", swamp_position, min=0)
    seed = check_int("seed", seed)
    pair = _Pair.drawn(words_a, words_b, dim, seed)
    return OrderSensitivity(
        sentences=(" ".join(words_a), " ".join(words_b)),
        vocabulary=tuple(pair.vocab),
        dim=dim,
        num_heads=num_heads,
        seed=seed,
        mean_pooling=_pooling(pair, "none"),
        index_pooling=_pooling(pair, "index"),
        index_swamping=_swamping(pair, swamp_position),
        attention=tuple(
            _attention_demo(pair, setting, num_heads) for setting in ATTENTION_SETTINGS
        ),
    )


@dataclasses.dataclass(frozen=True)
class _Pair:
    """The two sentences embedded: the words, random token embeddings and projections."""

    words_a: list[str]
    words_b: list[str]
    vocab: list[str]  # the words, sorted
    table: torch.Tensor  # [V, d] token embeddings
    weights: torch.Tensor  # [3, d, d] q, k, v projections
    x_a: torch.Tensor  # [s, d] the first sentence's embeddings
    x_b: torch.Tensor  # [s, d] the second's
    token_scale: float  # the mean norm of a token embedding

    @classmethod
    def drawn(cls, words_a: list[str], words_b: list[str], dim: int, seed: int) -> _Pair:
        """Embeddings ``N(0, 1)`` and projections ``N(0, 1 / dim)`` drawn from ``seed``."""
        vocab = sorted(words_a)
        gen = torch.Generator().manual_seed(seed)
        table = torch.randn(len(vocab), dim, generator=gen)  # [V, d]
        weights = torch.randn(3, dim, dim, generator=gen) / math.sqrt(dim)  # [3, d, d]
        ids_a = torch.tensor([vocab.index(w) for w in words_a])
        ids_b = torch.tensor([vocab.index(w) for w in words_b])
        scale = float(table.norm(dim=-1).mean())
        return cls(words_a, words_b, vocab, table, weights, table[ids_a], table[ids_b], scale)

    @property
    def dim(self) -> int:
        return self.table.shape[1]

    @property
    def length(self) -> int:
        return len(self.words_a)


def _pooling(pair: _Pair, encoding: str) -> PoolingDemo:
    """(a), (b): the mean of token + position embeddings of each sentence, compared."""
    dim = pair.dim
    config = {"name": encoding} if encoding == "none" else {"name": encoding, "dim": dim}
    pe = additive_table(resolve_encoding(config), torch.arange(pair.length), dim=dim)
    mean_a = (pair.x_a.double() + pe).mean(0)
    mean_b = (pair.x_b.double() + pe).mean(0)
    gap = float((mean_a - mean_b).norm())
    return PoolingDemo(encoding, gap, pair.token_scale, gap > 1e-6 * pair.token_scale)


def _swamping(pair: _Pair, position: int) -> SwampingDemo:
    """(b): the naive index at ``position`` added to two different tokens."""
    index = resolve_encoding({"name": "index", "dim": pair.dim})
    pe_far = additive_table(index, torch.tensor([position]))[0].float()  # [d]
    w1, w2 = pair.words_a[0], pair.words_a[-1]
    e1, e2 = pair.table[pair.vocab.index(w1)], pair.table[pair.vocab.index(w2)]
    return SwampingDemo(
        position=position,
        position_norm=float(pe_far.norm()),
        token_norm=pair.token_scale,
        ratio=float(pe_far.norm()) / pair.token_scale,
        words=(w1, w2),
        token_cosine=_cosine(e1, e2),
        encoded_cosine=_cosine(e1 + pe_far, e2 + pe_far),
    )


def _attention_demo(
    pair: _Pair, setting: tuple[str, str | None, str, bool], num_heads: int
) -> AttentionDemo:
    """(c), (d): one self-attention layer on both sentences, each word's outputs compared."""
    label, name, where, causal = setting
    dim = pair.dim
    enc = _attention_encoding(name, num_heads, dim // num_heads)
    inputs = (pair.x_a, pair.x_b)
    if name == "sinusoidal":
        sinusoidal = resolve_encoding({"name": "sinusoidal", "dim": dim})
        pe = additive_table(sinusoidal, torch.arange(pair.length))
        inputs = (pair.x_a + pe.float(), pair.x_b + pe.float())
    out_a, out_b = (
        _self_attention(x, pair.weights, num_heads=num_heads, encoding=enc, causal=causal)
        for x in inputs
    )
    gaps = {
        w: float((out_a[pair.words_a.index(w)] - out_b[pair.words_b.index(w)]).norm())
        for w in pair.vocab
    }
    scale = float(out_a.norm(dim=-1).pow(2).mean().sqrt())
    worst = max(gaps.values())
    return AttentionDemo(
        label=label,
        encoding=name or "none",
        where=where,
        causal=causal,
        word_distances=gaps,
        max_word_distance=worst,
        scale=scale,
        permutation_equivariant=worst <= 1e-5 * scale,
    )
