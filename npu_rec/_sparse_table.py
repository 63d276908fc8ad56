"""`SparseTable`: a dynamic embedding table keyed by raw int64/int32 ids.

Keys map to rows through `KeyIndex` (TF's `DenseHashTable` kernel on mixed
keys; see docs/design.md);
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

from npu_rec import _keyed_init, _table_lock, _table_registry
from npu_rec import _log as logging
from npu_rec._admission import PendingCounts
from npu_rec._kernels import _ops as _kernel_ops
from npu_rec._key_index import KeyIndex
from npu_rec._key_pipeline import flat_keys as _flat_keys
from npu_rec._table_config import (
    DEFAULT_DYNAMIC_CAPACITY,
    DEFAULT_FIXED_CAPACITY,
    DEFAULT_MAX_PENDING_KEYS,
    TableConfig,
    global_use_dynamic_expansion,
)
from npu_rec._table_state import _NO_NOW, TableStateMixin
from npu_rec._table_storage import RowStorage

#: A training timestamp more than this many seconds ahead of the wall clock (a
#: millisecond or garbage value among seconds) is replaced by the table's clock.
MAX_SECONDS_AHEAD = 86400


class SparseTable(TableStateMixin):
    """A huge sparse embedding table on raw ids; create it with `create_table`.

    Attributes:
      name: The table name (unique per program, or per graph in graph mode).
      dim: Row width.
      config: The validated `TableConfig`.

    Example:
      >>> table = npu_rec.create_table("user", 8, optimizer=npu_rec.optimizers.SGD(0.1))
      >>> emb = npu_rec.sparse_lookup(table, tf.constant([3, 7, 3], tf.int64))  # [3, 8]
    """

    def __init__(self, config: TableConfig, *, _register: bool = True, _seed_name=None):
        self.config = config
        self.name = config.name
        self.dim = config.dim
        self.key_dtype = tf.as_dtype(config.key_dtype)
        self.optimizer = config.optimizer
        self._seed = _keyed_init.name_seed(_seed_name or config.name)
        slot_specs = self.optimizer.slot_specs if self.optimizer is not None else ()
        if _register:
            _table_registry.register(self)
        with tf.init_scope():
            self._graph_mode = not tf.executing_eagerly()
            with tf.name_scope(f"npu_rec_table_{config.name}"):
                self._storage = RowStorage(config.name, config.dim, slot_specs,
                                           config.capacity, config.dynamic_expansion)
                self._index = KeyIndex(config.capacity, name="index")
                self._pending = PendingCounts(config.max_pending_keys)
                self._deleted = tf.lookup.experimental.MutableHashTable(
                    tf.int64, tf.int64, default_value=0, name="deleted")
                self._max_seen = tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                             name="max_seen")
                self._ts_feature = tf.Variable(False, trainable=False, name="ts_feature")
                self._opt_step = tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                             name="opt_step")
                # Timestamps clamped so far (see `_clamp_times`), and the newest of them.
                self._clamped = tf.Variable(tf.zeros([2], tf.int64), trainable=False,
                                            name="clamped_timestamps")
                self._clamped_reported = 0
                self._lock = _table_lock.make_lock(self._graph_mode, "lock")
                if self._graph_mode:
                    self._graph_ops = self._build_graph_ops()

    @property
    def num_shards(self) -> int:
        """Number of key-hash shards (1 for an unsharded table)."""
        return 1

    @property
    def shards(self) -> list[SparseTable]:
        """The single-shard tables holding the state: `[self]` when unsharded."""
        return [self]

    @property
    def slot_names(self) -> list[str]:
        """Names of the optimizer slots kept per row (e.g. ["accumulator"])."""
        return list(self._storage.slots)

    def variables(self) -> list[tf.Variable]:
        """The (non-trainable) variables holding this table's state."""
        s = self._storage
        return [*s.per_row_variables(), s.next_row, s.num_free, self._max_seen,
                self._ts_feature, self._opt_step, self._index.removed,
                self._index.reserved_rows, self._clamped]

    def __repr__(self) -> str:
        c = self.config
        return (f"SparseTable(name={c.name!r}, dim={c.dim}, optimizer={c.optimizer!r}, "
                f"access_threshold={c.access_threshold}, "
                f"eviction_threshold={c.eviction_threshold}, "
                f"dynamic_expansion={c.dynamic_expansion})")

    # ----------------------------------------------------------------- lookups
    def _initial_values(self, keys: tf.Tensor) -> tf.Tensor:
        init = self.config.initializer
        if init is None:
            return _keyed_init.keyed_uniform(keys, self.dim, self._seed)
        n = tf.size(keys)
        try:
            return tf.cast(init(tf.stack([n, self.dim]), tf.float32), tf.float32)
        except (TypeError, ValueError, tf.errors.OperatorNotAllowedInGraphError) as err:
            raise TypeError(
                f"The initializer of sparse table {self.name!r} cannot make rows for a "
                "dynamic number of new keys (shape [None, dim]); fan-based initializers "
                "such as glorot/he/lecun need a static shape. Use a fixed-distribution "
                "initializer (RandomUniform, RandomNormal, TruncatedNormal, Constant), a "
                "callable (shape, dtype) -> tensor, or None (keyed uniform). "
                f"Received: initializer={init!r}") from err

    @tf.autograph.experimental.do_not_convert
    @_table_lock.serialised(training_arg=3)
    def _lookup_unique(self, keys: tf.Tensor, counts: tf.Tensor | None,
                       times: tf.Tensor | None, training: bool, from_feature: bool = False,
                       batch_time: tf.Tensor | None = None):
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
        rows0 = self._index.lookup(keys)
        if not training:
            return rows0, self._gather(rows0, [])
        s, c = self._storage, self.config
        clamp_ops = []
        if from_feature:
            times, batch_time, clamp_ops = self._clamp_times(times, batch_time)
        miss_pos = tf.where(rows0 < 0)[:, 0]
        miss_keys = tf.gather(keys, miss_pos)
        miss_counts = tf.gather(counts, miss_pos)
        pending_ops = []
        if c.access_threshold > 1:     # 0 and 1 admit every key at its first sighting
            prior = self._pending.lookup(miss_keys)
            total = prior[:, 0] + miss_counts
            admit = total >= c.access_threshold
            wait = tf.logical_not(admit)
            wait_state = tf.stack([tf.boolean_mask(total, wait), tf.maximum(
                tf.boolean_mask(prior[:, 1], wait),
                tf.boolean_mask(tf.gather(times, miss_pos), wait))], 1)
            adm_pos = tf.boolean_mask(miss_pos, admit)
            adm_keys = tf.boolean_mask(miss_keys, admit)
            adm_prior = tf.boolean_mask(prior[:, 0], admit)
            pending_args = (adm_keys, tf.boolean_mask(miss_keys, wait), wait_state)
        else:
            adm_pos, adm_keys = miss_pos, miss_keys
            adm_prior = tf.zeros_like(miss_counts)
            pending_args = None
        num_new = tf.size(adm_keys, out_type=tf.int64)

        def admit():
            # Rows for the admitted keys: allocated, initialised and in the index
            # once the returned rows are computed.
            new_rows, alloc = s.allocate(num_new)
            with tf.control_dependencies([new_rows]):
                init = s.init_rows(new_rows, adm_keys, self._initial_values(adm_keys))
                insert = self._index.insert(adm_keys, new_rows)
            with tf.control_dependencies([alloc, init, insert]):
                return tf.identity(new_rows)

        # Most steps of a warm table admit nothing: skip the allocation, initialiser
        # and insert ops then (a cond is lowered to cheap switch/merge nodes).
        new_rows = tf.cond(num_new > 0, admit, lambda: tf.zeros([0], tf.int64))
        with tf.control_dependencies([new_rows]):
            if pending_args is not None:
                pending_ops.append(self._pending.update(*pending_args))
        rows = tf.tensor_scatter_nd_update(rows0, adm_pos[:, None], new_rows)
        if self.admits_at_once:
            # Every key has a row now, and none had pending sightings.
            live_rows, add = rows, counts
            live_times = times if batch_time is None else batch_time
        else:
            u = tf.shape(keys, out_type=tf.int64)[0]
            extra = tf.scatter_nd(adm_pos[:, None], adm_prior, tf.reshape(u, [1]))
            if _kernel_ops.enabled():   # the kernel skips rows < 0 itself
                live_rows, add, live_times = rows, counts + extra, times
            else:
                live_pos = tf.where(rows >= 0)[:, 0]
                live_rows = tf.gather(rows, live_pos)
                add = tf.gather(counts + extra, live_pos)
                live_times = tf.gather(times, live_pos)
        newest = (tf.reduce_max(tf.concat([times, [0]], 0)) if batch_time is None
                  else tf.maximum(batch_time, 0))
        seen = self._max_seen.assign(tf.maximum(self._max_seen.read_value(), newest),
                                     read_value=False)
        effects = [new_rows, seen, *pending_ops, *clamp_ops]
        if from_feature:
            effects.append(self._ts_feature.assign(True, read_value=False))
        if _kernel_ops.enabled():
            # One kernel: gather the rows, add the sightings, raise last-seen. (The
            # effects hang on an identity: the kernel's own inputs made inside a
            # control_dependencies block would not carry them.)
            with tf.control_dependencies(effects):
                live_rows = tf.identity(live_rows)
            emb = _kernel_ops.gather_touch(s, live_rows, add, live_times)
            with tf.control_dependencies([emb]):
                return tf.identity(rows), emb
        with tf.control_dependencies([new_rows]):
            old_counts = tf.gather(s.counts, live_rows)
            old_seen = tf.gather(s.last_seen, live_rows)
        # Unique rows: the count grows by the sightings, last-seen takes the max. (Gather
        # and assign: TF's CPU scatter-add/max kernels are ~4x slower than assign.)
        effects.append(tf.group(
            s.counts.scatter_update(tf.IndexedSlices(old_counts + add, live_rows)),
            s.last_seen.scatter_update(tf.IndexedSlices(tf.maximum(old_seen, live_times),
                                                        live_rows))))
        # Whatever consumes the rows (the embeddings, the sparse optimizer step) runs
        # after admission and bookkeeping, even when its gradient does not depend on
        # the row values: in a v1 graph, fetching the embeddings runs every effect.
        with tf.control_dependencies(effects):
            rows = tf.identity(rows)
        return rows, self._gather(rows, [], all_rows=self.admits_at_once)

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
            tf.stack([old[0] + tf.math.count_nonzero(late, dtype=tf.int64),
                      tf.maximum(old[1], newest)]), read_value=False)
        times = tf.where(late, clock, times)
        if batch_time is not None:
            batch_time = tf.where(batch_time > limit, clock, batch_time)
        return times, batch_time, [count]

    def _clamped_report(self) -> tf.Tensor:
        """int64 [2]: timestamps clamped so far and the largest of them."""
        return self._clamped.read_value()

    def _warn_clamped(self, session=None) -> None:
        """Logs a warning when more timestamps were clamped since the last one."""
        if self._graph_mode:
            count, newest = self._session(session).run(self._graph_ops["clamped"])
        else:
            count, newest = self._clamped_report().numpy()
        if count > self._clamped_reported:
            logging.warning(
                "npu_rec: sparse table %r replaced %d training timestamps (%d so far) lying "
                "more than %d s ahead of the wall clock, e.g. %d, by its clock: timestamps "
                "must be int seconds (not milliseconds).", self.name,
                count - self._clamped_reported, count, MAX_SECONDS_AHEAD, newest)
            self._clamped_reported = int(count)

    def _checked_keys(self, keys: tf.Tensor) -> tf.Tensor:
        """int64 [u] `keys`, once asserted to fit the table's key dtype (int32 tables).

        An int64 id beyond the int32 range would otherwise be stored, and
        exported, wrapped into another key.
        """
        if self.key_dtype != tf.int32:
            return keys
        low, high = tf.int32.min, tf.int32.max
        bad = tf.boolean_mask(keys, (keys < low) | (keys > high))
        rule = (f"Sparse table {self.name!r} has key_dtype=int32, so ids must lie in "
                f"[{low}, {high}]; create it with key_dtype=tf.int64 for wider ids.")
        if tf.executing_eagerly():
            if tf.size(bad) > 0:
                raise tf.errors.InvalidArgumentError(
                    None, None, f"{rule} Received out-of-range ids (first 3): "
                    f"{bad.numpy()[:3].tolist()}")
            return keys
        check = tf.debugging.Assert(tf.equal(tf.size(bad), 0), [
            f"{rule} Received out-of-range ids (first 3):", bad[:3]], summarize=3)
        with tf.control_dependencies([check]):
            return tf.identity(keys)

    @property
    def admits_at_once(self) -> bool:
        """True when a training lookup gives every key a row (access_threshold <= 1)."""
        return self.config.access_threshold <= 1

    def _gather(self, rows: tf.Tensor, deps, all_rows: bool = False) -> tf.Tensor:
        """Rows' embeddings; zeros where rows < 0 (skipped when `all_rows`: none is)."""
        with tf.control_dependencies(deps):
            if all_rows:
                return tf.gather(self._storage.values, rows)
            emb = tf.gather(self._storage.values, tf.maximum(rows, 0))
        return emb * tf.cast(rows >= 0, tf.float32)[:, None]

    # --------------------------------------------------------------- gradients
    @tf.autograph.experimental.do_not_convert
    def _apply_rows(self, rows: tf.Tensor, grads: tf.Tensor, all_rows: bool = False,
                    current: tf.Tensor | None = None) -> tf.Operation:
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
        if self.optimizer is None:
            raise ValueError(
                f"Sparse table {self.name!r} has no optimizer, so it cannot apply gradients. "
                "Pass `optimizer=npu_rec.optimizers.<SGD|Adagrad|Adam|Ftrl>(...)` to "
                "npu_rec.create_table. Received: optimizer=None")
        step = self._opt_step.assign_add(1)
        s = self._storage
        if _kernel_ops.enabled() and _kernel_ops.supports(self.optimizer):
            # Sums per-id gradients (IndexedSlices) and updates in one kernel; skips rows < 0.
            return _kernel_ops.sparse_apply(self.optimizer, s, rows, grads, step)
        if isinstance(grads, tf.IndexedSlices):
            grads = tf.math.unsorted_segment_sum(grads.values, grads.indices,
                                                 tf.shape(rows, out_type=tf.int64)[0])
        rows, grads, current = _rows_with_values(rows, tf.cast(grads, tf.float32), current,
                                                 all_rows)
        update = self.optimizer.apply_sparse(s.values, s.slots, rows, grads, step,
                                             current=current)
        # In a v1 graph the step count would not run when the rate does not read it.
        with tf.control_dependencies([step]):
            return tf.group(update)

    @tf.autograph.experimental.do_not_convert
    def apply_gradients(self, ids, grads) -> tf.Operation | None:
        """Applies the table's sparse optimizer to the rows of `ids`.

        Gradients of repeated ids are summed first; ids without a row (not
        admitted, or evicted) are ignored. The hash map is only read.

        Args:
          ids: int [...] tensor or `tf.RaggedTensor` of the ids looked up.
          grads: float32 [..., dim], d loss / d `sparse_lookup(table, ids)` (no
            combiner); a `tf.IndexedSlices` or ragged tensor is accepted.

        Returns:
          The update op (None in eager mode, where it has run).

        Raises:
          ValueError: the table has no optimizer, or the shapes disagree.
        """
        flat_ids = _flat_keys(ids)
        if isinstance(grads, tf.IndexedSlices):
            grads = tf.convert_to_tensor(grads)
        if isinstance(grads, tf.RaggedTensor):
            grads = grads.flat_values
        grads = tf.reshape(tf.cast(grads, tf.float32), [-1, self.dim])
        uniq, idx = tf.unique(flat_ids, out_idx=tf.int64)
        uniq = self._checked_keys(uniq)
        summed = tf.IndexedSlices(grads, idx)
        if not _kernel_ops.enabled() or self.num_shards > 1:
            summed = tf.math.unsorted_segment_sum(grads, idx, tf.size(uniq, out_type=tf.int64))
        op = self._apply_rows(self._find_rows(uniq), summed)
        return None if tf.executing_eagerly() else op

    def _find_rows(self, keys: tf.Tensor) -> tf.Tensor:
        """int64 [u] rows of unique `keys` (-1 = no row); reads the hash map only."""
        return self._index.lookup(keys)

    # ------------------------------------------------------------- maintenance
    @tf.autograph.experimental.do_not_convert
    def size(self) -> int | tf.Tensor:
        """Number of keys holding a row: an int in eager mode, else an int64 scalar tensor.

        Inside a `tf.compat.v1` graph or a `tf.function` it is a tensor (run or
        return it); in eager mode it is a plain Python int, read now.
        """
        if self._graph_mode:
            return self._graph_ops["size"]
        count = self._storage.live_count()
        return int(count) if tf.executing_eagerly() else count

    def _default_now(self) -> tf.Tensor:
        wall = tf.cast(tf.timestamp(), tf.int64)
        return tf.where(self._ts_feature.read_value(), self._max_seen.read_value(), wall)

    @_table_lock.serialised()
    def _build_evict(self, now: tf.Tensor) -> tf.Tensor:
        c, s = self.config, self._storage
        if not c.eviction:
            return tf.constant(0, tf.int64)
        now = tf.where(tf.equal(now, _NO_NOW), self._default_now(), now)
        rows = s.idle_rows(now, c.eviction_threshold)
        keys = tf.gather(s.row_keys, rows)
        ops = [self._index.remove(keys), s.release(rows),
               self._deleted.insert(keys, tf.ones_like(keys)),
               self._pending.drop_idle(now, c.eviction_threshold)]
        with tf.control_dependencies(ops):
            compact = self._index.maybe_rebuild()
        with tf.control_dependencies([compact]):
            return tf.size(rows, out_type=tf.int64)

    @tf.autograph.experimental.do_not_convert
    def evict(self, now: int | tf.Tensor | None = None, session=None):
        """Frees the rows (with slots and counts) of keys idle longer than the threshold.

        A key is idle when `now - last_seen > eviction_threshold`. Counters of
        not-yet-admitted keys idle that long are dropped too. Does nothing
        (returns 0) when eviction is off.

        Args:
          now: int seconds; None = the newest timestamp seen by lookups with a
            `timestamps=` feature, or the wall clock if the table never had one.
          session: graph mode only: the session to run in (default: the default
            session; if there is none, the int64 evict tensor is returned).

        Returns:
          The number of rows freed: an int (eager, or graph mode with a session)
          or an int64 scalar tensor (inside `tf.function`, or graph mode without
          a session).
        """
        now_value = _NO_NOW if now is None else now
        if self._graph_mode:
            ph, out = self._graph_ops["evict"]
            sess = session or tf.compat.v1.get_default_session()
            if sess is None:
                if now is None:
                    return out
                return self._build_evict(tf.cast(now_value, tf.int64))
            freed = int(sess.run(out, {ph: int(now_value)}))
            self._warn_clamped(sess)
            return freed
        if not tf.executing_eagerly():
            return self._build_evict(tf.cast(now_value, tf.int64))
        if getattr(self, "_eager_evict", None) is None:
            # Compiled once: a whole-table scan runs multi-threaded, and the
            # metadata read is released before the scatters (no copy-on-write).
            self._eager_evict = tf.function(
                self._build_evict, input_signature=[tf.TensorSpec([], tf.int64)])
            # One trace per table by design: without this, TF warns of "excessive
            # retracing" of `_build_evict` once a model's tables are evicted.
            self._eager_evict._omit_frequent_tracing_warning = True
        freed = int(self._eager_evict(tf.constant(now_value, tf.int64)))
        self._warn_clamped()
        return freed

