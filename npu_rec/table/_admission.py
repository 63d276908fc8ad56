"""Bounded sighting counters for keys that are not admitted yet.

A key of a table with `access_threshold > 0` is counted here until its count
reaches the threshold; then it moves to the table (with its count) and leaves
this map. The map is an exact hash map (TF `MutableHashTable`, key -> [count,
last_seen]) bounded by `max_pending_keys`: when an insert takes it past the
bound, it keeps the `max_pending_keys // 2` most recently seen keys (ties
broken by smaller key) and forgets the rest, which start counting from zero
if they come back. Memory is therefore at most `max_pending_keys` entries of
about 100 bytes (key, inline 2-vector value, hash-map node overhead), whatever
the number of distinct ids in the stream. Below the bound, counting is exact
(no sketch collisions), so admission is deterministic and testable.
"""

from __future__ import annotations

import tensorflow as tf


class PendingCounts:
    """Exact, bounded key -> (count, last_seen) map (see module docstring).

    Args:
      max_keys: The bound on entries (>= 2).
    """

    def __init__(self, max_keys: int):
        self.max_keys = max_keys
        self.map = tf.lookup.experimental.MutableHashTable(
            tf.int64, tf.int64, default_value=tf.constant([0, 0], tf.int64), name="pending"
        )

    def lookup(self, keys: tf.Tensor) -> tf.Tensor:
        """int64 [n, 2]: (count, last_seen) of `keys` (zeros for unknown keys)."""
        return tf.reshape(self.map.lookup(keys), [-1, 2])

    def update(self, admitted: tf.Tensor, waiting: tf.Tensor, waiting_state: tf.Tensor):
        """Removes `admitted` keys, stores `waiting` keys' [n, 2] state, prunes.

        Returns:
          The update op.
        """
        removed = self.map.remove(admitted)
        with tf.control_dependencies([removed]):
            inserted = self.map.insert(waiting, waiting_state)
        with tf.control_dependencies([inserted]):
            return tf.cond(self.map.size() > self.max_keys, self._prune, tf.no_op)

    def _prune(self) -> tf.Operation:
        keys, state = self.export()
        by_key = tf.argsort(keys, stable=True)
        recency = tf.gather(state[:, 1], by_key)
        order = tf.gather(by_key, tf.argsort(recency, direction="DESCENDING", stable=True))
        drop = tf.gather(keys, order[self.max_keys // 2 :])
        return self.map.remove(drop)

    def drop_idle(self, now: tf.Tensor, threshold: int) -> tf.Operation:
        """Forgets keys last seen more than `threshold` seconds before `now`."""
        keys, state = self.export()
        return self.map.remove(tf.boolean_mask(keys, now - state[:, 1] > threshold))

    def export(self) -> tuple[tf.Tensor, tf.Tensor]:
        """(keys int64 [p], state int64 [p, 2])."""
        keys, state = self.map.export()
        return keys, tf.reshape(state, [-1, 2])

    def load(self, keys: tf.Tensor, state: tf.Tensor) -> tf.Operation:
        """Replaces the contents by `keys` / `state`."""
        old, _ = self.map.export()
        removed = self.map.remove(old)
        with tf.control_dependencies([removed]):
            return self.map.insert(keys, state)
