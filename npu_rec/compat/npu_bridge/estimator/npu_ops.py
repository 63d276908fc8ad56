"""npu_bridge's `npu_ops`: the ops with a CPU meaning."""

from __future__ import annotations

import tensorflow as tf


def dropout(x, keep_prob, noise_shape=None, seed=None, name=None):
    """npu_bridge's dropout: `tf.nn.dropout` with `rate = 1 - keep_prob`."""
    return tf.nn.dropout(x, rate=1.0 - keep_prob, noise_shape=noise_shape, seed=seed, name=name)
