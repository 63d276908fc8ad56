"""A table looked up several times: mx_rec's one sparse variable per table.

mx_rec gives a program one sparse variable per table however often it is
looked up (`get_dense_and_sparse_variable()` and the
`ASCEND_SPARSE_LOOKUP_LOCAL_EMB` collection hold one entry per table), and
the gradient of the loss with respect to it is a `tf.IndexedSlices` covering
every lookup. Rec SDK's samples rely on it: they take
`opt.compute_gradients(loss, var_list=dense + sparse)`, treat all but the last
pair as dense (dividing the gradients by a float) and hand the last to the
hash optimizer. The programs here are written in that shape.
"""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import npu_rec
from npu_rec.compat.mx_rec.constants import constants as c
from npu_rec.compat.mx_rec.core.asc.feature_spec import FeatureSpec
from npu_rec.compat.mx_rec.core.embedding import create_table, sparse_lookup
from npu_rec.compat.mx_rec.optimizers import (
    gradient_descent,
    gradient_descent_by_addr,
    lazy_adam,
)
from npu_rec.compat.mx_rec.util.variable import get_dense_and_sparse_variable

DIM = 3
INIT = 0.5


def _table(name="user"):
    return create_table(
        tf.int64,
        tf.TensorShape([DIM]),
        name,
        tf.compat.v1.constant_initializer(INIT),
        device_vocabulary_size=64,
    )


def _lookups(table, id_arrays, feature_specs):
    """One training lookup of `table` per ids array (FeatureSpecs read from a batch, or tensors)."""
    batch = {f"f{i}": tf.constant(ids, tf.int64) for i, ids in enumerate(id_arrays)}
    if feature_specs:
        return [
            sparse_lookup(table, FeatureSpec(k, table_name=table.table_name), None, batch=batch)
            for k in batch
        ]
    return [sparse_lookup(table, batch[k], None, is_train=True) for k in batch]


def _loss(embs, weight_arrays, w):
    """sum(weight * (h + h**2 / 2)) with h = emb * w: its gradient depends on the rows."""
    total = 0.0
    for emb, weights in zip(embs, weight_arrays, strict=True):
        h = emb * w
        total += tf.reduce_sum(tf.constant(weights, tf.float32)[..., None] * (h + 0.5 * h * h))
    return total


def _train(id_arrays, weight_arrays, make_optimizer, steps, *, feature_specs=True, by_addr=False):
    """Trains with the samples' step; returns ({key: row}, number of sparse variables)."""
    g = tf.Graph()
    with g.as_default():
        table = _table()
        embs = _lookups(table, id_arrays, feature_specs)
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([DIM]))
        loss = _loss(embs, weight_arrays, w)
        dense_variables, sparse_variables = get_dense_and_sparse_variable()
        dense_opt = tf.compat.v1.train.GradientDescentOptimizer(0.0)  # w stays 1
        sparse_opt = make_optimizer()
        if by_addr:  # the samples' dynamic-expansion step
            local = tf.compat.v1.get_collection(c.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)[0]
            grads = dense_opt.compute_gradients(loss, var_list=dense_variables + [local])
            addresses = tf.compat.v1.get_collection(c.ASCEND_SPARSE_LOOKUP_ID_OFFSET)
            sparse_pairs = list(zip(list(grads[-1]), addresses, strict=False))
        else:
            grads = dense_opt.compute_gradients(loss, var_list=dense_variables + sparse_variables)
            sparse_pairs = list(zip(list(grads[-1]), sparse_variables, strict=False))
        dense_pairs = [(grad / 8.0, var) for grad, var in grads[:-1]]
        train = tf.group(
            dense_opt.apply_gradients(dense_pairs), sparse_opt.apply_gradients(sparse_pairs)
        )
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(steps):
                sess.run(train)
            state = table.core.export(session=sess)
    rows = dict(zip(state["keys"].tolist(), state["values"], strict=True))
    return rows, len(sparse_variables)


