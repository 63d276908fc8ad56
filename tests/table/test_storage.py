"""The row storage's compact metadata: int32 saturating counts, int32 last-seen times.

A checkpoint (or a `.keras` state) carries int64 counts and absolute int64
times, as every checkpoint written before the metadata was narrowed did; the
table stores them in 4 bytes each and hands back the same int64 values, except
that counts saturate at 2**31 - 1 (a saturated key still reaches every delta
save) and times are kept between 1970 and 2106.
"""

import time

import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec.checkpoint import TableCheckpointManager, read_file, write_file
from npu_rec.table import _registry as _table_registry
from npu_rec.table._storage import COUNT_MAX, SEEN_MAX, decode_seen, encode_seen
from tests.table.test_table_kernels import kernel_path, needs_kernels

LATE = 2**31 + 1_000  # after 2038-01-19 (past a signed 32-bit time_t)
T0 = int(time.time()) - 10_000  # timestamps of lookups (later ones would be clamped)


def _table(name, eviction=-1):
    _table_registry.clear()
    return npu_rec.create_table(
        name,
        2,
        optimizer=npu_rec.optimizers.SGD(0.1),
        access_threshold=0 if eviction >= 0 else -1,
        eviction_threshold=eviction,
    )


def _look(table, ids, when):
    ids = tf.constant(ids, tf.int64)
    npu_rec.sparse_lookup(
        table, ids, timestamps=tf.fill(tf.shape(ids), tf.constant(when, tf.int64))
    )


def _rows(var):
    return int(tf.raw_ops.VariableShape(input=var.handle)[0])


def _by_key(state):
    return {
        int(k): (int(c), int(t))
        for k, c, t in zip(*[state[f] for f in ("keys", "counts", "last_seen")], strict=True)
    }


def test_seen_encoding_round_trips_and_clamps():
    times = tf.constant([0, 1, 2**31 - 1, 2**31, LATE, SEEN_MAX, SEEN_MAX + 5, -7], tf.int64)
    stored = encode_seen(times)
    assert stored.dtype == tf.int32
    np.testing.assert_array_equal(
        decode_seen(stored).numpy(), [0, 1, 2**31 - 1, 2**31, LATE, SEEN_MAX, SEEN_MAX, 0]
    )


@pytest.mark.parametrize("kernels", [False, pytest.param(True, marks=needs_kernels)])
def test_checkpoint_with_int64_metadata_restores_saturates_and_deltas_see_sightings(
    tmp_path, kernels
):
    """An old-layout file (int64 counts beyond int32, int64 times) restores and trains on."""
    with kernel_path(kernels):
        table = _table("old", eviction=100)
        manager = TableCheckpointManager(str(tmp_path), [table])
        _look(table, [1, 2, 3], T0)
        manager.save(1)
        path = manager.versions()[-1].path
        arrays, meta = read_file(path)
        keys = arrays["tables/old/keys"]
        # The values a table of the int64 layout could have written.
        big = {1: 2**40, 2: COUNT_MAX - 1, 3: 7}
        arrays["tables/old/counts"] = np.array([big[int(k)] for k in keys], np.int64)
        arrays["tables/old/last_seen"] = np.array([T0 + 10 * int(k) for k in keys], np.int64)
        write_file(path, arrays, meta)

        table = _table("old", eviction=100)
        manager = TableCheckpointManager(str(tmp_path), [table])
        manager.restore()
        got = _by_key(table.read_state(0))
        assert got == {1: (COUNT_MAX, T0 + 10), 2: (COUNT_MAX - 1, T0 + 20), 3: (7, T0 + 30)}

        # Key 2 saturates; key 3 is sighted; key 1 (saturated) is not looked up.
        _look(table, [2, 2, 2, 3], T0 + 50)
        got = _by_key(table.read_state(0))
        assert got[2] == (COUNT_MAX, T0 + 50) and got[3] == (8, T0 + 50)
        # Sightings since the restore: 2 and 3; a saturated count always counts as sighted.
        assert sorted(table.read_state(1)["keys"].tolist()) == [1, 2, 3]
        manager.save(2)
        _look(table, [3], T0 + 60)
        manager.save(3, delta=True)
        arrays, _ = read_file(manager.versions()[-1].path)
        # 3 sighted since the save; 1 and 2 saturated (their sightings are not counted).
        assert sorted(arrays["tables/old/keys"].tolist()) == [1, 2, 3]

        # Eviction compares absolute times: 1 (last seen T0 + 10) is idle at T0 + 120.
        assert int(table.evict(T0 + 120)) == 1
        assert sorted(table.read_state(0)["keys"].tolist()) == [2, 3]


def test_state_round_trip_keeps_int64_fields():
    table = _table("rt")
    state = {
        "keys": np.array([5, 6], np.int64),
        "values": np.ones([2, 2], np.float32),
        "counts": np.array([3, 2**35], np.int64),
        "last_seen": np.array([0, LATE], np.int64),
    }
    full = table.read_state(0)
    full.update(state)
    table.write_state(full)
    out = table.read_state(0)
    assert out["counts"].dtype == np.int64 and out["last_seen"].dtype == np.int64
    assert _by_key(out) == {5: (3, 0), 6: (COUNT_MAX, LATE)}


def test_free_list_takes_memory_only_once_rows_are_freed():
    table = _table("fl", eviction=10)
    storage = table.storage
    _look(table, list(range(100)), T0)
    assert _rows(storage.free) == 0
    assert table.storage.counts.dtype == tf.int32
    assert table.storage.last_seen.dtype == tf.int32
    _look(table, list(range(50)), T0 + 1_000)
    assert int(table.evict(T0 + 1_000)) == 50
    assert 50 <= _rows(storage.free) <= 100
    # Freed rows are reused before fresh ones.
    _look(table, list(range(1000, 1030)), T0 + 1_001)
    assert int(storage.next_row.numpy()) == 100 and int(table.size()) == 80
