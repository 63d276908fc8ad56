"""`ShardedTable`: a sparse table split by key hash into single-shard tables.

Key `k` lives in shard `shard_of(k) = (splitmix64(k) >> 32) mod S`; each
shard is a `SingleShardTable` (own hash map, rows, slots, counters, free
list) that is not registered under its own name; the two classes are
siblings under `SparseTable`. The sharded table routes
the unique keys of a batch to their shards (`tf.dynamic_partition`) and
stitches the rows back in order, so lookups, gradients, eviction, export,
`save`/`restore` and `TableCheckpointManager` see one table.

A row id handed out by a sharded table (in `LookupRecord.rows`) is
`local_row * S + shard`, so `apply_recorded_gradients` can merge records and
send each gradient back to its shard without another hash lookup.

Checkpoints hold the merged state (sorted by key) and record `num_shards`
for information only: restoring re-routes every key by its hash, so a
checkpoint restores into a table with any shard count.

All shards share the table's initializer seed (a key's first row does not
depend on its shard), its optimizer step and its clock: `evict(None)` uses
the newest timestamp over all shards.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf

from npu_rec.table import _check as _table_check
from npu_rec.table import _fallback
from npu_rec.table._base import NO_NOW, SparseTable, rows_with_values
from npu_rec.table._config import TableConfig
from npu_rec.table._keyed_init import _splitmix64
from npu_rec.table._sparse import SingleShardTable

_M64 = (1 << 64) - 1
_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_ROW_FIELDS = ("keys", "values", "counts", "last_seen")
_PENDING_FIELDS = ("pending_keys", "pending_counts", "pending_last_seen")


def shard_of(keys: tf.Tensor, num_shards: int) -> tf.Tensor:
    """int32 [n] shard of each int64 key: `(splitmix64(key) >> 32) mod num_shards`."""
    h = _splitmix64(tf.bitcast(tf.cast(keys, tf.int64), tf.uint64))
    high = tf.bitwise.right_shift(h, tf.constant(32, tf.uint64))
    return tf.cast(high % tf.constant(num_shards, tf.uint64), tf.int32)


def shard_of_numpy(keys: np.ndarray, num_shards: int) -> np.ndarray:
    """NumPy twin of `shard_of` (int64 [n] -> int64 [n])."""
    z = np.asarray(keys, np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        z = z + np.uint64(_GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
        z = z ^ (z >> np.uint64(31))
    return ((z >> np.uint64(32)) % np.uint64(num_shards)).astype(np.int64)


class ShardedTable(SparseTable):
    """A `SparseTable` split by key hash into `num_shards` single-shard tables.

    Create it with `npu_rec.create_table(..., num_shards=S)`; use it exactly
    like an unsharded table. See the module docstring for routing and state.

    Example:
      >>> table = npu_rec.create_table("item", 16, num_shards=4,
      ...                              optimizer=npu_rec.optimizers.Adagrad(0.05))
      >>> emb = npu_rec.sparse_lookup(table, tf.constant([[3, 7]], tf.int64))  # [1, 2, 16]
    """

    def __init__(self, config: TableConfig, backend, devices=None):
        """`backend`: the shards' `TableBackend`; `devices[s]` (optional): the device of
        shard `s`'s state (`tf.compat.v1.device`)."""
        super().__init__(config, backend)
        n = config.num_shards
        shard_cfg = dataclasses.replace(
            config,
            num_shards=1,
            capacity=-(-config.capacity // n),
            max_pending_keys=max(2, -(-config.max_pending_keys // n)),
            memory_rows=None if config.memory_rows is None else -(-config.memory_rows // n),
        )
        self._shards = []
        for s in range(n):
            place = contextlib.nullcontext() if devices is None else tf.compat.v1.device(devices[s])
            with place:
                self._shards.append(
                    SingleShardTable(
                        dataclasses.replace(shard_cfg, name=f"{config.name}_shard{s}"),
                        backend,
                        register=False,
                        seed_name=config.name,
                        fan_rows=config.capacity,
                    )
                )
        if self._graph_mode:
            with tf.init_scope():
                self._graph_ops = self._graph_ops_common(f"{config.name}_evict_now")

    @property
    def num_shards(self) -> int:
        return len(self._shards)

    @property
    def shards(self) -> list[SparseTable]:
        return list(self._shards)

    @property
    def slot_names(self) -> list[str]:
        return self._shards[0].slot_names

    def variables(self) -> list[tf.Variable]:
        fallback = [] if self.fallback is None else self.fallback.variables()
        return [v for s in self._shards for v in s.variables()] + fallback

    # ------------------------------------------------------------ routing
    def _partition(self, keys: tf.Tensor, *values):
        sid = shard_of(keys, self.num_shards)
        pos = tf.dynamic_partition(tf.range(tf.size(sid)), sid, self.num_shards)
        parts = [
            tf.dynamic_partition(v, sid, self.num_shards)
            if v is not None
            else [None] * self.num_shards
            for v in (keys, *values)
        ]
        return pos, parts

    def _global_rows(self, local: tf.Tensor, shard: int) -> tf.Tensor:
        return tf.where(local >= 0, local * self.num_shards + shard, tf.constant(-1, tf.int64))

    @tf.autograph.experimental.do_not_convert
    def lookup_unique(self, keys, counts, times, training, from_feature=False, batch_time=None):
        pos, (pk, pc, pt) = self._partition(keys, counts, times)
        rows, embs = [], []
        for s, shard in enumerate(self._shards):
            r, e = shard.lookup_unique(pk[s], pc[s], pt[s], training, from_feature, batch_time)
            rows.append(self._global_rows(r, s))
            embs.append(e)
        return tf.dynamic_stitch(pos, rows), tf.dynamic_stitch(pos, embs)

    def find_rows(self, keys):
        pos, (pk,) = self._partition(keys)
        return tf.dynamic_stitch(
            pos,
            [self._global_rows(shard.find_rows(pk[s]), s) for s, shard in enumerate(self._shards)],
        )

    @tf.autograph.experimental.do_not_convert
    def apply_rows(self, rows, grads, all_rows=False, current=None):
        self._require_optimizer()
        rows, grads, current = rows_with_values(rows, tf.cast(grads, tf.float32), current, all_rows)
        sid = tf.cast(rows % self.num_shards, tf.int32)
        local = tf.dynamic_partition(rows // self.num_shards, sid, self.num_shards)
        part = tf.dynamic_partition(grads, sid, self.num_shards)
        now = (
            [None] * self.num_shards
            if current is None
            else tf.dynamic_partition(current, sid, self.num_shards)
        )
        # Every shard steps (possibly with no rows), so their optimizer steps stay equal.
        return tf.group(
            *[
                shard.apply_rows(local[s], part[s], all_rows=True, current=now[s])
                for s, shard in enumerate(self._shards)
            ]
        )

    # -------------------------------------------------------- maintenance
    def build_size(self) -> tf.Tensor:
        return tf.add_n([s.build_size() for s in self._shards])

    def clamped_report(self) -> tf.Tensor:
        reports = tf.stack([s.clamped_report() for s in self._shards])
        return tf.stack([tf.reduce_sum(reports[:, 0]), tf.reduce_max(reports[:, 1])])

    def clock(self) -> tuple[tf.Tensor, tf.Tensor]:
        clocks = [s.clock() for s in self._shards]
        return (
            tf.reduce_max(tf.stack([seen for seen, _ in clocks])),
            tf.reduce_any(tf.stack([ts for _, ts in clocks])),
        )

    def build_evict(self, now: tf.Tensor) -> tf.Tensor:
        if not self.config.eviction:
            return tf.constant(0, tf.int64)
        now = tf.where(tf.equal(now, NO_NOW), self.default_now(), now)
        return tf.add_n([s.build_evict(now) for s in self._shards])

    # -------------------------------------------------------------- state
    def read_state(
        self, min_period: int = 0, session=None, check: bool = True
    ) -> dict[str, np.ndarray]:
        parts = [s.read_state(min_period, session, check) for s in self._shards]
        st: dict[str, Any] = {}
        row_fields = [*_ROW_FIELDS, *[f"slot/{n}" for n in self.slot_names]]
        for fields in (row_fields, _PENDING_FIELDS, ("deleted_keys",)):
            merged = {f: np.concatenate([p[f] for p in parts]) for f in fields}
            order = np.argsort(merged[fields[0]], kind="stable")
            st.update({f: v[order] for f, v in merged.items()})
        st["max_seen"] = np.max([p["max_seen"] for p in parts])
        st["ts_feature"] = np.any([p["ts_feature"] for p in parts])
        st["opt_step"] = parts[0]["opt_step"]
        if check:  # a key in two shards (each shard checked itself)
            _table_check.verify_unique_keys(self.name, st["keys"])
        return _fallback.read_into(self, st, session, check)

    def write_state(self, st: dict[str, np.ndarray], session=None) -> None:
        st = self.fit_restored_slots(st)  # before any shard changes
        self.note_value_conversion(st["values"])
        _fallback.write_from(self, st, session)
        st = {k: v for k, v in st.items() if not k.startswith(_fallback.PREFIX)}
        row_fields = [*_ROW_FIELDS, *[f"slot/{n}" for n in self.slot_names]]
        rows_sid = shard_of_numpy(st["keys"], self.num_shards)
        pend_sid = shard_of_numpy(st["pending_keys"], self.num_shards)
        for s, shard in enumerate(self._shards):
            sub = {k: v for k, v in st.items() if k not in row_fields + list(_PENDING_FIELDS)}
            sub.update({f: np.asarray(st[f])[rows_sid == s] for f in row_fields})
            sub.update({f: np.asarray(st[f])[pend_sid == s] for f in _PENDING_FIELDS})
            shard.write_state(sub, session)

    def end_period(self, session=None) -> None:
        for s in self._shards:
            s.end_period(session)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "num_shards": self.num_shards}
