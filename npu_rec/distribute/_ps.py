"""Sparse tables on the `ps` tasks of the Estimator's parameter-server route.

Inside `table_placement(P)` (entered by the route's trainers around their
training graph, `npu_rec.estimator._ps`), `npu_rec.create_table` asks
`table_for_ps` for the table: it is split by key hash into
`max(num_shards, P)` shards and shard `s` (its hash map, rows, optimizer
slots, counters, lock) lives on `/job:ps/task:(s mod P)`, so every trainer
looks up and updates the same shards, under the shard's lock. What a step sends
between a trainer and a ps task goes as one tensor per ps task, way and stage
of the step for all tables (`batch_transfers`, `_ps_table`). Variables, hash
tables and locks on a ps task are shared between the sessions of all trainers
through their names (the same graph on every task). The rest of the route
(servers, dense placement, sessions, the end of the job) is the Estimator's:
`npu_rec.estimator._ps` (docs/distributed.md, "The Estimator route").
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading

import tensorflow as tf

PS = "ps"

_placement = threading.local()


def ps_device(index: int) -> str:
    return f"/job:{PS}/task:{index}"


@contextlib.contextmanager
def table_placement(num_ps: int):
    """Tables created inside are sharded over `num_ps` ps tasks (0: no placement)."""
    previous = getattr(_placement, "num_ps", 0)
    _placement.num_ps = num_ps
    try:
        yield
    finally:
        _placement.num_ps = previous


def placed_num_ps() -> int:
    """The number of ps tasks tables are placed on now (0: none)."""
    return getattr(_placement, "num_ps", 0)


def table_for_ps(config, backend):
    """The table `create_table` makes for `config` inside `table_placement`, else None.

    `backend` is the new table's `TableBackend` (`create_table` chose it).

    A `PsShardedTable` of `max(config.num_shards, P)` shards (one with one ps
    task and one shard), shard `s` on ps task `s mod P`; what a step sends
    between a trainer and a ps task is merged over all tables by
    `batch_transfers` (`_ps_table`, `_ps_transfers`).
    """
    num_ps = placed_num_ps()
    if num_ps == 0:
        return None
    from npu_rec.distribute._ps_table import PsShardedTable  # noqa: PLC0415

    shards = max(config.num_shards, num_ps)
    config = dataclasses.replace(config, num_shards=shards)
    return PsShardedTable(config, backend, devices=[ps_device(s % num_ps) for s in range(shards)])


def batch_transfers(graph: tf.Graph | None = None) -> int:
    """Merges the step's trainer <-> ps tensors of `graph` over all tables (`_ps_transfers`).

    A trainer calls it once its training graph is complete, before its session
    runs it. Returns the number of tensors merged into others.
    """
    from npu_rec.distribute import _ps_transfers  # noqa: PLC0415

    return _ps_transfers.batch(graph)
