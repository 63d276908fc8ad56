"""Keyed initialisation: a key's first row depends only on (table seed, key).

A key admitted in eager mode, inside `tf.function`, in a v1 graph, after an
eviction, or on another shard gets the same initial vector; this makes runs
reproducible across execution modes and independent of batch composition.
"""

from __future__ import annotations

import zlib

import tensorflow as tf

_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def name_seed(name: str) -> int:
    """The default initialisation seed of a table: CRC-32 of its name."""
    return zlib.crc32(name.encode("utf-8"))


def _splitmix64(z: tf.Tensor) -> tf.Tensor:
    """SplitMix64 finaliser on a uint64 tensor (wrap-around arithmetic)."""
    u = tf.uint64
    z = z + tf.constant(_GOLDEN, u)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(30, u)))
    z = z * tf.constant(_MIX1, u)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(27, u)))
    z = z * tf.constant(_MIX2, u)
    return tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(31, u)))


def keyed_uniform(keys: tf.Tensor, dim: int, seed: int, scale: float = 0.05) -> tf.Tensor:
    """Deterministic uniform [-scale, scale) rows for keys.

    Element (i, j) is `(2 * u - 1) * scale` where `u = (h >> 40) / 2**24` and
    `h = splitmix64(splitmix64(key_i ^ seed) + j)`, computed in float32.

    Args:
      keys: int64 tensor [n].
      dim: Row width.
      seed: Non-negative int seed (see `name_seed`).
      scale: Half-width of the range.

    Returns:
      float32 tensor [n, dim].
    """
    u = tf.uint64
    k = tf.bitcast(tf.cast(keys, tf.int64), u)
    base = _splitmix64(tf.bitwise.bitwise_xor(k, tf.constant(seed, u)))
    cols = tf.range(dim, dtype=tf.int64)
    h = _splitmix64(base[:, None] + tf.bitcast(cols, u)[None, :])
    top = tf.cast(tf.bitwise.right_shift(h, tf.constant(40, u)), tf.float32)
    unit = top * tf.constant(1.0 / (1 << 24), tf.float32)
    return (unit * 2.0 - 1.0) * tf.constant(scale, tf.float32)
