"""`StockBackend`: a table shard's operations in stock TensorFlow ops (the reference).

A training lookup of unique keys probes the key index, sends the keys
without a row through admission (pending counters, row allocation from the
free list or the high-water mark, the initializer, the index insert) inside
a `tf.cond` that runs only when a key is admitted, then adds the sightings
and last-seen times of the rows it found (gather, then scatter-assign:
TF's CPU scatter-add and scatter-max are about 4x slower) and reads the rows.
The optimizer step is the optimizer's own `apply_sparse` on the rows'
variables (for compact rows, a `RoundedRows` view of the rows variable that
rounds the new rows stochastically, `_rounding`). Eviction scans the `last_seen` column, frees the idle rows and
removes their keys. See `TableBackend` (`_backend`) for the interface.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from npu_rec.table._backend import TableBackend
from npu_rec.table._base import MAX_SECONDS_AHEAD, NO_NOW, key_times, rows_with_values
from npu_rec.table._config import TableConfig
from npu_rec.table._key_index import MAX_LOAD, buckets_for
from npu_rec.table._rounding import RoundedRows
from npu_rec.table._state import ShardState
from npu_rec.table._storage import encode_seen, saturated

#: Bytes of a key index bucket after a restore (the kernels' map; `DenseHashTable`: 16).
_INDEX_BUCKET_BYTES = 12
#: Per-row metadata: key (int64), counts, saved counts, last-seen (int32 each); the
#: free list is empty after a restore.
_METADATA_ROW_BYTES = 8 + 3 * 4


def restored_memory(keys: int, dim: int, value_bytes: int, slot_widths) -> dict[str, int]:
    """`memory_stats` of a table holding exactly `keys` rows (as a restore makes it).

    Args:
      keys: Live keys (= rows: no spare capacity).
      dim: Row width.
      value_bytes: Bytes of one stored element (4 float32, 2 bfloat16/float16).
      slot_widths: The float32 width of each optimizer slot (dim, or 1 for a row-wise one).
    """
    return {
        "live_keys": keys,
        "rows": keys * dim * value_bytes,
        "slots": keys * 4 * sum(slot_widths),
        "metadata": keys * _METADATA_ROW_BYTES,
        "index": buckets_for(keys) * _INDEX_BUCKET_BYTES,
    }


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


class StockBackend(TableBackend):
    """The stock-op implementation of `TableBackend` (see module docstring)."""

    name = "stock"
    sums_slices = False

    def map_class(self):
        """The key index's hash map class."""
        return tf.lookup.experimental.DenseHashTable

    def create_state(self, config: TableConfig, graph_mode: bool) -> ShardState:
        return ShardState.create(config, self.map_class(), graph_mode)

    # ---------------------------------------------------------------- lookups
    def lookup_ids(self, shard, ids, times, from_feature: bool, batch_time):
        uniq, idx, counts = tf.unique_with_counts(ids, out_idx=tf.int64)
        uniq = shard.checked_keys(uniq)
        utimes = key_times(times, idx, tf.size(uniq, out_type=tf.int64), batch_time)
        rows, emb = self.lookup_unique(
            shard, uniq, tf.cast(counts, tf.int64), utimes, True, from_feature, batch_time
        )
        return uniq, idx, rows, emb

    def lookup_unique(self, shard, keys, counts, times, training: bool, from_feature, batch_time):
        if not training:
            rows = shard.state.index.lookup(keys)
            return rows, self.gather(shard, rows)
        return shard.state.locked(
            lambda: self._train_unique(shard, keys, counts, times, from_feature, batch_time)
        )

    def _train_unique(self, shard, keys, counts, times, from_feature, batch_time):
        st = shard.state
        s = st.rows
        rows0 = st.index.lookup(keys)
        clamp_ops = []
        if from_feature:
            times, batch_time, clamp_ops = self._clamp_times(shard, times, batch_time)
        miss_pos = tf.where(rows0 < 0)[:, 0]
        miss_keys = tf.gather(keys, miss_pos)
        miss_counts = tf.gather(counts, miss_pos)
        plan = self.admission_plan(
            shard, miss_pos, miss_keys, miss_counts, tf.gather(times, miss_pos)
        )
        adm_pos, adm_keys, adm_prior = plan.pos, plan.keys, plan.prior
        num_new = tf.size(adm_keys, out_type=tf.int64)

        def admit():
            return self.admit_rows(shard, adm_keys, num_new)

        # Most steps of a warm table admit nothing: skip the allocation, initialiser
        # and insert ops then (a cond is lowered to cheap switch/merge nodes).
        new_rows = tf.cond(num_new > 0, admit, lambda: tf.zeros([0], tf.int64))
        pending_ops = self.pending_update(shard, plan, new_rows)
        rows = tf.tensor_scatter_nd_update(rows0, adm_pos[:, None], new_rows)
        if shard.admits_at_once:
            # Every key has a row now, and none had pending sightings.
            live_rows, add = rows, counts
            live_times = times if batch_time is None else batch_time
        else:
            u = tf.shape(keys, out_type=tf.int64)[0]
            extra = tf.scatter_nd(adm_pos[:, None], adm_prior, tf.reshape(u, [1]))
            live_pos = tf.where(rows >= 0)[:, 0]
            live_rows = tf.gather(rows, live_pos)
            add = tf.gather(counts + extra, live_pos)
            live_times = tf.gather(times, live_pos)
        newest = (
            tf.reduce_max(tf.concat([times, [0]], 0))
            if batch_time is None
            else tf.maximum(batch_time, 0)
        )
        seen = st.max_seen.assign(tf.maximum(st.max_seen.read_value(), newest), read_value=False)
        effects = [new_rows, seen, *pending_ops, *clamp_ops]
        if from_feature:
            effects.append(st.ts_feature.assign(True, read_value=False))
        with tf.control_dependencies([new_rows]):
            old_counts = tf.cast(tf.gather(s.counts, live_rows), tf.int64)
            old_seen = tf.gather(s.last_seen, live_rows)
        # Unique rows: the count grows by the sightings (saturating), last-seen takes the
        # max (stored relative: `encode_seen`). (Gather and assign: TF's CPU
        # scatter-add/max kernels are ~4x slower than assign.)
        effects.append(
            tf.group(
                s.counts.scatter_update(tf.IndexedSlices(saturated(old_counts + add), live_rows)),
                s.last_seen.scatter_update(
                    tf.IndexedSlices(tf.maximum(old_seen, encode_seen(live_times)), live_rows)
                ),
            )
        )
        # Whatever consumes the rows (the embeddings, the sparse optimizer step) runs
        # after admission and bookkeeping, even when its gradient does not depend on
        # the row values: in a v1 graph, fetching the embeddings runs every effect.
        with tf.control_dependencies(effects):
            rows = tf.identity(rows)
        return rows, self.gather(shard, rows, all_rows=shard.admits_at_once)

    def admission_plan(self, shard, miss_pos, miss_keys, miss_counts, miss_times):
        """Which of the keys without a row get one now (see `AdmissionPlan`)."""
        threshold = shard.config.access_threshold
        if threshold <= 1:  # 0 and 1 admit every key at its first sighting
            return AdmissionPlan(
                miss_pos, miss_keys, tf.zeros_like(miss_counts), miss_counts, miss_times, None
            )
        prior = shard.state.pending.lookup(miss_keys)
        total = prior[:, 0] + miss_counts
        admit = total >= threshold
        wait = tf.logical_not(admit)
        wait_state = tf.stack(
            [
                tf.boolean_mask(total, wait),
                tf.maximum(tf.boolean_mask(prior[:, 1], wait), tf.boolean_mask(miss_times, wait)),
            ],
            1,
        )
        adm_keys = tf.boolean_mask(miss_keys, admit)
        return AdmissionPlan(
            tf.boolean_mask(miss_pos, admit),
            adm_keys,
            tf.boolean_mask(prior[:, 0], admit),
            tf.boolean_mask(total, admit),
            tf.boolean_mask(miss_times, admit),
            (adm_keys, tf.boolean_mask(miss_keys, wait), wait_state),
        )

    def admit_rows(self, shard, keys: tf.Tensor, num_new: tf.Tensor) -> tf.Tensor:
        """int64 [k] rows for the admitted `keys`: allocated, initialised and indexed."""
        s = shard.state.rows
        new_rows, alloc = s.allocate(num_new)
        with tf.control_dependencies([new_rows]):
            init = s.init_rows(new_rows, keys, shard.initial_values(keys))
            insert = shard.state.index.insert(keys, new_rows)
        with tf.control_dependencies([alloc, init, insert]):
            return tf.identity(new_rows)

    def pending_update(self, shard, plan: AdmissionPlan, after: tf.Tensor) -> list:
        """[op updating the counters of not-yet-admitted keys], run after `after`."""
        if plan.pending is None:
            return []
        with tf.control_dependencies([after]):
            return [shard.state.pending.update(*plan.pending)]

    def _clamp_times(self, shard, times: tf.Tensor, batch_time: tf.Tensor | None):
        """Replaces timestamps far in the future by the table's clock, and counts them.

        A timestamp more than `MAX_SECONDS_AHEAD` past the wall clock cannot be
        seconds of a real event (milliseconds among seconds, INT64_MAX); taken
        as is, it would move the clock (`max_seen`) so far that the next
        `evict()` frees every row. It is replaced by the clock (the newest
        valid timestamp seen so far); `evict()` logs a warning with the count.

        Returns:
          (times int64 [u], batch_time or None, [op counting the clamped ones]).
        """
        st = shard.state
        limit = tf.cast(tf.timestamp(), tf.int64) + MAX_SECONDS_AHEAD
        clock = st.max_seen.read_value()
        late = times > limit
        newest = tf.reduce_max(tf.concat([tf.boolean_mask(times, late), [0]], 0))
        old = st.clamped.read_value()
        count = st.clamped.assign(
            tf.stack(
                [old[0] + tf.math.count_nonzero(late, dtype=tf.int64), tf.maximum(old[1], newest)]
            ),
            read_value=False,
        )
        times = tf.where(late, clock, times)
        if batch_time is not None:
            batch_time = tf.where(batch_time > limit, clock, batch_time)
        return times, batch_time, [count]

    def gather(self, shard, rows: tf.Tensor, all_rows: bool = False) -> tf.Tensor:
        """Rows' float32 embeddings; zeros where rows < 0 (skipped when `all_rows`: none is)."""
        s = shard.state.rows
        if all_rows:
            return s.read(rows)
        emb = s.read(tf.maximum(rows, 0))
        return emb * tf.cast(rows >= 0, tf.float32)[:, None]

    def find_rows(self, shard, keys) -> tf.Tensor:
        return shard.state.index.lookup(keys)

    def expand(self, embeddings, index) -> tf.Tensor:
        return tf.gather(embeddings, index)

    # -------------------------------------------------------------- gradients
    def apply(self, shard, rows, grads, step, all_rows: bool, current) -> tf.Operation:
        s = shard.state.rows
        if isinstance(grads, tf.IndexedSlices):
            grads = tf.math.unsorted_segment_sum(
                grads.values, grads.indices, tf.shape(rows, out_type=tf.int64)[0]
            )
        rows, grads, current = rows_with_values(rows, tf.cast(grads, tf.float32), current, all_rows)
        values = s.values
        if s.value_dtype != tf.float32:
            # Compact rows: the optimizer reads float32 and its writes round stochastically.
            values = RoundedRows(s, shard.seed, step)
            if current is None:
                current = s.read(rows)
        update = shard.optimizer.apply_sparse(values, s.slots, rows, grads, step, current=current)
        # In a v1 graph the step count would not run when the rate does not read it.
        with tf.control_dependencies([step]):
            return tf.group(update)

    # ------------------------------------------------------------ maintenance
    def evict(self, shard, now) -> tf.Tensor:
        if not shard.config.eviction:
            return tf.constant(0, tf.int64)
        return shard.state.locked(lambda: self._evict(shard, now))

    def _evict(self, shard, now) -> tf.Tensor:
        c, st = shard.config, shard.state
        s = st.rows
        now = tf.where(tf.equal(now, NO_NOW), shard.default_now(), now)
        rows = s.idle_rows(now, c.eviction_threshold)
        keys = tf.gather(s.row_keys, rows)
        ops = [
            st.index.remove(keys),
            s.release(rows),
            st.deleted.insert(keys, tf.ones_like(keys)),
            st.pending.drop_idle(now, c.eviction_threshold),
        ]
        with tf.control_dependencies(ops):
            compact = st.index.maybe_rebuild()
        with tf.control_dependencies([compact]):
            return tf.size(rows, out_type=tf.int64)

    def size(self, shard) -> tf.Tensor:
        return shard.state.rows.live_count()

    def export(self, shard, min_period) -> dict[str, tf.Tensor]:
        return shard.state.build_export(min_period)

    def load(self, shard, state: dict[str, tf.Tensor]) -> tf.Operation:
        return shard.state.build_load(state)

    def end_period(self, shard) -> tf.Operation:
        return shard.state.build_end_period()

    def memory_stats(self, shard) -> dict[str, tf.Tensor]:
        st = shard.state
        s = st.rows

        def nbytes(v):
            shape = tf.raw_ops.VariableShape(input=v.handle, out_type=tf.int64)
            return tf.reduce_prod(shape) * v.dtype.size

        live = s.live_count()
        # The smallest power of two holding the live keys below the map's load limit.
        need = tf.math.ceil(
            tf.math.log(tf.maximum(tf.cast(st.index.size(), tf.float64), 1.0) / MAX_LOAD)
            / tf.math.log(tf.constant(2.0, tf.float64))
            - 1e-9
        )
        buckets = tf.maximum(
            tf.constant(st.index.initial_buckets, tf.int64),
            tf.cast(tf.pow(tf.constant(2.0, tf.float64), need), tf.int64),
        )
        meta = s.metadata_variables()
        zero = tf.constant(0, tf.int64)
        return {
            "live_keys": live,
            "rows": nbytes(s.values),
            "slots": tf.add_n([zero, *[nbytes(v) for v in s.slots.values()]]),
            "metadata": tf.add_n([nbytes(v) for v in meta]),
            "index": buckets * st.index.bucket_bytes,
        }
