"""The lookups of a step's worker-sharded tables in one exchange, and their gradients in one more.

`Lookups` moves the unique ids of several lookups (of any tables of one
strategy) to their owners in one `Route`: a size exchange, then one
all-to-all of (key, lookup, count, newest time); each owner merges the
copies of each lookup's keys (counts summed, times maxed: one process's
admission and eviction clocks on the global batch), looks them up in its
local shard in the lookups' order, and one all-to-all brings the rows back.
`Lookups.apply` sends the row gradients the same way the ids went (same
layout: no size exchange); each owner sums the copies of a row over the
lookups of its table and steps that table's optimizer once.

A lookup made alone (`WorkerShardedTable.lookup_unique` outside
`prefetched_lookups`) is a `Lookups` of one: 3 collectives for the ids and
rows, 1 for its gradients. `prefetched_lookups` gathers a step's lookups
before its forward pass, so a step makes one `Lookups` for every table:

1. collect: the model runs once with `training=False` (so no layer updates
   its state) while every lookup of a worker-sharded table records its ids
   (with the counts and times of a training lookup when the step trains)
   and returns zeros; the ops that only fed the model's outputs are pruned
   from the step's graph, the id computations stay;
2. exchange: one `Lookups` of every recorded lookup;
3. serve: the model runs for real; each lookup of a table takes the rows of
   that table's next recorded lookup.

A lookup whose ids are computed from another lookup's rows (known only after
the forward pass has begun) cannot be gathered beforehand: its table's
lookups take the one-lookup path (logged once).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading

import tensorflow as tf

from npu_rec import _log as logging
from npu_rec._kernels import _ops as _kernel_ops
from npu_rec.table import _lookup
from npu_rec.table._fused import KernelBackend

_STATE = threading.local()
_LOGGED: set[str] = set()


@dataclasses.dataclass
class Entry:
    """One lookup of a worker-sharded table: unique keys int64 [u], and how to count them."""

    table: object  # WorkerShardedTable
    keys: tf.Tensor
    counts: tf.Tensor | None
    times: tf.Tensor | None
    training: bool
    from_feature: bool


class Lookups:
    """Several lookups exchanged together; `results[i]` is (rows, embeddings) of `entries[i]`.

    Every worker must create it with the same entries (tables, training flags,
    widths) at the same point of the same step: it runs collectives.
    """

    def __init__(self, exchange, entries: list[Entry]):
        self._exchange = exchange
        self.entries = list(entries)
        workers, rank = exchange.num_workers, exchange.rank
        self.width = max(e.table.dim for e in self.entries)
        training = any(e.training for e in self.entries)
        keys = tf.concat([tf.cast(e.keys, tf.int64) for e in self.entries], 0)
        which = tf.concat(
            [
                tf.fill(tf.shape(e.keys), tf.constant(i, tf.int64))
                for i, e in enumerate(self.entries)
            ],
            0,
        )
        columns = [keys, which]
        if training:
            columns += [
                tf.concat([_counts(e) for e in self.entries], 0),
                tf.concat([_times(e) for e in self.entries], 0),
            ]
        dest = self.entries[0].table.owner_of(keys)
        self._route = exchange.route(dest, self.entries[0].table.name)
        got = self._route.send(tf.stack(columns, 1))  # [m, 2 or 4]
        self._which = tf.cast(got[:, 1], tf.int32)
        # One partition op per column for all the lookups (few ops per lookup: a step's
        # ops run one after another on a worker's thread).
        n_entries = len(self.entries)
        positions = tf.dynamic_partition(tf.range(tf.shape(got)[0]), self._which, n_entries)
        keys_of = tf.dynamic_partition(got[:, 0], self._which, n_entries)
        if training:
            counts_of = tf.dynamic_partition(got[:, 2], self._which, n_entries)
            times_of = tf.dynamic_partition(got[:, 3], self._which, n_entries)
        local_rows, embs = [], []
        #: Lookup -> (its unique local rows [u], each received copy's index into them),
        #: for the training lookups merged in the kernel: their owners' updates reuse
        #: them (no `Unique` of the received rows per table).
        self._merged: dict[int, tuple[tf.Tensor, tf.Tensor]] = {}
        for i, entry in enumerate(self.entries):
            local = entry.table.local
            if entry.training and _merges_in_kernel(local):
                # The training lookup kernel merges the copies itself (counts summed,
                # times maxed, first-occurrence order, as below): one op, not four.
                _, at, rows, emb = local.state.locked(
                    lambda local=local, i=i, entry=entry: local.backend.fused_lookup(
                        local, keys_of[i], counts_of[i], times_of[i], entry.from_feature, None
                    )
                )
                if entry.table.dim != self.width:
                    emb = tf.pad(emb, [[0, 0], [0, self.width - entry.table.dim]])
                self._merged[i] = (rows, at)
                local_rows.append(_kernel_ops.take(rows, at))
                embs.append(_kernel_ops.take(emb, at))
                continue
            uniq, at = tf.unique(keys_of[i], out_idx=tf.int64)
            if entry.training:
                n_uniq = tf.size(uniq, out_type=tf.int64)
                counts = tf.math.unsorted_segment_sum(counts_of[i], at, n_uniq)
                times = tf.math.unsorted_segment_max(times_of[i], at, n_uniq)
                rows, emb = local.lookup_unique(
                    uniq, counts, times, True, from_feature=entry.from_feature
                )
            else:
                rows, emb = local.lookup_unique(uniq, None, None, False)
            if entry.table.dim != self.width:
                emb = tf.pad(emb, [[0, 0], [0, self.width - entry.table.dim]])
            local_rows.append(_kernel_ops.take(rows, at))
            embs.append(_kernel_ops.take(emb, at))
        #: Per received item: this worker's row (-1: not admitted).
        self._local_rows = tf.dynamic_stitch(positions, local_rows)
        global_rows = tf.where(
            self._local_rows >= 0,
            self._local_rows * workers + rank,
            tf.constant(-1, tf.int64),
        )
        back = self._route.reply(_pack(global_rows, tf.dynamic_stitch(positions, embs)))
        rows, emb = _unpack(back)
        sizes = [tf.shape(e.keys)[0] for e in self.entries]
        self.results = []
        for entry, r, v in zip(
            self.entries, tf.split(rows, sizes), tf.split(emb, sizes), strict=True
        ):
            if entry.table.dim != self.width:
                v = v[:, : entry.table.dim]
            # The way back for the gradient, on the tensor itself (it lives as long as its
            # graph): npu_rec's own attribute, read only by `registered`.
            v.npu_rec_exchange = (self, len(self.results))
            self.results.append((r, v))

    @tf.autograph.experimental.do_not_convert
    def apply(self, grads: dict[int, tf.Tensor], condition=None) -> tf.Operation:
        """Sends the gradients of the lookups (`grads`: lookup -> float32 [u, dim]) to the owners.

        Each owner sums the copies of each of its rows over the lookups of one
        table and steps that table's optimizer once (every owner steps every
        table that has a gradient, possibly with no rows: Adam's step count is
        one process's). Lookups without a gradient send zeros and step nothing.
        `condition` (a bool scalar equal on every worker, or None): apply only if True.
        """
        got = self._route.send(self._gradient_buffer(grads))
        lookups_of: dict[int, list[int]] = {}  # id(table) -> its lookups with a gradient
        for i in sorted(grads):
            lookups_of.setdefault(id(self.entries[i].table), []).append(i)
        ops = []
        # A table with one lookup merged in the kernel: the lookup's unique rows and
        # index are those of its received gradient copies (laid out as the ids came).
        single = [ii[0] for ii in lookups_of.values() if len(ii) == 1 and ii[0] in self._merged]
        if single:
            grads_by_lookup = tf.dynamic_partition(got, self._which, len(self.entries))
            for i in single:
                table = self.entries[i].table
                g = grads_by_lookup[i]
                g = g if table.dim == self.width else g[:, : table.dim]
                ops.append(table.apply_local(None, g, None, condition, merged=self._merged[i]))
        tables: dict[int, tuple[object, int]] = {}  # id(table) -> (table, its bin)
        bin_of = [-1] * len(self.entries)
        for i in sorted(grads):
            if i not in single:
                table = self.entries[i].table
                bin_of[i] = tables.setdefault(id(table), (table, len(tables)))[1]
        if tables:
            n_bins = len(tables)
            # Bin of each received row: its table's, or the last (discarded): not
            # admitted, a lookup without a gradient, or a table updated above.
            bins = tf.gather(tf.constant(bin_of, tf.int32), self._which)
            bins = tf.where((bins >= 0) & (self._local_rows >= 0), bins, n_bins)
            rows_of = tf.dynamic_partition(self._local_rows, bins, n_bins + 1)
            grads_of = tf.dynamic_partition(got, bins, n_bins + 1)
            for table, b in tables.values():
                g = grads_of[b] if table.dim == self.width else grads_of[b][:, : table.dim]
                ops.append(table.apply_local(rows_of[b], g, None, condition))
        return tf.group([op for op in ops if op is not None])

    def _gradient_buffer(self, grads: dict[int, object]) -> tf.Tensor:
        """float32 [sum of the lookups' u, width]: each lookup's gradient summed per row.

        `grads[i]` is dense [u_i, dim] or the per-id `tf.IndexedSlices` of lookup
        i's rows; where every lookup's table is on the kernel backend one op sums
        the slices of every lookup (`NpuRecSumSlices`), else a `tf.scatter_nd`
        per lookup.
        """
        sizes = [tf.shape(e.keys, out_type=tf.int64)[0] for e in self.entries]
        if all(_on_kernels(e.table.local) for e in self.entries):
            parts = []
            for i, (entry, u) in enumerate(zip(self.entries, sizes, strict=True)):
                g = grads.get(i)
                if g is None:
                    parts.append((tf.zeros([0, entry.table.dim]), tf.zeros([0], tf.int64), u))
                elif isinstance(g, tf.IndexedSlices):
                    at = tf.cast(g.indices, tf.int64)
                    parts.append((tf.cast(g.values, tf.float32), at, u))
                else:
                    parts.append((tf.cast(g, tf.float32), tf.range(u), u))
            return _kernel_ops.sum_slices(parts, self.width)
        parts = []
        for i, (entry, u) in enumerate(zip(self.entries, sizes, strict=True)):
            g = grads.get(i)
            if g is None:
                parts.append(tf.zeros(tf.stack([u, self.width])))
                continue
            g = tf.cast(_lookup.densify(g, u), tf.float32)
            if entry.table.dim != self.width:
                g = tf.pad(g, [[0, 0], [0, self.width - entry.table.dim]])
            parts.append(g)
        return tf.concat(parts, 0)


def _merges_in_kernel(local) -> bool:
    """Whether a worker's shard `local` takes repeated keys with counts in its training lookup.

    The kernel backend's training lookup (`NpuRecTrainLookup`) deduplicates
    keys with per-key counts and times itself; other backends (stock ops, a
    tiered table) take the merged unique keys.
    """
    return type(getattr(local, "backend", None)) is KernelBackend


def _on_kernels(local) -> bool:
    """Whether a worker's shard `local` runs on the kernel backend (or the tier over it).

    Its backend was chosen when the table was made, the kernels' only where
    they load: the exchange follows the tables' choice rather than asking again.
    """
    return isinstance(getattr(local, "backend", None), KernelBackend)


def registered(embeddings: tf.Tensor):
    """(Lookups, index) that produced `embeddings` (a lookup's result), or None."""
    return getattr(embeddings, "npu_rec_exchange", None)


def _counts(entry: Entry) -> tf.Tensor:
    if entry.counts is None:
        return tf.ones(tf.shape(entry.keys), tf.int64)
    return tf.cast(entry.counts, tf.int64)


def _times(entry: Entry) -> tf.Tensor:
    if entry.times is None:
        return tf.zeros(tf.shape(entry.keys), tf.int64)
    return tf.broadcast_to(tf.cast(entry.times, tf.int64), tf.shape(entry.keys))


def _pack(rows: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
    """float32 [n, 2 + dim]: int64 rows [n] bit-cast into two columns, then values [n, dim]."""
    return tf.concat([tf.bitcast(rows, tf.float32), values], 1)


def _unpack(packed: tf.Tensor):
    """(int64 rows [n], float32 values [n, dim]) from `_pack`'s result (bit-exact)."""
    return tf.bitcast(packed[:, :2], tf.int64), packed[:, 2:]


def _log_once(key: str, message: str, *args) -> None:
    if key not in _LOGGED:
        _LOGGED.add(key)
        logging.info(message, *args)


# ----------------------------------------------------------------- one step's lookups
def current():
    """The `_Collector` or `_Server` of the step being traced in this thread, or None."""
    return getattr(_STATE, "mode", None)


class _Collector:
    """The collect pass: records each lookup of a worker-sharded table, returns zeros."""

    def __init__(self, training: bool, is_sharded):
        self.training = training
        self._is_sharded = is_sharded
        self.entries: list[Entry] = []
        self.inner: dict[int, object] = {}  # tables whose ids come from other lookups' rows
        self._outputs: set = set()

    def training_of(self, table, is_training: bool) -> bool:
        """The lookup mode `sparse_lookup` uses for `table` in this pass (`_lookup` hook)."""
        return self.training if self._is_sharded(table) else is_training

    def lookup(self, table, keys, counts, times, training, from_feature):
        if self._depends_on_lookups(keys):
            if id(table) not in self.inner:
                _log_once(
                    f"inner:{table.name}",
                    "npu_rec: the ids of a lookup of table %r are computed from other "
                    "lookups' rows inside the model, so they are not known before the "
                    "forward pass: this table's lookups are exchanged one by one (3 more "
                    "collectives each).",
                    table.name,
                )
            self.inner[id(table)] = table
        else:
            self.entries.append(Entry(table, keys, counts, times, training, from_feature))
        rows = tf.fill(tf.shape(keys), tf.constant(-1, tf.int64))
        emb = tf.zeros(tf.stack([tf.shape(keys)[0], table.dim]))
        self._outputs.update((rows.op, emb.op))
        return rows, emb

    def _depends_on_lookups(self, tensor: tf.Tensor) -> bool:
        if not self._outputs:
            return False
        seen, stack = set(), [tensor.op]
        while stack:
            op = stack.pop()
            if op in self._outputs:
                return True
            for t in op.inputs:
                if t.op not in seen:
                    seen.add(t.op)
                    stack.append(t.op)
        return False


class _Server:
    """The real pass: each lookup of a table takes the rows of its next recorded lookup."""

    def __init__(self, lookups: Lookups | None, inner: dict[int, object]):
        self._inner = inner
        self._queues: dict[int, list[int]] = {}
        self._lookups = lookups
        for i, entry in enumerate([] if lookups is None else lookups.entries):
            self._queues.setdefault(id(entry.table), []).append(i)

    def training_of(self, table, is_training: bool) -> bool:
        return is_training

    def lookup(self, table, keys, counts, times, training, from_feature):
        if id(table) in self._inner:
            return None
        queue = self._queues.get(id(table))
        if not queue or self._lookups.entries[queue[0]].training != training:
            _log_once(
                f"extra:{table.name}",
                "npu_rec: table %r was looked up in the step in a way the model's "
                "collect pass did not show (a lookup that depends on `training`?); "
                "that lookup is exchanged on its own.",
                table.name,
            )
            return None
        return self._lookups.results[queue.pop(0)]

    def unused(self) -> list[str]:
        return sorted(
            {self._lookups.entries[i].table.name for q in self._queues.values() for i in q}
        )


class _Shapes:
    """A pass for shapes only (a graph never run): lookups return zeros, record nothing."""

    def training_of(self, table, is_training: bool) -> bool:
        return is_training

    def lookup(self, table, keys, counts, times, training, from_feature):
        rows = tf.fill(tf.shape(keys), tf.constant(-1, tf.int64))
        return rows, tf.zeros(tf.stack([tf.shape(keys)[0], table.dim]))


@contextlib.contextmanager
def shapes_only():
    """Lookups of worker-sharded tables in the block return zeros, with no collective.

    For Keras' symbolic build, which calls the model in a scratch graph that
    never runs, outside any replica step (there a lookup is refused), to learn
    the shapes of its outputs and build the compiled metrics from them.
    """
    with _mode(_Shapes()):
        yield


@contextlib.contextmanager
def _mode(mode):
    previous = current()
    _STATE.mode = mode
    try:
        with _lookup.lookup_mode(mode.training_of):
            yield
    finally:
        _STATE.mode = previous


@contextlib.contextmanager
def prefetched_lookups(forward, training: bool):
    """Inside the block, the step's lookups of worker-sharded tables are already exchanged.

    Args:
      forward: Runs the model on the step's batch with `training=False` (the
        collect pass; its outputs are not used).
      training: Whether the step trains (its lookups count and admit keys).

    Every worker must enter it at the same point of the same replica step.
    """
    if current() is not None:  # nested: the outer block already gathers
        yield
        return
    collector = _Collector(training, lambda t: getattr(t, "gathers_lookups", False))
    with tf.name_scope("npu_rec_collect_ids"), _mode(collector):
        forward()
    entries = [e for e in collector.entries if id(e.table) not in collector.inner]
    lookups = None
    if entries:
        with tf.name_scope("npu_rec_exchange_ids"):
            lookups = Lookups(entries[0].table._exchange, entries)
    server = _Server(lookups, collector.inner)
    with _mode(server):
        yield
    if lookups is not None and server.unused():
        _log_once(
            "unused",
            "npu_rec: the collect pass looked up tables %s more often than the step did; "
            "those ids were counted all the same.",
            server.unused(),
        )
