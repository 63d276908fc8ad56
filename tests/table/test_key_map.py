"""`KeyMap` (the kernels' `NpuRecKeyMap`) against a Python dict, and under concurrent ops.

The map must behave as `DenseHashTable` does for `KeyIndex`: the same answers,
export format and checkpoints, with growth, tombstone reuse and the two
reserved keys refused.
"""

import threading

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import npu_rec
from npu_rec._kernels import _build
from npu_rec._kernels._key_map import KeyMap
from npu_rec.table import _registry as _table_registry
from npu_rec.table._key_index import DELETED_KEY, EMPTY_KEY, KeyIndex
from tests.table.test_table_kernels import needs_kernels

pytestmark = needs_kernels

# Keys of a few buckets' worth of homes, so chains collide; plus far keys with
# the same low bits.
_KEY = st.one_of(st.integers(0, 40), st.integers(0, 5).map(lambda k: k + (7 << 40)))
_OP = st.one_of(
    st.tuples(st.just("insert"), st.lists(_KEY, min_size=1, max_size=12), st.integers(0, 99)),
    st.tuples(st.just("remove"), st.lists(_KEY, min_size=1, max_size=12), st.just(0)),
    st.tuples(st.just("reset"), st.just([]), st.just(0)),
    st.tuples(st.just("roundtrip"), st.just([]), st.just(0)),
)


def _map(buckets=8, name="km"):
    return KeyMap(tf.int64, tf.int64, -1, EMPTY_KEY, DELETED_KEY, buckets, name=name)


def _i64(values):
    return tf.constant(values, tf.int64)


def _held(table) -> dict:
    keys, values = (t.numpy().reshape(-1) for t in table.export())
    live = (keys != EMPTY_KEY) & (keys != DELETED_KEY)
    return dict(zip(keys[live].tolist(), values[live].tolist(), strict=True))


def _import(table, keys, values):
    return tf.raw_ops.LookupTableImportV2(
        table_handle=table.resource_handle, keys=keys, values=values
    )


@settings(max_examples=40, deadline=None, derandomize=True)
@given(ops=st.lists(_OP, min_size=1, max_size=25))
def test_random_ops_match_a_dict(ops):
    table, ref = _map(), {}
    universe = _i64(sorted({k for _, keys, _ in ops for k in keys} | {1}))
    for kind, keys, base in ops:
        if kind == "insert":
            values = [base + i for i in range(len(keys))]
            table.insert(_i64(keys), _i64(values))
            ref.update(zip(keys, values, strict=True))
        elif kind == "remove":
            table.remove(_i64(keys))
            for k in keys:
                ref.pop(k, None)
        elif kind == "reset":  # as KeyIndex._reset_mixed clears the map
            _import(table, tf.fill([8, 1], _i64(EMPTY_KEY)), tf.fill([8, 1], _i64(-1)))
            ref.clear()
        else:  # export into a fresh map (a checkpoint restore)
            keys_t, values_t = table.export()
            table = _map(name="km2")
            _import(table, keys_t, values_t)
        found = table.lookup(universe).numpy()
        np.testing.assert_array_equal(found, [ref.get(k, -1) for k in universe.numpy()])
        assert int(table.size()) == len(ref)
        assert _held(table) == ref
        keys_t, values_t = table.export()
        assert keys_t.shape[1:] == [1] and values_t.shape == keys_t.shape
        # Growth keeps the live keys at most 80% of the buckets.
        assert len(ref) <= 0.8 * keys_t.shape[0]


def test_grows_by_doubling_above_the_load_factor():
    table = _map()
    table.insert(_i64(range(7)), _i64(range(7)))  # 7 > 0.8 * 8
    assert table.export()[0].shape[0] == 16
    table.insert(_i64(range(7, 100)), _i64(range(7, 100)))
    assert table.export()[0].shape[0] == 128
    np.testing.assert_array_equal(table.lookup(_i64(range(100))).numpy(), np.arange(100))


