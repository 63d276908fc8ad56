"""Python wrappers of the fused table kernels, used by the table when they load.

`enabled()` says whether the kernel path is on (see `_build` for the build,
the cache and `NPU_REC_KERNELS`); only the kernel backend of the tables asks
it (`npu_rec.table._fused.select_backend`, once per new table). The wrappers take a table's `RowStorage`
variables and mirror the stock code they replace:

* `train_lookup` = the whole training lookup of one shard's ids up to
  admission: `tf.unique_with_counts`, the newest time per key (clamped),
  the key mixing and `KeyIndex.lookup`, and `gather_touch` of the keys found;
  it returns the keys not found for the stock admission ops.
Rows may be stored as float32, bfloat16 or float16 (read as float32, written
rounded as the stock path does); slots are float32.

* `gather_touch` = `tf.gather` of the rows' values (zeros for rows < 0) plus,
  when training, `counts += add` and `last_seen = max(last_seen, times)`
  (the stock gather + scatter-assign of `SparseTable._lookup_unique`).
* `sparse_apply` = the summation of per-id gradients into unique rows
  (`densify`) plus `SparseOptimizer.apply_sparse`, in one kernel.
* `pad_rows` = `_storage.concat_zeros` (zero rows appended), with the zero
  pages left unresident until written (`NpuRecPadRows`).
* `expand` = `tf.gather` of unique rows to the ids (axis 0, int64 [n]
  index), with `tf.gather`'s gradient (`tf.IndexedSlices` of the per-id
  gradients).
* `sum_slices` = the per-lookup sums of several lookups' per-id gradients
  into one zero-padded buffer (`tf.scatter_nd`, `tf.pad` and `tf.concat`
  per lookup), for the multi-worker exchange's gradient all-to-all.
* `take` = `tf.gather` on axis 0 of float32, int32 or int64 rows with an
  int32 or int64 index, copied inline (`NpuRecTake`), for the exchange's
  buffers.
* `tier_read`, `tier_victims`, `tier_pack`, `tier_unpack` = the tiered
  table's NumPy record reads (by `pread`, not through a map), victim
  selection, record packing and verified unpacking (`npu_rec.table._tier`,
  `_tier_store`); `tier_probe` = `tf.unique_with_counts` of the batch's
  ids and both indexes' lookups of its keys (the keys the tier promotes).
"""

from __future__ import annotations

import tensorflow as tf

from npu_rec._kernels import _build
from npu_rec.optimizers import _sparse_optimizers as _opt


def enabled() -> bool:
    """True when the table kernels are loaded (built on first call if needed)."""
    return _build.library() is not None


