"""`SparseTable`: a dynamic embedding table keyed by raw int64/int32 ids.

Keys map to rows through TF's `MutableHashTable` kernel (see docs/design.md);
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

from typing import Any

import numpy as np
import tensorflow as tf

from npu_rec import _keyed_init, _table_registry
from npu_rec._admission import PendingCounts
from npu_rec._table_config import (
    DEFAULT_DYNAMIC_CAPACITY,
    DEFAULT_FIXED_CAPACITY,
    DEFAULT_MAX_PENDING_KEYS,
    TableConfig,
    global_use_dynamic_expansion,
)
from npu_rec._table_storage import META_COUNT, META_LAST_SEEN, META_PERIOD, RowStorage

_NO_NOW = np.iinfo(np.int64).min


class SparseTable:
    """A huge sparse embedding table on raw ids; create it with `create_table`.

    Attributes:
      name: The table name (unique per program, or per graph in graph mode).
      dim: Row width.
      config: The validated `TableConfig`.

    Example:
      >>> table = npu_rec.create_table("user", 8, optimizer=npu_rec.optimizers.SGD(0.1))
      >>> emb = npu_rec.sparse_lookup(table, tf.constant([3, 7, 3], tf.int64))  # [3, 8]
    """

    def __init__(self, config: TableConfig):
        self.config = config
        self.name = config.name
        self.dim = config.dim
        self.key_dtype = tf.as_dtype(config.key_dtype)
        self.optimizer = config.optimizer
        self._seed = _keyed_init.name_seed(config.name)
        slot_specs = self.optimizer.slot_specs if self.optimizer is not None else ()
        _table_registry.register(self)
        with tf.init_scope():
            self._graph_mode = not tf.executing_eagerly()
            with tf.name_scope(f"npu_rec_table_{config.name}"):
                self._storage = RowStorage(config.name, config.dim, slot_specs,
                                           config.capacity, config.dynamic_expansion)
                self._index = tf.lookup.experimental.MutableHashTable(
                    tf.int64, tf.int64, default_value=-1, name="index")
                self._pending = PendingCounts(config.max_pending_keys)
                self._deleted = tf.lookup.experimental.MutableHashTable(
                    tf.int64, tf.int64, default_value=0, name="deleted")
                self._max_seen = tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                             name="max_seen")
                self._ts_feature = tf.Variable(False, trainable=False, name="ts_feature")
                self._opt_step = tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                             name="opt_step")
                if self._graph_mode:
                    self._graph_ops = self._build_graph_ops()

    @property
    def slot_names(self) -> list[str]:
        """Names of the optimizer slots kept per row (e.g. ["accumulator"])."""
        return list(self._storage.slots)

    def variables(self) -> list[tf.Variable]:
        """The (non-trainable) variables holding this table's state."""
        s = self._storage
        return [*s.per_row_variables(), s.next_row, s.num_free, self._max_seen,
                self._ts_feature, self._opt_step]

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
        return tf.cast(init(tf.stack([n, self.dim]), tf.float32), tf.float32)

    @tf.autograph.experimental.do_not_convert
    def _lookup_unique(self, keys: tf.Tensor, counts: tf.Tensor | None,
                       times: tf.Tensor | None, training: bool, from_feature: bool = False):
        """Rows and embeddings of unique keys; admits and counts when training.

        Args:
          keys: int64 [u], unique.
          counts: int64 [u], occurrences in the batch (training only).
          times: int64 [u], newest timestamp per key (training only).
          training: Count, admit and record last-seen times.
          from_feature: `times` come from a timestamp feature (not the wall clock).

        Returns:
          (rows int64 [u], -1 where the key has no row; embeddings float32 [u, dim],
          zeros where the key has no row).
        """
        rows0 = self._index.lookup(keys)
        if not training:
            return rows0, self._gather(rows0, [])
        s, c = self._storage, self.config
        miss_pos = tf.where(rows0 < 0)[:, 0]
        miss_keys = tf.gather(keys, miss_pos)
        miss_counts = tf.gather(counts, miss_pos)
        pending_ops = []
        if c.access_threshold > 0:
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
        new_rows, alloc = s.allocate(tf.size(adm_keys, out_type=tf.int64))
        with tf.control_dependencies([new_rows]):
            if pending_args is not None:
                pending_ops.append(self._pending.update(*pending_args))
            init = s.init_rows(new_rows, adm_keys, self._initial_values(adm_keys))
            insert = self._index.insert(adm_keys, new_rows)
        u = tf.shape(keys, out_type=tf.int64)[0]
        rows = tf.tensor_scatter_nd_update(rows0, adm_pos[:, None], new_rows)
        extra = tf.scatter_nd(adm_pos[:, None], adm_prior, tf.reshape(u, [1]))
        live_pos = tf.where(rows >= 0)[:, 0]
        live_rows = tf.gather(rows, live_pos)
        add = tf.gather(counts + extra, live_pos)
        with tf.control_dependencies([init]):
            old = tf.gather(s.meta, live_rows)
        new_meta = tf.stack([old[:, META_COUNT] + add, old[:, META_PERIOD] + add,
                             tf.maximum(old[:, META_LAST_SEEN], tf.gather(times, live_pos))], 1)
        meta_op = s.meta.scatter_update(tf.IndexedSlices(new_meta, live_rows))
        seen = self._max_seen.assign(tf.maximum(self._max_seen.read_value(),
                                                tf.reduce_max(tf.concat([times, [0]], 0))),
                                     read_value=False)
        effects = [alloc, init, insert, meta_op, seen, *pending_ops]
        if from_feature:
            effects.append(self._ts_feature.assign(True, read_value=False))
        return rows, self._gather(rows, effects)

    def _gather(self, rows: tf.Tensor, deps) -> tf.Tensor:
        with tf.control_dependencies(deps):
            emb = tf.gather(self._storage.values, tf.maximum(rows, 0))
        return emb * tf.cast(rows >= 0, tf.float32)[:, None]

    # --------------------------------------------------------------- gradients
    @tf.autograph.experimental.do_not_convert
    def _apply_rows(self, rows: tf.Tensor, grads: tf.Tensor) -> tf.Operation:
        """Applies summed gradients of unique rows (rows < 0 are skipped).

        Args:
          rows: int64 [u], unique (or -1).
          grads: float32 [u, dim].
        """
        if self.optimizer is None:
            raise ValueError(
                f"Sparse table {self.name!r} has no optimizer, so it cannot apply gradients. "
                "Pass `optimizer=npu_rec.optimizers.<SGD|Adagrad|Adam|Ftrl>(...)` to "
                "npu_rec.create_table. Received: optimizer=None")
        valid = tf.where(rows >= 0)[:, 0]
        step = self._opt_step.assign_add(1)
        s = self._storage
        return self.optimizer.apply_sparse(s.values, s.slots, tf.gather(rows, valid),
                                           tf.gather(tf.cast(grads, tf.float32), valid), step)

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
        summed = tf.math.unsorted_segment_sum(grads, idx, tf.size(uniq, out_type=tf.int64))
        op = self._apply_rows(self._index.lookup(uniq), summed)
        return None if tf.executing_eagerly() else op

    # ------------------------------------------------------------- maintenance
    @tf.autograph.experimental.do_not_convert
    def size(self) -> tf.Tensor:
        """int64 scalar tensor: number of keys holding a row."""
        if self._graph_mode:
            return self._graph_ops["size"]
        return self._storage.live_count()

    def _default_now(self) -> tf.Tensor:
        wall = tf.cast(tf.timestamp(), tf.int64)
        return tf.where(self._ts_feature.read_value(), self._max_seen.read_value(), wall)

    def _build_evict(self, now: tf.Tensor) -> tf.Tensor:
        c, s = self.config, self._storage
        if not c.eviction:
            return tf.constant(0, tf.int64)
        now = tf.where(tf.equal(now, _NO_NOW), self._default_now(), now)
        meta = s.meta.read_value()
        idle = (meta[:, META_COUNT] > 0) & (now - meta[:, META_LAST_SEEN] > c.eviction_threshold)
        rows = tf.where(idle)[:, 0]
        keys = tf.gather(s.row_keys, rows)
        ops = [self._index.remove(keys), s.release(rows),
               self._deleted.insert(keys, tf.ones_like(keys)),
               self._pending.drop_idle(now, c.eviction_threshold)]
        with tf.control_dependencies(ops):
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
            return int(sess.run(out, {ph: int(now_value)}))
        out = self._build_evict(tf.cast(now_value, tf.int64))
        return int(out) if tf.executing_eagerly() else out

    # ------------------------------------------------------- state in and out
    def _build_state(self, min_period) -> dict[str, tf.Tensor]:
        s = self._storage
        rows = s.live_rows(min_period)
        meta = tf.gather(s.meta, rows)
        pkeys, pstate = self._pending.export()
        out = {"keys": tf.gather(s.row_keys, rows), "values": tf.gather(s.values, rows),
               "counts": meta[:, META_COUNT], "last_seen": meta[:, META_LAST_SEEN],
               "pending_keys": pkeys, "pending_counts": pstate[:, 0],
               "pending_last_seen": pstate[:, 1], "deleted_keys": self._deleted.export()[0],
               "max_seen": self._max_seen.read_value(),
               "ts_feature": self._ts_feature.read_value(),
               "opt_step": self._opt_step.read_value()}
        for name, var in s.slots.items():
            out[f"slot/{name}"] = tf.gather(var, rows)
        return out

    def _build_load(self, st: dict[str, tf.Tensor]) -> tf.Operation:
        slots = {n: st[f"slot/{n}"] for n in self._storage.slots}
        old_keys, _ = self._index.export()
        removed = self._index.remove(old_keys)
        old_deleted, _ = self._deleted.export()
        ops = [self._storage.load(st["keys"], st["values"], slots, st["counts"], st["last_seen"]),
               self._pending.load(st["pending_keys"],
                                  tf.stack([st["pending_counts"], st["pending_last_seen"]], 1)),
               self._deleted.remove(old_deleted),
               self._max_seen.assign(st["max_seen"], read_value=False),
               self._ts_feature.assign(st["ts_feature"], read_value=False),
               self._opt_step.assign(st["opt_step"], read_value=False)]
        with tf.control_dependencies([removed]):
            n = tf.size(st["keys"], out_type=tf.int64)
            ops.append(self._index.insert(st["keys"], tf.range(n)))
        return tf.group(*ops)

    def _build_end_period(self) -> tf.Operation:
        keys, _ = self._deleted.export()
        return tf.group(self._storage.reset_period(), self._deleted.remove(keys))

    def _state_signature(self) -> dict[str, tuple[tf.DType, list]]:
        sig = {"keys": (tf.int64, [None]), "values": (tf.float32, [None, self.dim]),
               "counts": (tf.int64, [None]), "last_seen": (tf.int64, [None]),
               "pending_keys": (tf.int64, [None]), "pending_counts": (tf.int64, [None]),
               "pending_last_seen": (tf.int64, [None]), "deleted_keys": (tf.int64, [None]),
               "max_seen": (tf.int64, []), "ts_feature": (tf.bool, []),
               "opt_step": (tf.int64, [])}
        sig.update({f"slot/{n}": (tf.float32, [None, self.dim]) for n in self._storage.slots})
        return sig

    def _build_graph_ops(self) -> dict[str, Any]:
        ph = tf.compat.v1.placeholder
        min_period = ph(tf.int64, [], name="min_period")
        now = tf.compat.v1.placeholder_with_default(tf.constant(_NO_NOW, tf.int64), [], "now")
        feeds = {k: ph(d, s, name=k.replace("/", "_")) for k, (d, s) in
                 self._state_signature().items()}
        return {"size": self._storage.live_count(), "evict": (now, self._build_evict(now)),
                "state": (min_period, self._build_state(min_period)),
                "load": (feeds, self._build_load(feeds)), "end_period": self._build_end_period()}

    def _session(self, session):
        sess = session or tf.compat.v1.get_default_session()
        if sess is None:
            raise ValueError(
                f"Sparse table {self.name!r} lives in a tf.compat.v1 graph: pass `session=` "
                "(e.g. run_context.session in a SessionRunHook) or use a default session. "
                "Received: session=None")
        return sess

    def _read_state(self, min_period: int = 0, session=None) -> dict[str, np.ndarray]:
        """All state as numpy (rows with >= `min_period` sightings this period), sorted by key."""
        if self._graph_mode:
            ph, tensors = self._graph_ops["state"]
            st = self._session(session).run(tensors, {ph: min_period})
        else:
            st = {k: v.numpy() for k, v in self._build_state(min_period).items()}
        order = np.argsort(st["keys"], kind="stable")
        for k in ("keys", "values", "counts", "last_seen", *[f"slot/{n}" for n in self.slot_names]):
            st[k] = st[k][order]
        porder = np.argsort(st["pending_keys"], kind="stable")
        for k in ("pending_keys", "pending_counts", "pending_last_seen"):
            st[k] = st[k][porder]
        st["deleted_keys"] = np.sort(st["deleted_keys"])
        return st

    def _write_state(self, st: dict[str, np.ndarray], session=None) -> None:
        sig = self._state_signature()
        st = {**st, "deleted_keys": np.zeros([0], np.int64)}  # a restore starts a new period
        st = {k: np.asarray(st[k], d.as_numpy_dtype).reshape(
            [-1 if x is None else x for x in s]) if s else np.asarray(st[k], d.as_numpy_dtype)
            for k, (d, s) in sig.items()}
        if self._graph_mode:
            feeds, op = self._graph_ops["load"]
            self._session(session).run(op, {feeds[k]: v for k, v in st.items()})
        else:
            self._build_load({k: tf.constant(v) for k, v in st.items()})

    def _end_period(self, session=None) -> None:
        if self._graph_mode:
            self._session(session).run(self._graph_ops["end_period"])
        else:
            self._build_end_period()

    def export(self, session=None) -> dict[str, Any]:
        """The live rows as numpy, sorted by key.

        Args:
          session: graph mode only (see `evict`).

        Returns:
          dict with `keys` [n] (key dtype), `values` float32 [n, dim], `slots`
          (slot name -> float32 [n, dim]), `counts` int64 [n], `last_seen` int64 [n].
        """
        st = self._read_state(0, session)
        return {"keys": st["keys"].astype(self.key_dtype.as_numpy_dtype),
                "values": st["values"], "counts": st["counts"], "last_seen": st["last_seen"],
                "slots": {n: st[f"slot/{n}"] for n in self.slot_names}}

    def save(self, path: str, session=None) -> None:
        """Writes a full snapshot of this table to the file `path` (atomic, checksummed).

        Does not reset the delta tracking of `npu_rec.checkpoint.TableCheckpointManager`.
        """
        from npu_rec.checkpoint import _file_format  # noqa: PLC0415

        st = self._read_state(0, session)
        _file_format.write_file(path, _file_format.table_arrays(self.name, st),
                                {"tables": {self.name: self.describe()}, "kind": "full"})

    def restore(self, path: str, session=None) -> None:
        """Replaces this table's state by the snapshot in `path` (written by `save`).

        Raises:
          npu_rec.checkpoint.CheckpointCorruptedError: the file is truncated or altered.
          ValueError: the file holds no table of this name, or a different dim.
        """
        from npu_rec.checkpoint import _file_format  # noqa: PLC0415

        arrays, meta = _file_format.read_file(path)
        self.check_compatible(meta, path)
        self._write_state(_file_format.table_state(self.name, arrays), session)

    def describe(self) -> dict[str, Any]:
        """JSON-able description stored with checkpoints."""
        return {"dim": self.dim, "key_dtype": self.key_dtype.name, "slots": self.slot_names}

    def check_compatible(self, meta: dict[str, Any], path: str) -> None:
        """Raises ValueError unless checkpoint `meta` has this table with the same layout."""
        desc = meta.get("tables", {}).get(self.name)
        if desc is None:
            raise ValueError(f"Checkpoint file {path!r} has no table named {self.name!r}; "
                             f"it holds {sorted(meta.get('tables', {}))}.")
        if desc["dim"] != self.dim or list(desc["slots"]) != self.slot_names:
            raise ValueError(
                f"Checkpoint file {path!r} holds table {self.name!r} with dim={desc['dim']} "
                f"and slots={desc['slots']}, but the table has dim={self.dim} and "
                f"slots={self.slot_names} (is the optimizer the same?).")


