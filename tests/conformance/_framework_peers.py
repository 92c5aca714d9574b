"""Peers restated from tutorials and fetched sources (not installable), as adapters: the
seed's TensorFlow ``positional_encoding``, the TensorFlow transformer tutorial's
concatenated ``positional_encoding``, and Flax examples' ``sinusoidal_init``.

Each is the published arithmetic, evaluated at the case's positions instead of
``np.arange(length)``: a row depends on its position alone, so the rows equal those of the
full table (``test_frameworks.py`` checks that on the unmodified formulas). TensorFlow and
JAX are imported by the functions that use them.

Also what the framework tests (``test_frameworks.py``, ``test_adapters_torch.py``) assert of
a report: :func:`expect` (statuses) and :func:`named` (deviations). NumPy and posenc only.
"""

from __future__ import annotations

import fnmatch

import numpy as np

from posenc.conformance import Adapter, Unsupported

FLAX_COMMIT = "18f8f311c275d57f46d95e41b15aa97b454754c0"

FLOAT32_ANGLES = "angles computed in float32: the error grows with position"
AND_FLOAT32 = ", and angles computed in float32"


# --- what the tests assert of a report -------------------------------------------------------


def expect(report, rules: list[tuple[str, str]]) -> None:
    """Every result's status is that of the first ``(glob, status)`` matching its case."""
    got = {r.case: r.status for r in report.results}
    want = {case: next(s for g, s in rules if fnmatch.fnmatchcase(case, g)) for case in got}
    assert got == want, str(report)


def named(report, rules: list[tuple[str, str]]) -> None:
    """Every failure's deviation is the words of the first ``(glob, words)`` matching its
    case (``FLOAT32_ANGLES``: words starting so; the error they quote is measured)."""
    got = {r.case: r.deviation for r in report.failures}
    want = {case: next(w for g, w in rules if fnmatch.fnmatchcase(case, g)) for case in got}
    for case, words in want.items():
        if words == FLOAT32_ANGLES and (got[case] or "").startswith(FLOAT32_ANGLES):
            want[case] = got[case]
    assert got == want, str(report)


def _table_adapter(name: str, rows, layout: str, source: str) -> Adapter:
    """A float32 sinusoidal-table adapter claiming ``layout`` (sin before cos)."""
    return Adapter(
        name,
        "table",
        "sinusoidal",
        rows,
        convention={"layout": layout, "order": "sin_cos"},
        dtype="float32",
        source=source,
    )


def _tutorial_base(base: float) -> None:
    """:class:`Unsupported` unless ``base`` is the tutorials' fixed 10000."""
    if base != 10000.0:
        raise Unsupported("the tutorial's base is 10000")


# --- the seed: TensorFlow's original transformer tutorial ----------------------------------


