"""`ShardState`: everything one table shard holds, declared in one place, and its export / import.

A `SingleShardTable` owns one `ShardState` (made by its backend at creation)
and a backend that builds every op on it (`npu_rec.table._backend`). The
state is TensorFlow resources only: the row store (`RowStorage`: rows,
optimizer slots, per-row metadata, free list), the key index (`KeyIndex`),
the counters of not-yet-admitted keys (`PendingCounts`), the keys evicted
since the last checkpoint save, the clocks, and in a `tf.compat.v1` graph the
lock of its training lookups and evictions (`_lock`).

The exported state (`build_export`, as NumPy once read) has: `keys` int64
[n], `values` [n, dim] in the storage dtype (`value_dtype`: float32, bfloat16
or float16), `slot/<name>` float32 [n, dim] (or [n, 1] for a slot kept per
row), `counts` and
`last_seen` int64 [n], `pending_keys`, `pending_counts`, `pending_last_seen`
int64 [p], `deleted_keys` int64 [d] (evicted since the last checkpoint save),
and the scalars `max_seen` (int64), `ts_feature` (bool), `opt_step` (int64).
`signature` gives each entry's dtype and shape; `build_load` takes the same
entries back.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from npu_rec.table import _lock
from npu_rec.table._admission import PendingCounts
from npu_rec.table._config import TableConfig
from npu_rec.table._key_index import KeyIndex
from npu_rec.table._storage import RowStorage, decode_seen


@dataclasses.dataclass(eq=False)
class ShardState:
    """The resources of one shard (see module docstring).

    Attributes:
      rows: Rows, optimizer slots, per-row metadata and free list.
      index: Raw key -> row.
      pending: Sighting counters of keys not admitted yet.
      deleted: Keys evicted since the last checkpoint save (key -> 1).
      max_seen: int64 scalar, the newest timestamp seen by training lookups.
      ts_feature: bool scalar, a training lookup had a timestamp feature.
      opt_step: int64 scalar, optimizer updates so far.
      clamped: int64 [2], timestamps clamped so far and the largest of them.
      lock: The critical section of training lookups and evictions (v1 graphs), or None.
    """

    rows: RowStorage
    index: KeyIndex
    pending: PendingCounts
    deleted: tf.lookup.experimental.MutableHashTable
    max_seen: tf.Variable
    ts_feature: tf.Variable
    opt_step: tf.Variable
    clamped: tf.Variable
    lock: tf.CriticalSection | None

    @classmethod
    def create(cls, config: TableConfig, map_class, graph_mode: bool, pad_rows=None) -> ShardState:
        """Makes the resources of a shard of `config` (inside the caller's name scope).

        Args:
          config: The shard's configuration.
          map_class: The key index's hash map class (`DenseHashTable` API).
          graph_mode: The shard lives in a `tf.compat.v1` graph (it gets a lock).
          pad_rows: `RowStorage`'s `pad_rows` (None: stock ops).
        """
        opt = config.optimizer
        rows = RowStorage(
            config.name,
            config.dim,
            opt.slot_specs if opt is not None else (),
            config.capacity,
            config.dynamic_expansion,
            value_dtype=config.value_dtype,
            row_slots=getattr(opt, "row_slots", ()),
            pad_rows=pad_rows,
        )
        index = KeyIndex(config.capacity, name="index", map_class=map_class)
        pending = PendingCounts(config.max_pending_keys)
        deleted = tf.lookup.experimental.MutableHashTable(
            tf.int64, tf.int64, default_value=0, name="deleted"
        )

        def scalar(value, name):
            return tf.Variable(value, trainable=False, name=name)

        max_seen = scalar(tf.constant(0, tf.int64), "max_seen")
        ts_feature = scalar(False, "ts_feature")
        opt_step = scalar(tf.constant(0, tf.int64), "opt_step")
        lock = _lock.make_lock(graph_mode, "lock")
        clamped = scalar(tf.zeros([2], tf.int64), "clamped_timestamps")
        return cls(rows, index, pending, deleted, max_seen, ts_feature, opt_step, clamped, lock)

    def variables(self) -> list[tf.Variable]:
        """The (non-trainable) variables of this state (not the hash maps)."""
        s = self.rows
        return [
            *s.per_row_variables(),
            s.free,
            s.next_row,
            s.num_free,
            self.max_seen,
            self.ts_feature,
            self.opt_step,
            self.index.removed,
            self.index.reserved_rows,
            self.clamped,
        ]

    def locked(self, fn):
        """`fn()`'s tensors, built inside the lock when the shard has one (v1 graphs)."""
        return _lock.run_locked(self.lock, fn)

    # ------------------------------------------------------------ export / import
    def signature(self, dim: int) -> dict[str, tuple[tf.DType, list]]:
        """dtype and shape of each exported entry (see module docstring)."""
        sig = {
            "keys": (tf.int64, [None]),
            "values": (self.rows.value_dtype, [None, dim]),
            "counts": (tf.int64, [None]),
            "last_seen": (tf.int64, [None]),
            "pending_keys": (tf.int64, [None]),
            "pending_counts": (tf.int64, [None]),
            "pending_last_seen": (tf.int64, [None]),
            "deleted_keys": (tf.int64, [None]),
            "max_seen": (tf.int64, []),
            "ts_feature": (tf.bool, []),
            "opt_step": (tf.int64, []),
        }
        sig.update({f"slot/{n}": (tf.float32, [None, w]) for n, w in self.rows.slot_dims.items()})
        return sig

    def build_export(self, min_period) -> dict[str, tf.Tensor]:
        """The state's tensors: live rows with >= `min_period` sightings this period."""
        s = self.rows
        rows = s.live_rows(min_period)
        pkeys, pstate = self.pending.export()
        out = {
            "keys": tf.gather(s.row_keys, rows),
            "values": tf.gather(s.values, rows),
            "counts": tf.cast(tf.gather(s.counts, rows), tf.int64),
            "last_seen": decode_seen(tf.gather(s.last_seen, rows)),
            "pending_keys": pkeys,
            "pending_counts": pstate[:, 0],
            "pending_last_seen": pstate[:, 1],
            "deleted_keys": self.deleted.export()[0],
            "max_seen": self.max_seen.read_value(),
            "ts_feature": self.ts_feature.read_value(),
            "opt_step": self.opt_step.read_value(),
        }
        for name, var in s.slots.items():
            out[f"slot/{name}"] = tf.gather(var, rows)
        return out

    def build_load(self, st: dict[str, tf.Tensor]) -> tf.Operation:
        """Replaces the whole state by `st` (the entries of `signature`)."""
        slots = {n: st[f"slot/{n}"] for n in self.rows.slots}
        old_deleted, _ = self.deleted.export()
        ops = [
            self.rows.load(st["keys"], st["values"], slots, st["counts"], st["last_seen"]),
            self.pending.load(
                st["pending_keys"], tf.stack([st["pending_counts"], st["pending_last_seen"]], 1)
            ),
            self.deleted.remove(old_deleted),
            self.max_seen.assign(st["max_seen"], read_value=False),
            self.ts_feature.assign(st["ts_feature"], read_value=False),
            self.opt_step.assign(st["opt_step"], read_value=False),
        ]
        n = tf.size(st["keys"], out_type=tf.int64)
        ops.append(self.index.reset(st["keys"], tf.range(n)))
        return tf.group(*ops)

    def build_end_period(self) -> tf.Operation:
        """Starts a new delta period: sightings since the save and evicted keys restart."""
        keys, _ = self.deleted.export()
        return tf.group(self.rows.reset_period(), self.deleted.remove(keys))
