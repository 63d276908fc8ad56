"""`KernelBackend`: a table shard's operations on npu_rec's compiled kernels.

The training lookup is one kernel (`NpuRecTrainLookup`): it deduplicates the
batch's ids, takes the newest time per key (clamped like the stock path's
`StockBackend._clamp_times`), probes the key index (the kernels' own
`NpuRecKeyMap` directly, or a `DenseHashTable` through TensorFlow's lookup
interface), gathers the rows of the keys found and adds their sightings and
last-seen times in place. A table that admits at the first sighting with the
keyed initialiser also admits in the kernel (rows from the free list, then the
high-water mark; the index insert). For the other tables only the keys
without a row go on to admission in stock ops (pending counters, row
allocation, the initialiser, the index insert) inside a `tf.cond` that runs
when a key is admitted: there a second kernel (`NpuRecGatherTouch`) reads and
touches the new rows, merged into the result. The optimizer step of the five
built-in optimizers (SGD, Adagrad, RowWiseAdagrad, Adam, Ftrl) is one kernel
(`NpuRecSparseApply`, which also sums the per-id gradients), and unique rows
are expanded to the ids by `NpuRecExpand`. Everything else (eviction, export
and import, int32 keys, other optimizers) is the stock backend's, which this
one derives from.

Compact rows (`value_dtype` bfloat16 or float16) run on the same kernels:
they read rows as float32, write initial rows rounded to nearest and an
optimizer step's rows rounded stochastically with the hash of
`npu_rec.table._rounding`, computed in C++; the results equal the stock
path's bit for bit (tests/table/test_table_compact.py).

The stock path (`StockBackend`) computes the same state and is the reference
(tests/table/test_table_kernels.py). `select_backend` is the one place that
asks whether the kernels are on.
"""

from __future__ import annotations

import tensorflow as tf

from npu_rec._kernels import _key_map
from npu_rec._kernels import _ops as _kernel_ops
from npu_rec.table._backend import TableBackend
from npu_rec.table._base import MAX_SECONDS_AHEAD
from npu_rec.table._state import ShardState
from npu_rec.table._stock import StockBackend


def select_backend() -> TableBackend:
    """The backend of a new table: the kernels' when they load, else the stock one.

    `create_table` calls it once per table (the choice is the table's for its
    life). The kernels are built or loaded on the first call
    (`NPU_REC_KERNELS`, see `npu_rec._kernels._build`).
    """
    return _KERNELS if _kernel_ops.enabled() else _STOCK


def load_kernels() -> None:
    """Registers the kernels' ops in this process when the kernel path is on.

    A parameter server runs table ops that other processes placed on it, so
    it needs their kernels before its server starts.
    """
    _kernel_ops.enabled()


