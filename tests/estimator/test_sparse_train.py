"""`sparse_train_op`'s dynamic loss scaling (the float16 phase of `fast`)."""

import numpy as np
import tensorflow as tf

import npu_rec
from npu_rec.estimator import _sparse_train, sparse_train_op


def _graph():
    """loss = x * (w + sum of the rows of ids [1, 2]); SGD(1) for w and the table."""
    graph = tf.Graph()
    with graph.as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        _sparse_train.enable_loss_scaling(graph)
        x = tf.compat.v1.placeholder(tf.float32, [])
        w = tf.compat.v1.get_variable("w", initializer=tf.constant(1.0))
        table = npu_rec.create_table(
            "ls",
            2,
            optimizer=npu_rec.optimizers.SGD(1.0),
            initializer=lambda shape, dtype: tf.fill(shape, 0.5),
        )
        ids = tf.constant([1, 2], tf.int64)
        emb = npu_rec.sparse_lookup(table, ids)
        loss = x * (w + tf.reduce_sum(emb))
        op = sparse_train_op(loss, tf.compat.v1.train.GradientDescentOptimizer(1.0), step)
        scale = [v for v in tf.compat.v1.global_variables() if v.op.name == "npu_rec_loss_scale"][0]
        init = tf.compat.v1.global_variables_initializer()
    return graph, x, w, emb, op, scale, step, init


def test_finite_steps_apply_unscaled_gradients_and_nonfinite_steps_are_skipped():
    graph, x, w, rows, op, scale, step, init = _graph()
    with graph.as_default(), tf.compat.v1.Session() as sess:
        sess.run(init)
        # Admit the keys first: this loss's row gradient does not depend on the
        # rows, so nothing orders the update after the admission of the same run.
        np.testing.assert_allclose(sess.run(rows), np.full((2, 2), 0.5))
        assert sess.run(scale) == _sparse_train.INITIAL_LOSS_SCALE
        sess.run(op, {x: 0.25})  # d loss / d w = 0.25, per row entry 0.25
        assert sess.run(w) == 0.75  # unscaled: 1 - 0.25, not 1 - 0.25 * 2**15
        np.testing.assert_allclose(sess.run(rows), np.full((2, 2), 0.25))
        assert sess.run(scale) == _sparse_train.INITIAL_LOSS_SCALE
        sess.run(op, {x: np.inf})  # non-finite gradients: nothing updated
        assert sess.run(w) == 0.75
        np.testing.assert_allclose(sess.run(rows), np.full((2, 2), 0.25))
        assert sess.run(scale) == _sparse_train.INITIAL_LOSS_SCALE / 2  # scale halved
        assert sess.run(step) == 2  # the global step still advances
        sess.run(op, {x: 0.25})
        assert sess.run(w) == 0.5


def test_optimizer_slots_keep_the_names_of_a_float32_graph():
    """The switch hands slots over by name: loss scaling must not rename them."""
    names = []
    for scaled in (False, True):
        npu_rec.shutdown()
        graph = tf.Graph()
        with graph.as_default():
            step = tf.compat.v1.train.get_or_create_global_step()
            if scaled:
                _sparse_train.enable_loss_scaling(graph)
            w = tf.compat.v1.get_variable("w", initializer=tf.constant([1.0, 2.0]))
            sparse_train_op(tf.reduce_sum(w * w), tf.compat.v1.train.AdamOptimizer(0.1), step)
            names.append(
                {
                    v.op.name
                    for v in tf.compat.v1.global_variables()
                    if "loss_scale" not in v.op.name
                }
            )
    assert names[0] == names[1]
    assert "sparse_train_op/beta1_power" in names[1]
