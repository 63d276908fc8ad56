"""`PsShardedTable`: a sharded table whose shards live on the ps tasks, one crossing per shard and way.

The table the Estimator's parameter-server route creates (`_ps.table_for_ps`).
It routes keys to shards exactly as `ShardedTable` (same hash, same row ids,
same checkpoints), and differs only in where the ops run and what crosses
between the trainer and a shard's ps task:

* every op of a shard's lookup and update (its lock, admission, the optimizer
  step) is built in the shard's device scope, so the critical section's lock,
  its release and the control edges between them stay on the ps task;
* a lookup sends the shard its keys, counts, times and batch time as one int64
  tensor and gets its rows and embeddings back as one float32 tensor (row ids
  bit-cast); an update after that lookup sends only the gradients (the ps task
  keeps the lookup's rows and values) and gets one completion tensor back;
* those tensors go through `_ps_transfers.send`, so the route's `batch` merges
  them over all tables: per ps task and step one tensor of keys, one of rows,
  one of gradients, one of completions.

The ops on a shard's ps task wait for the received tensor only (none of the
trainer's surrounding control dependencies is copied there; they hold on the
trainer's side, where the sent tensor is built), so a shard's lock is taken
once its keys have arrived.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

from npu_rec.distribute import _ps_transfers
from npu_rec.table._base import rows_with_values
from npu_rec.table._sharded import ShardedTable, shard_of


class _Lookup:
    """What an update after a lookup needs: the shard of each key, each shard's rows and values."""

    def __init__(self, shard_ids, rows, values, embeddings):
        self.shard_ids = shard_ids  # int32 [u] (trainer)
        self.rows = rows  # per shard: local rows int64 [u_s] (on its ps task)
        self.values = values  # per shard: float32 [u_s, dim] (on its ps task)
        self.embeddings = embeddings  # the stitched float32 [u, dim] handed out


