"""Moving ids, rows and gradients between workers inside a replica step.

Every worker of a `tf.distribute.MultiWorkerMirroredStrategy` runs the same
traced step, so each exchange below is one collective that all workers issue
in the same order. The exchange is an all-gather with a different first
dimension per worker (each worker receives every worker's part, in worker
order), which TensorFlow's RING collectives support between CPU workers; the
owner then keeps the part it owns. (`CollectiveAllToAllV2` would move 1/W of
this, but needs equal shapes on all workers and an instance key per shape;
see docs/distributed.md for the bytes moved and where this stops scaling.)

Measured on 2 cores (2 local workers): a 100k-id exchange takes 9-16 ms.
"""

from __future__ import annotations

import tensorflow as tf

#: Seconds within which a lost or stalled worker fails the others' step (see `_faults.Watchdog`).
DEFAULT_TIMEOUT_SECONDS = 60.0


def communication_options(timeout_seconds: float | None = None):
    """RING collectives, by default without a timeout.

    A lost peer is detected by the process's watchdog (`multi_worker_strategy`),
    not by a timeout: TensorFlow keeps a thread per collective alive until its
    timeout passes, so a timeout on every collective exhausts the threads of a
    long run. `timeout_seconds` is kept for callers that want one anyway.
    """
    impl = tf.distribute.experimental.CommunicationImplementation.RING
    return tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=timeout_seconds, implementation=impl
    )


class NotInReplicaStepError(RuntimeError):
    """A worker-sharded table was used outside a replica step of its strategy."""


class Exchange:
    """All-gathers of variable-length tensors between the workers of one strategy.

    Args:
      num_workers: Workers (replicas) in the group.
      rank: This worker's replica id.
      options: `tf.distribute.experimental.CommunicationOptions` of every exchange
        (default: RING without a timeout).
    """

    def __init__(self, num_workers: int, rank: int, options=None):
        self.num_workers = num_workers
        self.rank = rank
        self.options = options if options is not None else communication_options()

    def _context(self, table_name: str):
        ctx = tf.distribute.get_replica_context()
        if ctx is None or ctx.num_replicas_in_sync != self.num_workers:
            raise NotInReplicaStepError(
                f"Sparse table {table_name!r} is sharded across {self.num_workers} workers, so "
                "it can only be looked up or updated inside a replica step of its strategy "
                "(`model.fit`/`evaluate`/`predict`, or `strategy.run`), where every worker "
                "takes part. To read it, use `table.export()` (this worker's keys). Received: "
                f"{'cross-replica context' if ctx is None else 'a replica context of '}"
                f"{'' if ctx is None else str(ctx.num_replicas_in_sync) + ' replica(s)'}"
            )
        return ctx

    def gather(self, value: tf.Tensor, table_name: str) -> tf.Tensor:
        """Every worker's `value` ([n_w, ...], n_w may differ), concatenated in worker order."""
        ctx = self._context(table_name)
        # tf.identity: the gather input must be a tensor made inside the replica function.
        return ctx.all_gather(tf.identity(value), axis=0, options=self.options)
