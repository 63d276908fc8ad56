"""An owner's update of one lookup's received gradient copies (`WorkerShardedTable.apply_local`)."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import npu_rec
from npu_rec._kernels import _ops as _kernel_ops
from npu_rec.distribute import Exchange, WorkerShardedTable
from npu_rec.table import _registry as _table_registry
from npu_rec.table._config import TableConfig
from npu_rec.table._fused import select_backend

pytestmark = pytest.mark.skipif(not _kernel_ops.enabled(), reason="the kernel path's merge")


def _table(name):
    config = TableConfig(name=name, dim=3, optimizer=npu_rec.optimizers.Adagrad(0.1), capacity=1024)
    return WorkerShardedTable(config, Exchange(2, 0), select_backend())


@settings(max_examples=5, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 60))
def test_the_lookup_kernels_merge_updates_as_a_unique_of_the_received_rows(seed, n):
    """The rows and index of the owner's training lookup give the update of `tf.unique`."""
    _table_registry.clear()
    rng = np.random.default_rng(seed)
    keys = tf.constant(rng.integers(0, 12, n), tf.int64)  # received copies, with repeats
    grads = tf.constant(rng.normal(size=(n, 3)), tf.float32)
    counts = tf.ones([n], tf.int64)
    times = tf.zeros([n], tf.int64)
    tables = []
    for _ in range(2):  # the same table twice (same initial rows)
        _table_registry.clear()
        tables.append(_table("a"))
    merged = []
    for t in tables:
        local = t.local
        _, at, rows, _ = local.backend.fused_lookup(local, keys, counts, times, False, None)
        merged.append((rows, at))
    rows_a, at_a = merged[0]
    tables[0].apply_local(tf.gather(rows_a, at_a), grads, None)
    tables[1].apply_local(None, grads, None, merged=merged[1])
    want, got = tables[0].export(), tables[1].export()
    np.testing.assert_array_equal(got["keys"], want["keys"])
    np.testing.assert_array_equal(got["values"], want["values"])