def train_lookup(
    index,
    storage,
    ids,
    id_counts,
    times,
    *,
    batch_time,
    clock=None,
    limit=None,
    admit_seed=None,
    known_rows=None,
):
    """The fused training lookup (`NpuRecTrainLookup`) of one shard.

    Args:
      index: the shard's `KeyIndex`.
      storage: the shard's `RowStorage`.
      ids: int64 [n] raw ids (repeats allowed).
      id_counts: int64 [n] sightings per id, or None (one each).
      times: int64 [n] per id, or a scalar when `batch_time`.
      batch_time: `times` is one time for the whole batch.
      clock, limit: int64 scalars: with both, times above `limit` are replaced
        by `clock` and counted (`late`); None = no clamping.
      admit_seed: None, or the table's keyed-initialiser seed: then every key
        without a row gets one in the kernel (a table that admits at once with
        the default initialiser), as `RowStorage.allocate` / `init_rows` and
        `KeyIndex.insert` would give it, and no key is returned as a miss.
      known_rows: None, or int64 [n] rows of `ids` already known (-1: to probe)
        when `ids` are unique keys and `batch_time`: then not deduplicated
        again (`index` is 0..n-1), and only the keys without a known row probed.

    Returns:
      A namedtuple of `unique` int64 [u] (first-occurrence order), `index`
      int64 [n], `rows` int64 [u] (-1 = no row), `embeddings` float32 [u, dim]
      (zeros where no row), `miss_pos`, `miss_keys`, `miss_counts`,
      `miss_times` int64 [m] (the keys without a row), `newest` int64 scalar
      (the newest time, >= 0) and `late` int64 [2] (times clamped, the
      largest of them).
    """
    clamp = clock is not None
    zero = tf.constant(0, tf.int64)
    head, tail = storage.full_message("\0").split("\0")
    args = dict(
        table_handle=index.map.resource_handle,
        reserved_rows=index.reserved_rows.handle,
        values=storage.values.handle,
        counts=storage.counts.handle,
        last_seen=storage.last_seen.handle,
        saved_counts=storage.saved_counts.handle,
        row_keys=storage.row_keys.handle,
        free_rows=storage.free.handle,
        next_row=storage.next_row.handle,
        num_free=storage.num_free.handle,
        slots=[v.handle for v in storage.slots.values()],
        ids=ids,
        id_counts=tf.zeros([0], tf.int64) if id_counts is None else id_counts,
        times=tf.reshape(times, [-1]),
        limit=limit if clamp else zero,
        clock=clock if clamp else zero,
        known_rows=tf.zeros([0], tf.int64) if known_rows is None else known_rows,
        dim=storage.dim,
        batch_time=batch_time,
        clamp=clamp,
        admit=admit_seed is not None,
        slot_init=[float(storage.slot_init[name]) for name in storage.slots],
        seed=admit_seed or 0,
        dynamic=storage.dynamic,
        full_head=head,
        full_tail=tail,
    )
    if not tf.executing_eagerly():
        return _build.library().npu_rec_train_lookup(**args)
    try:
        return _build.library().npu_rec_train_lookup(**args)
    except tf.errors.InvalidArgumentError as err:
        # Eagerly, TF wraps a kernel's message in the op's names: the table's "is
        # full" error reads as our message alone, as on the stock path.
        at = err.message.find(head)
        if at < 0:
            raise
        message = err.message[at:].split(" [Op:")[0]
        raise tf.errors.InvalidArgumentError(None, None, message) from None


