"""One training loop over a sparse table in eager, `tf.function` or v1-graph mode.

`ChurnDriver` runs training steps (lookup with timestamps, then an SGD update
of the looked-up rows), evictions, saves and restores of one table in the
chosen execution mode, and `check_table` compares the whole table with the
NumPy reference (`tests/table_reference.py`): keys, rows, counts, last-seen
times, size, the key index, and what a lookup of live and evicted keys reads.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import npu_rec
from npu_rec.checkpoint import TableCheckpointManager
from tests.table.table_reference import ReferenceTable, RefOptimizer

MODES = ("eager", "function", "graph")
LEARNING_RATE = 0.1


class ChurnDriver:
    """A table with SGD and the same operations in every execution mode.

    Args:
      mode: "eager", "function" (steps and evictions inside `tf.function`) or
        "graph" (a `tf.compat.v1` graph run in a session).
      name, dim: The table's name and width.
      **table_kwargs: More `npu_rec.create_table` arguments.
    """

    def __init__(self, mode: str, name: str, dim: int, **table_kwargs):
        self.mode, self.dim = mode, dim
        opt = npu_rec.optimizers.SGD(LEARNING_RATE)
        if mode == "graph":
            self.graph = tf.Graph()
            with self.graph.as_default():
                self.table = npu_rec.create_table(name, dim, optimizer=opt, **table_kwargs)
                self._build_graph()
                self.sess = tf.compat.v1.Session(graph=self.graph)
                self.sess.run(tf.compat.v1.global_variables_initializer())
            return
        self.sess = None
        self.table = npu_rec.create_table(name, dim, optimizer=opt, **table_kwargs)
        if mode == "function":
            self._step = tf.function(
                self._train,
                input_signature=[
                    tf.TensorSpec([None], tf.int64),
                    tf.TensorSpec([None], tf.int64),
                    tf.TensorSpec([None, dim], tf.float32),
                ],
            )
            self._evict = tf.function(
                self.table.evict, input_signature=[tf.TensorSpec([], tf.int64)]
            )
            self._infer = tf.function(self._read, input_signature=[tf.TensorSpec([None], tf.int64)])
        else:
            self._step, self._evict, self._infer = self._train, self.table.evict, self._read

    def _train(self, ids, ts, grads):
        emb = npu_rec.sparse_lookup(self.table, ids, timestamps=ts)
        with tf.control_dependencies([emb]):
            update = self.table.apply_gradients(ids, grads)
        deps = [] if update is None else [update]
        with tf.control_dependencies(deps):
            return tf.identity(emb)

    def _read(self, ids):
        return npu_rec.sparse_lookup(self.table, ids, is_training=False)

    def _build_graph(self):
        ph = tf.compat.v1.placeholder
        self._ids, self._ts = ph(tf.int64, [None]), ph(tf.int64, [None])
        self._grads = ph(tf.float32, [None, self.dim])
        self._step_out = self._train(self._ids, self._ts, self._grads)
        self._infer_ids = ph(tf.int64, [None])
        self._infer_out = self._read(self._infer_ids)
        self._removed = self.table.key_index.removed.read_value()
        self._index_size = self.table.key_index.size()
        self._index_export = self.table.key_index.export()

    # ------------------------------------------------------------------ ops
    def step(self, ids, ts, grads) -> np.ndarray:
        """Training lookup of unique `ids` at times `ts` (int or one per id), then SGD."""
        ts = np.broadcast_to(np.asarray(ts, np.int64), np.shape(ids))
        if self.mode == "graph":
            return self.sess.run(self._step_out, {self._ids: ids, self._ts: ts, self._grads: grads})
        return self._step(
            tf.constant(ids, tf.int64), tf.constant(ts, tf.int64), tf.constant(grads, tf.float32)
        ).numpy()

    def infer(self, ids) -> np.ndarray:
        if self.mode == "graph":
            return self.sess.run(self._infer_out, {self._infer_ids: ids})
        return self._infer(tf.constant(ids, tf.int64)).numpy()

    def evict(self, now: int) -> int:
        if self.mode == "graph":
            return self.table.evict(now, session=self.sess)
        return int(self._evict(tf.constant(now, tf.int64)))

    def export(self) -> dict:
        return self.table.export(session=self.sess)

    def save(self, path: str) -> None:
        self.table.save(path, session=self.sess)

    def restore(self, path: str) -> None:
        self.table.restore(path, session=self.sess)

    def manager(self, directory: str) -> TableCheckpointManager:
        return TableCheckpointManager(directory, [self.table])

    def manager_save(self, manager, step: int, delta: bool) -> None:
        manager.save(step, delta=delta, session=self.sess)

    def manager_restore(self, manager) -> None:
        manager.restore(session=self.sess)

    def size(self) -> int:
        if self.mode == "graph":
            return int(self.sess.run(self.table.size()))
        return int(self.table.size())

    def index_size(self) -> int:
        if self.mode == "graph":
            return int(self.sess.run(self._index_size))
        return int(self.table.key_index.size())

    def index_export(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys, rows) held by the table's key index."""
        if self.mode == "graph":
            return self.sess.run(self._index_export)
        return tuple(t.numpy() for t in self.table.key_index.export())

    def removed(self) -> int:
        """Keys removed from the index since its last rebuild (0 right after one)."""
        if self.mode == "graph":
            return int(self.sess.run(self._removed))
        return int(self.table.key_index.removed.numpy())

    def close(self):
        if self.sess is not None:
            self.sess.close()


