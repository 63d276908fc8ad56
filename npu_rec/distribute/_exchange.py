"""Moving ids, rows and gradients between workers inside a replica step.

Every worker of a `tf.distribute.MultiWorkerMirroredStrategy` runs the same
traced step, so each exchange below is a collective that all workers issue
in the same order. A `Route` sends each of this worker's items to one worker
(its owner) with TensorFlow's raw collectives, not the strategy's:

* the sizes: one `CollectiveAllToAllV2` that sends each worker's count per
  destination (W int32) to every worker, so every worker knows the W x W
  matrix of part sizes;
* the items: one `CollectiveAllToAllV2` of a [W, P, ...] buffer, part `o` for
  worker `o`, each part padded to P, the largest part of the matrix rounded
  up to a size bucket (at most 1/8 more). The all-to-all needs equal shapes on
  every worker, and TensorFlow fixes a collective's shape by its instance key,
  so the key is the call site's base plus the bucket's index: a bounded set of
  keys, each always used with one shape;
* the answers (`Route.reply`) come back the same way without a size exchange
  (the sizes are the matrix's transpose), and so can further items sent the
  same way (`Route.send` again: the row gradients go to the owners that
  looked the rows up).

A worker receives only what it owns: (W - 1) / W of the ids it is sent, not
every worker's ids as an all-gather would deliver. The collectives run with
no timeout (the watchdog of `multi_worker_strategy` bounds a lost worker)
and in a group of their own (`GROUP_KEY`), apart from the strategy's.
"""

from __future__ import annotations

import itertools

import numpy as np
import tensorflow as tf

from npu_rec._kernels import _ops as _kernel_ops

#: The collective group of the exchanges (the strategy numbers its groups from 1).
GROUP_KEY = 0x4E505552
#: Instance keys of the exchanges: a call site's base is `_KEY_BASE + site * _SITE_STRIDE`.
_KEY_BASE = 1 << 20
_SITE_STRIDE = 256
_SITES = itertools.count()


def _bucket_sizes() -> np.ndarray:
    """Padded part sizes: 1..8, then 8..15 times a power of two (at most 1/8 above a size)."""
    sizes = set(range(1, 9))
    for e in range(28):
        sizes.update(m << e for m in range(8, 16))
    return np.array(sorted(sizes), np.int32)


BUCKETS = _bucket_sizes()
assert len(BUCKETS) <= _SITE_STRIDE