def _reference(id_arrays, weight_arrays, rule, lr, steps):
    """NumPy: rows start at INIT; the gradient of key k is the sum over its positions of
    weight * (1 + row_k); then SGD, or lazy Adam (beta1 0.9, beta2 0.999, epsilon 1e-8)."""
    keys = sorted({int(k) for ids in id_arrays for k in np.ravel(ids)})
    rows = {k: np.full(DIM, INIT, np.float64) for k in keys}
    m = {k: np.zeros(DIM) for k in keys}
    v = {k: np.zeros(DIM) for k in keys}
    for t in range(1, steps + 1):
        grad = {k: np.zeros(DIM) for k in keys}
        for ids, weights in zip(id_arrays, weight_arrays, strict=True):
            for k, wt in zip(np.ravel(ids), np.ravel(weights), strict=True):
                grad[int(k)] += wt * (1.0 + rows[int(k)])
        for k in keys:
            if rule == "sgd":
                rows[k] = rows[k] - lr * grad[k]
                continue
            m[k] = 0.9 * m[k] + 0.1 * grad[k]
            v[k] = 0.999 * v[k] + 0.001 * grad[k] ** 2
            lr_t = lr * np.sqrt(1 - 0.999**t) / (1 - 0.9**t)
            rows[k] = rows[k] - lr_t * m[k] / (np.sqrt(v[k]) + 1e-8)
    return rows


_OPTIMIZERS = {
    "sgd": lambda: gradient_descent.create_hash_optimizer(0.1),
    "lazy_adam": lambda: lazy_adam.create_hash_optimizer(0.1),
}


def _ids_and_weights(n_lookups):
    shape = st.tuples(st.integers(1, 4), st.integers(1, 3))
    ids = shape.flatmap(lambda s: hnp.arrays(np.int64, s, elements=st.integers(0, 9)))
    weighted = ids.flatmap(
        lambda a: st.tuples(
            st.just(a),
            hnp.arrays(np.float32, a.shape, elements=st.floats(-1, 1, width=32)),
        )
    )
    return st.lists(weighted, min_size=n_lookups, max_size=n_lookups)


def test_a_table_looked_up_twice_is_one_sparse_variable():
    g = tf.Graph()
    with g.as_default():
        user, item = _table("user"), _table("item")
        batch = {
            "a": tf.constant([[1, 2], [2, 3]], tf.int64),
            "b": tf.constant([[3, 4]], tf.int64),
            "c": tf.constant([[5], [6]], tf.int64),
        }
        ua = sparse_lookup(user, FeatureSpec("a", table_name="user"), None, batch=batch)
        ia = sparse_lookup(item, FeatureSpec("c", table_name="item"), None, batch=batch)
        ub = sparse_lookup(user, FeatureSpec("b", table_name="user"), None, batch=batch)
        no_grad = sparse_lookup(user, batch["a"], None, is_train=True, is_grad=False)
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([DIM]))
        loss = (
            tf.reduce_sum(ua * w)
            + tf.reduce_sum(ub * w)
            + tf.reduce_sum(ia * w)
            + tf.reduce_sum(no_grad)
        )
        dense, sparse = get_dense_and_sparse_variable()
        assert len(sparse) == 2  # one per table, in the order of their first lookups
        item_record = [
            r for r in g.get_collection(npu_rec.LOOKUP_COLLECTION) if r.table is item.core
        ]
        assert sparse[1] is item_record[0].embeddings  # looked up once: as before
        assert tf.compat.v1.get_collection(c.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)[:2] == sparse
        assert len(tf.compat.v1.get_collection(c.ASCEND_SPARSE_LOOKUP_ID_OFFSET)) == 3
        assert len(tf.compat.v1.get_collection(c.ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS)) == 3
        grads = tf.compat.v1.train.AdamOptimizer().compute_gradients(loss, var_list=dense + sparse)
        assert [v for _, v in grads] == dense + sparse
        assert not isinstance(grads[0][0], tf.IndexedSlices)
        _ = grads[0][0] / 8.0  # dense gradients divide by a float
        user_grad = grads[1][0]
        assert isinstance(user_grad, tf.IndexedSlices)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            indices, values, shape = sess.run(
                [user_grad.indices, user_grad.values, user_grad.dense_shape]
            )
        # Unique rows of the two lookups: [1, 2, 3] then [3, 4]: one slice per looked-up id.
        assert shape.tolist() == [5, DIM]
        assert sorted(indices.tolist()) == [0, 1, 1, 2, 3, 4]
        np.testing.assert_allclose(values, np.ones((6, DIM)))