def seed_get_angles(pos, i, d_model):
    angle_rates = 1 / np.power(10000, (2 * (i // 2)) / np.float32(d_model))
    return pos * angle_rates


def seed_positional_encoding(position, d_model):
    """The seed's ``positional_encoding(position, d_model)``, as the tutorial writes it."""
    import tensorflow as tf

    angle_rads = seed_get_angles(
        np.arange(position)[:, np.newaxis], np.arange(d_model)[np.newaxis, :], d_model
    )
    angle_rads[:, 0::2] = np.sin(angle_rads[:, 0::2])
    angle_rads[:, 1::2] = np.cos(angle_rads[:, 1::2])
    pos_encoding = angle_rads[np.newaxis, ...]
    return tf.cast(pos_encoding, dtype=tf.float32)


def _seed_rows(positions, dim, *, base):
    import tensorflow as tf

    _tutorial_base(base)
    angle_rads = seed_get_angles(
        np.asarray(positions)[:, np.newaxis], np.arange(dim)[np.newaxis, :], dim
    )
    angle_rads[:, 0::2] = np.sin(angle_rads[:, 0::2])
    angle_rads[:, 1::2] = np.cos(angle_rads[:, 1::2])
    return tf.cast(angle_rads, dtype=tf.float32).numpy()


def seed_adapter() -> Adapter:
    import tensorflow as tf

    return _table_adapter(
        "seed positional_encoding (NumPy + TensorFlow)",
        _seed_rows,
        "interleaved",
        f"the TensorFlow tutorial, restated; TensorFlow {tf.__version__}",
    )


# --- the TensorFlow transformer tutorial's concatenated table ------------------------------


def tutorial_positional_encoding(length, depth):
    """The TensorFlow transformer tutorial's ``positional_encoding(length, depth)``."""
    import tensorflow as tf

    depth = depth / 2
    positions = np.arange(length)[:, np.newaxis]  # (seq, 1)
    depths = np.arange(depth)[np.newaxis, :] / depth  # (1, depth)
    angle_rates = 1 / (10000**depths)  # (1, depth)
    angle_rads = positions * angle_rates  # (pos, depth)
    pos_encoding = np.concatenate([np.sin(angle_rads), np.cos(angle_rads)], axis=-1)
    return tf.cast(pos_encoding, dtype=tf.float32)


def _tutorial_rows(positions, dim, *, base):
    import tensorflow as tf

    _tutorial_base(base)
    depth = dim / 2
    depths = np.arange(depth)[np.newaxis, :] / depth
    angle_rates = 1 / (10000**depths)
    angle_rads = np.asarray(positions)[:, np.newaxis] * angle_rates
    pos_encoding = np.concatenate([np.sin(angle_rads), np.cos(angle_rads)], axis=-1)
    return tf.cast(pos_encoding, dtype=tf.float32).numpy()


def tutorial_adapter() -> Adapter:
    import tensorflow as tf

    return _table_adapter(
        "TF tutorial positional_encoding (concatenated)",
        _tutorial_rows,
        "half",
        f"the TensorFlow transformer tutorial, restated; TensorFlow {tf.__version__}",
    )


# --- Flax examples' sinusoidal_init (examples/lm1b/models.py, examples/wmt/models.py) -------


def flax_sinusoidal_init(max_len=2048, min_scale=1.0, max_scale=10000.0):
    """Flax examples' ``sinusoidal_init``, as fetched (google/flax at :data:`FLAX_COMMIT`)."""
    import jax.numpy as jnp

    def init(key, shape, dtype=np.float32):
        del key, dtype
        d_feature = shape[-1]
        pe = np.zeros((max_len, d_feature), dtype=np.float32)
        position = np.arange(0, max_len)[:, np.newaxis]
        scale_factor = -np.log(max_scale / min_scale) / (d_feature // 2 - 1)
        div_term = min_scale * np.exp(np.arange(0, d_feature // 2) * scale_factor)
        pe[:, : d_feature // 2] = np.sin(position * div_term)
        pe[:, d_feature // 2 : 2 * (d_feature // 2)] = np.cos(position * div_term)
        pe = pe[np.newaxis, :, :]  # [1, max_len, d_feature]
        return jnp.array(pe)

    return init


def _flax_rows(positions, dim, *, base):
    import jax.numpy as jnp

    pe = np.zeros((len(positions), dim), dtype=np.float32)
    position = np.asarray(positions)[:, np.newaxis]
    scale_factor = -np.log(base / 1.0) / (dim // 2 - 1)
    div_term = 1.0 * np.exp(np.arange(0, dim // 2) * scale_factor)
    pe[:, : dim // 2] = np.sin(position * div_term)
    pe[:, dim // 2 : 2 * (dim // 2)] = np.cos(position * div_term)
    return np.asarray(jnp.array(pe))


def flax_adapter() -> Adapter:
    import jax

    return _table_adapter(
        "Flax examples sinusoidal_init",
        _flax_rows,
        "flax",
        f"google/flax@{FLAX_COMMIT[:12]} examples/lm1b/models.py, fetched source; "
        f"JAX {jax.__version__}",
    )
