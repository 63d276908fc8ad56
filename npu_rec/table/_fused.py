"""The training lookup of one shard on the kernel path (`NpuRecTrainLookup`).

One kernel deduplicates the batch's ids, takes the newest time per key
(clamped like the stock path's `_clamp_times`), probes the key index
(the kernels' own `NpuRecKeyMap` directly, or a `DenseHashTable` through
TensorFlow's lookup interface), gathers the
rows of the keys found and adds their sightings and last-seen times in place.
A table that admits at the first sighting with the keyed initialiser also
admits in the kernel (rows from the free list, then the high-water mark; the
index insert). For the other tables only the keys without a row go on to
admission in stock ops (pending counters, row allocation, the initialiser,
the index insert) inside a `tf.cond` that runs when a key is admitted: there
a second kernel (`NpuRecGatherTouch`) reads and touches the new rows, merged
into the result.
The stock path (`SingleShardTable.lookup_unique`) computes the same state
and is the reference (tests/table/test_table_kernels.py).
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from npu_rec._kernels import _ops as _kernel_ops
from npu_rec.table import _lock
from npu_rec.table._base import MAX_SECONDS_AHEAD


class AdmissionPlan(NamedTuple):
    """Keys without a row, split into those admitted now and those still counted.

    Attributes:
      pos: int64 [k], positions (in the unique keys) of the admitted keys.
      keys: int64 [k], the admitted keys.
      prior: int64 [k], their sightings before this batch (pending counters).
      total: int64 [k], their sightings including this batch (`prior` + batch).
      times: int64 [k], their newest times in this batch.
      pending: None (admission off or at once), or the arguments of
        `PendingCounts.update` (admitted keys, waiting keys, waiting state).
    """

    pos: tf.Tensor
    keys: tf.Tensor
    prior: tf.Tensor
    total: tf.Tensor
    times: tf.Tensor
    pending: tuple | None


class FusedLookupMixin:
    """`fused_lookup` / `lookup_ids` of `SingleShardTable` on the kernel path."""

    def fused_lookup(self, ids, id_counts, times, from_feature: bool, batch_time):
        """The training lookup of ids through `NpuRecTrainLookup` (no lock taken).

        Args:
          ids: int64 [n] (repeats allowed).
          id_counts: int64 [n] sightings per id, or None (one each).
          times: int64 [n] per id (ignored when `batch_time` is given).
          from_feature: the times come from a timestamp feature (clamped, and
            the table's clock follows them).
          batch_time: int64 scalar time of every id, or None.

        Returns:
          (unique int64 [u], index int64 [n], rows int64 [u] (-1 = no row),
          embeddings float32 [u, dim] (zeros where no row)).
        """
        s = self._storage
        clock = limit = None
        if from_feature:
            clock = self._max_seen.read_value()
            limit = tf.cast(tf.timestamp(), tf.int64) + MAX_SECONDS_AHEAD
        out = _kernel_ops.train_lookup(
            self._index,
            s,
            ids,
            id_counts,
            times if batch_time is None else batch_time,
            batch_time=batch_time is not None,
            clock=clock,
            limit=limit,
            admit_seed=self._seed if self._admits_in_kernel() else None,
        )
        if self._admits_in_kernel():  # every key has its row now
            rows, emb, effects = out.rows, out.embeddings, []
        else:
            rows, emb, effects = self._admit_misses(out)
        effects.append(
            self._max_seen.assign(
                tf.maximum(self._max_seen.read_value(), out.newest), read_value=False
            )
        )
        if from_feature:
            old = self._clamped.read_value()
            late = out.late
            effects.append(
                self._clamped.assign(
                    tf.stack([old[0] + late[0], tf.maximum(old[1], late[1])]), read_value=False
                )
            )
            effects.append(self._ts_feature.assign(True, read_value=False))
        # Whatever consumes the rows runs after admission and bookkeeping (in a v1
        # graph, fetching the embeddings runs every effect).
        with tf.control_dependencies(effects):
            return out.unique, out.index, tf.identity(rows), tf.identity(emb)

    def _admits_in_kernel(self) -> bool:
        """Admission at the first sighting with the keyed initialiser: all in the kernel."""
        return self.admits_at_once and self.config.initializer is None

    def _admit_misses(self, out):
        """(rows, embeddings, [effects]) once the kernel's misses went through admission."""
        s = self._storage
        plan = self._admission_plan(out.miss_pos, out.miss_keys, out.miss_counts, out.miss_times)
        num_new = tf.size(plan.keys, out_type=tf.int64)

        def admit():
            new_rows = self._admit_rows(plan.keys, num_new)
            emb = _kernel_ops.gather_touch(s, new_rows, plan.total, plan.times)
            at = plan.pos[:, None]
            return (
                tf.tensor_scatter_nd_update(out.rows, at, new_rows),
                tf.tensor_scatter_nd_update(out.embeddings, at, emb),
            )

        rows, emb = tf.cond(
            num_new > 0, admit, lambda: (tf.identity(out.rows), tf.identity(out.embeddings))
        )
        return rows, emb, self._pending_update(plan, rows)

    @tf.autograph.experimental.do_not_convert
    def lookup_ids(self, ids, times, from_feature: bool = False, batch_time=None):
        """The training lookup of a batch's ids (see `SparseTable.lookup_ids`)."""
        if not _kernel_ops.enabled() or self.key_dtype == tf.int32:
            return super().lookup_ids(ids, times, from_feature, batch_time)
        return self._locked_fused_lookup(ids, times, from_feature, batch_time)

    @_lock.serialised()
    def _locked_fused_lookup(self, ids, times, from_feature, batch_time):
        return self.fused_lookup(ids, None, times, from_feature, batch_time)
