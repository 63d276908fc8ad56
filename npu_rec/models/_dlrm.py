"""DLRM (Naumov et al., 2019) and Wide & Deep (Cheng et al., 2016) as Keras 3 models.

Like `build_deepfm`, each takes an `embedding_fn(name, ids, dim)` so the same
network runs over hashed Keras embeddings or npu_rec sparse tables.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import keras
from keras import layers, ops


def _inputs(dense_names, categorical_names):
    inputs = {n: keras.Input(shape=(), dtype="float32", name=n) for n in dense_names}
    inputs.update({n: keras.Input(shape=(), dtype="int64", name=n) for n in categorical_names})
    dense = ops.stack([ops.log1p(ops.maximum(inputs[n], 0.0)) for n in dense_names], axis=1)
    return inputs, dense


def _mlp(x, units: Sequence[int], prefix: str, init, last_activation="relu"):
    for i, width in enumerate(units):
        activation = "relu" if i < len(units) - 1 else last_activation
        x = layers.Dense(width, activation=activation, kernel_initializer=init,
                         name=f"{prefix}_{i}")(x)
    return x


def build_dlrm(
    dense_names: Sequence[str],
    categorical_names: Sequence[str],
    embedding_fn: Callable,
    *,
    embedding_dim: int = 16,
    bottom_units: Sequence[int] = (64, 16),
    top_units: Sequence[int] = (256, 128),
    interaction: str = "dot",
    seed: int | None = None,
) -> keras.Model:
    """Builds a DLRM click model.

    The bottom MLP maps the dense features to `embedding_dim`; the interaction
    combines it with the 26 (or however many) embeddings: "dot" takes the
    pairwise dot products of all the vectors (and the bottom output), "cat"
    concatenates them; the top MLP maps that to the click logit.

    Args:
      dense_names: dense input names; each input float32 `[batch]`.
      categorical_names: categorical input names; each input int64 `[batch]`.
      embedding_fn: `embedding_fn(name, ids, dim) -> float32 [batch, dim]`.
      embedding_dim: embedding width; the bottom MLP's last width must equal it.
      bottom_units: widths of the bottom MLP.
      top_units: hidden widths of the top MLP (a final 1-unit layer is added).
      interaction: "dot" or "cat".
      seed: seeds the dense layers' initialisers.

    Returns:
      A `keras.Model` from the named inputs to the click probability, float32 `[batch, 1]`.

    Raises:
      ValueError: `interaction` is unknown, or `bottom_units[-1] != embedding_dim`.
    """
    if interaction not in ("dot", "cat"):
        raise ValueError(
            f"`interaction` must be 'dot' or 'cat'. Received: interaction={interaction!r}"
        )
    if not bottom_units or bottom_units[-1] != embedding_dim:
        raise ValueError(
            "The bottom MLP must end at `embedding_dim` so its output interacts with the "
            f"embeddings. Received: bottom_units={tuple(bottom_units)!r}, "
            f"embedding_dim={embedding_dim}"
        )
    init = keras.initializers.GlorotUniform(seed=seed)
    inputs, dense = _inputs(dense_names, categorical_names)
    bottom = _mlp(dense, bottom_units, "bottom", init)
    vectors = [bottom] + [embedding_fn(n, inputs[n], embedding_dim) for n in categorical_names]
    stacked = ops.stack(vectors, axis=1)  # [batch, f, dim]
    if interaction == "cat":
        feats = ops.reshape(stacked, (-1, len(vectors) * embedding_dim))
    else:
        f = len(vectors)
        dots = ops.matmul(stacked, ops.transpose(stacked, (0, 2, 1)))  # [batch, f, f]
        upper = [(i, j) for i in range(f) for j in range(i + 1, f)]
        flat = ops.reshape(dots, (-1, f * f))
        pairs = ops.take(flat, [i * f + j for i, j in upper], axis=1)
        feats = ops.concatenate([bottom, pairs], axis=1)
    logit = _mlp(feats, (*top_units, 1), "top", init, last_activation=None)
    prob = layers.Activation("sigmoid", name="prob")(logit)
    return keras.Model(inputs=inputs, outputs=prob, name="dlrm")


def build_wide_deep(
    dense_names: Sequence[str],
    categorical_names: Sequence[str],
    embedding_fn: Callable,
    *,
    embedding_dim: int = 8,
    hidden_units: Sequence[int] = (128, 64),
    seed: int | None = None,
) -> keras.Model:
    """Builds a Wide & Deep click model.

    The wide part is linear: one weight per id (an `embedding_fn` of width 1)
    plus a linear layer on the dense features; the deep part is an MLP over the
    embeddings and the dense features. Their logits add.

    Args and returns as `build_deepfm`.
    """
    init = keras.initializers.GlorotUniform(seed=seed)
    inputs, dense = _inputs(dense_names, categorical_names)
    wide = [embedding_fn(n, inputs[n], 1) for n in categorical_names]
    wide = ops.sum(ops.concatenate(wide, axis=1), axis=1, keepdims=True)
    wide = wide + layers.Dense(1, kernel_initializer=init, name="wide_dense")(dense)
    factors = [embedding_fn(n, inputs[n], embedding_dim) for n in categorical_names]
    deep = ops.concatenate([*factors, dense], axis=1)
    deep = _mlp(deep, (*hidden_units, 1), "deep", init, last_activation=None)
    prob = layers.Activation("sigmoid", name="prob")(wide + deep)
    return keras.Model(inputs=inputs, outputs=prob, name="wide_deep")
