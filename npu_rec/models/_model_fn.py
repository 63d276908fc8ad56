"""The reference models as Estimator `model_fn`s (tf.compat.v1 graphs, sparse tables).

The network is the same description as the Keras builders
(`npu_rec.models.deepfm_logit` and friends); here its embeddings are
`npu_rec.sparse_lookup`s of tables made by `npu_rec.create_table`, its dense
layers are `tf.compat.v1` variables, and training is
`npu_rec.estimator.sparse_train_op` (dense Adam + each table's own sparse
optimizer in one op).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import tensorflow as tf

import npu_rec
from npu_rec.estimator import EstimatorSpec, ModeKeys, sparse_train_op, streaming_auc
from npu_rec.models import _networks
from npu_rec.models._features import FeatureTables, default_sparse_optimizer, grouped_embed

AUC_THRESHOLDS = 200  # as keras.metrics.AUC, so both front ends report the same AUC
# Training graphs add (loss, labels, probabilities) here, for progress hooks to fetch.
TRAIN_OUTPUTS = "npu_rec.models.train_outputs"


def _dense_layer(seed):
    def layer(name, units, activation):
        def apply(x):
            with tf.compat.v1.variable_scope(name):
                init = tf.compat.v1.glorot_uniform_initializer(seed=seed)
                w = tf.compat.v1.get_variable("kernel", [x.shape[-1], units], initializer=init)
                b = tf.compat.v1.get_variable(
                    "bias", [units], initializer=tf.compat.v1.zeros_initializer()
                )
                y = tf.matmul(x, w) + b
            return tf.nn.relu(y) if activation == "relu" else y

        return apply

    return layer


def estimator_model_fn(
    model: str,
    feature_specs: Sequence,
    dense_names: Sequence[str] = (),
    *,
    embedding_dim: int | None = None,
    learning_rate: float = 1e-3,
    sparse_optimizer: Callable | None = None,
    seed: int | None = None,
    value_dtype="float32",
    table_options: Mapping | None = None,
    **arch,
) -> Callable:
    """A reference model as an Estimator `model_fn` for `npu_rec.estimator.NPUEstimator`.

    Example:
      >>> specs = [FeatureSpec(n) for n in CATEGORICAL_NAMES]
      >>> est = NPUEstimator(estimator_model_fn("deepfm", specs, DENSE_NAMES), model_dir="/m")
      >>> est.train(as_input_fn(SyntheticSource(), 512), max_steps=100)

    Args:
      model: "deepfm", "wdl" or "dlrm".
      feature_specs: `npu_rec.data.FeatureSpec`s (input -> table, thresholds).
      dense_names: dense feature names; `features[name]` float32 `[batch]`.
      embedding_dim: factor width (default 8; DLRM 16).
      learning_rate: Adam learning rate of the dense weights.
      sparse_optimizer: zero-argument callable making each table's sparse
        optimizer (default `Adagrad(0.05)`).
      value_dtype: the tables' row storage dtype ("float32", "bfloat16",
        "float16"; `npu_rec.create_table`'s `value_dtype`).
      table_options: further `create_table` arguments of every table, e.g.
        `{"not_admitted": "hashed"}`.
      seed: seeds the dense initialisers (op-level seeds).
      **arch: further network arguments (`hidden_units`, `top_units`, ...).

    Returns:
      `model_fn(features, labels, mode, params, config)`: `features` maps the
      dense names and the specs' `index_key`s to `[batch]` tensors (int64 ids
      for the categorical ones), `labels` is `[batch]` 0/1. Predictions:
      `probabilities` and `logits`, float32 `[batch]`; evaluation metrics:
      `auc`; `loss` is the mean log loss.
    """
    tables = FeatureTables(
        tuple(feature_specs),
        sparse_optimizer=sparse_optimizer or default_sparse_optimizer,
        value_dtype=value_dtype,
        table_options=table_options,
    )
    network = _networks.logit_fn(model)
    if embedding_dim is not None:
        arch["embedding_dim"] = embedding_dim
        if model == "dlrm" and "bottom_units" not in arch:
            arch["bottom_units"] = (64, embedding_dim)
    if model == "dlrm":
        _networks.check_dlrm_args(
            arch.get("embedding_dim", 16),
            arch.get("bottom_units", (64, 16)),
            arch.get("interaction", "dot"),
        )
    dense_names = list(dense_names)

    def model_fn(features, labels, mode, params, config):
        training = mode == ModeKeys.TRAIN

        def lookup(table_name, dim, spec, keys):
            table = npu_rec.create_table(table_name, dim, **tables.table_kwargs(spec))
            return npu_rec.sparse_lookup(table, keys, is_training=training)

        embed = grouped_embed(tables, features, lookup)
        dense = _networks.dense_block([tf.cast(features[n], tf.float32) for n in dense_names])
        logits = network(dense, tables.input_names, embed, _dense_layer(seed), **arch)
        logits = tf.reshape(logits, [-1])
        probs = tf.sigmoid(logits)
        predictions = {"probabilities": probs, "logits": logits}
        if mode == ModeKeys.PREDICT:
            return EstimatorSpec(mode, predictions=predictions)
        labels = tf.reshape(tf.cast(labels, tf.float32), [-1])
        loss = tf.reduce_mean(
            tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits), name="loss"
        )
        if mode == ModeKeys.EVAL:
            return EstimatorSpec(
                mode,
                loss=loss,
                eval_metric_ops={
                    "auc": streaming_auc(labels, probs, num_thresholds=AUC_THRESHOLDS)
                },
            )
        for t in (loss, labels, probs):
            tf.compat.v1.add_to_collection(TRAIN_OUTPUTS, t)
        optimizer = tf.compat.v1.train.AdamOptimizer(learning_rate)
        train_op = sparse_train_op(loss, optimizer, tf.compat.v1.train.get_global_step())
        return EstimatorSpec(mode, loss=loss, train_op=train_op, predictions=predictions)

    return model_fn