class PsShardedTable(ShardedTable):
    """A `ShardedTable` with shard `s` on `devices[s]` (see module docstring)."""

    def __init__(self, config, backend, devices):
        super().__init__(config, backend, devices=devices)
        self.devices = list(devices)
        self._lookups: dict = {}  # ref of a lookup's stitched rows -> _Lookup

    # ------------------------------------------------------------ lookups
    @tf.autograph.experimental.do_not_convert
    def lookup_unique(self, keys, counts, times, training, from_feature=False, batch_time=None):
        if not _ps_transfers.batchable():
            return super().lookup_unique(keys, counts, times, training, from_feature, batch_time)
        n = self.num_shards
        sid = shard_of(keys, n)
        pos = tf.dynamic_partition(tf.range(tf.size(sid)), sid, n)
        fill_times = times is not None and batch_time is not None  # times = batch_time each
        fields = [f for f in (keys, counts, None if fill_times else times) if f is not None]
        parts = [tf.dynamic_partition(tf.cast(f, tf.int64), sid, n) for f in fields]
        tail = [] if batch_time is None else [tf.reshape(tf.cast(batch_time, tf.int64), [1])]
        rows, embs, ps_rows, ps_values = [], [], [], []
        width = self.dim + 2
        for s, shard in enumerate(self._shards):
            packed = tf.concat([p[s] for p in parts] + tail, 0)
            with self._on(s):
                got = _ps_transfers.send(packed, name="keys")
                body, when = (got[:-1], got[-1]) if tail else (got, None)
                body = tf.reshape(body, [len(fields), -1])
                k, rest = body[0], [body[i] for i in range(1, len(fields))]
                c = rest.pop(0) if counts is not None else None
                t = tf.fill(tf.shape(k), when) if fill_times else (rest.pop(0) if rest else None)
                local, values = shard.lookup_unique(k, c, t, training, from_feature, when)
                out = tf.reshape(tf.concat([tf.bitcast(local, tf.float32), values], 1), [-1])
            back = _ps_transfers.send(out, name="rows")
            back = tf.reshape(back, [-1, width])
            got_rows = tf.bitcast(back[:, :2], tf.int64)
            rows.append(self._global_rows(got_rows, s))
            embs.append(back[:, 2:])
            ps_rows.append(local)
            ps_values.append(values)
        rows, embs = tf.dynamic_stitch(pos, rows), tf.dynamic_stitch(pos, embs)
        if training:
            self._lookups[rows.ref()] = _Lookup(sid, ps_rows, ps_values, embs)
        return rows, embs

    def find_rows(self, keys):
        if not _ps_transfers.batchable():
            return super().find_rows(keys)
        n = self.num_shards
        sid = shard_of(keys, n)
        pos = tf.dynamic_partition(tf.range(tf.size(sid)), sid, n)
        parts = tf.dynamic_partition(tf.cast(keys, tf.int64), sid, n)
        rows = []
        for s, shard in enumerate(self._shards):
            with self._on(s):
                local = shard.find_rows(_ps_transfers.send(parts[s], name="keys"))
            rows.append(self._global_rows(_ps_transfers.send(local, name="rows"), s))
        return tf.dynamic_stitch(pos, rows)

    # ------------------------------------------------------------ updates
    @tf.autograph.experimental.do_not_convert
    def apply_rows(self, rows, grads, all_rows=False, current=None):
        self._require_optimizer()
        if not _ps_transfers.batchable():
            return super().apply_rows(rows, grads, all_rows, current)
        grads = tf.cast(tf.convert_to_tensor(grads), tf.float32)
        lookup = self._lookups.get(rows.ref())
        if lookup is not None:
            return self._apply_after_lookup(lookup, grads, all_rows, current is not None)
        rows, grads, current = rows_with_values(rows, grads, current, all_rows)
        n = self.num_shards
        sid = tf.cast(rows % n, tf.int32)
        local = tf.dynamic_partition(rows // n, sid, n)
        fields = [tf.dynamic_partition(grads, sid, n)]
        if current is not None:
            fields.append(tf.dynamic_partition(tf.cast(current, tf.float32), sid, n))
        width = 2 + self.dim * len(fields)
        done = []
        # Every shard steps (possibly with no rows), so their optimizer steps stay equal.
        for s, shard in enumerate(self._shards):
            out = tf.concat([tf.bitcast(local[s], tf.float32)] + [f[s] for f in fields], 1)
            out = tf.reshape(out, [-1])
            with self._on(s):
                got = tf.reshape(_ps_transfers.send(out, name="grads"), [-1, width])
                r = tf.bitcast(got[:, :2], tf.int64)
                g = got[:, 2 : 2 + self.dim]
                cur = got[:, 2 + self.dim :] if current is not None else None
                token = _token(shard.apply_rows(r, g, all_rows=True, current=cur), r)
            done.append(_ps_transfers.send(token, name="done"))
        return tf.group(*done)

    def _apply_after_lookup(self, lookup, grads, all_rows, with_current):
        """The update of the rows `lookup` handed out: only the gradients cross."""
        n = self.num_shards
        parts = tf.dynamic_partition(grads, lookup.shard_ids, n)
        done = []
        for s, shard in enumerate(self._shards):
            flat = tf.reshape(parts[s], [-1])
            with self._on(s):
                got = _ps_transfers.send(flat, name="grads")
                g = tf.reshape(got, [-1, self.dim])
                cur = lookup.values[s] if with_current else None
                r, g, cur = rows_with_values(lookup.rows[s], g, cur, all_rows)
                token = _token(shard.apply_rows(r, g, all_rows=True, current=cur), r)
            done.append(_ps_transfers.send(token, name="done"))
        return tf.group(*done)

    @contextlib.contextmanager
    def _on(self, s: int):
        """Shard `s`'s device scope, free of the trainer's control dependencies."""
        with tf.control_dependencies(None), tf.compat.v1.device(self.devices[s]):
            yield


def _token(update, rows) -> tf.Tensor:
    """int64 [1], computed once `update` ran (what the trainer waits for)."""
    with tf.control_dependencies([update]):
        return tf.reshape(tf.size(rows, out_type=tf.int64), [1])
