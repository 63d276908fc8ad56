"""`tf.estimator` for programs written for TensorFlow 1.15.

TensorFlow 2.21 has no `tf.estimator`; Rec SDK programs call
`tf.estimator.EstimatorSpec`, `ModeKeys`, `TrainSpec`, `train_and_evaluate`
and `tf.estimator.export.*` directly. Importing either compat package sets
`tf.estimator` and `tf.compat.v1.estimator` to `npu_rec.estimator` when
TensorFlow has none (an installed tf.estimator is left alone).
"""

from __future__ import annotations

import tensorflow as tf


def install() -> None:
    """Sets `tf.estimator` / `tf.compat.v1.estimator` where TensorFlow lacks them."""
    from npu_rec import estimator

    for module in (tf, tf.compat.v1):
        if not hasattr(module, "estimator"):
            module.estimator = estimator