def expand(params: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
    """float32 [n, dim]: row `index[i]` of `params` (float32 [u, dim]) at i.

    `tf.gather(params, index)` for a rank-1 int64 index, in one small kernel
    (`NpuRecExpand`) instead of TensorFlow's sharded gather; its gradient is
    the same `tf.IndexedSlices` as `tf.gather`'s.
    """
    return _build.library().npu_rec_expand(params=params, index=index)


def _expand_gradient(op, grad):
    """`tf.gather`'s gradient: the per-id gradients as slices of the unique rows."""
    return [tf.IndexedSlices(grad, op.inputs[1], tf.shape(op.inputs[0])), None]


try:
    tf.RegisterGradient("NpuRecExpand")(_expand_gradient)
    tf.RegisterGradient("NpuRecTake")(_expand_gradient)
except KeyError:  # this module imported a second time (e.g. reloaded): registered already
    pass


def sum_slices(parts, width: int) -> tf.Tensor:
    """float32 [sum u_i, width]: each part's per-id gradients summed per row, stacked.

    Args:
      parts: `(values float32 [n_i, d_i], indices int64 [n_i], u_i)` per part,
        d_i <= width, every index in [0, u_i).
      width: the columns of the result (part i fills its first d_i, zeros after).

    Part i's sums are rows [u_0 + ... + u_{i-1}, u_0 + ... + u_i) of the result
    (`NpuRecSumSlices`): `tf.concat` of `tf.pad(tf.scatter_nd(indices, values,
    [u_i, d_i]))` over the parts, in one kernel.
    """
    return _build.library().npu_rec_sum_slices(
        values=[v for v, _, _ in parts],
        indices=[x for _, x, _ in parts],
        sizes=tf.stack([tf.cast(u, tf.int64) for _, _, u in parts]),
        width=width,
    )


def take(params: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
    """`tf.gather(params, index)` on axis 0, in one inline copy (`NpuRecTake`).

    For float32, int32 or int64 `params` [u, ...] and a rank-1 int32 or int64
    index; other inputs, or no kernels, take `tf.gather`. Its gradient is
    `tf.gather`'s.
    """
    if (
        enabled()
        and params.dtype in (tf.float32, tf.int32, tf.int64)
        and index.dtype in (tf.int32, tf.int64)
        and params.shape.rank is not None
        and params.shape.rank >= 1
        and index.shape.rank == 1
    ):
        return _build.library().npu_rec_take(params=params, index=index)
    return tf.gather(params, index)


def pad_rows(x: tf.Tensor, rows) -> tf.Tensor:
    """`x` [r, ...] with zero rows appended up to `rows` (int64 scalar >= r).

    The stock code's `tf.concat([x, tf.zeros(...)], 0)` (`NpuRecPadRows`),
    in a buffer whose whole pages of zeros take no memory until written
    (madvise), so a table's spare rows cost no RSS before they are used.
    """
    return _build.library().npu_rec_pad_rows(input=x, rows=tf.cast(rows, tf.int64))


def tier_read(**args) -> tf.Tensor:
    """int64 [m, words]: records read from the segment files, unverified (`NpuRecTierRead`)."""
    return _build.library().npu_rec_tier_read(**args)


def tier_probe(index, cold_index, ids: tf.Tensor):
    """The first look of a tiered table's training lookup at its indexes (`NpuRecTierProbe`).

    `index`, `cold_index`: the table's `KeyIndex`es (the kernels' map or
    `DenseHashTable`). Returns `tf.unique_with_counts(ids)` and the indexes'
    view of its keys: (unique int64 [u] in first-occurrence order, their rows
    in `index` int64 [u] (-1: none), the position of each id among them
    int64 [n], sightings int64 [u], how many keys have no row (int64
    scalar), the cold keys among those int64 [c] in the same order, and
    their locations in `cold_index` int64 [c]).
    """
    return _build.library().npu_rec_tier_probe(
        table=index.map.resource_handle,
        reserved_rows=index.reserved_rows.handle,
        cold_table=cold_index.map.resource_handle,
        cold_reserved_rows=cold_index.reserved_rows.handle,
        ids=ids,
    )


def tier_victims(**args):
    """(int64 [k] rows a tiered table demotes, the hand's next position) (`NpuRecTierVictims`)."""
    return _build.library().npu_rec_tier_victims(**args)


def tier_pack(**args) -> tf.Tensor:
    """int64 [k, words]: the victims' checksummed records (`NpuRecTierPack`)."""
    return _build.library().npu_rec_tier_pack(**args)


def tier_unpack(**args):
    """(values, slots, counts, saved counts, last-seen) of verified records (`NpuRecTierUnpack`)."""
    return _build.library().npu_rec_tier_unpack(**args)


try:
    tf.no_gradient("NpuRecPadRows")
except KeyError:  # registered already (module reloaded)
    pass


def gather_touch(storage, rows, add=None, times=None) -> tf.Tensor:
    """float32 [u, dim] values of `rows` (int64 [u]; zeros where < 0).

    With `add` (int64 [u]) and `times` (int64 [u] or [1]) it also adds `add` to
    the rows' counts and raises their last-seen times to `times`, in the same
    kernel, under the variables' locks. Rows < 0 are skipped.
    """
    lib = _build.library()
    touch = add is not None
    if not touch:
        add = times = tf.zeros([0], tf.int64)
    return lib.npu_rec_gather_touch(
        values=storage.values.handle,
        counts=storage.counts.handle,
        last_seen=storage.last_seen.handle,
        rows=rows,
        add=add,
        times=tf.reshape(times, [-1]),
        touch=touch,
        dim=storage.dim,
    )


def supports(optimizer) -> bool:
    """True when `optimizer` is one of the five built-in ones with their own update.

    SGD with `weight_decay` runs on the stock ops (the kernel has no decay term).
    """
    if getattr(optimizer, "weight_decay", 0.0):
        return False
    return any(
        type(optimizer).apply_sparse is cls.apply_sparse
        for cls in (_opt.SGD, _opt.Adagrad, _opt.RowWiseAdagrad, _opt.Adam, _opt.Ftrl)
    )


def _attrs(optimizer, step: tf.Tensor):
    """(kernel optimizer name, float32 step size, float attrs) of `optimizer`.

    Coefficients are rounded to float32 the way the stock path's Python floats
    are when they meet a float32 tensor (`1.0 - beta_1` in double first).
    """
    lr = optimizer.learning_rate_at(step)
    if isinstance(optimizer, _opt.Adagrad):
        return "adagrad", lr, {"epsilon": optimizer.epsilon}
    if isinstance(optimizer, _opt.RowWiseAdagrad):
        return "rowwise_adagrad", lr, {"epsilon": optimizer.epsilon}
    if isinstance(optimizer, _opt.Adam):
        t = tf.cast(step, tf.float32)
        b1, b2 = optimizer.beta_1, optimizer.beta_2
        lr_t = lr * tf.sqrt(1.0 - tf.pow(b2, t)) / (1.0 - tf.pow(b1, t))
        return (
            "adam",
            lr_t,
            {
                "epsilon": optimizer.epsilon,
                "beta_1": b1,
                "one_minus_beta_1": 1.0 - b1,
                "beta_2": b2,
                "one_minus_beta_2": 1.0 - b2,
            },
        )
    if isinstance(optimizer, _opt.Ftrl):
        return (
            "ftrl",
            lr,
            {
                "power": -optimizer.learning_rate_power,
                "l1": optimizer.l1,
                "two_l2": 2.0 * optimizer.l2,
            },
        )
    return "sgd", lr, {}


def sparse_apply(optimizer, storage, rows, grads, step, seed: int = 0) -> tf.Operation:
    """One optimizer step on unique `rows` (int64 [u]; rows < 0 are skipped).

    Rows stored as bfloat16 or float16 are written back rounded stochastically
    for (`seed`, the row's key, `step`), as `_rounding.RoundedRows` does.

    Args:
      optimizer: an `npu_rec.optimizers` SGD, Adagrad, RowWiseAdagrad, Adam or Ftrl.
      storage: the table's `RowStorage`.
      rows: int64 [u], unique.
      grads: float32 [u, dim] (summed), or a `tf.IndexedSlices` of per-id
        gradients whose indices point into `rows` (summed by the kernel).
      step: int64 scalar, this update's 1-based count.
      seed: the table's seed (of the rounding hash).
    """
    if isinstance(grads, tf.IndexedSlices):
        values = tf.cast(grads.values, tf.float32)
        index = tf.cast(grads.indices, tf.int64)
    else:
        values = tf.cast(grads, tf.float32)
        index = tf.range(tf.shape(values, out_type=tf.int64)[0])
    values = tf.reshape(values, [-1, storage.dim])
    kind, lr, attrs = _attrs(optimizer, step)
    with tf.control_dependencies([step]):  # counted even when the rate does not read it
        lr = tf.identity(lr)
    slots = [storage.slots[name].handle for name, _ in optimizer.slot_specs]
    return _build.library().npu_rec_sparse_apply(
        values=storage.values.handle,
        slots=slots,
        rows=rows,
        grads=values,
        grad_index=index,
        lr=lr,
        row_keys=storage.row_keys.handle,
        step=tf.cast(step, tf.int64),
        optimizer=kind,
        seed=int(seed),
        **attrs,
    )