class KernelBackend(StockBackend):
    """The kernel implementation of `TableBackend` (see module docstring)."""

    name = "kernels"
    sums_slices = True

    def map_class(self):
        """The kernels' own map (`DenseHashTable` within `_key_map.dense_maps()`)."""
        if _key_map.wanted():
            return _key_map.KeyMap
        return tf.lookup.experimental.DenseHashTable

    def create_state(self, config, graph_mode: bool):
        """The stock state, its per-row variables made and grown by `NpuRecPadRows`."""
        return ShardState.create(config, self.map_class(), graph_mode, _kernel_ops.pad_rows)

    # ---------------------------------------------------------------- lookups
    def lookup_ids(self, shard, ids, times, from_feature: bool, batch_time):
        if shard.key_dtype == tf.int32:  # ids are range-checked after deduplication
            return super().lookup_ids(shard, ids, times, from_feature, batch_time)
        return shard.state.locked(
            lambda: self.fused_lookup(shard, ids, None, times, from_feature, batch_time)
        )

    def lookup_unique(self, shard, keys, counts, times, training: bool, from_feature, batch_time):
        if not training:
            return super().lookup_unique(
                shard, keys, counts, times, training, from_feature, batch_time
            )
        return shard.state.locked(
            lambda: self.fused_lookup(shard, keys, counts, times, from_feature, batch_time)[2:]
        )

    def fused_lookup(
        self, shard, ids, id_counts, times, from_feature: bool, batch_time, known_rows=None
    ):
        """The training lookup of ids through `NpuRecTrainLookup` (no lock taken).

        Args:
          shard: The `SingleShardTable`.
          ids: int64 [n] (repeats allowed).
          id_counts: int64 [n] sightings per id, or None (one each).
          times: int64 [n] per id (ignored when `batch_time` is given).
          from_feature: the times come from a timestamp feature (clamped, and
            the table's clock follows them).
          batch_time: int64 scalar time of every id, or None.
          known_rows: None, or the rows of `ids` already known (see
            `_ops.train_lookup`: unique ids, one time for the batch).

        Returns:
          (unique int64 [u], index int64 [n], rows int64 [u] (-1 = no row),
          embeddings float32 [u, dim] (zeros where no row)).
        """
        st = shard.state
        clock = limit = None
        if from_feature:
            clock = st.max_seen.read_value()
            limit = tf.cast(tf.timestamp(), tf.int64) + MAX_SECONDS_AHEAD
        in_kernel = self._admits_in_kernel(shard)
        out = _kernel_ops.train_lookup(
            st.index,
            st.rows,
            ids,
            id_counts,
            times if batch_time is None else batch_time,
            batch_time=batch_time is not None,
            clock=clock,
            limit=limit,
            admit_seed=shard.seed if in_kernel else None,
            known_rows=known_rows,
        )
        if in_kernel:  # every key has its row now
            rows, emb, effects = out.rows, out.embeddings, []
        else:
            rows, emb, effects = self._admit_misses(shard, out)
        effects.append(
            st.max_seen.assign(tf.maximum(st.max_seen.read_value(), out.newest), read_value=False)
        )
        if from_feature:
            old = st.clamped.read_value()
            late = out.late
            effects.append(
                st.clamped.assign(
                    tf.stack([old[0] + late[0], tf.maximum(old[1], late[1])]), read_value=False
                )
            )
            effects.append(st.ts_feature.assign(True, read_value=False))
        # Whatever consumes the rows runs after admission and bookkeeping (in a v1
        # graph, fetching the embeddings runs every effect).
        with tf.control_dependencies(effects):
            return out.unique, out.index, tf.identity(rows), tf.identity(emb)

    @staticmethod
    def _admits_in_kernel(shard) -> bool:
        """Admission at the first sighting with the keyed initialiser: all in the kernel."""
        return shard.admits_at_once and shard.config.initializer is None

    def _admit_misses(self, shard, out):
        """(rows, embeddings, [effects]) once the kernel's misses went through admission."""
        s = shard.state.rows
        plan = self.admission_plan(
            shard, out.miss_pos, out.miss_keys, out.miss_counts, out.miss_times
        )
        num_new = tf.size(plan.keys, out_type=tf.int64)

        def admit():
            new_rows = self.admit_rows(shard, plan.keys, num_new)
            emb = _kernel_ops.gather_touch(s, new_rows, plan.total, plan.times)
            at = plan.pos[:, None]
            return (
                tf.tensor_scatter_nd_update(out.rows, at, new_rows),
                tf.tensor_scatter_nd_update(out.embeddings, at, emb),
            )

        rows, emb = tf.cond(
            num_new > 0, admit, lambda: (tf.identity(out.rows), tf.identity(out.embeddings))
        )
        return rows, emb, self.pending_update(shard, plan, rows)

    def expand(self, embeddings, index) -> tf.Tensor:
        """`NpuRecExpand` for float32 [u, dim] rows and an int64 [n] index, else `tf.gather`.

        One small copy loop per lookup instead of TensorFlow's sharded gather;
        the same gradient.
        """
        if (
            embeddings.dtype == tf.float32
            and embeddings.shape.rank == 2
            and index.dtype == tf.int64
            and index.shape.rank == 1
        ):
            return _kernel_ops.expand(embeddings, index)
        return tf.gather(embeddings, index)

    # -------------------------------------------------------------- gradients
    def apply(self, shard, rows, grads, step, all_rows: bool, current) -> tf.Operation:
        if not _kernel_ops.supports(shard.optimizer):  # a user's optimizer: stock ops
            return super().apply(shard, rows, grads, step, all_rows, current)
        # Sums per-id gradients (IndexedSlices) and updates in one kernel; skips rows < 0.
        return _kernel_ops.sparse_apply(
            shard.optimizer, shard.state.rows, rows, grads, step, seed=shard.seed
        )


_STOCK = StockBackend()
_KERNELS = KernelBackend()
