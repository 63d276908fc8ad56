"""The table's key -> row map (`npu_rec.table._key_index.KeyIndex`) against a dict."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import npu_rec
from npu_rec.table._key_index import (
    RESERVED_RAW_KEYS,
    KeyIndex,
    _mix,
    _unmix,
    buckets_for,
)

_INT64 = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=30, deadline=None)
@given(st.lists(_INT64, min_size=1, max_size=50))
def test_mix_is_a_bijection_with_its_inverse(keys):
    k = tf.constant(keys, tf.int64)
    np.testing.assert_array_equal(_unmix(_mix(k)).numpy(), keys)
    assert len(np.unique(_mix(k).numpy())) == len(set(keys))


def test_ids_differing_only_in_high_bits_spread_over_buckets():
    # With an identity hash, `field << 32` ids would all land in bucket 0 of a
    # 2**20-bucket array; mixed, they spread like random keys.
    keys = tf.range(4096, dtype=tf.int64) * (1 << 32)
    low = _mix(keys).numpy() & ((1 << 20) - 1)
    assert len(np.unique(low)) > 4000


def test_buckets_for_keeps_load_below_the_kernel_limit():
    for cap in (1, 7, 100, 1000, 65536, 10**6):
        n = buckets_for(cap)
        assert n & (n - 1) == 0 and n * 0.8 >= cap and (n // 2) * 0.8 < max(cap, 7)


@settings(max_examples=15, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["insert", "remove", "rebuild"]),
            st.lists(st.integers(-50, 50), max_size=12),
        ),
        max_size=12,
    )
)
def test_random_insert_remove_rebuild_matches_a_dict(ops):
    index = KeyIndex(4)
    ref: dict[int, int] = {}
    next_row = 0
    for op, raw in ops:
        keys = list(dict.fromkeys(k * (1 << 40) + k for k in raw))  # unique, high bits set
        if op == "insert":
            keys = [k for k in keys if k not in ref]  # the table inserts absent keys only
            rows = list(range(next_row, next_row + len(keys)))
            next_row += len(keys)
            index.insert(tf.constant(keys, tf.int64), tf.constant(rows, tf.int64))
            ref.update(zip(keys, rows, strict=True))
        elif op == "remove":
            index.remove(tf.constant(keys, tf.int64))
            for k in keys:
                ref.pop(k, None)
        else:
            index.rebuild()
        assert int(index.size()) == len(ref)
    got_keys, got_rows = (t.numpy() for t in index.export())
    assert dict(zip(got_keys.tolist(), got_rows.tolist(), strict=True)) == ref
    probe = sorted(set(ref) | {-1, 0, 7})
    expect = [ref.get(k, -1) for k in probe]
    np.testing.assert_array_equal(index.lookup(tf.constant(probe, tf.int64)), expect)


def test_reset_replaces_contents_and_grows_for_many_keys():
    index = KeyIndex(8)
    index.insert(tf.constant([1, 2], tf.int64), tf.constant([0, 1], tf.int64))
    keys = tf.range(5000, dtype=tf.int64) * 977
    index.reset(keys, tf.range(5000, dtype=tf.int64))
    assert int(index.size()) == 5000
    np.testing.assert_array_equal(index.lookup(keys), np.arange(5000))
    np.testing.assert_array_equal(index.lookup(tf.constant([1, 2], tf.int64)), [-1, -1])
    assert int(index.map.export()[0].shape[0]) == buckets_for(5000)


def test_reserve_sizes_the_array_once_and_keeps_the_held_keys():
    index = KeyIndex(8)
    held = tf.constant([5, 6, 7], tf.int64)
    index.insert(held, held + 100)
    index.reserve(20000)
    size = buckets_for(20000)
    assert int(index.map.export()[0].shape[0]) == size
    np.testing.assert_array_equal(index.lookup(held), [105, 106, 107])
    keys = tf.range(1000, 20992, dtype=tf.int64) * 31
    for part in tf.split(keys, 7):  # bulk inserts up to the reserved size: no regrowth
        index.insert(part, part + 1)
    assert int(index.map.export()[0].shape[0]) == size
    assert int(index.size()) == 19995
    np.testing.assert_array_equal(index.lookup(keys), keys.numpy() + 1)
    np.testing.assert_array_equal(index.lookup(held), [105, 106, 107])


def test_heavy_eviction_rebuilds_the_index_and_keeps_lookups_right():
    index = KeyIndex(8)  # 16 buckets; rebuild once live + removed > 14.4
    assert index.initial_buckets == 16
    first, second = tf.range(12, dtype=tf.int64), tf.range(100, 108, dtype=tf.int64)
    index.insert(first, first + 1000)
    index.remove(first[:8])
    assert not bool(index.maybe_rebuild())  # 4 live + 8 removed
    index.insert(second, second + 1000)
    index.remove(second)
    assert int(index.removed.numpy()) == 16
    assert bool(index.maybe_rebuild())  # 4 live + 16 removed
    assert int(index.removed.numpy()) == 0
    assert int(index.size()) == 4
    np.testing.assert_array_equal(
        index.lookup(tf.concat([first, second], 0)), [-1] * 8 + list(range(1008, 1012)) + [-1] * 8
    )


def test_reserved_raw_ids_are_valid_keys_of_the_index():
    index = KeyIndex(8)
    r0, r1 = RESERVED_RAW_KEYS
    index.insert(tf.constant([r0, 5, r1], tf.int64), tf.constant([0, 1, 2], tf.int64))
    np.testing.assert_array_equal(
        index.lookup(tf.constant([r1, r0, 5, 6], tf.int64)), [2, 0, 1, -1]
    )
    assert int(index.size()) == 3
    index.remove(tf.constant([r0], tf.int64))
    index.rebuild()
    keys, rows = (t.numpy() for t in index.export())
    assert dict(zip(keys.tolist(), rows.tolist(), strict=True)) == {5: 1, r1: 2}
    index.reset(tf.constant([r0], tf.int64), tf.constant([7], tf.int64))
    np.testing.assert_array_equal(index.lookup(tf.constant([r0, r1, 5], tf.int64)), [7, -1, -1])
    assert int(index.size()) == 1


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_reserved_raw_ids_train_save_restore_and_evict_like_any_id(mode, tmp_path):
    """Such an id must not crash a resume ("Using the empty_key...")."""
    table = npu_rec.create_table(
        f"reserved_{mode}",
        2,
        optimizer=npu_rec.optimizers.SGD(0.5),
        access_threshold=0,
        eviction_threshold=10,
    )
    ids = tf.constant(
        [RESERVED_RAW_KEYS[0], -(2**63), 2**63 - 1, -1, 0, RESERVED_RAW_KEYS[1]], tf.int64
    )

    def train(ts):
        emb = npu_rec.sparse_lookup(table, ids, timestamps=ts)
        table.apply_gradients(ids, tf.ones_like(emb))
        return emb

    step = tf.function(train) if mode == "function" else train
    first = step(tf.constant(100, tf.int64)).numpy()
    assert sorted(table.export()["keys"].tolist()) == sorted(ids.numpy().tolist())
    table.save(str(tmp_path / "t"))  # runs the invariant check
    step(tf.constant(101, tf.int64))
    table.restore(str(tmp_path / "t"))
    got = npu_rec.sparse_lookup(table, ids, is_training=False).numpy()
    np.testing.assert_allclose(got, first - 0.5)
    assert len(np.unique(got, axis=0)) == 6  # six rows, none shared
    assert table.evict(now=200) == 6 and int(table.size()) == 0
    np.testing.assert_array_equal(
        npu_rec.sparse_lookup(table, ids, is_training=False), np.zeros([6, 2])
    )
    table.save(str(tmp_path / "empty"))


def test_table_restore_leaves_no_stale_keys_in_the_index(tmp_path):
    table = npu_rec.create_table("stale", 2, optimizer=npu_rec.optimizers.SGD(0.1))
    npu_rec.sparse_lookup(table, tf.constant([1, 2, 3], tf.int64))
    table.save(str(tmp_path / "t"))
    npu_rec.sparse_lookup(table, tf.constant([4, 5], tf.int64))
    table.restore(str(tmp_path / "t"))
    assert int(table.key_index.size()) == 3
    got = npu_rec.sparse_lookup(table, tf.constant([4], tf.int64), is_training=False)
    np.testing.assert_array_equal(got, [[0.0, 0.0]])


def test_table_eviction_cycles_rebuild_the_index_and_keep_rows_right():
    table = npu_rec.create_table(
        "churn", 2, capacity=8, access_threshold=0, eviction_threshold=10, dynamic_expansion=True
    )
    rebuilt = False
    for cycle in range(4):
        keys = tf.range(10, dtype=tf.int64) + 100 * cycle
        npu_rec.sparse_lookup(
            table, keys, timestamps=tf.fill([10], tf.constant(1000 * cycle, tf.int64))
        )
        assert sorted(table.export()["keys"].tolist()) == keys.numpy().tolist()
        assert table.evict(now=1000 * cycle + 100) == 10
        rebuilt |= int(table.key_index.removed.numpy()) == 0
        assert int(table.size()) == 0 and int(table.key_index.size()) == 0
    assert rebuilt
    np.testing.assert_array_equal(
        npu_rec.sparse_lookup(table, tf.constant([5, 305], tf.int64), is_training=False),
        np.zeros([2, 2]),
    )


def _rebuild_cycles(insert, remove, rebuild, export, size):
    """Insert, remove, rebuild five times; the index must equal a dict after each."""
    rng = np.random.default_rng(3)
    ref: dict[int, int] = {}
    for cycle in range(5):
        new = [k for k in dict.fromkeys(rng.integers(1, 10**6, 40).tolist()) if k not in ref]
        insert(new, [k * 2 for k in new])
        ref.update({k: k * 2 for k in new})
        gone = sorted(ref)[:20]
        remove(gone)
        for k in gone:
            del ref[k]
        rebuild()
        keys, rows = export()
        assert sorted(keys.tolist()) == sorted(ref), f"cycle {cycle}: wrong keys"
        assert dict(zip(keys.tolist(), rows.tolist(), strict=True)) == ref
        assert size() == len(ref)


def test_rebuild_inside_tf_function_gives_a_fresh_array_every_call():
    """The rebuild's empty array must not be one constant buffer reused (constant folding)."""
    index = KeyIndex(40)

    @tf.function
    def rebuild():
        index.rebuild()

    def insert(keys, rows):
        index.insert(tf.constant(keys, tf.int64), tf.constant(rows, tf.int64))

    _rebuild_cycles(
        insert,
        lambda keys: index.remove(tf.constant(keys, tf.int64)),
        rebuild,
        lambda: [t.numpy() for t in index.export()],
        lambda: int(index.size()),
    )


def test_rebuild_op_of_a_v1_graph_run_several_times():
    with tf.Graph().as_default():
        index = KeyIndex(40)
        keys_ph, rows_ph = (tf.compat.v1.placeholder(tf.int64, [None]) for _ in range(2))
        insert, remove = index.insert(keys_ph, rows_ph), index.remove(keys_ph)
        rebuild, export, size = index.rebuild(), index.export(), index.size()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            _rebuild_cycles(
                lambda k, r: sess.run(insert, {keys_ph: k, rows_ph: r}),
                lambda k: sess.run(remove, {keys_ph: k}),
                lambda: sess.run(rebuild),
                lambda: sess.run(export),
                lambda: int(sess.run(size)),
            )
