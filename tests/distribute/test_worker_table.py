"""`WorkerShardedTable` in one process: its keys, its errors (the exchange needs workers)."""

import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec.distribute import Exchange, NotInReplicaStepError, WorkerShardedTable
from npu_rec.table import _registry as _table_registry
from npu_rec.table._config import TableConfig
from npu_rec.table._fused import select_backend
from npu_rec.table._sharded import shard_of_numpy


def _worker_table(rank, workers=2, name="w"):
    config = TableConfig(name=name, dim=4, optimizer=npu_rec.optimizers.SGD(0.1), capacity=1024)
    return WorkerShardedTable(config, Exchange(workers, rank), select_backend())


def test_restoring_keeps_only_the_keys_this_worker_owns(tmp_path):
    one = npu_rec.create_table("w", 4, optimizer=npu_rec.optimizers.SGD(0.1))
    npu_rec.sparse_lookup(one, tf.range(200, dtype=tf.int64))
    one.save(str(tmp_path / "t.nrc"))
    want = one.export()
    _table_registry.clear()
    table = _worker_table(rank=1, workers=3)
    table.restore(str(tmp_path / "t.nrc"))
    got = table.export()
    mine = shard_of_numpy(want["keys"], 3) == 1
    np.testing.assert_array_equal(got["keys"], want["keys"][mine])
    np.testing.assert_array_equal(got["values"], want["values"][mine])
    assert table.size() == int(mine.sum()) and 0.25 < mine.mean() < 0.45
    assert table.describe()["num_workers"] == 3 and table.describe()["rank"] == 1


def test_a_lookup_outside_a_replica_step_of_its_workers_is_refused():
    table = _worker_table(rank=0)
    with pytest.raises(
        NotInReplicaStepError,
        match=r"Sparse table 'w' is sharded across 2 "
        r"workers, so it can only be looked up",
    ):
        npu_rec.sparse_lookup(table, tf.constant([1, 2], tf.int64))


def test_apply_gradients_by_ids_is_refused_with_the_way_to_train_it():
    table = _worker_table(rank=0)
    with pytest.raises(NotImplementedError, match=r"train it through `RecModel.fit`"):
        table.apply_gradients(tf.constant([1], tf.int64), tf.ones([1, 4]))


def test_outside_a_multi_worker_strategy_create_table_makes_a_one_process_table():
    table = npu_rec.create_table("plain", 4)
    assert type(table).__name__ == "SingleShardTable"
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        assert type(npu_rec.create_table("mirrored", 4)).__name__ == "SingleShardTable"
