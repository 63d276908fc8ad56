"""A tiered table looked up several times before its optimizer step (one `SparseEmbedding`
called on two inputs, as in Keras): every row handed out stays in memory until the
step, however small `memory_rows` is, so the recorded gradients reach the rows their
lookups read and the table ends equal to an in-memory one.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec.table import _registry
from tests.table.tier_driver import OPTIMIZERS, assert_same_bits

DIM = 3


@pytest.fixture(autouse=True)
def _clean_registry():
    _registry.clear()
    yield
    _registry.clear()


def _train(table, batches):
    """Per step: one training lookup per batch, then one optimizer step of them all."""
    for step, lookups in enumerate(batches):
        with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as records:
            loss = 0.0
            for i, ids in enumerate(lookups):
                emb = npu_rec.sparse_lookup(
                    table, tf.constant(ids, tf.int64), timestamps=tf.constant(100 + step, tf.int64)
                )
                loss += tf.reduce_sum(emb * float(i + 1)) + tf.reduce_sum(emb * emb)
        grads = tape.gradient(loss, [r.embeddings for r in records])
        npu_rec.apply_recorded_gradients(records, grads)


@pytest.mark.parametrize("optimizer", ["adam", "adagrad"])
def test_two_lookups_per_step_with_more_keys_than_memory_rows(tmp_path, optimizer):
    rng = np.random.default_rng(4)
    batches = [
        [rng.choice(30, size=6, replace=False).tolist() for _ in range(2)] for _ in range(10)
    ]
    exports = []
    for tier in ({}, {"memory_rows": 2, "ssd_path": str(tmp_path)}):
        _registry.clear()
        table = npu_rec.create_table(
            "twice",
            DIM,
            optimizer=OPTIMIZERS[optimizer][0](),
            access_threshold=0,
            dynamic_expansion=True,
            **tier,
        )
        _train(table, batches)
        exports.append(table.export())
        if tier:
            stats = table.tier_stats()
            assert stats["promotions"] > 0 and stats["demotions"] > 0
            table.shards[0].state.store.close()
    want, got = exports
    order, want_order = np.argsort(got["keys"]), np.argsort(want["keys"])
    np.testing.assert_array_equal(got["keys"][order], want["keys"][want_order])
    assert_same_bits(got["values"][order], want["values"][want_order], "values")
    for name in want["slots"]:
        assert_same_bits(got["slots"][name][order], want["slots"][name][want_order], name)
