"""`sparse_train_op`: one backward pass that updates dense weights and sparse tables.

Every training `npu_rec.sparse_lookup` made while the `model_fn` builds its
graph is recorded in the collection `npu_rec.LOOKUP_COLLECTION`.
`sparse_train_op(loss, dense_optimizer, global_step)` differentiates the loss
once, with respect to the trainable dense variables and the recorded
unique-row tensors, applies the dense gradients with the `tf.compat.v1`
optimizer and the row gradients with each table's own sparse optimizer, and
returns the grouped op. In an accelerated `fast` (float16) phase it also does
dynamic loss scaling: the loss is multiplied by a scale, the gradients divided
by it, and a step whose gradients are not finite updates nothing and halves
the scale (the global step still advances).

A `model_fn` that keeps `optimizer.minimize(loss, global_step)` works too:
the Estimator notices the lookups its `train_op` does not update and adds
their sparse-optimizer step (`add_missing_sparse_updates`), at the cost of a
second backward pass.
"""

from __future__ import annotations

import tensorflow as tf

from npu_rec import _log as logging
from npu_rec._compat import create_v1_slots
from npu_rec.table._lookup import LOOKUP_COLLECTION, apply_recorded_gradients

APPLIED_COLLECTION = "npu_rec_estimator_applied_lookups"
_LOSS_SCALING_COLLECTION = "npu_rec_estimator_loss_scaling"
#: Initial dynamic loss scale, and the finite steps after which it doubles.
INITIAL_LOSS_SCALE = 2.0**15
GROWTH_STEPS = 2000


def enable_loss_scaling(graph: tf.Graph) -> None:
    """Asks `sparse_train_op` calls in `graph` to scale the loss (float16 phases)."""
    graph.add_to_collection(_LOSS_SCALING_COLLECTION, 1)


def _loss_scaling(graph: tf.Graph) -> bool:
    return bool(graph.get_collection(_LOSS_SCALING_COLLECTION))


def pending_lookups(graph: tf.Graph | None = None) -> list:
    """The recorded training lookups of `graph` whose gradients no op applies yet."""
    graph = graph or tf.compat.v1.get_default_graph()
    applied = set(graph.get_collection(APPLIED_COLLECTION))
    return [r for r in graph.get_collection(LOOKUP_COLLECTION) if r.embeddings.name not in applied]


def _mark_applied(graph: tf.Graph, records) -> None:
    for r in records:
        graph.add_to_collection(APPLIED_COLLECTION, r.embeddings.name)


def sparse_train_op(
    loss, dense_optimizer, global_step=None, var_list=None, name: str = "sparse_train_op"
) -> tf.Operation:
    """Builds one training step for dense weights and the sparse tables.

    Args:
      loss: float scalar tensor.
      dense_optimizer: A `tf.compat.v1.train.Optimizer` for the dense weights.
      global_step: The global step variable to increment (or None).
      var_list: Dense variables to train; default the trainable variables.
      name: Name scope of the built ops.

    Returns:
      The grouped training op. Records of `npu_rec.LOOKUP_COLLECTION` it
      updates are marked as applied.

    Raises:
      TypeError: `dense_optimizer` is not a `tf.compat.v1.train.Optimizer`.
      ValueError: nothing to train (no dense variable and no recorded lookup).

    Example:
      >>> train_op = npu_rec.estimator.sparse_train_op(
      ...     loss, tf.compat.v1.train.AdamOptimizer(1e-3),
      ...     tf.compat.v1.train.get_global_step())
    """
    if not isinstance(dense_optimizer, tf.compat.v1.train.Optimizer):
        raise TypeError(
            "`dense_optimizer` must be a tf.compat.v1.train.Optimizer. "
            f"Received: dense_optimizer={dense_optimizer!r}"
        )
    graph = tf.compat.v1.get_default_graph()
    dense = list(var_list) if var_list is not None else tf.compat.v1.trainable_variables()
    records = pending_lookups(graph)
    if not dense and not records:
        raise ValueError(
            "sparse_train_op found nothing to train: no trainable variable and "
            "no training npu_rec.sparse_lookup in this graph."
        )
    with tf.name_scope(name):
        loss = tf.cast(loss, tf.float32)
        targets = dense + [r.embeddings for r in records]
        if not _loss_scaling(graph):
            grads = tf.gradients(loss, targets)
            op = _apply(dense_optimizer, dense, records, grads, global_step)
        else:
            op = _apply_scaled(loss, dense_optimizer, dense, records, targets, global_step)
    _mark_applied(graph, records)
    return op


