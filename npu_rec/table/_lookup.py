"""`sparse_lookup` and the front-end hook to collect lookups and apply their gradients.

A training lookup deduplicates the ids once (`tf.unique_with_counts`, or
inside the fused lookup kernel on the kernel path: `SparseTable.lookup_ids`),
looks up only the unique keys in the hash map, gathers one row per unique key
(the "unique-row tensor") and expands it to the ids' shape with a plain
`tf.gather` (on the kernel path, an equivalent kernel with the same
gradient). Autodiff of that gather sums the gradients of repeated ids, and
flows through the combiners, so d loss / d unique-row tensor is exactly the
gradient the sparse optimizer needs, with no second hash lookup.

Front ends collect these unique-row tensors with `record_lookups`:

    with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as records:
        loss = model(features)
    grads = tape.gradient(loss, [r.embeddings for r in records])
    npu_rec.apply_recorded_gradients(records, grads)

In a `tf.compat.v1` graph each training lookup is also added to the graph
collection `npu_rec.LOOKUP_COLLECTION`, so a model_fn can do
`records = tf.compat.v1.get_collection(npu_rec.LOOKUP_COLLECTION)` and use
`tf.gradients(loss, [r.embeddings for r in records])`.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, NamedTuple

import tensorflow as tf

from npu_rec._compat import keep_out_of_meta_graphs
from npu_rec.table import _fallback
from npu_rec.table._base import SparseTable, key_times
from npu_rec.table._key_pipeline import PreparedIds
from npu_rec.table._key_pipeline import flat_keys as _flat_keys

#: Graph collection of `LookupRecord`s of training lookups in a v1 graph.
LOOKUP_COLLECTION = "npu_rec_sparse_lookups"
keep_out_of_meta_graphs(LOOKUP_COLLECTION)  # Python objects: no meta-graph form
_COMBINERS = (None, "sum", "mean", "sqrtn")
_STATE = threading.local()


class LookupRecord(NamedTuple):
    """One training lookup, as collected by `record_lookups`.

    Attributes:
      table: The `SparseTable` looked up.
      keys: int64 [u], the unique keys of the batch.
      rows: int64 [u], their rows (-1 = not admitted: zeros and no update, or
        with `not_admitted="hashed"` the key's fallback row, which is trained).
      embeddings: float32 [u, dim], the unique-row tensor; differentiate the
        loss with respect to it.
    """

    table: SparseTable
    keys: tf.Tensor
    rows: tf.Tensor
    embeddings: tf.Tensor


def recording() -> bool:
    """Whether a `record_lookups` block is open (in this thread)."""
    return bool(_recorders())


def _recorders() -> list:
    if not hasattr(_STATE, "stack"):
        _STATE.stack = []
    return _STATE.stack


@contextlib.contextmanager
def record_lookups(tape: tf.GradientTape | None = None):
    """Collects every training `sparse_lookup` made inside the block.

    Args:
      tape: Optional active `tf.GradientTape`; each recorded unique-row tensor
        is `tape.watch`ed so that `tape.gradient` can reach it.

    Yields:
      A list that fills with one `LookupRecord` per training lookup.
    """
    records: list[LookupRecord] = []
    _recorders().append((records, tape))
    try:
        yield records
    finally:
        _recorders().pop()


@contextlib.contextmanager
def lookup_mode(training_of):
    """Inside the block, `sparse_lookup(table, ..., is_training=x)` trains iff `training_of(table, x)`.

    For a front end's pass that gathers a step's ids before the step (see
    `npu_rec.distribute._step_exchange`); nests (the innermost decides).
    """
    previous = getattr(_STATE, "training_of", None)
    _STATE.training_of = training_of
    try:
        yield
    finally:
        _STATE.training_of = previous


@tf.autograph.experimental.do_not_convert
def apply_recorded_gradients(records, grads) -> tf.Operation | None:
    """Applies each table's sparse optimizer to recorded lookups.

    Records of the same table are merged (duplicate rows summed) into one
    optimizer step per table. The hash map is not consulted again, and a
    table looked up once takes its rows' current values from the record's
    embeddings: apply records once, in the step that looked them up.

    Args:
      records: `LookupRecord`s (from `record_lookups` or `LOOKUP_COLLECTION`).
      grads: One gradient per record, d loss / d `record.embeddings` (float32
        [u, dim], a `tf.IndexedSlices`, or None to skip the record).

    Returns:
      A grouped op in graph mode and inside `tf.function`; None in eager mode.

    Raises:
      ValueError: `records` and `grads` differ in length.
    """
    records, grads = list(records), list(grads)
    if len(records) != len(grads):
        raise ValueError(
            "`grads` must have one entry per record. Received: "
            f"len(records)={len(records)}, len(grads)={len(grads)}"
        )
    by_table: dict[int, tuple[SparseTable, list, list]] = {}
    for rec, grad in zip(records, grads, strict=True):
        if grad is None or getattr(rec.table, "exchange_group", None) is not None:
            continue  # tables sharded across workers: below, per-id gradients as they are
        if isinstance(grad, tf.IndexedSlices) and not rec.table.sums_slices:
            grad = densify(grad, tf.shape(rec.rows, out_type=tf.int64)[0])
        entry = by_table.setdefault(id(rec.table), (rec.table, [], [], []))
        entry[1].append(rec.rows)
        entry[2].append(grad)
        entry[3].append(rec.embeddings)
    ops = [_apply_fallbacks(records, grads)] if _has_fallback(records) else []
    together: dict = {}  # exchange_group -> [(record, grad)]
    for rec, grad in zip(records, grads, strict=True):
        group = getattr(rec.table, "exchange_group", None)
        if group is not None and grad is not None:
            together.setdefault(group, []).append((rec, grad))
    for table, rows, gs, embs in by_table.values():
        # Rows of training lookups are all >= 0 when the table admits at once.
        if len(rows) == 1:
            # The lookup's embeddings are the rows' values: no second read.
            ops.append(
                table.apply_rows(rows[0], gs[0], all_rows=table.admits_at_once, current=embs[0])
            )
            continue
        gs = [densify(g, tf.shape(r, out_type=tf.int64)[0]) for r, g in zip(rows, gs, strict=True)]
        uniq, idx = tf.unique(tf.concat(rows, 0), out_idx=tf.int64)
        summed = tf.math.unsorted_segment_sum(
            tf.concat(gs, 0), idx, tf.size(uniq, out_type=tf.int64)
        )
        ops.append(table.apply_rows(uniq, summed, all_rows=table.admits_at_once))
    for pairs in together.values():
        ops.append(pairs[0][0].table.apply_records_together(pairs))
    return None if tf.executing_eagerly() else tf.group(*ops)


def _has_fallback(records) -> bool:
    return any(getattr(rec.table, "fallback", None) is not None for rec in records)


def _apply_fallbacks(records, grads) -> tf.Operation:
    """One step of each table's fallback on the recorded keys that read it (rows < 0)."""
    by_table: dict[int, tuple] = {}
    for rec, grad in zip(records, grads, strict=True):
        if grad is None or getattr(rec.table, "fallback", None) is None:
            continue
        if rec.table.optimizer is None:  # its own `apply_rows` raises the error
            continue
        entry = by_table.setdefault(id(rec.table), (rec.table, [], [], []))
        entry[1].append(rec.keys)
        entry[2].append(rec.rows)
        entry[3].append(densify(grad, tf.shape(rec.rows, out_type=tf.int64)[0]))
    return _fallback.apply_all(
        [
            (table, tf.concat(keys, 0), tf.concat(rows, 0), tf.concat(gs, 0))
            for table, keys, rows, gs in by_table.values()
        ]
    )


#: Up to this many gradient rows, `densify` sums with `tf.scatter_nd`, above it with
#: `tf.math.unsorted_segment_sum`: on CPU the first is ~2x faster for a few thousand
#: rows (one feature of a 4096 batch), the second from ~20k rows (measured crossover).
_SCATTER_SUM_MAX_ROWS = 16384


def densify(grad, num_rows) -> tf.Tensor:
    """Dense [num_rows, dim] sum of a `tf.IndexedSlices` gradient (duplicates summed).

    The gradient of a unique-row tensor arrives as `tf.IndexedSlices` (one
    slice per looked-up id); this picks the faster CPU summation for its size.
    A dense tensor is returned unchanged.
    """
    if not isinstance(grad, tf.IndexedSlices):
        return tf.convert_to_tensor(grad)
    values, indices = grad.values, tf.cast(grad.indices, tf.int64)
    num_rows = tf.cast(num_rows, tf.int64)

    def by_scatter():
        shape = tf.concat([tf.reshape(num_rows, [1]), tf.shape(values, out_type=tf.int64)[1:]], 0)
        return tf.scatter_nd(indices[:, None], values, shape)

    def by_segments():
        return tf.math.unsorted_segment_sum(values, indices, num_rows)

    n = values.shape[0]
    if n is not None:
        return by_scatter() if n <= _SCATTER_SUM_MAX_ROWS else by_segments()
    return tf.cond(tf.shape(indices)[0] <= _SCATTER_SUM_MAX_ROWS, by_scatter, by_segments)


def _times(timestamps, ids) -> tf.Tensor:
    """int64 [n] timestamp of each of the n ids, from per-id or per-example timestamps.

    (One timestamp for the whole batch, or none, is handled by `sparse_lookup`.)
    """
    if isinstance(timestamps, tf.RaggedTensor):
        return tf.cast(tf.reshape(timestamps.flat_values, [-1]), tf.int64)
    if isinstance(timestamps, tf.SparseTensor):
        return tf.cast(timestamps.values, tf.int64)
    ts = tf.cast(tf.convert_to_tensor(timestamps), tf.int64)
    if isinstance(ids, tf.RaggedTensor):
        rowids = ids.nested_value_rowids()
        per_value = rowids[-1]
        for level in reversed(rowids[:-1]):
            per_value = tf.gather(level, per_value)
        return tf.gather(tf.reshape(ts, [-1]), per_value)
    if isinstance(ids, tf.SparseTensor):
        if ts.shape.rank == 2:  # one timestamp per position of the [batch, k] ids
            return tf.gather_nd(ts, ids.indices)
        return tf.gather(tf.reshape(ts, [-1]), ids.indices[:, 0])
    ids = tf.convert_to_tensor(ids)
    if ts.shape.rank == 1 and ids.shape.rank is not None and ids.shape.rank > 1:
        ts = tf.reshape(ts, [-1] + [1] * (ids.shape.rank - 1))
    return tf.reshape(tf.broadcast_to(ts, tf.shape(ids)), [-1])


def _combine(emb: tf.Tensor, segments: tf.Tensor, nsegments, combiner: str) -> tf.Tensor:
    total = tf.math.unsorted_segment_sum(emb, segments, nsegments)
    if combiner == "sum":
        return total
    count = tf.math.unsorted_segment_sum(tf.ones_like(segments, tf.float32), segments, nsegments)
    count = tf.maximum(count, 1.0)[:, None]
    return total / (count if combiner == "mean" else tf.sqrt(count))


@tf.autograph.experimental.do_not_convert
def sparse_lookup(
    table: SparseTable,
    ids,
    *,
    combiner: str | None = None,
    timestamps=None,
    is_training: bool = True,
    name: str | None = None,
):
    """Looks up rows of `table` for raw ids (admitting and counting when training).

    Args:
      table: A `SparseTable`.
      ids: int32/int64 ids: a dense tensor [...], a `tf.RaggedTensor`, or a
        rank-2 `tf.SparseTensor` [batch, k] (needs `combiner`); or a
        `PreparedIds` of such ids (from `prepare_ids` / `prepare_keys`), whose
        precomputed unique keys are used instead of deduplicating here.
        Every value is an id: dense ids are looked up in full (-1 is an id
        like any other). Multi-valued ids of fixed shape are a SparseTensor
        [batch, k] (as `npu_rec.data.as_dataset(use_dynamic=False)` gives
        them): its absent entries are the padding, never looked up.
      combiner: None, or "sum" / "mean" / "sqrtn" over the last (ragged) axis.
      timestamps: Optional int seconds per id (same shape as `ids`; dense
        [batch, k] for SparseTensor ids) or per example ([batch]); default the wall clock. Used for eviction. A value
        more than a day ahead of the wall clock is replaced by the table's
        clock and counted (`evict()` warns).
      is_training: When True the lookup counts sightings, admits keys, records
        last-seen times and is recorded for `record_lookups`. When False it only
        reads (unknown keys read as zeros, or their fallback rows with
        `not_admitted="hashed"`).
      name: Optional name scope.

    Returns:
      float32 [..., dim] for dense ids (without combiner), a `tf.RaggedTensor`
      [batch, (k), dim] for ragged ids without combiner, or the combined
      [batch, dim] (dense [..., k] ids combine over the last axis).

    Raises:
      TypeError: `table` is not a SparseTable, or ids are not integers.
      ValueError: unknown combiner, or a SparseTensor without combiner.
      tf.errors.InvalidArgumentError: an int32 table got an id outside the int32
        range (in graphs, when the lookup runs).
    """
    if not isinstance(table, SparseTable):
        raise TypeError(f"`table` must be an npu_rec.SparseTable. Received: table={table!r}")
    if combiner not in _COMBINERS:
        raise ValueError(f"`combiner` must be one of {_COMBINERS}. Received: combiner={combiner!r}")
    prepared = ids if isinstance(ids, PreparedIds) else None
    if prepared is not None:
        ids = prepared.ids
    if isinstance(ids, tf.SparseTensor) and combiner is None:
        raise ValueError(
            "SparseTensor ids need a `combiner` ('sum', 'mean' or 'sqrtn'). Received: combiner=None"
        )
    training_of = getattr(_STATE, "training_of", None)
    if training_of is not None:
        is_training = training_of(table, is_training)
    with tf.name_scope(name or f"sparse_lookup_{table.name}"):
        if prepared is not None:
            uniq, idx = prepared.unique, prepared.index
            flat = idx
        else:
            flat = _flat_keys(ids)
        if is_training:
            uniq, idx, rows, emb_u = _training_lookup(table, prepared, flat, ids, timestamps)
            emb_u = _fallback.fill(table, uniq, rows, emb_u)
            _record(LookupRecord(table, uniq, rows, emb_u))
        else:
            if prepared is None:
                uniq, idx = tf.unique(flat, out_idx=tf.int64)
            uniq = table.checked_keys(uniq)
            rows, emb_u = table.lookup_unique(uniq, None, None, False)
            emb_u = _fallback.fill(table, uniq, rows, emb_u)
        # The table's backend expands (on the kernel path `NpuRecExpand`: the same
        # values and gradient as `tf.gather`).
        return _shape_output(table.backend.expand(emb_u, idx), ids, combiner, table.dim)


def _training_lookup(table, prepared, flat, ids, timestamps):
    """(unique keys, index, rows, embeddings of the unique keys) of a training lookup."""
    batch_time = times = None
    if timestamps is None or (
        not isinstance(timestamps, (tf.RaggedTensor, tf.SparseTensor))
        and tf.convert_to_tensor(timestamps).shape.rank == 0
    ):
        # One time for the whole batch.
        batch_time = (
            tf.cast(tf.timestamp(), tf.int64)
            if timestamps is None
            else tf.cast(tf.convert_to_tensor(timestamps), tf.int64)
        )
    else:
        times = _times(timestamps, ids)
    from_feature = timestamps is not None
    if prepared is None:
        return table.lookup_ids(flat, times, from_feature, batch_time)
    uniq, idx = table.checked_keys(prepared.unique), prepared.index
    utimes = key_times(times, idx, tf.size(uniq, out_type=tf.int64), batch_time)
    rows, emb_u = table.lookup_unique(
        uniq, tf.cast(prepared.counts, tf.int64), utimes, True, from_feature, batch_time
    )
    return uniq, idx, rows, emb_u


def _record(rec: LookupRecord) -> None:
    for records, tape in _recorders():
        if tape is not None:
            tape.watch(rec.embeddings)
        records.append(rec)
    if not tf.executing_eagerly() and not tf.compat.v1.get_default_graph().building_function:
        tf.compat.v1.add_to_collection(LOOKUP_COLLECTION, rec)


def _shape_output(emb: tf.Tensor, ids, combiner, dim: int) -> Any:
    if isinstance(ids, tf.SparseTensor):
        if ids.shape.rank is not None and ids.shape.rank != 2:
            raise ValueError(f"SparseTensor ids must have rank 2. Received: rank={ids.shape.rank}")
        return _combine(emb, ids.indices[:, 0], ids.dense_shape[0], combiner)
    if isinstance(ids, tf.RaggedTensor):
        splits = ids.nested_row_splits
        if combiner is None:
            return tf.RaggedTensor.from_nested_row_splits(emb, splits, validate=False)
        inner = splits[-1]
        segments = tf.ragged.row_splits_to_segment_ids(inner, out_type=tf.int64)
        combined = _combine(emb, segments, tf.shape(inner, out_type=tf.int64)[0] - 1, combiner)
        if len(splits) == 1:
            return combined
        return tf.RaggedTensor.from_nested_row_splits(combined, splits[:-1], validate=False)
    ids = tf.convert_to_tensor(ids)
    out_shape = tf.concat([tf.shape(ids), [dim]], 0)
    if combiner is None:
        return tf.reshape(emb, out_shape)
    lead = tf.shape(ids)[:-1]
    k = tf.shape(ids)[-1]
    segments = tf.range(tf.size(ids)) // tf.maximum(k, 1)
    combined = _combine(emb, segments, tf.reduce_prod(lead), combiner)
    return tf.reshape(combined, tf.concat([lead, [dim]], 0))
