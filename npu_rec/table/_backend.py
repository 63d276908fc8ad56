"""`TableBackend`: the one seam between a table shard and the ops that run it.

A `SingleShardTable` gets its backend once, when `create_table` makes it
(`_fused.select_backend`: the kernel backend when the compiled table kernels
load, else the stock one), and keeps it; a sharded table hands its backend to
its shards. Nothing else in npu_rec asks which path is on: the table and the
lookup functions call their backend, which owns everything that differs
between the paths.

Two implementations:

* `StockBackend` (`_stock`): stock TensorFlow ops only. It is the reference:
  the kernel path is tested against it (tests/table/test_table_kernels.py).
* `KernelBackend` (`_fused`): the same state changes through npu_rec's
  compiled kernels (`npu_rec/_kernels`) where they exist: the training lookup,
  the optimizer step, the expansion of unique rows, the key index's map. It
  derives from `StockBackend` and inherits the rest (eviction, export and
  import, admission of keys that need counting or a user initializer).

Each operation takes the shard (`shard`: a `SingleShardTable`; the backend
reads its `config`, `state`, `seed`, `optimizer` and `initial_values`) and
builds ops on the shard's declared state (`ShardState`, `_state`), which the
backend itself creates (`create_state`). The backend holds no state of its own.

Where storage plugs in:

* Compact rows (`value_dtype` bfloat16 or float16, stochastic rounding,
  `_rounding`): rows are read only through `lookup_unique` / `lookup_ids`
  (which hand out float32) and `export` (the stored dtype), and written only
  through `apply`, `create_state`'s initial rows and `load`; both backends
  convert there (`RowStorage.read` / `stored`, `_rounding.RoundedRows`, the
  kernels' `RowsView`), and `memory_stats` reports the bytes really held.
* A tiered row store (hot rows in memory, cold rows on disk): `create_state`
  makes the store; a training lookup (`lookup_ids`, `lookup_unique` with
  `training=True`) is the one place where a batch's keys are known before
  their rows are read, so promotion happens there, once per step; `evict`,
  `export`, `load` and `size` are the whole-table operations that must see
  both tiers; `memory_stats` reports each tier.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

import tensorflow as tf

if TYPE_CHECKING:  # annotations only
    from npu_rec.table._config import TableConfig
    from npu_rec.table._state import ShardState


class TableBackend(abc.ABC):
    """The operations a table shard needs (see module docstring).

    Shapes: u unique keys, n ids, dim the row width.

    Attributes:
      name: "stock" or "kernels" (for reports and benchmarks).
      sums_slices: `apply` takes the per-id gradients as a `tf.IndexedSlices`
        (indices into its rows) and sums them itself; when False the caller
        sums them into a dense [u, dim] tensor first.
    """

    name: str = ""
    sums_slices: bool = False

    # ------------------------------------------------------------------ state
    @abc.abstractmethod
    def create_state(self, config: TableConfig, graph_mode: bool) -> ShardState:
        """A new shard's resources (called once, inside the shard's name scope)."""

    # ---------------------------------------------------------------- lookups
    @abc.abstractmethod
    def lookup_ids(self, shard, ids, times, from_feature: bool, batch_time):
        """The training lookup of a batch's raw ids: deduplicate, probe, admit, read.

        Args:
          shard: The `SingleShardTable`.
          ids: int64 [n], repeats allowed.
          times: int64 [n] per id, or None when `batch_time` is given.
          from_feature: The times come from a timestamp feature.
          batch_time: int64 scalar time of every id, or None.

        Returns:
          (unique int64 [u], index int64 [n] into unique, rows int64 [u] (-1 =
          no row), embeddings float32 [u, dim] (zeros where no row)).
        """

    @abc.abstractmethod
    def lookup_unique(self, shard, keys, counts, times, training: bool, from_feature, batch_time):
        """(rows int64 [u], embeddings float32 [u, dim]) of unique keys.

        With `training`, counts sightings (`counts` int64 [u]), admits and
        records last-seen times (`times` int64 [u], or `batch_time`);
        without, only reads (keys without a row read as zeros).
        """

    @abc.abstractmethod
    def find_rows(self, shard, keys) -> tf.Tensor:
        """int64 [u] rows of unique `keys` (-1 = no row); probes the index only."""

    @abc.abstractmethod
    def expand(self, embeddings, index) -> tf.Tensor:
        """`tf.gather(embeddings, index)` (unique rows to the ids), with its gradient."""

    # -------------------------------------------------------------- gradients
    @abc.abstractmethod
    def apply(self, shard, rows, grads, step, all_rows: bool, current) -> tf.Operation:
        """One optimizer step on unique `rows` (rows < 0 skipped unless `all_rows`).

        Args:
          shard: The `SingleShardTable` (its optimizer is set).
          rows: int64 [u], unique.
          grads: float32 [u, dim], or (when `sums_slices`) a `tf.IndexedSlices`
            of per-id gradients whose indices point into `rows`.
          step: int64 scalar, this update's 1-based count (already counted).
          all_rows: The caller knows no row is -1.
          current: float32 [u, dim], the rows' values as this step's lookup
            read them, or None to read them again.
        """

    # ------------------------------------------------------------ maintenance
    @abc.abstractmethod
    def evict(self, shard, now) -> tf.Tensor:
        """int64 scalar: rows freed of keys idle longer than the threshold at `now`."""

    @abc.abstractmethod
    def size(self, shard) -> tf.Tensor:
        """int64 scalar: keys holding a row."""

    @abc.abstractmethod
    def export(self, shard, min_period) -> dict[str, tf.Tensor]:
        """The shard's state as tensors (layout: `ShardState.signature`)."""

    @abc.abstractmethod
    def load(self, shard, state: dict[str, tf.Tensor]) -> tf.Operation:
        """Replaces the shard's state by `state` (the layout `export` gives)."""

    @abc.abstractmethod
    def end_period(self, shard) -> tf.Operation:
        """Starts a new delta period (after a checkpoint save)."""

    @abc.abstractmethod
    def memory_stats(self, shard) -> dict[str, tf.Tensor]:
        """int64 scalars: `live_keys` and the bytes of `rows`, `slots`, `metadata`, `index`.

        `index` counts the buckets the key index holds at least (12 B each in
        the kernels' map, 16 in `DenseHashTable`:
        the initial array, or the smallest one holding the live keys below the
        map's load limit); the counters of not-yet-admitted keys are not counted.
        """
