"""`SparseTable`: what every sparse table offers, built on a small internal protocol.

Two sibling classes implement it: `SingleShardTable` (`_sparse`: one hash
map, one row storage) and `ShardedTable` (`_sharded`: single-shard tables
chosen by key hash). `create_table` (`_create`) returns one of them; users
see `npu_rec.SparseTable`. Every table holds the `TableBackend` (`_backend`)
chosen when it was created (`backend`); a single-shard table builds its ops
through it, and the lookup functions ask it how to expand unique rows.

The public methods here (`size`, `evict`, `apply_gradients`, `export`,
`save`, `restore`, `describe`) use only the attributes this base sets and
the protocol below, which both siblings implement and the rest of npu_rec
(lookups, checkpoints, the front ends) calls. The names are plain because
they are called across modules; they stay out of the public API because
the package is private (`npu_rec.table._*`).

Protocol (shapes: u unique keys, dim the row width):

* `lookup_unique(keys, counts, times, training, from_feature, batch_time)`
  -> (rows int64 [u], -1 = no row; embeddings float32 [u, dim]).
* `lookup_ids(ids, times, from_feature, batch_time)` -> (unique keys, index,
  rows, embeddings): a training lookup of a batch's raw ids (deduplicated
  here, or inside the fused kernel of the kernel backend, `_fused`).
* `find_rows(keys)` -> rows int64 [u] (reads the hash map only).
* `apply_rows(rows, grads, all_rows=False, current=None)` -> update op.
* `read_state(min_period=0, session=None, check=True)` -> dict of NumPy
  arrays sorted by key (layout in `_state`); `write_state(state, session)`;
  `end_period(session)` (a checkpoint save starts a new delta period).
* `build_size()`, `build_evict(now)`, `clock()`, `clamped_report()`: the
  tensors behind `size`, `evict` and the clamped-timestamp warning.
* `sums_slices`: `apply_rows` takes per-id gradients as `tf.IndexedSlices`.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf

from npu_rec import _log as logging
from npu_rec._compat import quiet_retracing
from npu_rec.table import _registry, _slot_layout
from npu_rec.table._config import TableConfig
from npu_rec.table._key_pipeline import flat_keys

#: `now` value meaning "the table's own clock" (see `SparseTable.evict`).
NO_NOW = np.iinfo(np.int64).min
#: A training timestamp more than this many seconds ahead of the wall clock (a
#: millisecond or garbage value among seconds) is replaced by the table's clock.
MAX_SECONDS_AHEAD = 86400


class SparseTable(abc.ABC):
    """A huge sparse embedding table on raw ids; create it with `npu_rec.create_table`.

    Attributes:
      name: The table name (unique per program, or per graph in graph mode).
      dim: Row width.
      config: The validated `TableConfig`.
      key_dtype: `tf.int64` or `tf.int32`.
      optimizer: The table's sparse optimizer, or None.

    Example:
      >>> table = npu_rec.create_table("user", 8, optimizer=npu_rec.optimizers.SGD(0.1))
      >>> emb = npu_rec.sparse_lookup(table, tf.constant([3, 7, 3], tf.int64))  # [3, 8]
    """

    #: The trained fallback of not-yet-admitted keys (`not_admitted="hashed"`,
    #: `_fallback`) of the table a user created, or None.
    fallback = None
    #: The fallback a shard's newly admitted keys start from, or None.
    fallback_init = None

    def __init__(self, config: TableConfig, backend, *, register: bool = True):
        self.config = config
        #: The `TableBackend` (`_backend`) chosen at creation: stock ops or the kernels.
        self.backend = backend
        self.name = config.name
        self.dim = config.dim
        self.key_dtype = tf.as_dtype(config.key_dtype)
        self.optimizer = config.optimizer
        #: A table of its own (False for the shards of a sharded table).
        self.registered = register
        if register:
            _registry.register(self)
        with tf.init_scope():
            self._graph_mode = not tf.executing_eagerly()
        #: Graph mode: the ops run by `size`/`evict`/... (built by the subclass at creation).
        self._graph_ops: dict[str, Any] = {}
        self._evictor: TableEvictor | None = None  # `evict`'s, made on its first call
        self._clamped_reported = 0

    # ------------------------------------------------------------ description
    @property
    @abc.abstractmethod
    def num_shards(self) -> int:
        """Number of key-hash shards (1 for an unsharded table)."""

    @property
    @abc.abstractmethod
    def shards(self) -> list[SparseTable]:
        """The single-shard tables holding the state: `[self]` when unsharded."""

    @property
    @abc.abstractmethod
    def slot_names(self) -> list[str]:
        """Names of the optimizer slots kept per row (e.g. ["accumulator"])."""

    @abc.abstractmethod
    def variables(self) -> list[tf.Variable]:
        """The (non-trainable) variables holding this table's state."""

    def __repr__(self) -> str:
        c = self.config
        shards = f", num_shards={self.num_shards}" if self.num_shards > 1 else ""
        return (
            f"SparseTable(name={c.name!r}, dim={c.dim}, optimizer={c.optimizer!r}, "
            f"access_threshold={c.access_threshold}, "
            f"eviction_threshold={c.eviction_threshold}, "
            f"dynamic_expansion={c.dynamic_expansion}{shards})"
        )

    @property
    def sums_slices(self) -> bool:
        """`apply_rows` takes per-id gradients as `tf.IndexedSlices` and sums them itself."""
        return False

    @property
    def admits_at_once(self) -> bool:
        """True when a training lookup gives every key a row (access_threshold <= 1)."""
        return self.config.access_threshold <= 1

    def describe(self) -> dict[str, Any]:
        """JSON-able description stored with checkpoints."""
        return {
            "dim": self.dim,
            "key_dtype": self.key_dtype.name,
            "slots": self.slot_names,
            "value_dtype": tf.as_dtype(self.config.value_dtype).name,
            # A tiered table (memory + disk); absent for an in-memory one.
            **({"memory_rows": self.config.memory_rows} if self.config.memory_rows else {}),
        }

    def fit_restored_slots(self, st: dict) -> dict:
        """`st` with its optimizer slots in this table's layout (`_slot_layout.fit_slots`).

        Raises:
          ValueError: a slot is missing or saved in a shape that cannot be converted.
        """
        storage = self.shards[0].storage
        return _slot_layout.fit_slots(self.name, st, storage.slot_dims, self.dim, self.optimizer)

    def note_value_conversion(self, values) -> None:
        """Logs one line when restored rows `values` are not in this table's storage dtype."""
        have = np.asarray(values).dtype
        want = tf.as_dtype(self.config.value_dtype)
        if have != np.dtype(want.as_numpy_dtype):
            logging.info(
                "npu_rec: table %r restores %d rows stored as %s into value_dtype=%s "
                "(converted, rounded to nearest).",
                self.name,
                np.asarray(values).shape[0],
                have.name,
                want.name,
            )

    # --------------------------------------------------------------- protocol
    @abc.abstractmethod
    def lookup_unique(
        self,
        keys: tf.Tensor,
        counts: tf.Tensor | None,
        times: tf.Tensor | None,
        training: bool,
        from_feature: bool = False,
        batch_time: tf.Tensor | None = None,
    ):
        """(rows int64 [u], embeddings float32 [u, dim]) of unique keys (see `_sparse`)."""

    def lookup_ids(
        self,
        ids: tf.Tensor,
        times: tf.Tensor | None,
        from_feature: bool = False,
        batch_time: tf.Tensor | None = None,
    ):
        """The training lookup of a batch's ids: deduplicated, then `lookup_unique`.

        Args:
          ids: int64 [n], repeats allowed.
          times: int64 [n] per id, or None when `batch_time` is given.
          from_feature: the times come from a timestamp feature.
          batch_time: int64 scalar time of every id, or None.

        Returns:
          (unique int64 [u], index int64 [n] into unique, rows int64 [u],
          embeddings float32 [u, dim]).
        """
        uniq, idx, counts = tf.unique_with_counts(ids, out_idx=tf.int64)
        uniq = self.checked_keys(uniq)
        utimes = key_times(times, idx, tf.size(uniq, out_type=tf.int64), batch_time)
        rows, emb = self.lookup_unique(
            uniq, tf.cast(counts, tf.int64), utimes, True, from_feature, batch_time
        )
        return uniq, idx, rows, emb

    @abc.abstractmethod
    def find_rows(self, keys: tf.Tensor) -> tf.Tensor:
        """int64 [u] rows of unique `keys` (-1 = no row); reads the hash map only."""

    @abc.abstractmethod
    def apply_rows(
        self,
        rows: tf.Tensor,
        grads: tf.Tensor,
        all_rows: bool = False,
        current: tf.Tensor | None = None,
    ) -> tf.Operation:
        """Applies summed gradients float32 [u, dim] of unique rows (rows < 0 skipped)."""

    @abc.abstractmethod
    def read_state(
        self, min_period: int = 0, session=None, check: bool = True
    ) -> dict[str, np.ndarray]:
        """All state as NumPy, sorted by key (layout: `npu_rec.table._state`)."""

    @abc.abstractmethod
    def write_state(self, st: dict[str, np.ndarray], session=None) -> None:
        """Replaces all state by `st` (as returned by `read_state`)."""

    @abc.abstractmethod
    def end_period(self, session=None) -> None:
        """Starts a new delta period (after a checkpoint save)."""

    @abc.abstractmethod
    def build_size(self) -> tf.Tensor:
        """int64 scalar: keys holding a row."""

    @abc.abstractmethod
    def build_evict(self, now: tf.Tensor) -> tf.Tensor:
        """int64 scalar: rows freed by evicting at `now` (`NO_NOW` = the table's clock)."""

    @abc.abstractmethod
    def clock(self) -> tuple[tf.Tensor, tf.Tensor]:
        """(newest timestamp seen int64, whether lookups had a timestamp feature bool)."""

    @abc.abstractmethod
    def clamped_report(self) -> tf.Tensor:
        """int64 [2]: timestamps clamped so far and the largest of them."""

    def _graph_ops_common(self, now_name: str) -> dict[str, Any]:
        """Graph mode: the ops of `size`, `evict`, `memory_stats` and the clamp warning."""
        now = tf.compat.v1.placeholder_with_default(tf.constant(NO_NOW, tf.int64), [], now_name)
        return {
            "size": self.build_size(),
            "evict": (now, self.build_evict(now)),
            "clamped": self.clamped_report(),
            "memory": self.build_memory_stats(),
        }

    def build_memory_stats(self) -> dict[str, tf.Tensor]:
        """int64 scalars: live keys and bytes held, summed over this process's shards."""
        parts = [s.build_memory_stats() for s in self.shards]
        return {k: tf.add_n([p[k] for p in parts]) for k in parts[0]}

    def memory_stats(self, session=None) -> dict[str, int | float]:
        """What the table holds in memory, in this process (every shard of it).

        Returns:
          A dict of `live_keys` (keys holding a row); the bytes of `rows` (the
          rows at their storage dtype, allocated capacity included), `slots`
          (optimizer state), `metadata` (per-row counts, times, keys and free
          list), `index` (the key index's buckets, at least) and `fallback`
          (the trained fallback of `not_admitted="hashed"`, else 0); `total_bytes`,
          their sum; and `bytes_per_live_key` (`total_bytes / live_keys`, 0.0
          for an empty table); `memory_rows` and `disk_rows`, the live keys whose
          rows are in memory and on disk (a tiered table's two tiers; 0 on disk
          otherwise). Bytes count the arrays the table allocated, not
          the process's resident memory (on the kernel path, rows past the
          high-water mark take none until used; `benchmarks/table_bench.py`
          measures it).

        Args:
          session: graph mode only (see `evict`).
        """
        if self._graph_mode:
            raw = self._session(session).run(self._graph_ops["memory"])
        else:
            raw = {k: v.numpy() for k, v in self.build_memory_stats().items()}
        out: dict[str, int | float] = {k: int(v) for k, v in raw.items()}
        out["fallback"] = self.fallback.nbytes() if self.fallback is not None else 0
        out.setdefault("memory_rows", out["live_keys"])  # a tiered table counts both tiers
        out.setdefault("disk_rows", 0)
        total = sum(v for k, v in out.items() if k in _BYTE_FIELDS)
        out["total_bytes"] = total
        out["bytes_per_live_key"] = total / out["live_keys"] if out["live_keys"] else 0.0
        return out

    def default_now(self) -> tf.Tensor:
        """The table's clock: newest timestamp seen, or the wall clock without a feature."""
        seen, from_feature = self.clock()
        return tf.where(from_feature, seen, tf.cast(tf.timestamp(), tf.int64))

    def _session(self, session):
        sess = session or tf.compat.v1.get_default_session()
        if sess is None:
            raise ValueError(
                f"Sparse table {self.name!r} lives in a tf.compat.v1 graph: pass `session=` "
                "(e.g. run_context.session in a SessionRunHook) or use a default session. "
                "Received: session=None"
            )
        return sess

    # ------------------------------------------------------------ keys, grads
    def checked_keys(self, keys: tf.Tensor) -> tf.Tensor:
        """int64 [u] `keys`, once asserted to fit the table's key dtype (int32 tables).

        An int64 id beyond the int32 range would otherwise be stored, and
        exported, wrapped into another key.
        """
        if self.key_dtype != tf.int32:
            return keys
        low, high = tf.int32.min, tf.int32.max
        bad = tf.boolean_mask(keys, (keys < low) | (keys > high))
        rule = (
            f"Sparse table {self.name!r} has key_dtype=int32, so ids must lie in "
            f"[{low}, {high}]; create it with key_dtype=tf.int64 for wider ids."
        )
        if tf.executing_eagerly():
            if tf.size(bad) > 0:
                raise tf.errors.InvalidArgumentError(
                    None,
                    None,
                    f"{rule} Received out-of-range ids (first 3): {bad.numpy()[:3].tolist()}",
                )
            return keys
        check = tf.debugging.Assert(
            tf.equal(tf.size(bad), 0),
            [f"{rule} Received out-of-range ids (first 3):", bad[:3]],
            summarize=3,
        )
        with tf.control_dependencies([check]):
            return tf.identity(keys)

    def _require_optimizer(self) -> None:
        if self.optimizer is None:
            raise ValueError(
                f"Sparse table {self.name!r} has no optimizer, so it cannot apply gradients. "
                "Pass `optimizer=npu_rec.optimizers.<SGD|Adagrad|Adam|Ftrl>(...)` to "
                "npu_rec.create_table or call `table.bind_optimizer(...)`. "
                "Received: optimizer=None"
            )

    def bind_optimizer(self, optimizer) -> None:
        """Gives a table created without optimizer its sparse optimizer.

        Rec SDK binds a table's optimizer when the optimizer first applies
        gradients to it, not at `create_table`; this is that step. The Keras
        front end binds the counterpart of the compiled optimizer to tables
        that have none of their own (`RecModel.compile`). The
        optimizer's slots are allocated now (initial values for rows already
        present). In a `tf.compat.v1` graph, call it before the graph is
        finalised (while the model is built). Binding the optimizer the table
        already has does nothing.

        Args:
          optimizer: An `npu_rec.optimizers` sparse optimizer.

        Raises:
          ValueError: the table already has another optimizer (one table, one
            optimizer), or it is sharded across workers or parameter servers, or
            tiered and the optimizer has slots (give those their optimizer at
            `create_table`).
          TypeError: `optimizer` is not a sparse optimizer.
        """
        if optimizer is self.optimizer:
            return
        if self.optimizer is not None:
            raise ValueError(
                f"Sparse table {self.name!r} already has an optimizer; one table is trained "
                f"by one optimizer. Has: {self.optimizer!r}. Received: optimizer={optimizer!r}"
            )
        config = dataclasses.replace(self.config, optimizer=optimizer)  # validates the type
        if config.memory_rows is not None and optimizer.slot_specs:
            raise ValueError(
                f"Tiered table {self.name!r} (`memory_rows`) lays out its disk records with "
                "its optimizer's slots: pass an optimizer with slots to npu_rec.create_table. "
                f"Received: optimizer={optimizer!r} bound later"
            )
        shards = self.shards
        if not all(hasattr(s, "add_optimizer_slots") for s in shards):
            raise ValueError(
                f"Sparse table {self.name!r} is sharded across workers or parameter servers: "
                "pass its optimizer to npu_rec.create_table. "
                f"Received: optimizer={optimizer!r}"
            )
        for shard in shards:
            if shard is not self:
                shard.config = dataclasses.replace(shard.config, optimizer=optimizer)
                shard.optimizer = optimizer
            shard.add_optimizer_slots(optimizer.slot_specs, getattr(optimizer, "row_slots", ()))
        if self.fallback is not None:
            self.fallback.bind_optimizer(optimizer)
        self.config = config
        self.optimizer = optimizer

    @tf.autograph.experimental.do_not_convert
    def apply_gradients(self, ids, grads) -> tf.Operation | None:
        """Applies the table's sparse optimizer to the rows of `ids`.

        Gradients of repeated ids are summed first; ids without a row (not
        admitted, or evicted) are ignored, or train their fallback rows with
        `not_admitted="hashed"`. The hash map is only read.

        Args:
          ids: int [...] tensor or `tf.RaggedTensor` of the ids looked up.
          grads: float32 [..., dim], d loss / d `sparse_lookup(table, ids)` (no
            combiner); a `tf.IndexedSlices` or ragged tensor is accepted.

        Returns:
          The update op (None in eager mode, where it has run).

        Raises:
          ValueError: the table has no optimizer, or the shapes disagree.
        """
        flat_ids = flat_keys(ids)
        if isinstance(grads, tf.IndexedSlices):
            grads = tf.convert_to_tensor(grads)
        if isinstance(grads, tf.RaggedTensor):
            grads = grads.flat_values
        grads = tf.reshape(tf.cast(grads, tf.float32), [-1, self.dim])
        uniq, idx = tf.unique(flat_ids, out_idx=tf.int64)
        uniq = self.checked_keys(uniq)
        summed = tf.IndexedSlices(grads, idx)
        if not self.sums_slices:
            summed = tf.math.unsorted_segment_sum(grads, idx, tf.size(uniq, out_type=tf.int64))
        rows = self.find_rows(uniq)
        op = self.apply_rows(rows, summed)
        if self.fallback is not None:
            dense = tf.math.unsorted_segment_sum(grads, idx, tf.size(uniq, out_type=tf.int64))
            op = tf.group(op, self.fallback.apply(uniq, rows, dense))
        return None if tf.executing_eagerly() else op

    # ------------------------------------------------------------ maintenance
    @tf.autograph.experimental.do_not_convert
    def size(self) -> int | tf.Tensor:
        """Number of keys holding a row: an int in eager mode, else an int64 scalar tensor.

        Inside a `tf.compat.v1` graph or a `tf.function` it is a tensor (run or
        return it); in eager mode it is a plain Python int, read now.
        """
        if self._graph_mode:
            return self._graph_ops["size"]
        count = self.build_size()
        return int(count) if tf.executing_eagerly() else count

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
        if self._graph_mode and (session or tf.compat.v1.get_default_session()) is None:
            if now is None:
                return self._graph_ops["evict"][1]
            return self.build_evict(tf.cast(now, tf.int64))
        if not self._graph_mode and not tf.executing_eagerly():  # inside a tf.function
            return self.build_evict(tf.cast(NO_NOW if now is None else now, tf.int64))
        if self._evictor is None:
            self._evictor = TableEvictor([self])
        return self._evictor(now, session)[self.name]

    def _report_clamped(self, count, newest) -> None:
        """Logs a warning when more timestamps were clamped since the last report.

        Args:
          count, newest: The table's clamped report (`clamped_report`), as read
            by an eviction.
        """
        if count > self._clamped_reported:
            logging.warning(
                "npu_rec: sparse table %r replaced %d training timestamps (%d so far) lying "
                "more than %d s ahead of the wall clock, e.g. %d, by its clock: timestamps "
                "must be int seconds (not milliseconds).",
                self.name,
                count - self._clamped_reported,
                count,
                MAX_SECONDS_AHEAD,
                newest,
            )
            self._clamped_reported = int(count)

    def tier_stats(self) -> dict[str, float]:
        """Counters of a tiered table (`memory_rows`, `ssd_path`) since it was made.

        Keys: `lookups` and `hits` (unique keys of training lookups, and those
        found in memory), `hit_rate`, `promotions`, `demotions`, `bytes_read`,
        `bytes_written`, `compactions`, `steps` (training lookups), `cold_keys`,
        `memory_keys` (-1 outside eager mode), `disk_bytes` (records in the
        segment files, live or dead), `disk_bytes_per_key`, and the memory the
        cold keys take: `cold_index_bytes` (the cold index's buckets; -1
        outside eager mode), `cold_liveness_bytes` (a byte per record location
        of the segment numbers in use, grown an eighth at a time) and
        `ram_bytes_per_cold_key` (both per cold key).

        Raises:
          ValueError: the table is not tiered.
        """
        stats = getattr(self.backend, "tier_stats", None)
        if stats is None:
            raise ValueError(
                f"Sparse table {self.name!r} is not tiered: `tier_stats` needs a table "
                "made with `memory_rows` and `ssd_path`."
            )
        return stats(self)

    # ------------------------------------------------------------------ state
    def export(self, session=None) -> dict[str, Any]:
        """The live rows as numpy, sorted by key.

        Args:
          session: graph mode only (see `evict`).

        Returns:
          dict with `keys` [n] (key dtype), `values` [n, dim] in the rows' storage
          dtype (`value_dtype`), `slots` (slot name -> float32 [n, dim], or [n, 1]
          for a row-wise slot), `counts` int64 [n], `last_seen` int64 [n].
        """
        st = self.read_state(0, session, check=False)
        return {
            "keys": st["keys"].astype(self.key_dtype.as_numpy_dtype),
            "values": st["values"],
            "counts": st["counts"],
            "last_seen": st["last_seen"],
            "slots": {n: st[f"slot/{n}"] for n in self.slot_names},
        }

    def save(self, path: str, session=None) -> None:
        """Writes a full snapshot of this table to the file `path` (atomic, checksummed).

        Does not reset the delta tracking of `npu_rec.checkpoint.TableCheckpointManager`.

        Raises:
          npu_rec.TableInvariantError: the table's state is inconsistent or holds
            NaN/Inf (nothing is written; see `npu_rec.table._check`).
        """
        from npu_rec.checkpoint import _file_format  # checkpoint is above

        st = self.read_state(0, session)
        _file_format.write_file(
            path,
            _file_format.table_arrays(self.name, st),
            {"tables": {self.name: self.describe()}, "kind": "full"},
        )

    def restore(self, path: str, session=None) -> None:
        """Replaces this table's state by the snapshot in `path` (written by `save`).

        Raises:
          npu_rec.checkpoint.CheckpointCorruptedError: the file is truncated or altered.
          ValueError: the file holds no table of this name, or a different dim.
        """
        from npu_rec.checkpoint import _file_format  # checkpoint is above

        arrays, meta = _file_format.read_file(path)
        self.check_compatible(meta, path)
        self.write_state(_file_format.table_state(self.name, arrays), session)

    def check_compatible(self, meta: dict[str, Any], path: str) -> None:
        """Raises ValueError unless checkpoint `meta` has this table with the same layout."""
        desc = meta.get("tables", {}).get(self.name)
        if desc is None:
            raise ValueError(
                f"Checkpoint file {path!r} has no table named {self.name!r}; "
                f"it holds {sorted(meta.get('tables', {}))}."
            )
        if desc["dim"] != self.dim or list(desc["slots"]) != self.slot_names:
            raise ValueError(
                f"Checkpoint file {path!r} holds table {self.name!r} with dim={desc['dim']} "
                f"and slots={desc['slots']}, but the table has dim={self.dim} and "
                f"slots={self.slot_names} (is the optimizer the same?)."
            )