def _rows_with_values(rows, grads, current, all_rows: bool):
    """(rows, grads, current) without the entries of rows < 0 (unchanged if `all_rows`)."""
    if all_rows:
        return rows, grads, current
    valid = tf.where(rows >= 0)[:, 0]
    return (tf.gather(rows, valid), tf.gather(grads, valid),
            None if current is None else tf.gather(current, valid))


def create_table(name: str, dim: int, *, key_dtype=tf.int64, initializer=None, optimizer=None,
                 capacity: int | None = None, access_threshold: int = -1,
                 eviction_threshold: int = -1, dynamic_expansion: bool | None = None,
                 max_pending_keys: int = DEFAULT_MAX_PENDING_KEYS,
                 num_shards: int = 1) -> SparseTable:
    """Creates a sparse embedding table keyed by raw ids.

    Args:
      name: Unique table name.
      dim: Embedding width (>= 1).
      key_dtype: `tf.int64` or `tf.int32`; raw ids, no vocabulary needed (an
        int32 table refuses ids outside the int32 range).
      initializer: Initial rows of admitted keys: None = keyed uniform(-0.05,
        0.05) (a function of table name and key only), a Keras/TF initializer
        (object or name such as "zeros") or a callable `(shape, dtype) -> tensor`.
      optimizer: An `npu_rec.optimizers` sparse optimizer, or None (lookups only).
      capacity: Initial rows; the fixed size when dynamic expansion is off.
        None = 65536 rows fixed, or 1024 rows growing.
      access_threshold: A key gets a row once its sightings (this batch
        included) reach this; 0 = at once; -1 = admission off.
      eviction_threshold: Free rows of keys idle longer than this many seconds
        at `evict()`; -1 = off. Needs `access_threshold >= 0`.
      dynamic_expansion: Grow on demand; None = `npu_rec.init`'s
        `use_dynamic_expansion` (False before init).
      max_pending_keys: Bound on counted not-yet-admitted keys (see
        `npu_rec._admission`), for the whole table.
      num_shards: Split the table by key hash into this many shards, each with
        its own hash map, rows, counters and free list (one process for now;
        see docs/design.md "Scale-out"). `capacity` and `max_pending_keys` are
        divided between the shards (rounded up). Lookups, gradients, eviction,
        export and checkpoints work across shards transparently.

    Returns:
      A `SparseTable` (a `ShardedTable` when `num_shards > 1`).

    Raises:
      ValueError: an argument is out of range, eviction is on without admission,
        or a table of this name exists.
      TypeError: wrong argument type.
    """
    if dynamic_expansion is None:
        dynamic_expansion = global_use_dynamic_expansion()
    if isinstance(initializer, str):
        import keras  # noqa: PLC0415

        try:
            initializer = keras.initializers.get(initializer)
        except ValueError as err:
            raise ValueError("`initializer` must name a Keras initializer. "
                             f"Received: initializer={initializer!r}") from err
    if capacity is None:
        capacity = DEFAULT_DYNAMIC_CAPACITY if dynamic_expansion else DEFAULT_FIXED_CAPACITY
    config = TableConfig(name=name, dim=dim, key_dtype=key_dtype, initializer=initializer,
                         optimizer=optimizer, capacity=capacity,
                         access_threshold=access_threshold,
                         eviction_threshold=eviction_threshold,
                         dynamic_expansion=dynamic_expansion, max_pending_keys=max_pending_keys,
                         num_shards=num_shards)
    if num_shards > 1:
        from npu_rec._sharded_table import ShardedTable  # noqa: PLC0415

        return ShardedTable(config)
    return SparseTable(config)
