"""`SingleShardTable`: a dynamic embedding table keyed by raw int64/int32 ids.

Keys map to rows through `KeyIndex` (an open-addressing map on mixed keys:
TF's `DenseHashTable`, or the kernels' own `NpuRecKeyMap`; see docs/design.md);
rows, optimizer slots and per-row metadata live in `RowStorage` variables;
not-yet-admitted keys are counted in `PendingCounts`.

Execution modes. A table created in eager mode works eagerly and inside
`tf.function` (lookups and `apply_gradients` build ops; `evict` returns a
tensor there). A table created inside a `tf.compat.v1` graph builds its
export / restore / evict / size ops at creation (so they exist before a
`MonitoredTrainingSession` finalises the graph); its `export`, `save`,
`restore` and `evict` run them in `session=` (or the default session).
Maintenance calls (evict, save, restore, export) must not run concurrently
with a training step of the same table.
"""

from __future__ import annotations

import tensorflow as tf

from npu_rec._kernels import _ops as _kernel_ops
from npu_rec.table import _keyed_init, _lock, _row_init
from npu_rec.table._admission import PendingCounts
from npu_rec.table._base import MAX_SECONDS_AHEAD, NO_NOW, SparseTable, rows_with_values
from npu_rec.table._config import TableConfig
from npu_rec.table._fused import AdmissionPlan, FusedLookupMixin
from npu_rec.table._key_index import KeyIndex
from npu_rec.table._state import TableStateMixin
from npu_rec.table._storage import RowStorage


