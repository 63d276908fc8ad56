"""The invariant check run before every save (`npu_rec.table._check`)."""

import os

import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec.checkpoint import TableCheckpointManager


def _trained(name, **kwargs):
    table = npu_rec.create_table(name, 3, optimizer=npu_rec.optimizers.Adagrad(0.1), **kwargs)
    ids = tf.constant([3, 5, 8, 13], tf.int64)
    npu_rec.sparse_lookup(table, ids, timestamps=10)
    table.apply_gradients(ids, tf.ones([4, 3]))
    return table


def _corrupt_index(table):
    """The index gains a key whose row holds another key (as a shared index buffer once caused)."""
    table.key_index.insert(tf.constant([99], tf.int64), tf.constant([1], tf.int64))


def _duplicate_key(table):
    """Row 3 (key 13's) claims key 3: two live rows with one key, key 13 without its row."""
    table.storage.row_keys.scatter_update(
        tf.IndexedSlices(tf.constant([3], tf.int64), tf.constant([3], tf.int64))
    )


def _nan_value(table):
    table.storage.values.scatter_update(
        tf.IndexedSlices(tf.constant([[np.nan, 0.0, 0.0]]), tf.constant([2], tf.int64))
    )


def _inf_slot(table):
    table.storage.slots["accumulator"].scatter_update(
        tf.IndexedSlices(tf.constant([[0.0, np.inf, 0.0]]), tf.constant([0], tf.int64))
    )


def _size_off(table):
    table.storage.num_free.assign(1)


@pytest.mark.parametrize(
    "damage, match",
    [
        (
            _corrupt_index,
            r"'chk' is inconsistent.*live rows \(4\) == size\(\) \(4\) == keys in the "
            r"index \(5 counted, 5 held\).*key 99",
        ),
        (
            _duplicate_key,
            r"'chk' is inconsistent.*1 indexed keys point to a row that is free or "
            r"holds another key \(e.g. key 13\)",
        ),
        (_size_off, r"live rows \(4\) == size\(\) \(3\)"),
        (_nan_value, r"'chk' holds NaN or Inf in 1 live rows of `values` \(e.g. key 8\)"),
        (_inf_slot, r"1 live rows of `slot/accumulator` \(e.g. key 3\)"),
    ],
)
def test_a_broken_table_refuses_every_save_and_keeps_the_previous_version(damage, match, tmp_path):
    table = _trained("chk")
    manager = TableCheckpointManager(str(tmp_path / "ck"), [table])
    manager.save(1)
    table.save(str(tmp_path / "single"))
    before = sorted(os.listdir(tmp_path / "ck"))
    damage(table)
    with pytest.raises(npu_rec.TableInvariantError, match=match):
        manager.save(2)
    with pytest.raises(npu_rec.TableInvariantError, match=match):
        manager.save(2, delta=True)
    with pytest.raises(npu_rec.TableInvariantError, match=match):
        table.save(str(tmp_path / "single"))
    assert sorted(os.listdir(tmp_path / "ck")) == before
    assert manager.latest_version() == 1
    table.restore(str(tmp_path / "single"))  # the previous snapshot is intact
    table.save(str(tmp_path / "single"))  # and consistent again
    np.testing.assert_array_equal(table.export()["keys"], [3, 5, 8, 13])


def test_export_reads_a_broken_table_for_inspection():
    table = _trained("inspect")
    _nan_value(table)
    assert np.isnan(table.export()["values"]).any()


def test_sharded_table_check_names_the_shard(tmp_path):
    table = _trained("sh", num_shards=2)
    shard = next(s for s in table.shards if int(s.size()) > 0)
    _nan_value_of = shard.storage.values
    _nan_value_of.scatter_update(
        tf.IndexedSlices(tf.constant([[np.inf, 0.0, 0.0]]), tf.constant([0], tf.int64))
    )
    with pytest.raises(npu_rec.TableInvariantError, match=f"'{shard.name}' holds NaN or Inf"):
        table.save(str(tmp_path / "s"))


def test_v1_graph_save_runs_the_check(tmp_path):
    with tf.Graph().as_default():
        table = npu_rec.create_table("g_chk", 2, optimizer=npu_rec.optimizers.SGD(1e30))
        ids = tf.constant([1, 2], tf.int64)
        emb = npu_rec.sparse_lookup(table, ids)
        recs = tf.compat.v1.get_collection(npu_rec.LOOKUP_COLLECTION)
        train = npu_rec.apply_recorded_gradients(
            recs, tf.gradients(tf.reduce_sum(emb * 1e30), [r.embeddings for r in recs])
        )
        manager = TableCheckpointManager(str(tmp_path), [table])
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(emb)
            manager.save(1, session=sess)
            sess.run(train)  # 1e30 * 1e30 overflows to -inf
            with pytest.raises(npu_rec.TableInvariantError, match="'g_chk' holds NaN or Inf"):
                manager.save(2, session=sess)
    assert manager.latest_version() == 1


def test_a_key_live_in_two_shards_is_refused():
    from npu_rec.table import _check as _table_check

    _table_check.verify_unique_keys("two", np.array([1, 5, 9]))
    with pytest.raises(npu_rec.TableInvariantError, match="'two' is inconsistent.*key 5 has two"):
        _table_check.verify_unique_keys("two", np.array([1, 5, 5, 9]))
