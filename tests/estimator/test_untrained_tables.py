"""An Estimator graph never trains silently without a table that has no optimizer.

The Keras front end lets such a table follow the compiled optimizer; a v1 graph
has no compiled optimizer to follow (a `tf.compat.v1.train` optimizer has no
sparse counterpart), so building the train op fails naming the table.
"""

import pytest
import tensorflow as tf

import npu_rec
from npu_rec.estimator import _sparse_train, sparse_train_op


def _loss():
    table = npu_rec.create_table("no_opt", 2)
    w = tf.compat.v1.get_variable("w", initializer=tf.constant(1.0))
    emb = npu_rec.sparse_lookup(table, tf.constant([1, 2], tf.int64), is_training=True)
    return w * tf.reduce_sum(emb)


def test_sparse_train_op_refuses_a_table_without_optimizer():
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        with pytest.raises(ValueError, match="'no_opt' has no optimizer"):
            sparse_train_op(_loss(), tf.compat.v1.train.AdamOptimizer(0.1), step)


def test_minimize_refuses_a_table_without_optimizer():
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        loss = _loss()
        train_op = tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss, step)
        with pytest.raises(ValueError, match="'no_opt' has no optimizer"):
            _sparse_train.add_missing_sparse_updates(loss, train_op)
