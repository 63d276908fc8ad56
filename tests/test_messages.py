"""What users read: errors without terminal escapes or TensorFlow's assertion dumps, and
eviction logged once per eviction that freed something."""

import logging as pylog
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec import estimator as E
from npu_rec.keras import SparseEmbedding, TableNotTrainedError
from npu_rec.keras.callbacks import Evict

FULL = (
    r"^Sparse table 'small' is full: its capacity is 3 rows and this batch needs 4\. Raise "
    r"`capacity` in npu_rec.create_table, or turn on dynamic expansion"
)


def test_table_not_trained_error_has_no_terminal_escapes():
    inputs = keras.Input(shape=(), dtype="int64")
    model = keras.Model(inputs, keras.layers.Dense(1)(SparseEmbedding("plain", 4)(inputs)))
    model.compile("adam", "mse")
    with pytest.raises(TableNotTrainedError) as info:
        model.fit(np.arange(8), np.zeros(8), verbose=0)
    text = str(info.value)
    assert "\x1b" not in text
    assert text.startswith(
        "SparseEmbedding 'plain_embedding' (table 'plain') ran with "
        "training=True outside npu_rec.keras.RecModel's train step"
    )


def _small():
    return npu_rec.create_table("small", 2, capacity=3, dynamic_expansion=False)


def test_capacity_full_in_eager_mode_is_our_message_alone():
    table = _small()
    npu_rec.sparse_lookup(table, tf.constant([1], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        npu_rec.sparse_lookup(table, tf.constant([2, 3, 4], tf.int64))
    assert info.value.message.startswith("Sparse table 'small' is full")
    assert "Condition" not in info.value.message and "elements of" not in info.value.message
    assert pytest.approx(table.size()) == 1


def test_capacity_full_in_graphs_has_no_assertion_dump():
    table = _small()
    look = tf.function(lambda ids: npu_rec.sparse_lookup(table, ids))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"table \W*small\W* is full") as info:
        look(tf.constant([1, 2, 3, 4], tf.int64))
    assert "Condition" not in info.value.message and "elements of" not in info.value.message
    with tf.Graph().as_default():
        table = _small()
        emb = npu_rec.sparse_lookup(table, tf.constant([1, 2, 3, 4], tf.int64))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            with pytest.raises(tf.errors.InvalidArgumentError, match=r"small\W* is full") as info:
                sess.run(emb)
    assert "Condition" not in info.value.message


def _evict_logs(caplog, evict):
    caplog.clear()
    with caplog.at_level(pylog.INFO, logger="absl"):
        evict()
    return [r.getMessage() for r in caplog.records if "evicted" in r.getMessage()]


def test_keras_evict_logs_one_line_only_when_rows_were_freed(caplog):
    tables = [
        npu_rec.create_table(n, 2, access_threshold=0, eviction_threshold=10)
        for n in ("A", "B", "C")
    ]
    npu_rec.sparse_lookup(tables[0], tf.constant([1, 2, 3], tf.int64), timestamps=100)
    npu_rec.sparse_lookup(tables[1], tf.constant([4], tf.int64), timestamps=100)
    callback = Evict(None, 1, tables=tables, now=lambda: 105)
    callback.set_model(types.SimpleNamespace(global_step=7))  # a RecModel's step
    assert _evict_logs(caplog, callback.evict) == []
    callback._now = lambda: 200
    assert _evict_logs(caplog, callback.evict) == [
        "npu_rec: evicted 4 rows at step 7 (A: 3, B: 1)."
    ]
    assert callback.evictions[-1] == (7, {"A": 3, "B": 1, "C": 0})


def test_estimator_evict_hook_logs_only_when_rows_were_freed(caplog):
    with tf.Graph().as_default():
        table = npu_rec.create_table("h", 2, access_threshold=0, eviction_threshold=10)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        ts = tf.compat.v1.placeholder(tf.int64, [])
        emb = npu_rec.sparse_lookup(table, ids, timestamps=ts)
        step = tf.compat.v1.assign_add(tf.compat.v1.train.create_global_step(), 1)
        hook = E.EvictHook(evict_enable=True, evict_time_interval=None, evict_step_interval=1)
        with caplog.at_level(pylog.INFO, logger="absl"):
            with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
                sess.run([emb, step], {ids: [1, 2], ts: 100})
                sess.run([emb, step], {ids: [3], ts: 105})
                sess.run([emb, step], {ids: [3], ts: 200})
    logged = [r.getMessage() for r in caplog.records if "evicted" in r.getMessage()]
    assert hook.evictions == [(1, 0), (2, 0), (3, 2)]
    assert logged == ["npu_rec: evicted 2 rows at step 3 (h: 2)."]


def test_a_graph_with_training_lookups_writes_its_meta_graph_without_warnings(caplog, tmp_path):
    with tf.Graph().as_default() as graph:
        table = npu_rec.create_table("meta", 2)
        npu_rec.sparse_lookup(table, tf.constant([1, 2], tf.int64))
        assert len(tf.compat.v1.get_collection(npu_rec.LOOKUP_COLLECTION)) == 1
        with caplog.at_level(pylog.WARNING):
            tf.compat.v1.summary.FileWriter(str(tmp_path), graph).close()
            tf.compat.v1.train.export_meta_graph(str(tmp_path / "graph.meta"))
    assert [r.getMessage() for r in caplog.records if r.levelno >= pylog.WARNING] == []
    assert list(tmp_path.glob("events.out.tfevents.*"))
