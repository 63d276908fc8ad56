"""DeepFM (Guo et al., 2017) as a Keras 3 functional model.

The embedding of each categorical feature is produced by an `embedding_fn`,
so the same network runs over a hashed `keras.layers.Embedding` (a fixed,
pre-hashed vocabulary) or over npu_rec sparse tables keyed by raw ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import keras
from keras import layers, ops


def hashed_embedding_fn(num_buckets: int, seed: int | None = None) -> Callable:
    """Returns an `embedding_fn` that hashes raw int64 ids into `num_buckets` rows.

    Each feature gets its own `keras.layers.Embedding` of `num_buckets` rows;
    a raw id `x` maps to row `x mod num_buckets` (collisions are shared rows).
    """
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, int) or num_buckets < 1:
        raise ValueError(
            f"`num_buckets` must be an integer >= 1. Received: num_buckets={num_buckets!r}"
        )

    def embed(name: str, ids, dim: int):
        buckets = ops.mod(ids, num_buckets)
        layer = layers.Embedding(
            num_buckets,
            dim,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=0.01, seed=seed),
            name=f"{name}_emb{dim}",
        )
        return layer(buckets)

    return embed


def build_deepfm(
    dense_names: Sequence[str],
    categorical_names: Sequence[str],
    embedding_fn: Callable,
    *,
    embedding_dim: int = 8,
    hidden_units: Sequence[int] = (128, 64),
    seed: int | None = None,
) -> keras.Model:
    """Builds a DeepFM click model.

    Args:
      dense_names: dense input names; each input is float32 `[batch]`.
      categorical_names: categorical input names; each input is int64 `[batch]`
        of raw ids.
      embedding_fn: `embedding_fn(name, ids, dim) -> float32 [batch, dim]`.
      embedding_dim: size of the factor (second-order) embeddings.
      hidden_units: widths of the deep part's hidden layers.
      seed: seeds the dense layers' initialisers.

    Returns:
      A `keras.Model` from a dict of the named inputs to the click
      probability, float32 `[batch, 1]`.
    """
    inputs = {n: keras.Input(shape=(), dtype="float32", name=n) for n in dense_names}
    inputs.update({n: keras.Input(shape=(), dtype="int64", name=n) for n in categorical_names})
    init = keras.initializers.GlorotUniform(seed=seed)

    dense = ops.stack([ops.log1p(ops.maximum(inputs[n], 0.0)) for n in dense_names], axis=1)
    factors = [embedding_fn(n, inputs[n], embedding_dim) for n in categorical_names]
    weights = [embedding_fn(n, inputs[n], 1) for n in categorical_names]

    # First order: one weight per id plus a linear layer on the dense part.
    first = ops.sum(ops.concatenate(weights, axis=1), axis=1, keepdims=True)
    first = first + layers.Dense(1, kernel_initializer=init, name="dense_linear")(dense)
    # Second order: the FM identity 0.5 * ((sum v)^2 - sum v^2).
    stacked = ops.stack(factors, axis=1)
    square_of_sum = ops.square(ops.sum(stacked, axis=1))
    sum_of_square = ops.sum(ops.square(stacked), axis=1)
    second = 0.5 * ops.sum(square_of_sum - sum_of_square, axis=1, keepdims=True)
    # Deep part over all factors and the dense features.
    deep = ops.concatenate([ops.reshape(stacked, (-1, len(factors) * embedding_dim)), dense], 1)
    for i, units in enumerate(hidden_units):
        deep = layers.Dense(units, activation="relu", kernel_initializer=init, name=f"mlp_{i}")(
            deep
        )
    deep = layers.Dense(1, kernel_initializer=init, name="mlp_out")(deep)
    prob = layers.Activation("sigmoid", name="prob")(first + second + deep)
    return keras.Model(inputs=inputs, outputs=prob, name="deepfm")
