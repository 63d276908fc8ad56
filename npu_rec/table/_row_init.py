"""Initial rows of newly admitted keys from a TF/Keras initializer.

A table makes rows for a number of new keys known only when a batch runs
(shape `[None, dim]`). Most initializers take such a shape; two families do not:

* Constant initializers (`tf.compat.v1.constant_initializer`,
  `tf.constant_initializer`, `keras.initializers.Constant`) need a static
  shape: their value (a scalar, or one value per column) is filled in.
* Fan-based initializers (`variance_scaling_initializer`, Glorot, He,
  LeCun, in their `tf.compat.v1` and Keras forms) compute their spread from
  the fans of the variable's shape. A table's rows are sized as the variable
  `[capacity, dim]` (the table's initial capacity; Rec SDK's
  `device_vocabulary_size`), so `fan_in = capacity`, `fan_out = dim`, and each
  new row is drawn from the distribution that variable would get.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

#: stddev of a standard normal truncated to [-2, 2] (TF's and Keras' constant).
_TRUNCATED_STDDEV = 0.87962566103423978


def _is_fan_based(init) -> bool:
    return all(hasattr(init, a) for a in ("scale", "mode", "distribution"))


def _is_constant(init) -> bool:
    return hasattr(init, "value") and "constant" in type(init).__name__.lower()


def fan_scale(init, fan_rows: int, dim: int) -> float:
    """The variance `scale / fan` of a fan-based initializer for a `[fan_rows, dim]` variable."""
    fan_in, fan_out = float(fan_rows), float(dim)
    mode = str(init.mode).lower()
    fan = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2.0}.get(mode)
    if fan is None:
        raise ValueError(
            "A fan-based initializer's `mode` must be 'fan_in', 'fan_out' or 'fan_avg'. "
            f"Received: mode={init.mode!r}"
        )
    return float(init.scale) / max(1.0, fan)


def initial_rows(init, n: tf.Tensor, dim: int, fan_rows: int) -> tf.Tensor:
    """float32 [n, dim]: rows made by `init` (see the module docstring).

    Args:
      init: A TF/Keras initializer or a callable `(shape, dtype) -> tensor`.
      n: int scalar tensor, the number of rows.
      dim: Row width.
      fan_rows: Rows of the variable fan-based initializers are sized for.

    Raises:
      TypeError: `init` cannot make rows of a dynamic number (the message says
        which initializers can).
    """
    shape = tf.stack([tf.cast(n, tf.int32), dim])
    seed = getattr(init, "seed", None)
    if _is_fan_based(init):
        scale = fan_scale(init, fan_rows, dim)
        dist = str(init.distribution).lower()
        if dist in ("normal", "truncated_normal"):
            stddev = math.sqrt(scale) / _TRUNCATED_STDDEV
            return tf.random.truncated_normal(shape, stddev=stddev, seed=seed)
        if dist == "untruncated_normal":
            return tf.random.normal(shape, stddev=math.sqrt(scale), seed=seed)
        if dist == "uniform":
            limit = math.sqrt(3.0 * scale)
            return tf.random.uniform(shape, -limit, limit, seed=seed)
        raise ValueError(
            "A fan-based initializer's `distribution` must be 'normal', 'truncated_normal', "
            f"'untruncated_normal' or 'uniform'. Received: distribution={init.distribution!r}"
        )
    if _is_constant(init):
        value = np.asarray(init.value, np.float32)
        if value.size == 1:
            return tf.fill(shape, tf.constant(value.reshape(()), tf.float32))
        if value.shape in ((dim,), (1, dim)):
            return tf.tile(tf.constant(value.reshape(1, dim)), tf.stack([tf.cast(n, tf.int32), 1]))
        raise ValueError(
            f"A constant initializer of a table of dim {dim} must hold one value or {dim} "
            f"values (one per column). Received: value of shape {value.shape}"
        )
    try:
        return tf.cast(init(shape, tf.float32), tf.float32)
    except (
        TypeError,
        ValueError,
        NotImplementedError,
        tf.errors.OperatorNotAllowedInGraphError,
    ) as err:
        raise TypeError(
            "This initializer cannot make rows for a dynamic number of new keys (shape "
            "[None, dim]). Use a fixed-distribution initializer (RandomUniform, RandomNormal, "
            "TruncatedNormal), a constant or fan-based one (sized from [capacity, dim]), a "
            f"callable (shape, dtype) -> tensor, or None (keyed uniform). Received: "
            f"initializer={init!r}"
        ) from err