class SingleShardTable(FusedLookupMixin, TableStateMixin, SparseTable):
    """A `SparseTable` with one hash map and one row storage.

    `create_table` returns it when `num_shards == 1`; a `ShardedTable` holds
    `num_shards` of them (unregistered, named `<name>_shard<i>`, seeded by
    the sharded table's name so a key's first row does not depend on its shard).

    Example:
      >>> table = npu_rec.create_table("user", 8, optimizer=npu_rec.optimizers.SGD(0.1))
      >>> type(table).__name__
      'SingleShardTable'
    """

    def __init__(
        self, config: TableConfig, *, register: bool = True, seed_name=None, fan_rows=None
    ):
        super().__init__(config, register=register)
        #: Rows of the variable fan-based initializers are sized for (`_row_init`).
        self._fan_rows = fan_rows or config.capacity
        self._seed = _keyed_init.name_seed(seed_name or config.name)
        slot_specs = self.optimizer.slot_specs if self.optimizer is not None else ()
        with tf.init_scope():
            with tf.name_scope(f"npu_rec_table_{config.name}"):
                self._storage = RowStorage(
                    config.name, config.dim, slot_specs, config.capacity, config.dynamic_expansion
                )
                self._index = KeyIndex(config.capacity, name="index")
                self._pending = PendingCounts(config.max_pending_keys)
                self._deleted = tf.lookup.experimental.MutableHashTable(
                    tf.int64, tf.int64, default_value=0, name="deleted"
                )
                self._max_seen = tf.Variable(
                    tf.constant(0, tf.int64), trainable=False, name="max_seen"
                )
                self._ts_feature = tf.Variable(False, trainable=False, name="ts_feature")
                self._opt_step = tf.Variable(
                    tf.constant(0, tf.int64), trainable=False, name="opt_step"
                )
                self._lock = _lock.make_lock(self._graph_mode, "lock")
                # Timestamps clamped so far (see `_clamp_times`), and the newest of them.
                self._clamped = tf.Variable(
                    tf.zeros([2], tf.int64), trainable=False, name="clamped_timestamps"
                )
                if self._graph_mode:
                    self._graph_ops = self._build_graph_ops()

    def _add_slots(self, slot_specs) -> None:
        """Allocates the slots of an optimizer bound after creation (`bind_optimizer`)."""
        with tf.init_scope():
            with tf.name_scope(f"npu_rec_table_{self.config.name}/"):
                self._storage.add_slots(slot_specs)
                if self._graph_mode:  # state, restore and evict ops see every slot
                    self._graph_ops = self._build_graph_ops()

    @property
    def num_shards(self) -> int:
        return 1

    @property
    def shards(self) -> list[SparseTable]:
        return [self]

    @property
    def slot_names(self) -> list[str]:
        return list(self._storage.slots)

    @property
    def storage(self) -> RowStorage:
        """The rows, slots and per-row metadata (`RowStorage`)."""
        return self._storage

    @property
    def key_index(self) -> KeyIndex:
        """The key -> row map (`KeyIndex`)."""
        return self._index

    def variables(self) -> list[tf.Variable]:
        s = self._storage
        return [
            *s.per_row_variables(),
            s.next_row,
            s.num_free,
            self._max_seen,
            self._ts_feature,
            self._opt_step,
            self._index.removed,
            self._index.reserved_rows,
            self._clamped,
        ]

    # ----------------------------------------------------------------- lookups
    def _initial_values(self, keys: tf.Tensor) -> tf.Tensor:
        init = self.config.initializer
        if init is None:
            return _keyed_init.keyed_uniform(keys, self.dim, self._seed)
        try:
            return _row_init.initial_rows(init, tf.size(keys), self.dim, self._fan_rows)
        except TypeError as err:
            raise TypeError(f"Sparse table {self.name!r}: {err}") from err

    @tf.autograph.experimental.do_not_convert
    @_lock.serialised(training_arg=3)
    def lookup_unique(
        self,
        keys: tf.Tensor,
        counts: tf.Tensor | None,
        times: tf.Tensor | None,
        training: bool,
        from_feature: bool = False,
        batch_time: tf.Tensor | None = None,
    ):
        """Rows and embeddings of unique keys; admits and counts when training.

        Args:
          keys: int64 [u], unique.
          counts: int64 [u], occurrences in the batch (training only).
          times: int64 [u], newest timestamp per key (training only).
          training: Count, admit and record last-seen times.
          from_feature: `times` come from a timestamp feature (not the wall clock).
          batch_time: int64 scalar when every key has this same time (`times` is
            filled with it), or None.

        Returns:
          (rows int64 [u], -1 where the key has no row; embeddings float32 [u, dim],
          zeros where the key has no row).
        """
        if training and _kernel_ops.enabled():
            return self.fused_lookup(keys, counts, times, from_feature, batch_time)[2:]
        rows0 = self._index.lookup(keys)
        if not training:
            return rows0, self._gather(rows0, [])
        s = self._storage
        clamp_ops = []
        if from_feature:
            times, batch_time, clamp_ops = self._clamp_times(times, batch_time)
        miss_pos = tf.where(rows0 < 0)[:, 0]
        miss_keys = tf.gather(keys, miss_pos)
        miss_counts = tf.gather(counts, miss_pos)
        plan = self._admission_plan(miss_pos, miss_keys, miss_counts, tf.gather(times, miss_pos))
        adm_pos, adm_keys, adm_prior = plan.pos, plan.keys, plan.prior
        num_new = tf.size(adm_keys, out_type=tf.int64)

        def admit():
            return self._admit_rows(adm_keys, num_new)

        # Most steps of a warm table admit nothing: skip the allocation, initialiser
        # and insert ops then (a cond is lowered to cheap switch/merge nodes).
        new_rows = tf.cond(num_new > 0, admit, lambda: tf.zeros([0], tf.int64))
        pending_ops = self._pending_update(plan, new_rows)
        rows = tf.tensor_scatter_nd_update(rows0, adm_pos[:, None], new_rows)
        if self.admits_at_once:
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
        seen = self._max_seen.assign(
            tf.maximum(self._max_seen.read_value(), newest), read_value=False
        )
        effects = [new_rows, seen, *pending_ops, *clamp_ops]
        if from_feature:
            effects.append(self._ts_feature.assign(True, read_value=False))
        with tf.control_dependencies([new_rows]):
            old_counts = tf.gather(s.counts, live_rows)
            old_seen = tf.gather(s.last_seen, live_rows)
        # Unique rows: the count grows by the sightings, last-seen takes the max. (Gather
        # and assign: TF's CPU scatter-add/max kernels are ~4x slower than assign.)
        effects.append(
            tf.group(
                s.counts.scatter_update(tf.IndexedSlices(old_counts + add, live_rows)),
                s.last_seen.scatter_update(
                    tf.IndexedSlices(tf.maximum(old_seen, live_times), live_rows)
                ),
            )
        )
        # Whatever consumes the rows (the embeddings, the sparse optimizer step) runs
        # after admission and bookkeeping, even when its gradient does not depend on
        # the row values: in a v1 graph, fetching the embeddings runs every effect.
        with tf.control_dependencies(effects):
            rows = tf.identity(rows)
        return rows, self._gather(rows, [], all_rows=self.admits_at_once)

    def _admission_plan(self, miss_pos, miss_keys, miss_counts, miss_times) -> AdmissionPlan:
        """Which of the keys without a row get one now (see `AdmissionPlan`)."""
        threshold = self.config.access_threshold
        if threshold <= 1:  # 0 and 1 admit every key at its first sighting
            return AdmissionPlan(
                miss_pos, miss_keys, tf.zeros_like(miss_counts), miss_counts, miss_times, None
            )
        prior = self._pending.lookup(miss_keys)
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

    def _admit_rows(self, keys: tf.Tensor, num_new: tf.Tensor) -> tf.Tensor:
        """int64 [k] rows for the admitted `keys`: allocated, initialised and indexed."""
        s = self._storage
        new_rows, alloc = s.allocate(num_new)
        with tf.control_dependencies([new_rows]):
            init = s.init_rows(new_rows, keys, self._initial_values(keys))
            insert = self._index.insert(keys, new_rows)
        with tf.control_dependencies([alloc, init, insert]):
            return tf.identity(new_rows)

    def _pending_update(self, plan: AdmissionPlan, after: tf.Tensor) -> list:
        """[op updating the counters of not-yet-admitted keys], run after `after`."""
        if plan.pending is None:
            return []
        with tf.control_dependencies([after]):
            return [self._pending.update(*plan.pending)]

    def _clamp_times(self, times: tf.Tensor, batch_time: tf.Tensor | None):
        """Replaces timestamps far in the future by the table's clock, and counts them.

        A timestamp more than `MAX_SECONDS_AHEAD` past the wall clock cannot be
        seconds of a real event (milliseconds among seconds, INT64_MAX); taken
        as is, it would move the clock (`max_seen`) so far that the next
        `evict()` frees every row. It is replaced by the clock (the newest
        valid timestamp seen so far); `evict()` logs a warning with the count.

        Returns:
          (times int64 [u], batch_time or None, [op counting the clamped ones]).
        """
        limit = tf.cast(tf.timestamp(), tf.int64) + MAX_SECONDS_AHEAD
        clock = self._max_seen.read_value()
        late = times > limit
        newest = tf.reduce_max(tf.concat([tf.boolean_mask(times, late), [0]], 0))
        old = self._clamped.read_value()
        count = self._clamped.assign(
            tf.stack(
                [old[0] + tf.math.count_nonzero(late, dtype=tf.int64), tf.maximum(old[1], newest)]
            ),
            read_value=False,
        )
        times = tf.where(late, clock, times)
        if batch_time is not None:
            batch_time = tf.where(batch_time > limit, clock, batch_time)
        return times, batch_time, [count]

    def clamped_report(self) -> tf.Tensor:
        return self._clamped.read_value()

    def clock(self) -> tuple[tf.Tensor, tf.Tensor]:
        return self._max_seen.read_value(), self._ts_feature.read_value()

    def _gather(self, rows: tf.Tensor, deps, all_rows: bool = False) -> tf.Tensor:
        """Rows' embeddings; zeros where rows < 0 (skipped when `all_rows`: none is)."""
        with tf.control_dependencies(deps):
            if all_rows:
                return tf.gather(self._storage.values, rows)
            emb = tf.gather(self._storage.values, tf.maximum(rows, 0))
        return emb * tf.cast(rows >= 0, tf.float32)[:, None]

    # --------------------------------------------------------------- gradients
    @tf.autograph.experimental.do_not_convert
    def apply_rows(self, rows, grads, all_rows=False, current=None) -> tf.Operation:
        if not self._storage.late_slots:
            return self._apply_rows(rows, grads, all_rows, current)
        # Slots of an optimizer bound after the lookups were built: grown first
        # (after the lookup that handed out `rows` grew the rows).
        with tf.control_dependencies([rows]):
            match = self._storage.match_late_slots()
        with tf.control_dependencies([match]):
            return self._apply_rows(rows, grads, all_rows, current)

    def _apply_rows(
        self,
        rows: tf.Tensor,
        grads: tf.Tensor,
        all_rows: bool = False,
        current: tf.Tensor | None = None,
    ) -> tf.Operation:
        """Applies summed gradients of unique rows (rows < 0 are skipped).

        Args:
          rows: int64 [u], unique (or -1).
          grads: float32 [u, dim], or a `tf.IndexedSlices` of per-id gradients whose
            indices point into `rows` (summed here).
          all_rows: The caller knows no row is -1 (training lookups of a table
            that admits at once): skip the filter.
          current: float32 [u, dim], the rows' values as read by this step's
            lookup (nothing wrote them since), or None to read them again.
        """
        self._require_optimizer()
        step = self._opt_step.assign_add(1)
        s = self._storage
        if _kernel_ops.enabled() and _kernel_ops.supports(self.optimizer):
            # Sums per-id gradients (IndexedSlices) and updates in one kernel; skips rows < 0.
            return _kernel_ops.sparse_apply(self.optimizer, s, rows, grads, step)
        if isinstance(grads, tf.IndexedSlices):
            grads = tf.math.unsorted_segment_sum(
                grads.values, grads.indices, tf.shape(rows, out_type=tf.int64)[0]
            )
        rows, grads, current = rows_with_values(rows, tf.cast(grads, tf.float32), current, all_rows)
        update = self.optimizer.apply_sparse(s.values, s.slots, rows, grads, step, current=current)
        # In a v1 graph the step count would not run when the rate does not read it.
        with tf.control_dependencies([step]):
            return tf.group(update)

    def find_rows(self, keys: tf.Tensor) -> tf.Tensor:
        """int64 [u] rows of unique `keys` (-1 = no row); reads the hash map only."""
        return self._index.lookup(keys)

    # ------------------------------------------------------------- maintenance
    def build_size(self) -> tf.Tensor:
        return self._storage.live_count()

    @_lock.serialised()
    def build_evict(self, now: tf.Tensor) -> tf.Tensor:
        c, s = self.config, self._storage
        if not c.eviction:
            return tf.constant(0, tf.int64)
        now = tf.where(tf.equal(now, NO_NOW), self._default_now(), now)
        rows = s.idle_rows(now, c.eviction_threshold)
        keys = tf.gather(s.row_keys, rows)
        ops = [
            self._index.remove(keys),
            s.release(rows),
            self._deleted.insert(keys, tf.ones_like(keys)),
            self._pending.drop_idle(now, c.eviction_threshold),
        ]
        with tf.control_dependencies(ops):
            compact = self._index.maybe_rebuild()
        with tf.control_dependencies([compact]):
            return tf.size(rows, out_type=tf.int64)
