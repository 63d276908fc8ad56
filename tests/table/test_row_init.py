"""Rows of new keys from TF1 constant and fan-based initializers (sized [capacity, dim])."""

import numpy as np
import pytest
import tensorflow as tf

import npu_rec


def _rows(initializer, capacity, dim, n):
    g = tf.Graph()
    with g.as_default():
        t = npu_rec.create_table("init", dim, capacity=capacity, initializer=initializer)
        emb = npu_rec.sparse_lookup(t, tf.range(n, dtype=tf.int64))
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            return s.run(emb)


@pytest.mark.parametrize(
    "make",
    [lambda: tf.compat.v1.constant_initializer(0.5), lambda: tf.constant_initializer(0.5)],
)
def test_constant_initializer_fills_rows(make):
    np.testing.assert_array_equal(_rows(make(), 16, 3, 4), np.full((4, 3), 0.5, np.float32))


def test_constant_per_column():
    rows = _rows(tf.compat.v1.constant_initializer([1.0, 2.0, 3.0]), 16, 3, 2)
    np.testing.assert_array_equal(rows, [[1, 2, 3], [1, 2, 3]])


@pytest.mark.parametrize(
    ("make", "variance"),
    [
        # fan_avg of [2000, 8] = 1004; scale 1 -> variance 1/1004
        (
            lambda: tf.compat.v1.variance_scaling_initializer(
                mode="fan_avg", distribution="normal", seed=1
            ),
            1 / 1004,
        ),
        (lambda: tf.compat.v1.glorot_uniform_initializer(seed=1), 1 / 1004),
        (lambda: tf.keras.initializers.HeNormal(seed=1), 2 / 2000),
        (
            lambda: tf.compat.v1.variance_scaling_initializer(
                scale=2.0, mode="fan_out", distribution="uniform", seed=1
            ),
            2 / 8,
        ),
    ],
)
def test_fan_based_rows_have_the_variance_of_a_capacity_by_dim_variable(make, variance):
    rows = _rows(make(), 2000, 8, 2000)
    assert abs(rows.mean()) < 4 * np.sqrt(variance / rows.size) + 1e-6
    assert rows.var() == pytest.approx(variance, rel=0.08)