def _apply(optimizer, dense, records, grads, global_step):
    pairs = [(g, v) for g, v in zip(grads[: len(dense)], dense, strict=True) if g is not None]
    ops = []
    if pairs:
        ops.append(optimizer.apply_gradients(pairs, global_step=global_step))
    elif global_step is not None:
        ops.append(tf.compat.v1.assign_add(global_step, 1))
    if records:
        ops.append(apply_recorded_gradients(records, grads[len(dense) :]))
    return tf.group(*ops)


def _apply_scaled(loss, optimizer, dense, records, targets, global_step):
    """Dynamic loss scaling: skip non-finite steps, halve / double the scale."""
    with tf.init_scope():
        scale = tf.compat.v1.get_variable(
            "npu_rec_loss_scale", initializer=tf.constant(INITIAL_LOSS_SCALE), trainable=False
        )
        good = tf.compat.v1.get_variable(
            "npu_rec_loss_scale_good_steps", initializer=tf.constant(0, tf.int64), trainable=False
        )
    grads = tf.gradients(loss * scale, targets)
    grads = [None if g is None else _unscale(g, scale) for g in grads]
    _create_slots_outside_cond(
        optimizer, [v for v, g in zip(dense, grads, strict=False) if g is not None]
    )
    flat = [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads if g is not None]
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in flat])

    def apply():
        with tf.control_dependencies([_apply(optimizer, dense, records, grads, None)]):
            grow = tf.equal(good + 1, GROWTH_STEPS)
            return tf.group(
                scale.assign(tf.where(grow, scale * 2.0, scale)),
                good.assign(tf.where(grow, tf.constant(0, tf.int64), good + 1)),
            )

    def skip():
        return tf.group(
            scale.assign(tf.maximum(scale / 2.0, 1.0)), good.assign(tf.constant(0, tf.int64))
        )

    step = tf.cond(finite, apply, skip)
    if global_step is None:
        return step
    with tf.control_dependencies([step]):
        return tf.group(tf.compat.v1.assign_add(global_step, 1))


def _create_slots_outside_cond(optimizer, variables):
    """Creates the optimizer's slots here, as `apply_gradients` would.

    Inside the `tf.cond` below, `apply_gradients` would create them outside the
    current name scope (`beta1_power` instead of `sparse_train_op/beta1_power`),
    so the float32 phase after the switch would not find them in the
    hand-over checkpoint. Made here, the names are the ones a float32 graph
    gives them; the call in the cond then reuses them.
    """
    if variables:
        with tf.init_scope():
            create_v1_slots(optimizer, variables)


def _unscale(g, scale):
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(g.values / scale, g.indices, g.dense_shape)
    return g / scale


def add_missing_sparse_updates(loss, train_op) -> tf.Operation:
    """Adds the sparse-optimizer step of lookups `train_op` does not update.

    Args:
      loss: The spec's loss.
      train_op: The spec's train_op (e.g. from `optimizer.minimize`).

    Returns:
      `train_op` unchanged when nothing is pending, else a group of it and the
      sparse updates (their gradients come from the same forward pass).
    """
    graph = tf.compat.v1.get_default_graph()
    records = pending_lookups(graph)
    if not records:
        return train_op
    logging.info(
        "npu_rec: the model_fn's train_op does not update %d sparse lookup(s); "
        "adding their sparse-optimizer step. npu_rec.estimator.sparse_train_op "
        "does both in one backward pass.",
        len(records),
    )
    if _loss_scaling(graph):
        logging.warning(
            "npu_rec: float16 accelerated training without sparse_train_op "
            "runs without loss scaling."
        )
    with tf.name_scope("npu_rec_sparse_updates"):
        grads = tf.gradients(tf.cast(loss, tf.float32), [r.embeddings for r in records])
        sparse_op = apply_recorded_gradients(records, grads)
    _mark_applied(graph, records)
    return tf.group(train_op, sparse_op)