def _flat_keys(ids) -> tf.Tensor:
    """int64 [n] keys of dense / ragged / sparse ids."""
    if isinstance(ids, tf.RaggedTensor):
        ids = ids.flat_values
    elif isinstance(ids, tf.SparseTensor):
        ids = ids.values
    ids = tf.convert_to_tensor(ids)
    if not ids.dtype.is_integer:
        raise TypeError(f"`ids` must be an integer tensor. Received: ids.dtype={ids.dtype!r}")
    return tf.reshape(tf.cast(ids, tf.int64), [-1])


def create_table(name: str, dim: int, *, key_dtype=tf.int64, initializer=None, optimizer=None,
                 capacity: int | None = None, access_threshold: int = -1,
                 eviction_threshold: int = -1, dynamic_expansion: bool | None = None,
                 max_pending_keys: int = DEFAULT_MAX_PENDING_KEYS) -> SparseTable:
    """Creates a sparse embedding table keyed by raw ids.

    Args:
      name: Unique table name.
      dim: Embedding width (>= 1).
      key_dtype: `tf.int64` or `tf.int32`; raw ids, no vocabulary needed.
      initializer: Initial rows of admitted keys: None = keyed uniform(-0.05,
        0.05) (a function of table name and key only), a Keras/TF initializer or
        a callable `(shape, dtype) -> tensor`.
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
        `npu_rec._admission`).

    Returns:
      A `SparseTable`.

    Raises:
      ValueError: an argument is out of range, eviction is on without admission,
        or a table of this name exists.
      TypeError: wrong argument type.
    """
    if dynamic_expansion is None:
        dynamic_expansion = global_use_dynamic_expansion()
    if capacity is None:
        capacity = DEFAULT_DYNAMIC_CAPACITY if dynamic_expansion else DEFAULT_FIXED_CAPACITY
    config = TableConfig(name=name, dim=dim, key_dtype=key_dtype, initializer=initializer,
                         optimizer=optimizer, capacity=capacity,
                         access_threshold=access_threshold,
                         eviction_threshold=eviction_threshold,
                         dynamic_expansion=dynamic_expansion, max_pending_keys=max_pending_keys)
    return SparseTable(config)
