"""With npu_rec.compat.mx_rec imported, a plain tf Saver saves and restores the sparse tables."""

import os

import numpy as np
import tensorflow as tf

from npu_rec.compat.mx_rec.core.embedding import create_table, sparse_lookup
from npu_rec.compat.mx_rec.optimizers.lazy_adam import create_hash_optimizer
from npu_rec.compat.mx_rec.util.variable import get_dense_and_sparse_variable

IDS = [[3, 5], [5, 9]]


def _graph(train):
    table = create_table(
        tf.int64,
        4,
        "saved",
        tf.compat.v1.truncated_normal_initializer(seed=1),
        device_vocabulary_size=16,
    )
    emb = sparse_lookup(table, tf.constant(IDS, tf.int64), None, is_train=train)
    w = tf.compat.v1.get_variable("w", [4], initializer=tf.compat.v1.ones_initializer())
    loss = tf.reduce_sum(emb * w)
    op = None
    if train:
        dense, sparse = get_dense_and_sparse_variable()
        op = tf.group(
            tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, var_list=dense),
            create_hash_optimizer(0.1).apply_gradients(
                zip(tf.gradients(loss, sparse), sparse, strict=True)
            ),
        )
    return table, emb, op


def test_saver_writes_and_reads_the_tables(tmp_path):
    prefix = str(tmp_path / "model-0")
    with tf.Graph().as_default():
        table, emb, op = _graph(True)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(op)
            sess.run(op)
            saver = tf.compat.v1.train.Saver()
            # the tables' variables are not in the dense checkpoint
            assert not any("npu_rec_table" in v.name for v in saver._var_list)
            saver.save(sess, prefix, global_step=2)
            trained = sess.run(emb)
            size = table.size()
    assert os.path.isfile(tmp_path / "sparse-model-0-2" / "saved.npr")
    with tf.Graph().as_default():
        table, emb, _ = _graph(False)  # prediction: no optimizer bound
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            tf.compat.v1.train.Saver().restore(sess, prefix + "-2")
            np.testing.assert_allclose(sess.run(emb), trained)
            assert table.size() == size == 3