def test_the_hash_optimizer_refuses_a_tensor_that_is_no_sparse_variable():
    g = tf.Graph()
    with g.as_default():
        opt = gradient_descent.create_hash_optimizer(0.1)
        with pytest.raises(ValueError, match="sparse variable"):
            opt.apply_gradients([(tf.zeros([1, DIM]), tf.zeros([1, DIM]))])


@pytest.mark.parametrize("rule", sorted(_OPTIMIZERS))
@settings(max_examples=3, deadline=None)
@given(_ids_and_weights(2), st.sampled_from([True, False]))
def test_two_lookups_train_the_table_as_numpy_says(rule, lookups, feature_specs):
    id_arrays = [ids for ids, _ in lookups]
    weight_arrays = [wts for _, wts in lookups]
    rows, n_sparse = _train(
        id_arrays, weight_arrays, _OPTIMIZERS[rule], steps=2, feature_specs=feature_specs
    )
    assert n_sparse == 1
    expected = _reference(id_arrays, weight_arrays, rule, 0.1, steps=2)
    assert sorted(rows) == sorted(expected)
    for key, row in expected.items():
        np.testing.assert_allclose(rows[key], row, rtol=1e-4, atol=1e-5)


@settings(max_examples=2, deadline=None)
@given(_ids_and_weights(3))
def test_several_lookups_train_with_lazy_adam_as_one_lookup_of_the_same_ids(lookups):
    """Three lookups of one table update it as one lookup of all their ids does."""
    k = max(ids.shape[1] for ids, _ in lookups)
    pad = [
        (np.pad(i, ((0, 0), (0, k - i.shape[1]))), np.pad(w, ((0, 0), (0, k - w.shape[1]))))
        for i, w in lookups
    ]
    id_arrays = [ids for ids, _ in pad]
    weight_arrays = [wts for _, wts in pad]
    make = lambda: lazy_adam.create_hash_optimizer(0.05)  # noqa: E731
    several, n_sparse = _train(id_arrays, weight_arrays, make, steps=3)
    assert n_sparse == 1
    one, _ = _train([np.concatenate(id_arrays)], [np.concatenate(weight_arrays)], make, steps=3)
    assert sorted(several) == sorted(one)
    for key, row in one.items():
        np.testing.assert_allclose(several[key], row, rtol=1e-5, atol=1e-6)


@settings(max_examples=2, deadline=None)
@given(_ids_and_weights(2))
def test_the_first_local_embedding_and_address_cover_every_lookup(lookups):
    """The samples' dynamic-expansion step pairs LOCAL_EMB[0]'s gradient with ID_OFFSET[0]."""
    id_arrays = [ids for ids, _ in lookups]
    weight_arrays = [wts for _, wts in lookups]
    rows, _ = _train(
        id_arrays,
        weight_arrays,
        lambda: gradient_descent_by_addr.create_hash_optimizer_by_addr(0.1),
        steps=2,
        by_addr=True,
    )
    expected = _reference(id_arrays, weight_arrays, "sgd", 0.1, steps=2)
    for key, row in expected.items():
        np.testing.assert_allclose(rows[key], row, rtol=1e-5, atol=1e-5)


def test_one_lookup_keeps_its_unique_row_tensor():
    g = tf.Graph()
    with g.as_default():
        table = _table()
        (emb,) = _lookups(table, [np.array([[1, 2]])], feature_specs=True)
        _, sparse = get_dense_and_sparse_variable()
        (record,) = g.get_collection(npu_rec.LOOKUP_COLLECTION)
        assert sparse == [record.embeddings]
        assert tf.compat.v1.get_collection(c.ASCEND_SPARSE_LOOKUP_LOCAL_EMB) == [record.embeddings]
        assert tf.compat.v1.get_collection(c.ASCEND_SPARSE_LOOKUP_ID_OFFSET) == [record.rows]
        (grad,) = tf.gradients(tf.reduce_sum(emb), sparse)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            np.testing.assert_allclose(sess.run(tf.convert_to_tensor(grad)), np.ones((2, DIM)))