def reference(name: str, dim: int, **table_kwargs) -> ReferenceTable:
    return ReferenceTable(
        name,
        dim,
        RefOptimizer("sgd", learning_rate=LEARNING_RATE),
        table_kwargs.get("access_threshold", -1),
        table_kwargs.get("eviction_threshold", -1),
    )


def check_table(driver: ChurnDriver, ref: ReferenceTable, probe) -> None:
    """Asserts the table holds exactly the reference's live keys and rows.

    `probe` (int ids, e.g. recently evicted and live keys) are also looked up
    without training: live keys read their rows, others zeros.
    """
    got, want = driver.export(), ref.export()
    keys = got["keys"]
    assert len(np.unique(keys)) == len(keys), "export() holds a key twice"
    missing = sorted(set(want["keys"].tolist()) - set(keys.tolist()))
    extra = sorted(set(keys.tolist()) - set(want["keys"].tolist()))
    assert not missing and not extra, (
        f"{len(missing)} live keys missing (e.g. {missing[:3]}), "
        f"{len(extra)} evicted or unknown keys present (e.g. {extra[:3]})"
    )
    np.testing.assert_allclose(got["values"], want["values"], atol=1e-5)
    np.testing.assert_array_equal(got["counts"], want["counts"])
    np.testing.assert_array_equal(got["last_seen"], want["last_seen"])
    assert driver.size() == len(want["keys"]), "size() disagrees with the live keys"
    index_keys, index_rows = driver.index_export()
    live = set(want["keys"].tolist())
    stale = sorted(set(index_keys.tolist()) - live)
    assert len(index_keys) == len(set(index_keys.tolist())) and not stale, (
        f"the key index holds {len(index_keys)} entries for {len(live)} live keys: "
        f"{len(index_keys) - len(set(index_keys.tolist()))} duplicates, {len(stale)} "
        f"evicted keys (e.g. {stale[:3]})"
    )
    assert len(np.unique(index_rows)) == len(index_rows), "two keys share a row"
    assert driver.index_size() == len(want["keys"]), "the key index size is wrong"
    probe = np.asarray(probe, np.int64)
    if probe.size:
        np.testing.assert_allclose(
            driver.infer(probe), ref.lookup(probe.tolist(), [], training=False), atol=1e-5
        )
