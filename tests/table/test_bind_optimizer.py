"""A table's optimizer bound after creation, and float tensor learning rates."""

import numpy as np
import pytest
import tensorflow as tf

import npu_rec


def _graph_step(table_kwargs, optimizer_fn, ids, steps=2):
    """Looks up `ids`, binds the optimizer after the lookup, runs `steps` steps of sum(emb)."""
    g = tf.Graph()
    with g.as_default():
        t = npu_rec.create_table("late", 4, initializer="zeros", **table_kwargs)
        emb = npu_rec.sparse_lookup(t, tf.constant(ids, tf.int64))
        loss = tf.reduce_sum(emb)
        recs = tf.compat.v1.get_collection(npu_rec.LOOKUP_COLLECTION)
        grads = tf.gradients(loss, [r.embeddings for r in recs])
        t.bind_optimizer(optimizer_fn())
        op = npu_rec.apply_recorded_gradients(recs, grads)
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            for _ in range(steps):
                s.run(op)
            return t.export(session=s), t


@pytest.mark.parametrize("dynamic", [False, True])
def test_bound_after_lookup_trains_like_bound_at_creation(dynamic):
    ids = [1, 2, 3, 2, 5]
    kwargs = {"capacity": 2 if dynamic else 16, "dynamic_expansion": dynamic}
    state, table = _graph_step(kwargs, lambda: npu_rec.optimizers.Adagrad(0.1, epsilon=0.0), ids)
    # reference: Adagrad on counts of each key (grad = number of occurrences)
    keys, counts = np.unique(ids, return_counts=True)
    acc = np.full(len(keys), 0.1)
    value = np.zeros(len(keys))
    for _ in range(2):
        acc += counts**2
        value -= 0.1 * counts / np.sqrt(acc)
    order = np.argsort(state["keys"])
    np.testing.assert_array_equal(state["keys"][order], keys)
    np.testing.assert_allclose(state["values"][order][:, 0], value, rtol=1e-5)
    np.testing.assert_allclose(state["slots"]["accumulator"][order][:, 0], acc, rtol=1e-5)
    assert table.slot_names == ["accumulator"]


def test_bind_rules():
    t = npu_rec.create_table("bind_rules", 4)
    sgd = npu_rec.optimizers.SGD(0.1)
    t.bind_optimizer(sgd)
    t.bind_optimizer(sgd)  # the same one again: nothing happens
    with pytest.raises(ValueError, match="already has an optimizer"):
        t.bind_optimizer(npu_rec.optimizers.Adam(0.1))
    with pytest.raises(TypeError, match="optimizer"):
        npu_rec.create_table("bind_rules2", 4).bind_optimizer("adam")


def test_sharded_table_binds_every_shard():
    t = npu_rec.create_table("bind_sharded", 4, num_shards=3)
    t.bind_optimizer(npu_rec.optimizers.Adam(0.1))
    assert all(s.slot_names == ["m", "v"] for s in t.shards)
    with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as recs:
        loss = tf.reduce_sum(npu_rec.sparse_lookup(t, tf.constant([1, 2, 3, 4], tf.int64)))
    npu_rec.apply_recorded_gradients(recs, tape.gradient(loss, [r.embeddings for r in recs]))
    assert t.export()["slots"]["m"].shape == (4, 4)


def test_tensor_learning_rate_is_read_at_every_step():
    g = tf.Graph()
    with g.as_default():
        lr = tf.compat.v1.placeholder(tf.float32, [])
        t = npu_rec.create_table(
            "tensor_lr", 2, initializer="zeros", optimizer=npu_rec.optimizers.SGD(lr)
        )
        emb = npu_rec.sparse_lookup(t, tf.constant([7], tf.int64))
        recs = tf.compat.v1.get_collection(npu_rec.LOOKUP_COLLECTION)
        op = npu_rec.apply_recorded_gradients(
            recs, tf.gradients(tf.reduce_sum(emb), [recs[0].embeddings])
        )
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            s.run(op, {lr: 0.5})
            s.run(op, {lr: 0.25})
            np.testing.assert_allclose(t.export(session=s)["values"], [[-0.75, -0.75]])
    with pytest.raises(ValueError, match="tensor"):
        npu_rec.optimizers.SGD(tf.constant(0.1)).get_config()
    with pytest.raises(TypeError, match="float scalar"):
        npu_rec.optimizers.SGD(tf.constant([0.1, 0.2]))


def test_sgd_weight_decay_matches_reference():
    t = npu_rec.create_table(
        "wd",
        2,
        initializer=tf.constant_initializer(1.0),
        optimizer=npu_rec.optimizers.SGD(0.1, weight_decay=0.01),
    )
    with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as recs:
        loss = tf.reduce_sum(npu_rec.sparse_lookup(t, tf.constant([3], tf.int64)))
    npu_rec.apply_recorded_gradients(recs, tape.gradient(loss, [r.embeddings for r in recs]))
    np.testing.assert_allclose(t.export()["values"], [[1.0 - 0.1 * (1.0 + 0.01)] * 2], rtol=1e-6)