class TableEvictor:
    """Evicts from several tables in one call (`SparseTable.evict` runs one for its table).

    Eagerly, one `tf.function` (compiled on the first call) runs every table's
    eviction, side by side on TensorFlow's inter-op threads, and reads their
    clamped-timestamp reports; in a `tf.compat.v1` graph one `session.run`
    does. The front ends' eviction callback and hook use it: per table, the
    call and its synchronisation cost more than a small table's scan.

    Args:
      tables: The `SparseTable`s (distinct).
    """

    def __init__(self, tables):
        self.tables = tuple(tables)
        self._eager = None

    def __call__(self, now: int | None = None, session=None) -> dict[str, int]:
        """Rows freed per table name, as `{t.name: t.evict(now, session)}` would give."""
        tables = self.tables
        now_value = NO_NOW if now is None else int(now)
        if not tables:
            return {}
        if all(t._graph_mode for t in tables):
            sess = session or tf.compat.v1.get_default_session()
            if sess is None:  # the tables' own error, naming the first table
                tables[0]._session(None)
            fetches = [(t._graph_ops["evict"][1], t._graph_ops["clamped"]) for t in tables]
            out = sess.run(fetches, {t._graph_ops["evict"][0]: now_value for t in tables})
        elif tf.executing_eagerly() and not any(t._graph_mode for t in tables):
            if self._eager is None:
                # Compiled once: a whole-table scan runs multi-threaded, and the
                # metadata read is released before the scatters (no copy-on-write).
                self._eager = tf.function(
                    self._evict_all, input_signature=[tf.TensorSpec([], tf.int64)]
                )
                # One trace per evictor by design: without this, TF warns of
                # "excessive retracing" once every table of a model has evicted.
                quiet_retracing(self._eager)
            freed, clamped = self._eager(tf.constant(now_value, tf.int64))
            out = zip(freed.numpy(), clamped.numpy(), strict=True)
        else:  # tables of different graphs, or inside a tf.function: one by one
            return {t.name: t.evict(now=now, session=session) for t in tables}
        result = {}
        for table, (freed, (count, newest)) in zip(tables, out, strict=True):
            table._report_clamped(count, newest)
            result[table.name] = int(freed)
        return result

    def _evict_all(self, now: tf.Tensor):
        freed = [t.build_evict(now) for t in self.tables]
        return tf.stack(freed), tf.stack([t.clamped_report() for t in self.tables])


#: The `memory_stats` fields that are bytes of the table's arrays.
_BYTE_FIELDS = ("rows", "slots", "metadata", "index", "fallback")


def key_times(times, index, num_keys, batch_time) -> tf.Tensor:
    """int64 [num_keys]: each unique key's newest time (of per-id `times` [n], or `batch_time`)."""
    if batch_time is None:
        return tf.math.unsorted_segment_max(times, index, num_keys)
    return tf.fill(tf.reshape(num_keys, [1]), batch_time)


def rows_with_values(rows, grads, current, all_rows: bool):
    """(rows, grads, current) without the entries of rows < 0 (unchanged if `all_rows`)."""
    if all_rows:
        return rows, grads, current
    valid = tf.where(rows >= 0)[:, 0]
    return (
        tf.gather(rows, valid),
        tf.gather(grads, valid),
        None if current is None else tf.gather(current, valid),
    )
