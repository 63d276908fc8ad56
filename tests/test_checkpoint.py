"""Full and delta table checkpoints: versions, restore, corruption, filtering."""

import os

import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec.checkpoint import CheckpointCorruptedError, TableCheckpointManager


def _train(table, ids, ts, lr_sign=1.0):
    ids_t = tf.constant(ids, tf.int64)
    with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as recs:
        emb = npu_rec.sparse_lookup(table, ids_t, timestamps=ts)
        loss = lr_sign * tf.reduce_sum(emb * emb + emb)
    npu_rec.apply_recorded_gradients(recs, tape.gradient(loss, [r.embeddings for r in recs]))


def _snapshot(table):
    st = table.read_state()
    st.pop("deleted_keys")
    return st


def _assert_same(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], atol=1e-6, err_msg=k)


def _make_table(name="ck"):
    return npu_rec.create_table(
        name,
        3,
        optimizer=npu_rec.optimizers.Adam(0.05),
        access_threshold=2,
        eviction_threshold=20,
        dynamic_expansion=True,
        capacity=4,
    )


@pytest.fixture()
def history(tmp_path):
    """Full@10, delta@20, delta@30 with training and eviction between them."""
    table = _make_table()
    manager = TableCheckpointManager(str(tmp_path), [table])
    live = {}
    _train(table, [1, 2, 2, 3, 3, 4, 4, 5], 100)
    _train(table, [1, 2, 6, 7], 105)
    manager.save(10)
    live[10] = _snapshot(table)
    _train(table, [2, 6, 6, 8, 8, 9], 130)
    assert table.evict() > 0  # keys idle since 100/105 go: deletions
    manager.save(20, delta=True)
    live[20] = _snapshot(table)
    _train(table, [1, 1, 9, 10, 10], 140)
    manager.save(30, delta=True)
    live[30] = _snapshot(table)
    _train(table, [11, 11, 12], 150)  # unsaved changes
    return table, manager, live, tmp_path


def test_versions_lists_full_and_deltas(history):
    _, manager, _, _ = history
    assert [(v.step, v.kind) for v in manager.versions()] == [
        (10, "full"),
        (20, "delta"),
        (30, "delta"),
    ]
    assert manager.latest_version() == 30


@pytest.mark.parametrize("version", [10, 20, 30, None])
def test_restore_each_version_equals_live_state(history, version):
    table, manager, live, _ = history
    assert manager.restore(version) == (version or 30)
    _assert_same(_snapshot(table), live[version or 30])


def test_restore_into_a_fresh_table_keeps_admitting_and_evicting(history):
    _, _, live, tmp_path = history
    npu_rec.table._registry.clear()
    fresh = _make_table()
    TableCheckpointManager(str(tmp_path), [fresh]).restore(20)
    _assert_same(_snapshot(fresh), live[20])
    pending = dict(zip(live[20]["pending_keys"], live[20]["pending_counts"], strict=True))
    key = next(k for k, c in pending.items() if c == 1)
    npu_rec.sparse_lookup(fresh, tf.constant([key], tf.int64), timestamps=131)
    assert key in fresh.export()["keys"]  # second sighting admits it (threshold 2)


def test_truncated_delta_is_refused_and_older_versions_still_restore(history):
    table, manager, live, _ = history
    path = manager.versions()[-1].path
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 7)
    with pytest.raises(CheckpointCorruptedError, match=f"{os.path.basename(path)}.*truncated"):
        manager.restore()
    manager.restore(20)
    _assert_same(_snapshot(table), live[20])


def test_altered_byte_is_refused(history):
    _, manager, _, _ = history
    path = manager.versions()[1].path
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - 40)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CheckpointCorruptedError, match="checksum mismatch"):
        manager.restore(20)


def test_delta_skips_low_frequency_keys(tmp_path):
    table = npu_rec.create_table("lf", 2, optimizer=npu_rec.optimizers.SGD(0.1))
    manager = TableCheckpointManager(str(tmp_path), [table], recent_key_count_threshold=2)
    _train(table, [1, 2], 1)
    manager.save(1)
    _train(table, [1, 1, 2, 3, 3, 3, 4], 2)
    manager.save(2, delta=True)
    arrays, _ = npu_rec.checkpoint.read_file(manager.versions()[-1].path)
    np.testing.assert_array_equal(arrays["tables/lf/keys"], [1, 3])


def test_first_delta_is_made_full_and_no_temp_files_remain(tmp_path):
    table = npu_rec.create_table("first", 2)
    npu_rec.sparse_lookup(table, tf.constant([1], tf.int64))
    manager = TableCheckpointManager(str(tmp_path), [table])
    manager.save(5, delta=True)
    assert [v.kind for v in manager.versions()] == ["full"]
    assert os.listdir(tmp_path) == ["ckpt-000000000005.full.nrc"]


def test_restore_errors_name_the_problem(tmp_path):
    table = npu_rec.create_table("err", 2)
    manager = TableCheckpointManager(str(tmp_path), [table])
    with pytest.raises(FileNotFoundError, match="No table checkpoint"):
        manager.restore()
    manager.save(3)
    with pytest.raises(FileNotFoundError, match="at or before step 2"):
        manager.restore(2)
    npu_rec.table._registry.clear()
    other = npu_rec.create_table("err", 5)
    with pytest.raises(ValueError, match="dim=2"):
        TableCheckpointManager(str(tmp_path), [other]).restore()
    with pytest.raises(ValueError, match="recent_key_count_threshold"):
        TableCheckpointManager(str(tmp_path), [other], recent_key_count_threshold=-1)


def test_graph_mode_save_and_restore_with_session(tmp_path):
    with tf.Graph().as_default():
        table = npu_rec.create_table("g", 2, optimizer=npu_rec.optimizers.SGD(0.1))
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        emb = npu_rec.sparse_lookup(table, ids)
        manager = TableCheckpointManager(str(tmp_path), [table])
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(emb, {ids: [1, 2]})
            manager.save(1, session=sess)
            sess.run(emb, {ids: [3]})
            manager.save(2, delta=True, session=sess)
            want = table.export(session=sess)
            sess.run(emb, {ids: [4, 5]})
            manager.restore(session=sess)
            got = table.export(session=sess)
    np.testing.assert_array_equal(got["keys"], [1, 2, 3])
    np.testing.assert_allclose(got["values"], want["values"])
