"""Which strategy shards tables across workers, and a strategy whose lost workers fail the others."""

from __future__ import annotations

import weakref

import tensorflow as tf

from npu_rec import _log as logging
from npu_rec.distribute import _faults, _tf_private
from npu_rec.distribute._exchange import DEFAULT_TIMEOUT_SECONDS, Exchange, communication_options


def multi_worker_strategy(timeout_seconds: float | None = DEFAULT_TIMEOUT_SECONDS):
    """A `MultiWorkerMirroredStrategy` from `TF_CONFIG`, RING collectives, a peer watchdog.

    Create it first thing in the program, before any other TensorFlow op (the
    collective runtime is configured then). The collectives have no timeout
    (a timeout keeps a thread alive per collective until it passes); instead
    one watchdog thread per process checks the other workers every few
    seconds and, when one stops answering, aborts this worker's collectives:
    the step waiting on it fails with `UnavailableError` naming the task
    (`RecModel.fit` raises `WorkerLostError`) within about `timeout_seconds`
    instead of waiting for ever.

    Args:
      timeout_seconds: Seconds within which a lost or stalled worker fails the
        others (> 0), or None for no watchdog (a dead worker still breaks the
        others' step when its connections reset; a stalled one hangs them).

    Returns:
      The strategy; tables created in its scope are sharded across its workers.

    Raises:
      ValueError: `timeout_seconds` is not > 0.
    """
    if timeout_seconds is not None and (
        isinstance(timeout_seconds, bool) or not timeout_seconds > 0
    ):
        raise ValueError(
            "`timeout_seconds` must be > 0 (or None for no limit). "
            f"Received: timeout_seconds={timeout_seconds!r}"
        )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=communication_options()
    )
    _OURS.add(strategy)
    if timeout_seconds is not None and strategy.num_replicas_in_sync > 1:
        _watch(strategy, timeout_seconds)
    return strategy


#: Strategies made by `multi_worker_strategy` (their watchdog was chosen there).
_OURS: weakref.WeakSet = weakref.WeakSet()
_WARNED_TIMEOUT: list[bool] = []


def _watch(strategy, bound_seconds: float) -> _faults.Watchdog:
    resolver = strategy.cluster_resolver
    return _faults.watch_peers(
        bound_seconds, resolver.cluster_spec().as_dict(), resolver.task_type, resolver.task_id
    )


def worker_rank(strategy) -> int:
    """This task's replica id in a one-device-per-worker `MultiWorkerMirroredStrategy`."""
    resolver = strategy.cluster_resolver
    chiefs = len(resolver.cluster_spec().as_dict().get("chief", []))
    if resolver.task_type == "chief":
        return 0
    return int(resolver.task_id) + chiefs


def current_exchange() -> Exchange | None:
    """The `Exchange` of the multi-worker strategy in scope, or None (one process)."""
    if not tf.distribute.has_strategy():
        return None
    strategy = tf.distribute.get_strategy()
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return None
    workers = strategy.num_replicas_in_sync
    if workers == 1:
        return None
    if len(strategy.extended.worker_devices) != 1:
        raise ValueError(
            "Sparse tables shard across workers with one device each; this worker has "
            f"{len(strategy.extended.worker_devices)} devices "
            f"({list(strategy.extended.worker_devices)}). Received: "
            f"num_replicas_in_sync={workers}"
        )
    if _faults.watchdog() is None and strategy not in _OURS:
        logging.warning(
            "npu_rec: this MultiWorkerMirroredStrategy has no npu_rec watchdog, so a "
            "stalled worker would hang the others; starting one that fails them within "
            "%g s. Create the strategy with npu_rec.distribute.multi_worker_strategy().",
            DEFAULT_TIMEOUT_SECONDS,
        )
        _watch(strategy, DEFAULT_TIMEOUT_SECONDS)
    if _tf_private.strategy_timeout(strategy) is not None and not _WARNED_TIMEOUT:
        _WARNED_TIMEOUT.append(True)
        logging.warning(
            "npu_rec: the strategy's collectives have a timeout; TensorFlow keeps a "
            "thread alive per collective until its timeout passes, so a long run can "
            "run out of threads. Sparse-table exchanges use none (the watchdog bounds "
            "a lost worker instead)."
        )
    return Exchange(workers, worker_rank(strategy), communication_options())


def table_for_strategy(config, backend):
    """A `WorkerShardedTable` for `config` under a multi-worker strategy, else None.

    `backend` is the new table's `TableBackend` (`create_table` chose it).
    """
    exchange = current_exchange()
    if exchange is None:
        return None
    from npu_rec.distribute._worker_table import WorkerShardedTable  # noqa: PLC0415

    return WorkerShardedTable(config, exchange, backend)