def test_insert_reuses_the_tombstone_of_its_chain():
    table = _map()
    table.insert(_i64([3, 11, 19]), _i64([1, 2, 3]))  # one chain: buckets 3, 4, 5
    table.remove(_i64([3]))  # a tombstone: 11 and 19 lie beyond it
    keys = table.export()[0].numpy().reshape(-1)
    assert keys[3] == DELETED_KEY
    table.insert(_i64([27]), _i64([4]))
    keys = table.export()[0].numpy().reshape(-1)
    assert keys[3] == 27 and DELETED_KEY not in keys
    np.testing.assert_array_equal(table.lookup(_i64([3, 11, 19, 27])).numpy(), [-1, 2, 3, 4])


def test_churn_never_fills_the_array_with_tombstones():
    table = _map()
    for i in range(300):
        keys = _i64([8 * i + 1, 8 * i + 2, 8 * i + 9])  # collide at bucket 1
        table.insert(keys, _i64([i, i, i]))
        table.remove(keys[:2])
        assert int(table.size()) == 1
        table.remove(keys[2:])
    assert int(table.size()) == 0
    assert table.export()[0].shape[0] == 8  # no growth from tombstones
    assert table.lookup(_i64([12345])).numpy()[0] == -1


@pytest.mark.parametrize("key", [EMPTY_KEY, DELETED_KEY])
@pytest.mark.parametrize("op", ["lookup", "insert", "remove"])
def test_reserved_keys_are_refused(key, op):
    table = _map()
    with pytest.raises(tf.errors.InvalidArgumentError, match="is reserved"):
        if op == "lookup":
            table.lookup(_i64([1, key]))
        elif op == "insert":
            table.insert(_i64([key]), _i64([1]))
        else:
            table.remove(_i64([key]))


def test_import_refuses_mismatched_shapes():
    table = _map()
    with pytest.raises(tf.errors.InvalidArgumentError, match="one shape"):
        _import(table, tf.fill([8, 1], _i64(EMPTY_KEY)), tf.fill([8], _i64(-1)))


@pytest.mark.parametrize("to_dense", [True, False])
def test_checkpoints_restore_between_the_two_maps(to_dense, tmp_path):
    def dense():
        return tf.lookup.experimental.DenseHashTable(
            tf.int64, tf.int64, -1, EMPTY_KEY, DELETED_KEY, 8
        )

    source, target = (_map(), dense()) if to_dense else (dense(), _map())
    source.insert(_i64(range(50)), _i64(range(100, 150)))
    source.remove(_i64([7, 8]))
    path = tf.train.Checkpoint(t=source).write(str(tmp_path / "ck"))
    tf.train.Checkpoint(t=target).read(path).assert_consumed()
    assert _held(target) == {k: k + 100 for k in range(50) if k not in (7, 8)}


def test_key_index_uses_the_kernels_map_only_on_the_kernel_path():
    _table_registry.clear()
    with _build.forced(True):
        table = npu_rec.create_table("a", 2)
        assert table.backend.name == "kernels"
        assert isinstance(table.key_index.map, KeyMap)
    with _build.forced(False):
        table = npu_rec.create_table("b", 2)
        assert table.backend.name == "stock"
        assert not isinstance(table.key_index.map, KeyMap)
        assert isinstance(table.key_index.map, tf.lookup.experimental.DenseHashTable)
    assert not isinstance(KeyIndex(100, name="c").map, KeyMap)  # the default map class


