"""Two tables fed the same operations: an in-memory one and a tiered one.

`TablePair` makes both tables under the same name (each in its own
`tf.Graph` in v1-graph mode; the registry is cleared in between eagerly),
so they draw the same first rows and can restore each other's checkpoints.
Every operation runs on both; `assert_same` compares their whole exported
state (keys, rows, slots, counts, last-seen), rows and slots bit for bit in
their stored dtypes.

The tier test modules share their setup from here too: `HAVE_CXX` (a compiler
builds the kernels), `PATHS` (the stock and the kernel lookup path, as a
parameter) and the `small_segments` fixture (segment files of a few records).
"""

from __future__ import annotations

import contextlib
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec._kernels import _build
from npu_rec.checkpoint import TableCheckpointManager
from npu_rec.table import _registry, _tier_store
from tests.table.table_helpers import OPTIMIZERS as _SHARED
from tests.table.table_reference import RefOptimizer

HAVE_CXX = shutil.which(os.environ.get("CXX") or "g++") is not None
#: The lookup path as a parameter: stock (False) and the compiled kernels (True).
PATHS = [False, pytest.param(True, marks=pytest.mark.skipif(not HAVE_CXX, reason="no compiler"))]


@pytest.fixture
def small_segments(monkeypatch):
    """Segments of a few records, so that sealing, compaction and deletion happen often
    (and saves meet sealed and open segments); a fresh table registry around the test."""
    monkeypatch.setattr(_tier_store, "DEFAULT_SEGMENT_BYTES", 600)
    _registry.clear()
    yield
    _registry.clear()


#: The shared optimizers and one keeping a slot per row (width 1).
OPTIMIZERS = {
    **_SHARED,
    "rowwise_adagrad": (
        lambda: npu_rec.optimizers.RowWiseAdagrad(0.1),
        lambda: RefOptimizer(
            "rowwise_adagrad", learning_rate=0.1, initial_accumulator_value=0.1, epsilon=1e-7
        ),
    ),
}


