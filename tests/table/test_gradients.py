"""Gradient plumbing of sparse lookups: `densify` and tables that admit at once."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import npu_rec
from npu_rec.table import _lookup


def _reference(values, indices, num_rows):
    out = np.zeros((num_rows, values.shape[1]), np.float32)
    np.add.at(out, indices, values)
    return out


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 40), st.integers(1, 300), st.integers(0, 2**31 - 1))
def test_densify_sums_duplicate_slices_like_numpy(num_rows, n, seed):
    rng = np.random.default_rng(seed)
    values = rng.normal(size=(n, 3)).astype(np.float32)
    indices = rng.integers(0, num_rows, size=n)
    grad = tf.IndexedSlices(tf.constant(values), tf.constant(indices, tf.int64))
    np.testing.assert_allclose(
        _lookup.densify(grad, num_rows), _reference(values, indices, num_rows), atol=1e-5
    )


@pytest.mark.parametrize("n", [100, _lookup._SCATTER_SUM_MAX_ROWS + 1])
def test_densify_both_paths_with_unknown_static_size(n):
    rng = np.random.default_rng(n)
    values = rng.normal(size=(n, 2)).astype(np.float32)
    indices = rng.integers(0, 50, size=n)

    @tf.function(input_signature=[tf.TensorSpec([None, 2]), tf.TensorSpec([None], tf.int64)])
    def dense(v, i):
        return _lookup.densify(tf.IndexedSlices(v, i), 50)

    np.testing.assert_allclose(dense(values, indices), _reference(values, indices, 50), atol=1e-4)


@pytest.mark.parametrize("threshold", [0, 1])
def test_tables_admitting_at_once_train_every_key_from_its_first_sighting(threshold):
    table = npu_rec.create_table(
        f"once{threshold}",
        2,
        access_threshold=threshold,
        optimizer=npu_rec.optimizers.SGD(1.0),
        initializer="zeros",
    )
    ids = tf.constant([4, 9, 4], tf.int64)
    with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as recs:
        loss = tf.reduce_sum(npu_rec.sparse_lookup(table, ids))
    npu_rec.apply_recorded_gradients(recs, tape.gradient(loss, [r.embeddings for r in recs]))
    out = table.export()
    np.testing.assert_array_equal(out["keys"], [4, 9])
    np.testing.assert_array_equal(out["counts"], [2, 1])
    # d loss / d row = number of occurrences; SGD(1.0) from zeros.
    np.testing.assert_allclose(out["values"], [[-2.0, -2.0], [-1.0, -1.0]])
    assert int(table.state.pending.map.size()) == 0  # nothing waits for admission
