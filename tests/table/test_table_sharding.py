"""Sharded tables (`create_table(..., num_shards=S)`): routing, modes, checkpoints."""

import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec.table import _registry as _table_registry
from npu_rec.table._sharded import shard_of, shard_of_numpy

IDS = np.array([[1, 5, 9, 1], [2**40 + 3, -7, 5, 11], [13, 17, 19, 23]], np.int64)


def _train(table, steps=3):
    for step in range(steps):
        ids = tf.constant(IDS + step, tf.int64)
        with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as recs:
            emb = npu_rec.sparse_lookup(table, ids, timestamps=tf.constant([10, 20, 30]) + step)
            loss = tf.reduce_sum(tf.square(emb - 0.1))
        npu_rec.apply_recorded_gradients(recs, tape.gradient(loss, [r.embeddings for r in recs]))


def _make(name, num_shards, **kw):
    return npu_rec.create_table(
        name,
        4,
        optimizer=npu_rec.optimizers.Adam(0.05),
        access_threshold=1,
        eviction_threshold=15,
        dynamic_expansion=True,
        capacity=2,
        num_shards=num_shards,
        **kw,
    )


def _assert_same_export(a, b):
    ea, eb = a.export(), b.export()
    for field in ("keys", "counts", "last_seen"):
        np.testing.assert_array_equal(ea[field], eb[field])
    np.testing.assert_allclose(ea["values"], eb["values"], atol=1e-6)
    for name in ea["slots"]:
        np.testing.assert_allclose(ea["slots"][name], eb["slots"][name], atol=1e-6)


def test_shard_hash_is_stable_and_balanced():
    keys = np.arange(-5000, 5000, dtype=np.int64) * 7919
    got = shard_of(tf.constant(keys), 4).numpy()
    np.testing.assert_array_equal(got, shard_of_numpy(keys, 4))
    assert np.bincount(got, minlength=4).min() > 2200


def test_sharded_table_equals_unsharded():
    _table_registry.clear()
    plain = _make("t", 1)
    _train(plain)
    plain_state = plain.read_state()
    _table_registry.clear()
    sharded = _make("t", 3)
    assert sharded.num_shards == 3 and len(sharded.shards) == 3
    assert isinstance(sharded, npu_rec.SparseTable)
    _train(sharded)
    st = sharded.read_state()
    for field in ("keys", "counts", "last_seen", "pending_keys", "opt_step", "max_seen"):
        np.testing.assert_array_equal(st[field], plain_state[field])
    np.testing.assert_allclose(st["values"], plain_state["values"], atol=1e-6)
    assert sum(int(s.size()) for s in sharded.shards) == int(sharded.size()) == len(st["keys"])
    assert all(int(s.size()) > 0 for s in sharded.shards)
    assert sharded.evict() == plain.evict() > 0  # now = newest timestamp over shards
    np.testing.assert_array_equal(sharded.export()["keys"], plain.export()["keys"])


@pytest.mark.parametrize("restore_shards", [1, 2, 3])
def test_checkpoint_restores_into_any_shard_count(tmp_path, restore_shards):
    _table_registry.clear()
    source = _make("t", 3)
    _train(source)
    manager = npu_rec.checkpoint.TableCheckpointManager(str(tmp_path), [source])
    manager.save(1)
    _train(source, steps=1)
    manager.save(2, delta=True)
    source.save(str(tmp_path / "snap.nrc"))
    _table_registry.clear()
    target = _make("t", restore_shards)
    npu_rec.checkpoint.TableCheckpointManager(str(tmp_path), [target]).restore()
    _assert_same_export(source, target)
    _table_registry.clear()
    again = _make("t", restore_shards)
    again.restore(str(tmp_path / "snap.nrc"))
    _assert_same_export(source, again)
    _train(source, steps=1)  # both keep training alike (optimizer step restored)
    _train(target, steps=1)
    _assert_same_export(source, target)


def test_sharded_table_in_v1_graph_matches_eager():
    _table_registry.clear()
    eager = _make("t", 1)
    _train(eager)
    eager.evict(now=40)
    graph = tf.Graph()
    with graph.as_default():
        table = _make("t", 2)
        ids = tf.compat.v1.placeholder(tf.int64, [3, 4])
        ts = tf.compat.v1.placeholder(tf.int64, [3])
        emb = npu_rec.sparse_lookup(table, ids, timestamps=ts)
        loss = tf.reduce_sum(tf.square(emb - 0.1))
        records = tf.compat.v1.get_collection(npu_rec.LOOKUP_COLLECTION)
        grads = tf.gradients(loss, [r.embeddings for r in records])
        train_op = npu_rec.apply_recorded_gradients(records, grads)
        init = tf.compat.v1.global_variables_initializer()
        with tf.compat.v1.Session() as sess:
            sess.run(init)
            for step in range(3):
                sess.run(train_op, {ids: IDS + step, ts: np.array([10, 20, 30]) + step})
            assert table.evict(now=40, session=sess) > 0
            got = table.export(session=sess)
            assert int(sess.run(table.size())) == len(got["keys"])
    np.testing.assert_array_equal(got["keys"], eager.export()["keys"])
    np.testing.assert_allclose(got["values"], eager.export()["values"], atol=1e-6)


def test_num_shards_validated():
    _table_registry.clear()
    with pytest.raises(
        ValueError,
        match=r"`num_shards` must be an integer >= 1. "
        r"Received: num_shards=0",
    ):
        npu_rec.create_table("bad", 4, num_shards=0)


def test_the_two_table_classes_are_siblings_under_sparse_table():
    _table_registry.clear()
    plain, sharded = _make("single", 1), _make("split", 2)
    assert type(plain) is npu_rec.SingleShardTable and type(sharded) is npu_rec.ShardedTable
    assert isinstance(plain, npu_rec.SparseTable) and isinstance(sharded, npu_rec.SparseTable)
    assert not isinstance(sharded, npu_rec.SingleShardTable)
    assert all(type(s) is npu_rec.SingleShardTable for s in sharded.shards)
    assert repr(sharded).startswith("SparseTable(name='split'") and "num_shards=2" in repr(sharded)
    assert "num_shards" not in repr(plain)
    with pytest.raises(TypeError, match="abstract"):
        npu_rec.SparseTable(plain.config)
