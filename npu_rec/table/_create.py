"""`create_table`: the one way to make a sparse table, unsharded or sharded.

It sits above both table classes (`SingleShardTable` in `_sparse`,
`ShardedTable` in `_sharded`, siblings under `SparseTable` in `_base`),
so neither imports the other to pick one.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

from npu_rec._validation import ConfigError
from npu_rec.table._base import SparseTable
from npu_rec.table._config import (
    DEFAULT_DYNAMIC_CAPACITY,
    DEFAULT_FIXED_CAPACITY,
    DEFAULT_MAX_PENDING_KEYS,
    TableConfig,
    global_use_dynamic_expansion,
)
from npu_rec.table._fallback import attach as attach_fallback
from npu_rec.table._fused import select_backend
from npu_rec.table._sharded import ShardedTable
from npu_rec.table._sparse import SingleShardTable

#: `memory_rows` and `ssd_path` of tables made without them (`tier_defaults`), or None.
_TIER_DEFAULTS: tuple | None = None


@contextlib.contextmanager
def tier_defaults(memory_rows: int, ssd_path):
    """Within the block, `create_table` calls without `memory_rows`/`ssd_path` get these.

    For the scripts' `--memory_rows`/`--ssd_path`: every table of a run is tiered.
    """
    global _TIER_DEFAULTS
    old, _TIER_DEFAULTS = _TIER_DEFAULTS, (memory_rows, ssd_path)
    try:
        yield
    finally:
        _TIER_DEFAULTS = old


def create_table(
    name: str,
    dim: int,
    *,
    key_dtype=tf.int64,
    initializer=None,
    optimizer=None,
    capacity: int | None = None,
    access_threshold: int = -1,
    eviction_threshold: int = -1,
    not_admitted: str = "zeros",
    fallback_buckets: int = 1 << 20,
    dynamic_expansion: bool | None = None,
    max_pending_keys: int = DEFAULT_MAX_PENDING_KEYS,
    num_shards: int = 1,
    value_dtype=tf.float32,
    memory_rows: int | None = None,
    ssd_path=None,
) -> SparseTable:
    """Creates a sparse embedding table keyed by raw ids.

    Args:
      name: Unique table name.
      dim: Embedding width (>= 1).
      key_dtype: `tf.int64` or `tf.int32`; raw ids, no vocabulary needed (an
        int32 table refuses ids outside the int32 range).
      initializer: Initial rows of admitted keys: None = keyed uniform(-0.05,
        0.05) (a function of table name and key only), a Keras/TF initializer
        (object or name such as "zeros") or a callable `(shape, dtype) -> tensor`.
        Constant initializers fill their value in; fan-based ones
        (`variance_scaling_initializer`, Glorot, He, LeCun) draw each new row as
        for a variable of shape `[capacity, dim]` (`fan_in = capacity`).
      optimizer: An `npu_rec.optimizers` sparse optimizer, or None (lookups only).
      capacity: Initial rows; the fixed size when dynamic expansion is off.
        None = 65536 rows fixed, or 1024 rows growing.
      access_threshold: A key gets a row once its sightings (this batch
        included) reach this; 0 = at once; -1 = admission off.
      eviction_threshold: Free rows of keys idle longer than this many seconds
        at `evict()`; -1 = off. Needs `access_threshold >= 0`.
      not_admitted: What a key below `access_threshold` reads and trains:
        "zeros" (the zero vector, no update; mx_rec's behaviour) or "hashed"
        (row `hash(key) mod fallback_buckets` of a small dense table the table
        owns, trained by the table's optimizer; an admitted key's row starts
        from its fallback row). "hashed" needs `access_threshold >= 2`; on
        tables sharded across workers every worker keeps a copy of the
        fallback, trained on the global batch (docs/design.md).
      fallback_buckets: Rows of the fallback table (`not_admitted="hashed"`).
      dynamic_expansion: Grow on demand; None = `npu_rec.init`'s
        `use_dynamic_expansion` (False before init).
      max_pending_keys: Bound on counted not-yet-admitted keys (see
        `npu_rec.table._admission`), for the whole table.
      num_shards: Split the table by key hash into this many shards, each with
        its own hash map, rows, counters and free list (one process for now;
        see docs/design.md "Scale-out"). `capacity` and `max_pending_keys` are
        divided between the shards (rounded up). Lookups, gradients, eviction,
        export and checkpoints work across shards transparently.
      value_dtype: Storage dtype of the rows: `tf.float32` (default),
        `tf.bfloat16` or `tf.float16`, or their names. Lookups return float32
        whatever it is and optimizer slots stay float32; an optimizer step
        computes in float32 and rounds the new rows to `value_dtype`
        stochastically, reproducibly for a given (table, key, step) (see
        docs/design.md "Compact rows"). bfloat16 halves the rows' bytes.
      memory_rows: With `ssd_path`, a tiered table: the hottest `memory_rows`
        rows (divided between the shards) stay in memory, the others live in
        append-only files under `ssd_path` and come back to memory when a
        training lookup sees their keys (docs/design.md "Tiered tables"). Its
        key count is bounded by the disk, not by `capacity`. Its cold rows keep
        their `value_dtype` bits and the optimizer's slots (row-wise ones
        included) unchanged; a `not_admitted="hashed"` fallback stays in
        memory. Under a multi-worker strategy each worker's shard is tiered
        (`memory_rows` divided between the workers, its files in its own
        subdirectories of `ssd_path`); refused on parameter servers. None =
        every row in memory.
      ssd_path: A directory, or a list of directories the disk tier spreads its
        files over (each table uses its own subdirectory).

    Returns:
      A `SparseTable`: a `SingleShardTable`, or a `ShardedTable` when
      `num_shards > 1` (both exported from `npu_rec`); a
      `npu_rec.distribute.WorkerShardedTable` inside the scope of a
      `MultiWorkerMirroredStrategy` with several workers (`num_shards` is then
      ignored: the table is sharded across the workers, docs/distributed.md);
      on `P` parameter servers (an `NPUEstimator` trainer whose `TF_CONFIG`
      has ps tasks), a table of `max(num_shards, P)` shards, shard `s` on ps
      task `s mod P`.

    Raises:
      ValueError: an argument is out of range, eviction is on without admission,
        a table of this name exists, or a tiered table is placed on parameter
        servers (`ConfigError`).
      TypeError: wrong argument type.
    """
    if dynamic_expansion is None:
        dynamic_expansion = global_use_dynamic_expansion()
    if isinstance(initializer, str):
        import keras

        try:
            initializer = keras.initializers.get(initializer)
        except ValueError as err:
            raise ValueError(
                "`initializer` must name a Keras initializer. "
                f"Received: initializer={initializer!r}"
            ) from err
    if capacity is None:
        capacity = DEFAULT_DYNAMIC_CAPACITY if dynamic_expansion else DEFAULT_FIXED_CAPACITY
    if memory_rows is None and ssd_path is None and _TIER_DEFAULTS is not None:
        memory_rows, ssd_path = _TIER_DEFAULTS
    config = TableConfig(
        name=name,
        dim=dim,
        key_dtype=key_dtype,
        initializer=initializer,
        optimizer=optimizer,
        capacity=capacity,
        access_threshold=access_threshold,
        eviction_threshold=eviction_threshold,
        not_admitted=not_admitted,
        fallback_buckets=fallback_buckets,
        dynamic_expansion=dynamic_expansion,
        max_pending_keys=max_pending_keys,
        num_shards=num_shards,
        value_dtype=value_dtype,
        memory_rows=memory_rows,
        ssd_path=ssd_path,
    )
    from npu_rec.distribute._ps import table_for_ps  # noqa: PLC0415
    from npu_rec.distribute._strategy import table_for_strategy  # noqa: PLC0415

    backend = select_backend()  # stock ops or the compiled kernels, for the table's life
    if config.tiered:
        backend = _tiered_backend(config, backend)  # every shard, in every worker, tiered
    table = table_for_strategy(config, backend)  # sharded across workers (multi-worker strategy)
    if table is None:
        table = table_for_ps(
            config, backend
        )  # shards on the ps tasks (Estimator, TF_CONFIG with ps)
    if table is None:
        table = (
            ShardedTable(config, backend) if num_shards > 1 else SingleShardTable(config, backend)
        )
    attach_fallback(table)
    return table


def _tiered_backend(config: TableConfig, backend):
    """The tiered backend over `backend` (`npu_rec.table._tier`), or the refusal of ps tasks."""
    from npu_rec.distribute._ps import placed_num_ps  # noqa: PLC0415
    from npu_rec.table._tier import tiered_backend  # noqa: PLC0415

    if placed_num_ps():
        raise ConfigError(
            f"Tiered table {config.name!r}: a table with `memory_rows` and `ssd_path` cannot "
            "be placed on parameter servers: its disk tier is kept by the process that builds "
            "the training graph (the segment files' bookkeeping runs in Python inside the "
            "table's ops), while a ps task runs the table's ops for every trainer's graph. "
            "Use the Keras front end's multi-worker strategy (each worker's shard is tiered) "
            "or one process. Received: "
            f"memory_rows={config.memory_rows}, ssd_path={list(config.ssd_path)}, "
            f"ps tasks={placed_num_ps()}"
        )
    return tiered_backend(backend)