def test_values_outside_int32_are_refused_and_the_map_is_unchanged():
    """The map holds row numbers in 12-byte buckets: a value must fit int32."""
    table = _map()
    table.insert(_i64([1, 2]), _i64([2**31 - 1, -(2**31)]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="value 2147483648 is outside int32"):
        table.insert(_i64([3, 4]), _i64([5, 2**31]))
    np.testing.assert_array_equal(table.lookup(_i64([1, 2, 3, 4])), [2**31 - 1, -(2**31), -1, -1])


def test_concurrent_lookups_inserts_removes_exports_of_one_map():
    """One graph runs all four ops in parallel, from several threads, many times."""
    graph = tf.Graph()
    stable = np.arange(2000, dtype=np.int64) * 7919
    with graph.as_default():
        table = _map(name="shared")
        init = table.insert(_i64(stable), _i64(stable + 1))
        band = tf.compat.v1.placeholder(tf.int64, [])
        churn = tf.range(band * 500, band * 500 + 500, dtype=tf.int64) + (1 << 40)
        inserted = table.insert(churn, churn - (1 << 40))  # values are rows: int32
        with tf.control_dependencies([inserted]):
            found_churn = table.lookup(churn)
        with tf.control_dependencies([found_churn]):
            removed = table.remove(churn)
        found = table.lookup(_i64(stable))
        keys, values = table.export()
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4)
    errors = []
    with tf.compat.v1.Session(graph=graph, config=config) as sess:
        sess.run(init)

        def worker(t):
            try:
                for i in range(150):
                    got_churn, got, k, v, _ = sess.run(
                        [found_churn, found, keys, values, removed], {band: t * 1000 + i}
                    )
                    np.testing.assert_array_equal(got, stable + 1)
                    first = (t * 1000 + i) * 500
                    np.testing.assert_array_equal(got_churn, np.arange(500) + first)
                    held = dict(zip(k.reshape(-1).tolist(), v.reshape(-1).tolist(), strict=True))
                    assert all(held.get(s) == s + 1 for s in stable[::97].tolist())
            except Exception as err:  # noqa: BLE001 - reported by the main thread
                errors.append(err)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads)
        assert not errors, errors[0]
        assert sess.run(table.size()) == len(stable)


# ---------------------------------------------------------------- exact sizes
# The tiered table's cold index: growth by 1.4 to an exact size (no power of
# two), home bucket = the high half of key * buckets.
LOAD, GROWTH = 0.85, 1.4


def _exact(buckets=8, name="kx"):
    return KeyMap(
        tf.int64,
        tf.int64,
        -1,
        EMPTY_KEY,
        DELETED_KEY,
        buckets,
        name=name,
        max_load_factor=LOAD,
        growth_factor=GROWTH,
    )


# Keys sharing their high bits share home buckets (chains collide), plus keys
# that differ only in their high bits.
_XKEY = st.one_of(
    st.integers(0, 40).map(lambda k: (5 << 58) + k),
    st.integers(0, 40),
    st.integers(-40, -3).map(lambda k: k - (1 << 62)),
)
_XOP = st.one_of(
    st.tuples(st.just("insert"), st.lists(_XKEY, min_size=1, max_size=30), st.integers(0, 99)),
    st.tuples(st.just("remove"), st.lists(_XKEY, min_size=1, max_size=30), st.just(0)),
    st.tuples(st.just("reserve"), st.just([]), st.integers(0, 300)),
    st.tuples(st.just("reset"), st.just([]), st.just(0)),
    st.tuples(st.just("roundtrip"), st.just([]), st.just(0)),
)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(ops=st.lists(_XOP, min_size=1, max_size=25))
def test_exact_sizes_random_ops_match_a_dict(ops):
    table, ref = _exact(), {}
    universe = _i64(sorted({k for _, keys, _ in ops for k in keys} | {1}))
    for kind, keys, arg in ops:
        before, held_before, _ = table.counts().numpy().tolist()
        if kind == "insert":
            values = [arg + i for i in range(len(keys))]
            table.insert(_i64(keys), _i64(values))
            ref.update(zip(keys, values, strict=True))
        elif kind == "remove":
            table.remove(_i64(keys))
            for k in keys:
                ref.pop(k, None)
        elif kind == "reserve":
            table.reserve(arg)
            buckets = int(table.counts()[0])
            # Exactly sized for `arg` keys below the load, never shrunk.
            assert buckets == max(before, 8, int(np.ceil(arg / np.float32(LOAD))))
        elif kind == "reset":  # as KeyIndex._reset_mixed clears the map
            _import(table, tf.fill([8, 1], _i64(EMPTY_KEY)), tf.fill([8, 1], _i64(-1)))
            ref.clear()
        else:  # export into a fresh map (a checkpoint restore)
            keys_t, values_t = table.export()
            table = _exact(name="kx2")
            _import(table, keys_t, values_t)
            assert int(table.counts()[0]) == keys_t.shape[0]  # the same size, not rounded
        found = table.lookup(universe).numpy()
        np.testing.assert_array_equal(found, [ref.get(k, -1) for k in universe.numpy()])
        buckets, live, tombs = table.counts().numpy().tolist()
        assert live == len(ref) == int(table.size())
        assert _held(table) == ref
        assert len(ref) <= LOAD * buckets
        assert live + tombs < buckets  # every probe meets an empty bucket
        if kind == "insert" and buckets != before:
            # Grown by the factor (or to the exact size of the keys held and
            # inserted: an insert makes room for its whole batch), no more.
            need = int(np.ceil((held_before + len(keys)) / np.float32(LOAD)))
            assert buckets <= max(need, int(np.ceil(GROWTH * before))) + 1


