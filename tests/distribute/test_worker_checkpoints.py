"""Re-sharding table checkpoints in one process: layouts, merging, missing workers."""

import os

import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec.checkpoint import TableCheckpointManager
from npu_rec.distribute import merge_states, restore_tables
from npu_rec.table import _registry as _table_registry
from npu_rec.table._sharded import shard_of_numpy


def _trained(name="t", ids=None, seed=0):
    table = npu_rec.create_table(
        name, 4, optimizer=npu_rec.optimizers.Adagrad(0.1), access_threshold=2
    )
    rng = np.random.default_rng(seed)
    for _ in range(5):
        batch = tf.constant(rng.integers(0, 60, 40) if ids is None else ids, tf.int64)
        with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as records:
            loss = tf.reduce_sum(npu_rec.sparse_lookup(table, batch) ** 2)
        npu_rec.apply_recorded_gradients(
            records, tape.gradient(loss, [r.embeddings for r in records])
        )
    return table


def _split(state, workers):
    """The state as `workers` worker shards would hold it (keys by owner)."""
    parts = []
    for w in range(workers):
        part = dict(state)
        rows = shard_of_numpy(state["keys"], workers) == w
        pend = shard_of_numpy(state["pending_keys"], workers) == w
        for f, v in state.items():
            if f in ("keys", "values", "counts", "last_seen") or f.startswith("slot/"):
                part[f] = v[rows]
            elif f.startswith("pending_"):
                part[f] = v[pend]
        parts.append(part)
    return parts


def _write_workers(directory, table, workers, step=7):
    """Writes `table`'s state as a `workers`-worker checkpoint at `step`."""
    for w, part in enumerate(_split(table.read_state(0), workers)):
        stand_in = _StandIn(table, part)
        TableCheckpointManager(
            os.path.join(directory, f"worker-{w}-of-{workers}"), [stand_in]
        ).save(step)


class _StandIn:
    """A table whose state is one worker's part (for writing a worker's files)."""

    def __init__(self, table, state):
        self.name, self._table, self._state = table.name, table, state

    def read_state(self, min_period=0, session=None, check=True):
        return self._state

    def describe(self):
        return self._table.describe()

    def end_period(self, session=None):
        pass


def test_merging_worker_states_gives_back_the_table_state():
    table = _trained()
    state = table.read_state(0)
    merged = merge_states(_split(state, 3))
    assert set(merged) == set(state)
    for field, value in state.items():
        np.testing.assert_array_equal(merged[field], value, err_msg=field)


@pytest.mark.parametrize("workers, num_shards", [(2, 1), (3, 1), (3, 2)])
def test_a_checkpoint_of_n_workers_restores_in_one_process(tmp_path, workers, num_shards):
    table = _trained()
    want = table.export()
    _write_workers(str(tmp_path), table, workers)
    _table_registry.clear()
    fresh = npu_rec.create_table(
        "t", 4, optimizer=npu_rec.optimizers.Adagrad(0.1), access_threshold=2, num_shards=num_shards
    )
    assert restore_tables(str(tmp_path), [fresh]) == 7
    got = fresh.export()
    for field in ("keys", "values", "counts", "last_seen"):
        np.testing.assert_array_equal(got[field], want[field], err_msg=field)
    np.testing.assert_array_equal(got["slots"]["accumulator"], want["slots"]["accumulator"])


def test_a_missing_worker_directory_is_named(tmp_path):
    table = _trained()
    _write_workers(str(tmp_path), table, 3)
    os.rename(tmp_path / "worker-1-of-3", tmp_path / "moved")
    with pytest.raises(
        FileNotFoundError,
        match=r"written by 3 workers but holds the files "
        r"of workers \[0, 2\] only",
    ):
        restore_tables(str(tmp_path), [table])


def test_nothing_saved_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="No table checkpoint"):
        restore_tables(str(tmp_path), [_trained()])
