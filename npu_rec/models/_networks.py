"""The reference networks, written once for both front ends.

Each network is a function of the inputs it needs and two factories the
front end supplies:

* `embed(name, dim) -> float32 [batch, dim]`: the embedding of categorical
  input `name` (a Keras `SparseEmbedding`, a hashed `keras.layers.Embedding`,
  or an `npu_rec.sparse_lookup` in an Estimator graph);
* `layer(name, units, activation) -> callable(x)`: a fully connected layer
  (`keras.layers.Dense` in Keras, `tf.compat.v1` variables in a `model_fn`).

The arithmetic uses `keras.ops`, which works on Keras symbolic tensors and on
`tf.compat.v1` graph tensors alike, so the Keras builders and the Estimator
`model_fn`s run the same description. Every network returns the click logit,
float32 `[batch, 1]`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from keras import ops

MODELS = ("deepfm", "wdl", "dlrm")


def dense_block(dense_inputs: Sequence) -> object | None:
    """Stacks dense features `[batch]` into `log1p(max(x, 0))`, float32 `[batch, n]`."""
    if not dense_inputs:
        return None
    return ops.stack([ops.log1p(ops.maximum(x, 0.0)) for x in dense_inputs], axis=1)


def mlp(x, units: Sequence[int], prefix: str, layer: Callable, last_activation="relu"):
    """Fully connected layers `prefix_0`, `prefix_1`, ...; ReLU except maybe the last."""
    for i, width in enumerate(units):
        activation = "relu" if i < len(units) - 1 else last_activation
        x = layer(f"{prefix}_{i}", width, activation)(x)
    return x


def _sum_linear(weights, dense, layer, dense_name):
    """First-order term: the sum of per-id weights plus a linear layer on the dense part."""
    out = ops.sum(ops.concatenate(weights, axis=1), axis=1, keepdims=True)
    if dense is not None:
        out = out + layer(dense_name, 1, None)(dense)
    return out


def deepfm_logit(
    dense,
    names: Sequence[str],
    embed: Callable,
    layer: Callable,
    *,
    embedding_dim: int = 8,
    hidden_units: Sequence[int] = (128, 64),
):
    """DeepFM (Guo et al., 2017): first order + FM second order + a deep MLP.

    Args:
      dense: float32 `[batch, n_dense]` (see `dense_block`) or None.
      names: categorical input names, in order.
      embed: `embed(name, dim) -> [batch, dim]`.
      layer: `layer(name, units, activation) -> callable`.
      embedding_dim: width of the factor embeddings.
      hidden_units: widths of the deep part's hidden layers.

    Returns:
      The logit, float32 `[batch, 1]`.
    """
    factors = [embed(n, embedding_dim) for n in names]
    weights = [embed(n, 1) for n in names]
    first = _sum_linear(weights, dense, layer, "dense_linear")
    stacked = ops.stack(factors, axis=1)  # [batch, f, dim]
    square_of_sum = ops.square(ops.sum(stacked, axis=1))
    sum_of_square = ops.sum(ops.square(stacked), axis=1)
    second = 0.5 * ops.sum(square_of_sum - sum_of_square, axis=1, keepdims=True)
    deep = ops.reshape(stacked, (-1, len(factors) * embedding_dim))
    if dense is not None:
        deep = ops.concatenate([deep, dense], 1)
    deep = mlp(deep, hidden_units, "mlp", layer)
    deep = layer("mlp_out", 1, None)(deep)
    return first + second + deep


def wide_deep_logit(
    dense,
    names: Sequence[str],
    embed: Callable,
    layer: Callable,
    *,
    embedding_dim: int = 8,
    hidden_units: Sequence[int] = (128, 64),
):
    """Wide & Deep (Cheng et al., 2016): a linear wide part plus a deep MLP; logits add.

    Args and returns as `deepfm_logit`.
    """
    wide = _sum_linear([embed(n, 1) for n in names], dense, layer, "wide_dense")
    factors = [embed(n, embedding_dim) for n in names]
    deep = ops.concatenate([*factors, *([] if dense is None else [dense])], axis=1)
    deep = mlp(deep, (*hidden_units, 1), "deep", layer, last_activation=None)
    return wide + deep


def dlrm_logit(
    dense,
    names: Sequence[str],
    embed: Callable,
    layer: Callable,
    *,
    embedding_dim: int = 16,
    bottom_units: Sequence[int] = (64, 16),
    top_units: Sequence[int] = (256, 128),
    interaction: str = "dot",
):
    """DLRM (Naumov et al., 2019): bottom MLP, feature interaction, top MLP.

    The bottom MLP maps the dense features to `embedding_dim`; "dot" takes the
    pairwise dot products of all vectors (plus the bottom output), "cat"
    concatenates them. Without dense features there is no bottom MLP.

    Args:
      dense, names, embed, layer: as `deepfm_logit`.
      embedding_dim: embedding width; `bottom_units[-1]` must equal it.
      bottom_units: widths of the bottom MLP.
      top_units: hidden widths of the top MLP (a final 1-unit layer is added).
      interaction: "dot" or "cat".

    Returns:
      The logit, float32 `[batch, 1]`.

    Raises:
      ValueError: `interaction` is unknown, or `bottom_units[-1] != embedding_dim`.
    """
    check_dlrm_args(embedding_dim, bottom_units, interaction)
    bottom = None if dense is None else mlp(dense, bottom_units, "bottom", layer)
    vectors = ([] if bottom is None else [bottom]) + [embed(n, embedding_dim) for n in names]
    stacked = ops.stack(vectors, axis=1)  # [batch, f, dim]
    f = len(vectors)
    if interaction == "cat":
        feats = ops.reshape(stacked, (-1, f * embedding_dim))
    else:
        dots = ops.matmul(stacked, ops.transpose(stacked, (0, 2, 1)))  # [batch, f, f]
        pairs = ops.take(
            ops.reshape(dots, (-1, f * f)),
            [i * f + j for i in range(f) for j in range(i + 1, f)],
            axis=1,
        )
        feats = pairs if bottom is None else ops.concatenate([bottom, pairs], axis=1)
    return mlp(feats, (*top_units, 1), "top", layer, last_activation=None)


def check_dlrm_args(embedding_dim, bottom_units, interaction) -> None:
    """Raises ValueError for an unknown `interaction` or a bottom MLP of the wrong width."""
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


LOGITS = {"deepfm": deepfm_logit, "wdl": wide_deep_logit, "dlrm": dlrm_logit}


def logit_fn(model: str) -> Callable:
    """The network function of `model` ("deepfm", "wdl" or "dlrm")."""
    if model not in LOGITS:
        raise ValueError(f"`model` must be one of {list(MODELS)}. Received: model={model!r}")
    return LOGITS[model]