def test_exact_sizes_grow_by_the_factor_and_hold_at_most_19_8_bytes_per_key():
    table = _exact(1205)
    sizes, worst = [], 0.0
    for start in range(0, 400_000, 12_000):  # the tier's inserts per step
        mixed = np.arange(start, start + 12_000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        keys = (mixed >> np.uint64(1)).astype(np.int64)  # spread, never a reserved key
        table.insert(_i64(keys), _i64(np.arange(start, start + 12_000)))
        buckets, live, _ = table.counts().numpy().tolist()
        worst = max(worst, 12 * buckets / live)
        if not sizes or sizes[-1] != buckets:
            sizes.append(buckets)
    assert worst <= 12 * GROWTH / LOAD + 0.5  # 19.8 B, plus one step's keys
    assert all(b < 1.5 * a for a, b in zip(sizes[1:], sizes[2:], strict=False))
    assert any(b & (b - 1) for b in sizes)  # not powers of two
    assert int(table.size()) == 408_000


def test_reserve_sizes_the_array_once_before_a_bulk_insert():
    table = _exact()
    table.insert(_i64([1, 2, 3]), _i64([1, 2, 3]))
    table.reserve(100_003)
    buckets = int(table.counts()[0])
    assert buckets == int(np.ceil(100_003 / np.float32(LOAD)))
    keys = np.arange(4, 100_004, dtype=np.int64) << 20
    table.insert(_i64(keys), _i64(np.arange(len(keys))))
    assert int(table.counts()[0]) == buckets  # no growth on the way
    assert 12 * buckets / int(table.size()) < 14.2
    np.testing.assert_array_equal(table.lookup(_i64(keys[::997])), np.arange(len(keys))[::997])
    # The power-of-two map (the table's key index) reserves to a power of two.
    pow2 = _map()
    pow2.reserve(1000)
    assert int(pow2.counts()[0]) == 2048


def test_reserve_and_counts_refuse_another_map():
    dense = tf.lookup.experimental.DenseHashTable(tf.int64, tf.int64, -1, EMPTY_KEY, DELETED_KEY)
    with pytest.raises(tf.errors.InvalidArgumentError, match="takes an NpuRecKeyMap"):
        _build.library().npu_rec_key_map_counts(table_handle=dense.resource_handle)


@pytest.mark.parametrize("growth", [1.0, 4.5])
def test_a_bad_growth_factor_is_refused_naming_it(growth):
    with pytest.raises(ValueError, match="growth_factor"):
        KeyMap(tf.int64, tf.int64, -1, EMPTY_KEY, DELETED_KEY, growth_factor=growth)
