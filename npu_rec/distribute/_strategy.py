"""Which strategy shards tables across workers, and a strategy with a collective timeout."""

from __future__ import annotations

import tensorflow as tf

from npu_rec import _log as logging
from npu_rec.distribute import _tf_private
from npu_rec.distribute._exchange import DEFAULT_TIMEOUT_SECONDS, Exchange, communication_options


def multi_worker_strategy(timeout_seconds: float | None = DEFAULT_TIMEOUT_SECONDS):
    """A `MultiWorkerMirroredStrategy` from `TF_CONFIG`, RING collectives with a timeout.

    Create it first thing in the program, before any other TensorFlow op (the
    collective runtime is configured then). A worker whose peer dies fails its
    next collective with `DeadlineExceededError` after `timeout_seconds`
    instead of waiting for ever.

    Args:
      timeout_seconds: Seconds each collective waits for every worker (> 0), or
        None for no limit.

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
    return tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=communication_options(timeout_seconds)
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
    timeout = _tf_private.strategy_timeout(strategy)
    if timeout is None:
        logging.warning(
            "npu_rec: the strategy's collectives have no timeout, so a lost worker "
            "would hang the others; sparse-table exchanges use %g s. Create the "
            "strategy with npu_rec.distribute.multi_worker_strategy().",
            DEFAULT_TIMEOUT_SECONDS,
        )
        timeout = DEFAULT_TIMEOUT_SECONDS
    return Exchange(workers, worker_rank(strategy), communication_options(timeout))


def table_for_strategy(config, backend):
    """A `WorkerShardedTable` for `config` under a multi-worker strategy, else None.

    `backend` is the new table's `TableBackend` (`create_table` chose it).
    """
    exchange = current_exchange()
    if exchange is None:
        return None
    from npu_rec.distribute._worker_table import WorkerShardedTable  # noqa: PLC0415

    return WorkerShardedTable(config, exchange, backend)
