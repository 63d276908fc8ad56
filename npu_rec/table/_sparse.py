"""`SingleShardTable`: a dynamic embedding table keyed by raw int64/int32 ids.

A single-shard table is two parts, both fixed when it is created:

* its state (`ShardState`, `_state`): keys map to rows through `KeyIndex` (an
  open-addressing map on mixed keys: TF's `DenseHashTable`, or the kernels'
  own `NpuRecKeyMap`; see docs/design.md); rows, optimizer slots and per-row
  metadata live in `RowStorage` variables; not-yet-admitted keys are counted
  in `PendingCounts`;
* its backend (`TableBackend`, `_backend`): the object that builds every
  lookup, update, eviction and state transfer on that state, with stock ops
  (`StockBackend`, the reference) or npu_rec's kernels (`KernelBackend`).

This class holds what does not depend on the backend: configuration, the
initializer, the checks of keys, and moving the state in and out of NumPy.

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

import numpy as np
import tensorflow as tf

from npu_rec.table import _check as _table_check
from npu_rec.table import _fallback, _keyed_init, _row_init
from npu_rec.table._backend import TableBackend
from npu_rec.table._base import SparseTable
from npu_rec.table._config import TableConfig
from npu_rec.table._key_index import KeyIndex
from npu_rec.table._state import ShardState
from npu_rec.table._storage import RowStorage


class SingleShardTable(SparseTable):
    """A `SparseTable` with one hash map and one row storage.

    `create_table` returns it when `num_shards == 1`; a `ShardedTable` holds
    `num_shards` of them (unregistered, named `<name>_shard<i>`, seeded by
    the sharded table's name so a key's first row does not depend on its shard).

    Attributes:
      state: The shard's resources (`ShardState`).
      backend: The `TableBackend` building its ops.
      seed: The keyed initialiser's seed.

    Example:
      >>> table = npu_rec.create_table("user", 8, optimizer=npu_rec.optimizers.SGD(0.1))
      >>> type(table).__name__
      'SingleShardTable'
    """

    def __init__(
        self,
        config: TableConfig,
        backend: TableBackend,
        *,
        register: bool = True,
        seed_name=None,
        fan_rows=None,
    ):
        super().__init__(config, backend, register=register)
        self.seed = _keyed_init.name_seed(seed_name or config.name)
        #: Rows of the variable fan-based initializers are sized for (`_row_init`).
        self.fan_rows = fan_rows or config.capacity
        with tf.init_scope():
            with tf.name_scope(f"npu_rec_table_{config.name}"):
                self.state: ShardState = backend.create_state(config, self._graph_mode)
                if self._graph_mode:
                    self._graph_ops = self._build_graph_ops()

    def add_optimizer_slots(self, slot_specs, row_slots=()) -> None:
        """Allocates the slots of an optimizer bound after creation (`bind_optimizer`)."""
        with tf.init_scope():
            with tf.name_scope(f"npu_rec_table_{self.config.name}/"):
                self.state.rows.add_slots(slot_specs, row_slots)
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
        return list(self.state.rows.slots)

    @property
    def storage(self) -> RowStorage:
        """The rows, slots and per-row metadata (`RowStorage`)."""
        return self.state.rows

    @property
    def key_index(self) -> KeyIndex:
        """The key -> row map (`KeyIndex`)."""
        return self.state.index

    @property
    def sums_slices(self) -> bool:
        return self.backend.sums_slices

    def variables(self) -> list[tf.Variable]:
        fallback = [] if self.fallback is None else self.fallback.variables()
        return self.state.variables() + fallback

    def initial_values(self, keys: tf.Tensor) -> tf.Tensor:
        """float32 [k, dim]: the first rows of newly admitted `keys`.

        The initializer's, or with `not_admitted="hashed"` the keys' fallback rows.
        """
        if self.fallback_init is not None:
            return self.fallback_init.rows_of(keys)
        return self._initial_values(keys)

    def build_memory_stats(self) -> dict[str, tf.Tensor]:
        """int64 scalars: live keys and bytes held (`TableBackend.memory_stats`)."""
        return self.backend.memory_stats(self)

    # ----------------------------------------------------------------- lookups
    def _initial_values(self, keys: tf.Tensor) -> tf.Tensor:
        init = self.config.initializer
        if init is None:
            return _keyed_init.keyed_uniform(keys, self.dim, self.seed)
        try:
            return _row_init.initial_rows(init, tf.size(keys), self.dim, self.fan_rows)
        except TypeError as err:
            raise TypeError(f"Sparse table {self.name!r}: {err}") from err

    @tf.autograph.experimental.do_not_convert
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
        return self.backend.lookup_unique(
            self, keys, counts, times, training, from_feature, batch_time
        )

    @tf.autograph.experimental.do_not_convert
    def lookup_ids(self, ids, times, from_feature: bool = False, batch_time=None):
        """The training lookup of a batch's ids (see `SparseTable.lookup_ids`)."""
        return self.backend.lookup_ids(self, ids, times, from_feature, batch_time)

    def clamped_report(self) -> tf.Tensor:
        return self.state.clamped.read_value()

    def clock(self) -> tuple[tf.Tensor, tf.Tensor]:
        return self.state.max_seen.read_value(), self.state.ts_feature.read_value()

    # --------------------------------------------------------------- gradients
    @tf.autograph.experimental.do_not_convert
    def apply_rows(
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
        rows_store = self.state.rows
        if rows_store.late_slots:
            # Slots of an optimizer bound after the lookups were built: grown first
            # (after the lookup that handed out `rows` grew the rows).
            with tf.control_dependencies([rows]):
                match = rows_store.match_late_slots()
            with tf.control_dependencies([match]):
                step = self.state.opt_step.assign_add(1)
        else:
            step = self.state.opt_step.assign_add(1)
        return self.backend.apply(self, rows, grads, step, all_rows, current)

    def find_rows(self, keys: tf.Tensor) -> tf.Tensor:
        """int64 [u] rows of unique `keys` (-1 = no row); reads the hash map only."""
        return self.backend.find_rows(self, keys)

    # ------------------------------------------------------------- maintenance
    def build_size(self) -> tf.Tensor:
        return self.backend.size(self)

    def build_evict(self, now: tf.Tensor) -> tf.Tensor:
        return self.backend.evict(self, now)

    # ------------------------------------------------------------------- state
    def _build_graph_ops(self) -> dict:
        ph = tf.compat.v1.placeholder
        min_period = ph(tf.int64, [], name="min_period")
        feeds = {
            k: ph(d, s, name=k.replace("/", "_"))
            for k, (d, s) in self.state.signature(self.dim).items()
        }
        # A save reads the state and checks it in one consistent view: no training
        # lookup (admission) of another session, e.g. an asynchronous worker of the
        # ps route, runs in between.
        state, check = self.state.locked(
            lambda: (self.backend.export(self, min_period), _table_check.build_check(self))
        )
        return {
            **self._graph_ops_common("now"),
            "state": (min_period, state),
            "load": (feeds, self.backend.load(self, feeds)),
            "end_period": self.backend.end_period(self),
            "check": check,
        }

    def read_state(
        self, min_period: int = 0, session=None, check: bool = True
    ) -> dict[str, np.ndarray]:
        """All state as numpy (rows with >= `min_period` sightings this period), sorted by key.

        Args:
          min_period: Only rows sighted at least this often since the last save.
          session: graph mode only (see `evict`).
          check: Verify the table's invariants in the same read (every save does;
            see `npu_rec.table._check`).

        Raises:
          TableInvariantError: `check` and an invariant is broken.
        """
        if self._graph_mode:
            ph, tensors = self._graph_ops["state"]
            st, chk = self._session(session).run(
                (tensors, self._graph_ops["check"] if check else {}), {ph: min_period}
            )
        else:
            st = {k: v.numpy() for k, v in self.backend.export(self, min_period).items()}
            chk = {k: v.numpy() for k, v in _table_check.build_check(self).items()} if check else {}
        order = np.argsort(st["keys"], kind="stable")
        for k in ("keys", "values", "counts", "last_seen", *[f"slot/{n}" for n in self.slot_names]):
            st[k] = st[k][order]
        porder = np.argsort(st["pending_keys"], kind="stable")
        for k in ("pending_keys", "pending_counts", "pending_last_seen"):
            st[k] = st[k][porder]
        st["deleted_keys"] = np.sort(st["deleted_keys"])
        if check:
            _table_check.verify(self.name, chk, st["keys"])
        return _fallback.read_into(self, st, session, check)

    def write_state(self, st: dict[str, np.ndarray], session=None) -> None:
        st = self.fit_restored_slots(st)  # before anything changes (a clear error, or converted)
        if self.registered:  # a sharded table's shards: it logs once for all
            self.note_value_conversion(st["values"])
        _fallback.write_from(self, st, session)
        sig = self.state.signature(self.dim)
        st = {**st, "deleted_keys": np.zeros([0], np.int64)}  # a restore starts a new period
        st = {
            k: np.asarray(st[k], d.as_numpy_dtype).reshape([-1 if x is None else x for x in s])
            if s
            else np.asarray(st[k], d.as_numpy_dtype)
            for k, (d, s) in sig.items()
        }
        if self._graph_mode:
            feeds, op = self._graph_ops["load"]
            self._session(session).run(op, {feeds[k]: v for k, v in st.items()})
        else:
            self.backend.load(self, {k: tf.constant(v) for k, v in st.items()})

    def end_period(self, session=None) -> None:
        if self._graph_mode:
            self._session(session).run(self._graph_ops["end_period"])
        else:
            self.backend.end_period(self)