def assert_same_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Equal dtype, shape and bytes (a bfloat16 row that changed its last bit fails)."""
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype)
    np.testing.assert_array_equal(
        np.ascontiguousarray(got).view(np.uint8), np.ascontiguousarray(want).view(np.uint8), what
    )


class Driver:
    """One table and its training step in "eager", "function" or "graph" mode."""

    def __init__(self, mode: str, name: str, dim: int, optimizer: str, kernels: bool, **kwargs):
        self.mode, self.dim = mode, dim
        self.sess = None
        path = _build.forced(kernels)
        with path:
            if mode == "graph":
                self.graph = tf.Graph()
                with self.graph.as_default():
                    self.table = npu_rec.create_table(
                        name, dim, optimizer=OPTIMIZERS[optimizer][0](), **kwargs
                    )
                    ph = tf.compat.v1.placeholder
                    self._ids, self._ts = ph(tf.int64, [None]), ph(tf.int64, [None])
                    self._grads = ph(tf.float32, [None, dim])
                    self._out = self._train(self._ids, self._ts, self._grads)
                    self._read_ids = ph(tf.int64, [None])
                    self._read_out = self._read(self._read_ids)
                    self.sess = tf.compat.v1.Session(graph=self.graph)
                    self.sess.run(tf.compat.v1.global_variables_initializer())
                return
            self.table = npu_rec.create_table(
                name, dim, optimizer=OPTIMIZERS[optimizer][0](), **kwargs
            )
        self._step, self._read_fn = self._train, self._read
        if mode == "function":
            spec = [tf.TensorSpec([None], tf.int64)] * 2 + [tf.TensorSpec([None, dim], tf.float32)]
            self._step = tf.function(self._train, input_signature=spec)
            self._read_fn = tf.function(self._read, input_signature=spec[:1])

    def _train(self, ids, ts, grads):
        emb = npu_rec.sparse_lookup(self.table, ids, timestamps=ts)
        with tf.control_dependencies([emb]):
            update = self.table.apply_gradients(ids, grads)
        with tf.control_dependencies([] if update is None else [update]):
            return tf.identity(emb)

    def _read(self, ids):
        return npu_rec.sparse_lookup(self.table, ids, is_training=False)

    def step(self, ids, ts, grads) -> np.ndarray:
        if self.mode == "graph":
            return self.sess.run(self._out, {self._ids: ids, self._ts: ts, self._grads: grads})
        return self._step(
            tf.constant(ids, tf.int64), tf.constant(ts, tf.int64), tf.constant(grads)
        ).numpy()

    def read(self, ids) -> np.ndarray:
        if self.mode == "graph":
            return self.sess.run(self._read_out, {self._read_ids: ids})
        return self._read_fn(tf.constant(ids, tf.int64)).numpy()

    def evict(self, now: int) -> int:
        return int(self.table.evict(now, session=self.sess))

    def export(self) -> dict:
        return self.table.export(session=self.sess)

    def size(self) -> int:
        if self.mode == "graph":
            return int(self.sess.run(self.table.size()))
        return int(self.table.size())

    def save(self, path: str) -> None:
        self.table.save(path, session=self.sess)

    def restore(self, path: str) -> None:
        self.table.restore(path, session=self.sess)

    def manager(self, directory: str) -> TableCheckpointManager:
        if self.mode == "graph":
            with self.graph.as_default():
                return TableCheckpointManager(directory, [self.table])
        return TableCheckpointManager(directory, [self.table])

    def close(self) -> None:
        if self.sess is not None:
            self.sess.close()


class TablePair:
    """An in-memory table (`mem`) and a tiered one (`tier`) under one name."""

    def __init__(self, mode, name, dim, optimizer, kernels, memory_rows, ssd_path, **kwargs):
        self.mem = Driver(mode, name, dim, optimizer, kernels, **kwargs)
        if mode != "graph":
            _registry.clear()
        self.tier = Driver(
            mode,
            name,
            dim,
            optimizer,
            kernels,
            memory_rows=memory_rows,
            ssd_path=ssd_path,
            **kwargs,
        )
        self.both = (self.mem, self.tier)

    def step(self, ids, ts, grads) -> None:
        got = [d.step(ids, ts, grads) for d in self.both]
        np.testing.assert_array_equal(got[1], got[0])

    def train(self, ids, clock: int, rng) -> None:
        """One step on `ids` at timestamps `clock` or `clock - 1`, random gradients."""
        ids = np.array(ids, np.int64)
        ts = clock - rng.integers(0, 2, len(ids))
        self.step(ids, ts, rng.normal(size=(len(ids), self.mem.dim)).astype(np.float32))

    def evict(self, now: int) -> None:
        assert self.tier.evict(now) == self.mem.evict(now)

    def swap(self, directory) -> None:
        """Each table restores the other's full save (files in `directory`)."""
        paths = [os.path.join(directory, f"swap{i}.nrc") for i in range(2)]
        for d, path in zip(self.both, paths, strict=True):
            d.save(path)
        self.mem.restore(paths[1])
        self.tier.restore(paths[0])

    def assert_same(self) -> None:
        want, got = self.mem.export(), self.tier.export()
        for k in ("keys", "counts", "last_seen"):
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
        assert_same_bits(got["values"], want["values"], "values")
        assert sorted(got["slots"]) == sorted(want["slots"])
        for n in want["slots"]:
            assert_same_bits(got["slots"][n], want["slots"][n], n)
        assert self.tier.size() == self.mem.size() == len(want["keys"])

    def stats(self) -> dict:
        return self.tier.table.tier_stats()

    def close(self) -> None:
        for d in self.both:
            d.close()
        for shard in self.tier.table.shards:
            with contextlib.suppress(Exception):
                shard.state.store.close()
