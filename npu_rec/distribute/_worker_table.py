"""`WorkerShardedTable`: a sparse table split by key hash across the workers of a strategy.

Worker `w` of `W` owns the keys with `shard_of(key, W) == w` (the hash of
`npu_rec.table._sharded`, so the split is the one-process `num_shards=W`
split) and holds them in a plain, one-process `SparseTable` (`.local`):
hash map, rows, optimizer slots, admission counters and free list, in plain
(not mirrored) variables that the Keras optimizer never sees.

Inside a replica step (`model.fit` under `MultiWorkerMirroredStrategy`):

* lookup: each worker deduplicates its batch (as one process does) and
  sends each unique key, with its count and newest timestamp, to its owner
  only (`_step_exchange.Lookups`: a raw all-to-all; `RecModel`'s steps send
  the keys of all their tables in one); each owner merges the copies of its keys (counts summed,
  times maxed), so admission, eviction clocks and counts are exactly those
  of one process on the global batch, looks them up in `.local`, and the
  rows come back to the workers that asked;
* update: each worker sends the gradients of the rows it looked up to
  their owners (the way the keys went, one all-to-all per exchange); an owner sums the copies of a row and applies its sparse
  optimizer once per step (every owner steps, possibly with no rows, so
  Adam's step count is the one-process count).

A row id handed out (in `LookupRecord.rows`) is `local_row * W + owner`.

A tiered table (`memory_rows`, `ssd_path`) has a tiered `.local` on every
worker, with `ceil(memory_rows / W)` rows in memory: the owner's lookups
promote and demote (`npu_rec.table._tier`) as one process's do.

With `not_admitted="hashed"` every worker keeps a copy of the table's
fallback (`npu_rec.table._fallback`, plain variables): a key without a row
reads its fallback row on the worker that looked it up, and the owner admits
it from its own copy. The copies stay equal: each worker sums the
gradients of its keys without a row per bucket, one all-gather
(`gather_fallback_gradients`, for every such table of the step) hands all of
those sums to every worker, and each worker sums them per bucket and steps
its copy, the step one process takes on the global batch.
`export`, `save` and `size` describe this worker's keys; `restore` (and
`TableCheckpointManager.restore`) keep the keys this worker owns, so a
checkpoint of any number of workers, or of one process, restores here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any

import numpy as np
import tensorflow as tf

from npu_rec.distribute import _step_exchange, _tf_private
from npu_rec.distribute._exchange import Exchange
from npu_rec.table import _fallback, _lookup
from npu_rec.table._base import SparseTable, rows_with_values
from npu_rec.table._config import TableConfig
from npu_rec.table._sharded import shard_of, shard_of_numpy
from npu_rec.table._sparse import SingleShardTable

_ROW_FIELDS = ("keys", "values", "counts", "last_seen")
_PENDING_FIELDS = ("pending_keys", "pending_counts", "pending_last_seen")
_CONDITION = threading.local()


@contextlib.contextmanager
def updates_only_when(flag: tf.Tensor):
    """Table updates made in this block exchange their gradients, then apply them if `flag`.

    A loss-scaled step skips its update when a gradient is not finite. Every
    worker must still take part in the exchange (a collective cannot sit in one
    branch of a `tf.cond`), so the owners receive the gradients and skip only
    their local optimizer step. `flag` (a bool scalar) must be equal on every
    worker.
    """
    previous = getattr(_CONDITION, "flag", None)
    _CONDITION.flag = flag
    try:
        yield
    finally:
        _CONDITION.flag = previous


class WorkerShardedTable(SparseTable):
    """A `SparseTable` whose keys are split by hash across the workers of a strategy.

    Created by `npu_rec.create_table` (and so by `SparseEmbedding`) inside the
    scope of a `MultiWorkerMirroredStrategy` with more than one worker; see the
    module docstring.

    Example (on every worker, `TF_CONFIG` set by `python -m npu_rec.launch`):
      >>> strategy = npu_rec.distribute.multi_worker_strategy()
      >>> with strategy.scope():
      ...     table = npu_rec.create_table("item", 16, optimizer=npu_rec.optimizers.SGD(0.1))
      >>> table.num_workers, table.rank
      (2, 0)
    """

    #: Its lookups in `RecModel`'s steps are gathered into one exchange (`_step_exchange`).
    gathers_lookups = True

    def __init__(self, config: TableConfig, exchange: Exchange, backend):  # noqa: D107
        super().__init__(config, backend)
        self._exchange = exchange
        local_cfg = dataclasses.replace(
            config, name=f"{config.name}_worker{exchange.rank}", num_shards=1
        )
        if config.memory_rows is not None:  # tiered: divided as between one process's shards
            local_cfg = dataclasses.replace(
                local_cfg, memory_rows=-(-config.memory_rows // exchange.num_workers)
            )
        with _tf_private.outside_strategy():
            self.local = SingleShardTable(local_cfg, backend, register=False, seed_name=config.name)
        if self._graph_mode:
            with tf.init_scope():
                self._graph_ops = self._graph_ops_common(f"{config.name}_evict_now")

    @property
    def num_workers(self) -> int:
        return self._exchange.num_workers

    @property
    def rank(self) -> int:
        return self._exchange.rank

    @property
    def num_shards(self) -> int:
        """Shards in this process (1: the other workers hold the other shards)."""
        return 1

    @property
    def shards(self) -> list[SparseTable]:
        """This worker's shard (the other shards live in the other workers)."""
        return [self.local]

    @property
    def slot_names(self) -> list[str]:
        return self.local.slot_names

    def variables(self) -> list[tf.Variable]:
        fallback = [] if self.fallback is None else self.fallback.variables()
        return self.local.variables() + fallback

    #: Plain variables in the strategy's scope (the table's fallback: a copy per worker).
    local_variables = staticmethod(_tf_private.outside_strategy)

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", num_workers={self.num_workers}, rank={self.rank})"

    def owner_of(self, keys: tf.Tensor) -> tf.Tensor:
        """int32 [n]: the worker owning each int64 key."""
        return shard_of(keys, self.num_workers)

    # ------------------------------------------------------------ lookups
    def _gather(self, value):
        return self._exchange.gather(value, self.name)

    @tf.autograph.experimental.do_not_convert
    def lookup_unique(self, keys, counts, times, training, from_feature=False, batch_time=None):
        keys = tf.cast(keys, tf.int64)
        mode = _step_exchange.current()
        if mode is not None:  # the step's lookups are gathered (`prefetched_lookups`)
            got = mode.lookup(self, keys, counts, times, training, from_feature)
            if got is not None:
                return got
        # A lookup on its own: a size exchange, the ids out, the rows back.
        entry = _step_exchange.Entry(self, keys, counts, times, training, from_feature)
        return _step_exchange.Lookups(self._exchange, [entry]).results[0]

    def find_rows(self, keys):
        raise NotImplementedError(
            f"Sparse table {self.name!r} is sharded across workers: `apply_gradients(ids, "
            "grads)` is not supported on it; train it through `RecModel.fit` (recorded "
            "lookups) or `npu_rec.apply_recorded_gradients` inside the replica step."
        )

    # --------------------------------------------------------- gradients
    @tf.autograph.experimental.do_not_convert
    def apply_rows(self, rows, grads, all_rows=False, current=None):
        """Rows from anywhere: one all-gather of (row, gradient) to every worker (slow path)."""
        if self.optimizer is None:
            return self.local.apply_rows(rows, grads)  # raises the no-optimizer error
        rows, grads, _ = rows_with_values(rows, tf.cast(grads, tf.float32), None, all_rows)
        rows, grads = _unpack(self._gather(_pack(rows, grads)))
        return self._apply_mine(rows, grads, tf.equal(rows % self.num_workers, self.rank))

    @property
    def exchange_group(self):
        """Tables of one group send their gradients together (`apply_records_together`)."""
        return None if self.optimizer is None else ("workers", self.num_workers, self.rank)

    @tf.autograph.experimental.do_not_convert
    def apply_records_together(self, pairs):
        """Applies the gradients of recorded lookups of tables of this `exchange_group`.

        Args:
          pairs: `(LookupRecord, gradient)` per lookup: dense [u, dim] or the per-id
            `tf.IndexedSlices` of the lookup's embeddings.

        The gradients of the lookups exchanged together (`_step_exchange.Lookups`)
        go back to their owners in one collective, the way their ids went.
        """
        by_lookups: dict[int, tuple[_step_exchange.Lookups, dict]] = {}
        rest = []
        for rec, grad in pairs:
            hit = _step_exchange.registered(rec.embeddings)
            if hit is None:
                dense = _lookup.densify(grad, tf.shape(rec.rows, out_type=tf.int64)[0])
                rest.append((rec.table, rec.rows, dense, rec.table.admits_at_once))
                continue
            lookups, index = hit
            grads = by_lookups.setdefault(id(lookups), (lookups, {}))[1]
            grads[index] = grad if index not in grads else _add(grads[index], grad)
        flag = getattr(_CONDITION, "flag", None)
        ops = [lookups.apply(grads, flag) for lookups, grads in by_lookups.values()]
        if rest:
            ops.append(self.apply_rows_together(rest))
        return tf.group(ops)

    def apply_local(self, local_rows, grads, mine, condition=None, merged=None):
        """Sums the gradients of this worker's rows `local_rows[mine]` per row and steps once.

        `mine`: bool [n], or None for every row. `condition` (a bool scalar
        equal on every worker, or None): step only if True. `merged`: the
        rows already deduplicated, (unique rows [u] (-1: skipped), index [n]
        of each gradient into them), as the owner's training lookup kernel
        merged the same copies; then `local_rows` and `mine` are not used.
        """
        if merged is not None:
            rows, at = merged
        else:
            if mine is not None:
                mine = tf.where(mine)[:, 0]
                local_rows, grads = tf.gather(local_rows, mine), tf.gather(grads, mine)
            rows, at = tf.unique(local_rows, out_idx=tf.int64)
        all_rows = merged is None or self.local.admits_at_once
        if self.local.sums_slices:  # the update kernel sums the copies itself
            summed = tf.IndexedSlices(grads, at)
        else:
            summed = tf.math.unsorted_segment_sum(grads, at, tf.size(rows, out_type=tf.int64))
        if condition is None:
            return self.local.apply_rows(rows, summed, all_rows=all_rows)

        def apply():
            op = self.local.apply_rows(rows, summed, all_rows=all_rows)
            with tf.control_dependencies([] if op is None else [op]):
                return tf.constant(True)

        return tf.cond(condition, apply, lambda: tf.constant(False))

    @tf.autograph.experimental.do_not_convert
    def apply_rows_together(self, updates):
        """`apply_rows` of several tables of this `exchange_group` with one all-gather.

        Args:
          updates: `(table, rows, grads, all_rows)` per table, as `apply_rows` takes them.

        The slow path, for rows not looked up by a `_step_exchange.Lookups` of
        this step: each worker sends float32 [n, 3 + max dim] (the row id bit-cast
        into two columns, the table's position in `updates`, the gradient padded
        to the widest table) to every worker; each owner picks its rows.
        """
        width = max(t.dim for t, *_ in updates)
        parts = []
        for i, (t, rows, grads, all_rows) in enumerate(updates):
            rows, grads, _ = rows_with_values(rows, tf.cast(grads, tf.float32), None, all_rows)
            index = tf.fill(tf.stack([tf.shape(rows)[0], 1]), float(i))
            padded = tf.pad(grads, [[0, 0], [0, width - t.dim]])
            parts.append(tf.concat([tf.bitcast(rows, tf.float32), index, padded], 1))
        everyone = self._gather(tf.concat(parts, 0))
        rows = tf.bitcast(everyone[:, :2], tf.int64)
        which = everyone[:, 2]
        mine = tf.equal(rows % self.num_workers, self.rank)
        ops = []
        for i, (t, *_) in enumerate(updates):
            ops.append(
                t._apply_mine(rows, everyone[:, 3 : 3 + t.dim], mine & tf.equal(which, float(i)))
            )
        return tf.group([op for op in ops if op is not None])

    @tf.autograph.experimental.do_not_convert
    def gather_fallback_gradients(self, parts):
        """Every worker's fallback bucket sums, per table: one all-gather for all of them.

        Args:
          parts: `(buckets int64 [k], summed gradients float32 [k, dim])` per table
            of this strategy with a fallback (the same tables, in the same order,
            on every worker).

        Returns:
          `(buckets, gradients)` per part: every worker's, in worker order.
        """
        width = max(int(g.shape[1]) for _, g in parts)
        packed = []
        for i, (buckets, grads) in enumerate(parts):
            index = tf.fill(tf.stack([tf.shape(buckets)[0], 1]), float(i))
            padded = tf.pad(grads, [[0, 0], [0, width - int(grads.shape[1])]])
            # The bucket as two exact float32 numbers (24 bits each), not bit-cast: a
            # bit pattern of a small integer is a denormal float, which arithmetic may flush.
            high = tf.cast(tf.bitwise.right_shift(buckets, 24), tf.float32)[:, None]
            low = tf.cast(tf.bitwise.bitwise_and(buckets, 0xFFFFFF), tf.float32)[:, None]
            packed.append(tf.concat([high, low, index, padded], 1))
        everyone = self._gather(tf.concat(packed, 0))
        which = everyone[:, 2]
        out = []
        for i, (_, grads) in enumerate(parts):
            got = tf.gather(everyone, tf.where(tf.equal(which, float(i)))[:, 0])
            buckets = tf.cast(got[:, 0], tf.int64) * (1 << 24) + tf.cast(got[:, 1], tf.int64)
            out.append((buckets, got[:, 3 : 3 + int(grads.shape[1])]))
        return out

    def update_condition(self):
        """The bool scalar of `updates_only_when` around this update, or None."""
        return getattr(_CONDITION, "flag", None)

    def _apply_mine(self, rows, grads, mine):
        """Sums the gradients of the `mine` rows (global ids) per row and applies them."""
        flag = getattr(_CONDITION, "flag", None)
        return self.apply_local(rows // self.num_workers, grads, mine, flag)

    # ------------------------------------------------------- maintenance
    # `size()` and `evict()` (from `SparseTable`) count and free this worker's keys;
    # `evict(now=None)` uses this worker's clock (the newest timestamp among its own
    # keys' lookups, or the wall clock), not the newest over all workers: pass `now`
    # for the one-process rule.
    def build_size(self) -> tf.Tensor:
        return self.local.build_size()

    def build_evict(self, now: tf.Tensor) -> tf.Tensor:
        return self.local.build_evict(now)

    def clock(self) -> tuple[tf.Tensor, tf.Tensor]:
        return self.local.clock()

    def clamped_report(self) -> tf.Tensor:
        return self.local.clamped_report()

    # ------------------------------------------------------------- state
    def read_state(
        self, min_period: int = 0, session=None, check: bool = True
    ) -> dict[str, np.ndarray]:
        st = self.local.read_state(min_period, session, check)
        return _fallback.read_into(self, st, session, check)

    def write_state(self, st: dict[str, np.ndarray], session=None) -> None:
        """Loads the keys of `st` that this worker owns (`st` may hold any worker's keys)."""
        st = self.fit_restored_slots(st)  # before anything changes
        _fallback.write_from(self, st, session)
        st = {k: v for k, v in st.items() if not k.startswith(_fallback.PREFIX)}
        row_fields = [*_ROW_FIELDS, *[f"slot/{n}" for n in self.slot_names]]
        mine_rows = shard_of_numpy(st["keys"], self.num_workers) == self.rank
        mine_pend = shard_of_numpy(st["pending_keys"], self.num_workers) == self.rank
        sub = {k: v for k, v in st.items() if k not in row_fields + list(_PENDING_FIELDS)}
        sub.update({f: np.asarray(st[f])[mine_rows] for f in row_fields})
        sub.update({f: np.asarray(st[f])[mine_pend] for f in _PENDING_FIELDS})
        self.local.write_state(sub, session)

    def end_period(self, session=None) -> None:
        self.local.end_period(session)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "num_workers": self.num_workers, "rank": self.rank}


def _add(a, b):
    """The sum of two gradients of one lookup (dense or `tf.IndexedSlices`)."""
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return tf.IndexedSlices(
            tf.concat([a.values, b.values], 0),
            tf.concat([tf.cast(a.indices, tf.int64), tf.cast(b.indices, tf.int64)], 0),
            a.dense_shape,
        )
    return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)


def _pack(rows: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
    """float32 [n, 2 + dim]: int64 rows [n] bit-cast into two columns, then values [n, dim]."""
    return tf.concat([tf.bitcast(rows, tf.float32), values], 1)


def _unpack(packed: tf.Tensor):
    """(int64 rows [n], float32 values [n, dim]) from `_pack`'s result (bit-exact)."""
    return tf.bitcast(packed[:, :2], tf.int64), packed[:, 2:]