def next_site() -> int:
    """The base instance key of a new call site (taken in trace order, alike on every worker)."""
    return _KEY_BASE + next(_SITES) * _SITE_STRIDE


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
    """The collectives between the workers of one strategy: `route` (raw all-to-all), `gather`.

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
        """Every worker's `value` ([n_w, ...], n_w may differ), concatenated in worker order.

        The strategy's all-gather (two collectives: the lengths, then the padded
        data); used only where no `Route` of the step's lookups exists.
        """
        ctx = self._context(table_name)
        # tf.identity: the gather input must be a tensor made inside the replica function.
        return ctx.all_gather(tf.identity(value), axis=0, options=self.options)

    # ------------------------------------------------------------ raw collectives
    def gather_sizes(self, counts: tf.Tensor, site: int) -> tf.Tensor:
        """int32 [W, W]: every worker's `counts` (int32 [W]), row w from worker w.

        An all-to-all of `counts` to every worker: its W - 1 messages leave at
        once (a ring gather would take W - 1 hops one after the other).
        """
        workers = self.num_workers
        return tf.raw_ops.CollectiveAllToAllV2(
            input=tf.tile(tf.reshape(counts, [1, workers]), [workers, 1]),
            group_size=workers,
            group_key=GROUP_KEY,
            instance_key=site,
            ordering_token=[],
            communication_hint="auto",
            timeout_seconds=0,
        )

    def all_to_all(self, buffer: tf.Tensor, site: int, bucket: tf.Tensor) -> tf.Tensor:
        """Part w of `buffer` ([W, P, ...]) goes to worker w; part w of the result came from it."""
        return tf.raw_ops.CollectiveAllToAllV2(
            input=buffer,
            group_size=self.num_workers,
            group_key=GROUP_KEY,
            instance_key=site + bucket,
            ordering_token=[],
            communication_hint="auto",
            timeout_seconds=0,
        )

    def route(self, dest: tf.Tensor, table_name: str) -> Route:
        """A `Route` for items going to the workers `dest` (int32 [n]); exchanges the sizes."""
        self._context(table_name)
        return Route(self, dest)


class Route:
    """Where each of this worker's n items goes, and the padded layout that moves them.

    Made by `Exchange.route` (one size exchange). Then `send` moves items to
    their workers (each receiver gets its items in sender order, each sender's
    in this worker's order), `reply` moves answers to received items back to
    their senders, in the senders' original order.
    """

    def __init__(self, exchange: Exchange, dest: tf.Tensor):
        self._exchange = exchange
        workers, rank = exchange.num_workers, exchange.rank
        dest = tf.cast(dest, tf.int32)
        n = tf.size(dest)
        # A stable sort by worker: each worker's items in this worker's order (one
        # partition, not the `TopKV2` of `tf.argsort`).
        self._order = tf.concat(tf.dynamic_partition(tf.range(n), dest, workers), 0)
        sorted_dest = _take(dest, self._order)
        counts = tf.math.bincount(dest, minlength=workers, maxlength=workers, dtype=tf.int32)
        matrix = exchange.gather_sizes(counts, next_site())  # [sender, receiver]
        largest = tf.maximum(tf.reduce_max(matrix), 1)
        self._bucket = tf.searchsorted(BUCKETS, tf.reshape(largest, [1]), out_type=tf.int32)[0]
        self.pad = tf.gather(BUCKETS, self._bucket)
        starts = tf.cumsum(counts, exclusive=True)
        # Position of each item in the flat [W * P] send buffer, in this worker's order.
        slot = sorted_dest * self.pad + tf.range(n) - _take(starts, sorted_dest)
        self._slot = _take(slot, tf.math.invert_permutation(self._order))
        # The buffers are filled by gathers, not scatters (a CPU `ScatterNd` took 4-5
        # times a `GatherV2`'s time): slot (w, j) of the send buffer holds sorted item
        # starts[w] + j, or (padding) the row appended after the n items.
        at = tf.range(self.pad)[None, :]
        self._fill = _slots(at < counts[:, None], starts[:, None] + at, n)
        self._fill = _take(tf.concat([self._order, [n]], 0), self._fill)
        incoming = matrix[:, rank]
        valid = at < incoming[:, None]  # [W, P]
        self._received = tf.cast(tf.where(tf.reshape(valid, [-1]))[:, 0], tf.int32)
        # Slot (w, j) of a reply buffer holds the answer to received item
        # incoming_starts[w] + j, or padding.
        self._reply_fill = _slots(
            valid, tf.cumsum(incoming, exclusive=True)[:, None] + at, tf.size(self._received)
        )
        #: int32 [W, W]: items per (sender, receiver).
        self.sizes = matrix

    def _exchange_buffer(self, flat: tf.Tensor, site: int) -> tf.Tensor:
        workers = self._exchange.num_workers
        shaped = tf.reshape(flat, tf.concat([[workers, self.pad], tf.shape(flat)[1:]], 0))
        got = self._exchange.all_to_all(shaped, site, self._bucket)
        return tf.reshape(got, tf.shape(flat))

    def send(self, values: tf.Tensor) -> tf.Tensor:
        """This worker's items ([n, ...], n as in `dest`) to their workers: the items received.

        Returns [m, ...]: the items sent to this worker, by sender, each
        sender's in its order. Every worker must call it (a collective).
        """
        buffer = _take(_with_padding_row(values), self._fill)
        return _take(self._exchange_buffer(buffer, next_site()), self._received)

    def reply(self, answers: tf.Tensor) -> tf.Tensor:
        """Answers ([m, ...], one per item `send` returned) back: one per item this worker sent."""
        buffer = _take(_with_padding_row(answers), self._reply_fill)
        return _take(self._exchange_buffer(buffer, next_site()), self._slot)


def _take(params: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
    """`tf.gather(params, index)`: on the kernel path one inline copy (`NpuRecTake`)."""
    return _kernel_ops.take(params, index)


def _slots(valid: tf.Tensor, source: tf.Tensor, padding) -> tf.Tensor:
    """int32 [W * P]: `source` where `valid` ([W, P] each), else `padding`."""
    return tf.reshape(tf.where(valid, source, padding), [-1])


def _with_padding_row(values: tf.Tensor) -> tf.Tensor:
    """`values` ([n, ...]) and one row of zeros after them (the padding's source)."""
    zeros = tf.zeros(tf.concat([[1], tf.shape(values)[1:]], 0), values.dtype)
    return tf.concat([values, zeros], 0)
