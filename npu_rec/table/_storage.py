"""Row storage of a sparse table: rows, slots, per-row metadata and a free list.

All state lives in non-trainable resource variables (so Keras never treats a
table as dense weights). Per-row variables share their first dimension, the
capacity. Rows are handed out from a free-list stack (rows freed by eviction)
first, then from the high-water mark `next_row`. With dynamic expansion the
per-row variables have shape `[None, ...]` and grow by doubling (one copy per
doubling, so amortised O(1) per admitted key), also inside `tf.function` and
v1 graphs; without it, running out of rows raises an error naming the table.

Per-row metadata, 20 bytes a row: `row_keys` int64, and three int32
[capacity] columns: `counts` the sighting count (0 marks a free row; a live
row has count >= 1; saturates at `COUNT_MAX`), `saved_counts` the count at the
last checkpoint save (sightings since then = counts - saved_counts; a row whose
count has saturated counts as sighted), `last_seen` the last-seen time, stored
as seconds relative to `SEEN_BASE` (absolute times clamped to [0, `SEEN_MAX`],
1970 to 2106; `FREE_ROW` for a row freed by eviction). Everything outside the
storage (lookups' sightings and times, exports, checkpoints, the tier store)
sees int64 counts and absolute times: `encode_seen` / `decode_seen` and
`saturated` convert at the boundary. A lookup reads and rewrites only `counts`
and `last_seen` of its unique rows (gather + scatter-assign, the fastest CPU
scatter); the eviction scan reads only `last_seen` (4 bytes per row). The
free list (int32 row numbers) is not per row: it holds the rows freed so far
(empty until an eviction frees one) and grows by doubling in `release`.

Rows are stored in the table's `value_dtype` (float32, bfloat16 or float16;
see `npu_rec.table._rounding`); slots are float32, `[capacity, dim]` each, or
`[capacity, 1]` for a slot the optimizer keeps per row (`row_slots`, e.g.
`RowWiseAdagrad`'s accumulator). `init_rows` and `load` take float32 rows and
round them to nearest; an optimizer step's stochastic rounding is
`_rounding.RoundedRows`.

Spare capacity: every per-row variable is made, grown and padded by
`pad_rows` (zero rows appended). The stock code is `tf.concat` with
`tf.zeros`, which writes every spare row; the kernel backend passes the
kernels' `NpuRecPadRows`, whose zero pages stay unresident until written, so
rows past `next_row` cost no memory until they are handed out. Either way
they read as zeros.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

#: Largest stored sighting count (int32; counts saturate there).
COUNT_MAX = int(np.iinfo(np.int32).max)
#: Stored `last_seen` = absolute seconds - SEEN_BASE (int32).
SEEN_BASE = 2**31
#: Largest absolute time stored (2106-02-07); later times are stored as this.
SEEN_MAX = 2**32 - 2
#: Stored `last_seen` of a row freed by eviction (never idle; overwritten on reuse).
FREE_ROW = int(np.iinfo(np.int32).max)


def encode_seen(times: tf.Tensor) -> tf.Tensor:
    """int32: absolute int64 seconds as stored in `last_seen` (clamped to [0, SEEN_MAX])."""
    return tf.cast(tf.clip_by_value(times, 0, SEEN_MAX) - SEEN_BASE, tf.int32)


def decode_seen(stored: tf.Tensor) -> tf.Tensor:
    """int64: absolute seconds of stored `last_seen` values."""
    return tf.cast(stored, tf.int64) + SEEN_BASE


def concat_zeros(x: tf.Tensor, rows) -> tf.Tensor:
    """`x` [r, ...] with zero rows appended up to `rows` (int64 scalar >= r)."""
    shape = tf.shape(x, out_type=tf.int64)
    pad = tf.concat([[tf.cast(rows, tf.int64) - shape[0]], shape[1:]], 0)
    return tf.concat([x, tf.zeros(pad, x.dtype)], 0)


def saturated(counts: tf.Tensor) -> tf.Tensor:
    """int32: int64 sighting counts as stored (saturating at COUNT_MAX)."""
    return tf.cast(tf.clip_by_value(counts, 0, COUNT_MAX), tf.int32)


class RowStorage:
    """The variables holding a table's rows (see module docstring).

    Args:
      table_name: For variable names and error messages.
      dim: Row width.
      slot_specs: `(slot_name, initial_value)` pairs of the optimizer.
      capacity: Initial number of rows.
      dynamic: Grow on demand (True) or fail when full (False).
      value_dtype: The rows' storage dtype (float32, bfloat16 or float16).
      row_slots: Names of the slots holding one value per row (width 1).
      pad_rows: `(x, rows) -> x` with zero rows appended up to `rows`
        (default `concat_zeros`; see module docstring).
    """

    def __init__(
        self,
        table_name: str,
        dim: int,
        slot_specs,
        capacity: int,
        dynamic: bool,
        value_dtype: tf.DType = tf.float32,
        row_slots=(),
        pad_rows=None,
    ):
        self.pad_rows = pad_rows or concat_zeros
        self.table_name = table_name
        self.dim = dim
        self.value_dtype = tf.as_dtype(value_dtype)
        #: Slot name -> its width (`dim`, or 1 for a slot kept per row).
        self.slot_dims = {n: 1 if n in row_slots else dim for n, _ in slot_specs}
        self.dynamic = dynamic
        self.initial_capacity = capacity
        self.slot_init = dict(slot_specs)
        #: Slots added after creation (`add_slots`).
        self.late_slots: list[str] = []
        lead = None if dynamic else capacity

        def var(name, dtype, shape):
            zeros = self.pad_rows(tf.zeros([0, *shape[1:]], dtype), capacity)
            return tf.Variable(zeros, trainable=False, name=name, shape=tf.TensorShape(shape))

        self.values = var("values", self.value_dtype, [lead, dim])
        self.slots = {n: var(f"slot_{n}", tf.float32, [lead, w]) for n, w in self.slot_dims.items()}
        self.counts = var("counts", tf.int32, [lead])
        self.saved_counts = var("saved_counts", tf.int32, [lead])
        self.last_seen = var("last_seen", tf.int32, [lead])
        self.row_keys = var("row_keys", tf.int64, [lead])
        # int32: a shard's rows stay below 2**31. Empty until rows are freed.
        self.free = tf.Variable(
            tf.zeros([0], tf.int32), trainable=False, name="free_rows", shape=tf.TensorShape([None])
        )
        self.next_row = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="next_row")
        self.num_free = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="num_free")

    def add_slots(self, slot_specs, row_slots=()) -> None:
        """Adds slot variables (initial values in every row) for an optimizer bound late.

        Ops built before (a training lookup's growth and admission) do not know
        these slots, so they are "late": `match_late_slots` grows them to the
        rows' capacity before an optimizer step, and `release` resets them for
        the next key of a freed row.
        """
        lead = None if self.dynamic else self.initial_capacity
        # In a graph the variables start at their initial capacity.
        rows = self.capacity() if tf.executing_eagerly() else self.initial_capacity
        for name, initial in slot_specs:
            self.slot_init[name] = initial
            self.late_slots.append(name)
            width = self.slot_dims[name] = 1 if name in row_slots else self.dim
            self.slots[name] = tf.Variable(
                tf.fill(tf.stack([rows, width]), tf.constant(initial, tf.float32)),
                trainable=False,
                name=f"slot_{name}",
                shape=tf.TensorShape([lead, width]),
            )

    def match_late_slots(self) -> tf.Operation:
        """Grows the late slots (initial values) to the rows' capacity when they are shorter."""
        cap = self.capacity()
        ops = []
        for name in self.late_slots:
            var = self.slots[name]
            have = tf.raw_ops.VariableShape(input=var.handle, out_type=tf.int64)[0]

            def grow(var=var, have=have, name=name):
                fill = tf.fill(tf.stack([cap - have, self.slot_dims[name]]), self.slot_init[name])
                grown = var.assign(tf.concat([var.read_value(), fill], 0), read_value=False)
                with tf.control_dependencies([grown]):  # branch ops run only when needed
                    return tf.constant(True)

            ops.append(tf.cond(have < cap, grow, lambda: tf.constant(False)))
        return tf.group(*ops)

    def stored(self, values: tf.Tensor) -> tf.Tensor:
        """`values` in the storage dtype (rounded to nearest)."""
        return tf.cast(values, self.value_dtype)

    def read(self, rows: tf.Tensor) -> tf.Tensor:
        """float32 [n, dim]: the values of `rows` (valid, int64 [n])."""
        return tf.cast(tf.gather(self.values, rows), tf.float32)

    def per_row_variables(self) -> list[tf.Variable]:
        """Every variable whose first dimension is the capacity (not the free list)."""
        return [
            self.values,
            *self.slots.values(),
            self.counts,
            self.saved_counts,
            self.last_seen,
            self.row_keys,
        ]

    def metadata_variables(self) -> list[tf.Variable]:
        """The per-row metadata and the free list."""
        return [self.counts, self.saved_counts, self.last_seen, self.row_keys, self.free]

    def capacity(self) -> tf.Tensor:
        """int64 scalar: rows currently allocated.

        Reads the shape through the handle: reading the value would keep a
        reference to the buffer and make the next scatter copy the whole table.
        """
        return tf.raw_ops.VariableShape(input=self.values.handle, out_type=tf.int64)[0]

    def live_count(self) -> tf.Tensor:
        """int64 scalar: rows holding a key."""
        return self.next_row.read_value() - self.num_free.read_value()

    def full_message(self, needed: str) -> str:
        return (
            f"Sparse table '{self.table_name}' is full: its capacity is "
            f"{self.initial_capacity} rows and this batch needs {needed}. Raise "
            "`capacity` in npu_rec.create_table, or turn on dynamic expansion "
            "(npu_rec.init(use_dynamic_expansion=True) or "
            "create_table(..., dynamic_expansion=True))."
        )

    def _check_capacity(self, needed: tf.Tensor, cap: tf.Tensor) -> tf.Tensor:
        """`cap` once `needed <= cap` holds; the error is the message alone (no x/y dump)."""
        if tf.executing_eagerly():
            if int(needed) > int(cap):
                raise tf.errors.InvalidArgumentError(
                    None, None, self.full_message(str(int(needed)))
                )
            return cap
        check = tf.debugging.Assert(needed <= cap, [self.full_message("more")])
        with tf.control_dependencies([check]):
            return tf.identity(cap)

    def _ensure_capacity(self, needed: tf.Tensor) -> tf.Tensor:
        """Makes room for `needed` rows (grows or asserts); returns the capacity."""
        cap = self.capacity()
        if not self.dynamic:
            return self._check_capacity(needed, cap)

        def grow():
            new_cap = tf.maximum(needed, cap * 2)
            ops = [
                v.assign(self.pad_rows(v.read_value(), new_cap), read_value=False)
                for v in self.per_row_variables()
            ]
            with tf.control_dependencies(ops):
                return tf.identity(new_cap)

        return tf.cond(needed > cap, grow, lambda: tf.identity(cap))

    def allocate(self, n: tf.Tensor) -> tuple[tf.Tensor, tf.Operation]:
        """Takes `n` free rows (free list first, then fresh rows).

        Args:
          n: int64 scalar.

        Returns:
          (rows int64 [n], op updating the allocator state). Rows are valid
          (storage grown) once `rows` is computed.
        """
        num_free = self.num_free.read_value()
        next_row = self.next_row.read_value()
        take = tf.minimum(n, num_free)
        needed = next_row + (n - take)
        cap = self._ensure_capacity(needed)
        with tf.control_dependencies([cap]):
            from_free = tf.cast(tf.gather(self.free, tf.range(num_free - take, num_free)), tf.int64)
            rows = tf.concat([from_free, tf.range(next_row, needed)], 0)
        with tf.control_dependencies([rows]):
            update = tf.group(
                self.num_free.assign(num_free - take, read_value=False),
                self.next_row.assign(needed, read_value=False),
            )
        return rows, update

    def init_rows(self, rows: tf.Tensor, keys: tf.Tensor, values: tf.Tensor) -> tf.Operation:
        """Writes fresh `values` [n, dim], initial slots, `keys` and zero metadata into `rows`."""
        n = tf.size(rows)
        zeros = tf.zeros(tf.reshape(n, [1]), tf.int32)
        never = tf.fill(tf.reshape(n, [1]), encode_seen(tf.constant(0, tf.int64)))
        ops = [
            self.values.scatter_update(tf.IndexedSlices(self.stored(values), rows)),
            self.row_keys.scatter_update(tf.IndexedSlices(keys, rows)),
            *[
                v.scatter_update(tf.IndexedSlices(zeros, rows))
                for v in (self.counts, self.saved_counts)
            ],
            self.last_seen.scatter_update(tf.IndexedSlices(never, rows)),
        ]
        for name, var in self.slots.items():
            fill = tf.fill(
                tf.stack([n, self.slot_dims[name]]), tf.constant(self.slot_init[name], tf.float32)
            )
            ops.append(var.scatter_update(tf.IndexedSlices(fill, rows)))
        return tf.group(*ops)

    def release(self, rows: tf.Tensor) -> tf.Operation:
        """Frees `rows` (int64 [n], live, unique): clear metadata, push on the free list."""
        n = tf.size(rows, out_type=tf.int64)
        num_free = self.num_free.read_value()
        have = tf.raw_ops.VariableShape(input=self.free.handle, out_type=tf.int64)[0]

        def grow():  # by doubling (at most to the capacity): amortised O(1) per freed row
            size = tf.maximum(num_free + n, tf.minimum(2 * have, self.capacity()))
            fill = tf.zeros(tf.reshape(size - have, [1]), tf.int32)
            grown = self.free.assign(tf.concat([self.free.read_value(), fill], 0), read_value=False)
            with tf.control_dependencies([grown]):
                return tf.constant(True)

        grown = tf.cond(num_free + n > have, grow, lambda: tf.constant(False))
        with tf.control_dependencies([grown]):
            push = self.free.scatter_update(
                tf.IndexedSlices(tf.cast(rows, tf.int32), tf.range(num_free, num_free + n))
            )
        zeros = tf.zeros(tf.reshape(n, [1]), tf.int32)
        wipe = self.counts.scatter_update(tf.IndexedSlices(zeros, rows))
        mark = self.last_seen.scatter_update(
            tf.IndexedSlices(tf.fill(tf.reshape(n, [1]), tf.constant(FREE_ROW, tf.int32)), rows)
        )
        resets = [
            self.slots[name].scatter_update(
                tf.IndexedSlices(
                    tf.fill(tf.stack([n, self.slot_dims[name]]), self.slot_init[name]), rows
                )
            )
            for name in self.late_slots
        ]
        with tf.control_dependencies([push, wipe, mark, *resets]):
            return self.num_free.assign(num_free + n, read_value=False)

    def live_rows(self, min_period: tf.Tensor | int = 0) -> tf.Tensor:
        """int64 [k]: live rows with at least `min_period` sightings this period."""
        counts = self.counts.read_value()
        period = tf.cast(counts, tf.int64) - tf.cast(self.saved_counts.read_value(), tf.int64)
        # A saturated count no longer grows: such a row counts as sighted.
        recent = (period >= tf.cast(min_period, tf.int64)) | tf.equal(counts, COUNT_MAX)
        return tf.where((counts > 0) & recent)[:, 0]

    def idle_rows(self, now: tf.Tensor, threshold: int) -> tf.Tensor:
        """int64 [k]: live rows last seen more than `threshold` seconds before `now`."""
        # Rows at or past `next_row` were never handed out; freed rows hold FREE_ROW.
        seen = self.last_seen.read_value()[: self.next_row.read_value()]
        idle = tf.not_equal(seen, FREE_ROW) & (now - decode_seen(seen) > threshold)
        return tf.where(idle)[:, 0]

    def reset_period(self) -> tf.Operation:
        """Zeroes every row's since-last-save sighting count."""
        return self.saved_counts.assign(self.counts.read_value(), read_value=False)

    def load(self, keys, values, slots, counts, last_seen) -> tf.Operation:
        """Replaces the whole storage by `n` rows (rows 0..n-1, in the given order).

        Args:
          keys: int64 [n]; values: [n, dim] (float32 or the storage dtype; rounded
            to nearest); each of `slots`: float32 [n, width];
          counts, last_seen: int64 [n] (stored saturated / relative: `saturated`,
            `encode_seen`).
        """
        n = tf.size(keys, out_type=tf.int64)
        if self.dynamic:
            cap = tf.maximum(n, self.initial_capacity)
        else:
            cap = tf.constant(self.initial_capacity, tf.int64)
            check = tf.debugging.assert_less_equal(
                n,
                cap,
                message=(
                    f"Cannot restore sparse table '{self.table_name}': the "
                    f"checkpoint holds more keys than its capacity "
                    f"({self.initial_capacity}). Raise `capacity`."
                ),
            )
            with tf.control_dependencies([check] if check is not None else []):
                cap = tf.identity(cap)

        def pad(x):
            return self.pad_rows(x, cap)

        ops = [
            self.values.assign(pad(self.stored(values)), read_value=False),
            self.counts.assign(pad(saturated(counts)), read_value=False),
            self.saved_counts.assign(pad(saturated(counts)), read_value=False),
            self.last_seen.assign(pad(encode_seen(last_seen)), read_value=False),
            self.row_keys.assign(pad(keys), read_value=False),
            self.free.assign(tf.zeros([0], tf.int32), read_value=False),
            self.next_row.assign(n, read_value=False),
            self.num_free.assign(tf.constant(0, tf.int64), read_value=False),
        ]
        ops += [var.assign(pad(slots[name]), read_value=False) for name, var in self.slots.items()]
        return tf.group(*ops)
