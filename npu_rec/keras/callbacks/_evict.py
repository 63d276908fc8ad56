"""`Evict`: frees the rows of idle keys on a time and/or step cadence (`EvictPolicy`)."""

from __future__ import annotations

import time
from collections.abc import Callable

import keras

from npu_rec import _log as logging
from npu_rec.keras.callbacks._common import global_step, tables_of
from npu_rec.table._base import TableEvictor
from npu_rec.training._policies import EvictPolicy


class Evict(keras.callbacks.Callback):
    """Evicts stale keys from the model's sparse tables during training.

    When the shared `EvictPolicy` says eviction is due (every
    `evict_time_interval` seconds and/or every `evict_step_interval` steps),
    every table with eviction on (`eviction_threshold >= 0`) frees the rows
    of keys unseen for more than its `eviction_threshold` seconds. The table
    clock is the newest timestamp fed to its lookups, or the wall clock.

    Args:
      evict_time_interval: Seconds between evictions (> 0) or None.
      evict_step_interval: Steps between evictions (>= 1) or None.
      tables: The tables to evict from; default all tables of the model.
      now: Optional callable giving the table clock (int seconds) for
        `SparseTable.evict(now=...)`; default the table's own clock.
      clock: Time source of the interval cadence (default `time.monotonic`).

    Attributes:
      evictions: One `(global_step, {table_name: rows_freed})` per eviction.

    Example:
      >>> model.fit(ds, epochs=1, callbacks=[Evict(evict_step_interval=100)])
    """

    def __init__(
        self,
        evict_time_interval: float | None = 24 * 60 * 60,
        evict_step_interval: int | None = None,
        *,
        tables=None,
        now: Callable[[], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__()
        self.policy = EvictPolicy(evict_time_interval, evict_step_interval, clock=clock)
        self._tables = tables
        self._now = now
        self.evictions: list[tuple[int, dict[str, int]]] = []
        self._evictor = TableEvictor(())

    def on_train_begin(self, logs=None):
        self.policy.start(global_step(self.model))

    def on_train_batch_end(self, batch, logs=None):
        step = global_step(self.model)
        if self.policy.due(step):
            self.evict(step)

    def evict(self, step: int | None = None) -> dict[str, int]:
        """Evicts now from every table with eviction on; returns rows freed per table."""
        step = global_step(self.model) if step is None else step
        now = None if self._now is None else self._now()
        tables = tuple(
            t for t in tables_of(self.model, self._tables) if t.config.eviction_threshold >= 0
        )
        if tables != self._evictor.tables:  # one compiled eviction for these tables
            self._evictor = TableEvictor(tables)
        freed = self._evictor(now=now)
        self.policy.mark_evicted(step)
        self.evictions.append((step, freed))
        logging.evicted(step, freed)
        return freed
