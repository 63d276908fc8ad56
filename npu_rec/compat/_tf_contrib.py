"""A minimal `tf.contrib` for TensorFlow 1.15 model code: the few names Rec SDK programs use.

TensorFlow 2 has no `tf.contrib`. Rec SDK's sample models (DLRM, DCNv2)
regularise their dense layers with `tf.contrib.layers.l1_regularizer`.
Importing `npu_bridge.npu_init` (or running under `python -m
npu_rec.compat.run`) sets `tf.compat.v1.contrib` to a namespace holding only
`layers.l1_regularizer`, `layers.l2_regularizer` and
`layers.l1_l2_regularizer`, each TF 1.15's rule written with TF 2.21 ops; an
installed `contrib` is left alone, and TensorFlow 2's own `tf` (not
`tf.compat.v1`) gets none. Any other `tf.contrib` name raises
`AttributeError` naming it and what to use instead.

Each `..._regularizer(scale)` returns a function of a weight tensor giving
the penalty, a scalar of the weights' dtype named after the rule (the form
`tf.compat.v1.layers.dense(kernel_regularizer=...)` and
`tf.compat.v1.get_variable(regularizer=...)` take); a scale of 0 gives a
function returning None (no penalty), as TF 1.15's did.
"""

from __future__ import annotations

import numbers
import types

import tensorflow as tf

__all__ = ["install", "l1_l2_regularizer", "l1_regularizer", "l2_regularizer"]


def _check_scale(name: str, scale) -> float:
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"`{name}` must be a float >= 0. Received: {name}={scale!r}")
    if scale < 0:
        raise ValueError(f"`{name}` must be a float >= 0. Received: {name}={scale!r}")
    return float(scale)


def _penalty(weights, scale: float, reduce, name: str):
    with tf.name_scope(name):
        weights = tf.convert_to_tensor(weights)
        factor = tf.cast(scale, weights.dtype.base_dtype)
        return tf.multiply(factor, reduce(weights), name="value")


def l1_regularizer(scale, scope=None):
    """`scale * sum(|w|)` (TF 1.15's `tf.contrib.layers.l1_regularizer`).

    Raises:
      TypeError / ValueError: `scale` is not a number >= 0.
    """
    scale = _check_scale("scale", scale)
    if scale == 0.0:
        return lambda _: None

    def l1(weights):
        return _penalty(
            weights, scale, lambda w: tf.reduce_sum(tf.abs(w)), scope or "l1_regularizer"
        )

    return l1


def l2_regularizer(scale, scope=None):
    """`scale * sum(w**2) / 2` (TF 1.15's `tf.contrib.layers.l2_regularizer`, i.e. `tf.nn.l2_loss`).

    Raises:
      TypeError / ValueError: `scale` is not a number >= 0.
    """
    scale = _check_scale("scale", scale)
    if scale == 0.0:
        return lambda _: None

    def l2(weights):
        return _penalty(weights, scale, tf.nn.l2_loss, scope or "l2_regularizer")

    return l2


def l1_l2_regularizer(scale_l1=1.0, scale_l2=1.0, scope=None):
    """The sum of `l1_regularizer(scale_l1)` and `l2_regularizer(scale_l2)` of the weights.

    Raises:
      TypeError / ValueError: a scale is not a number >= 0.
    """
    scale_l1 = _check_scale("scale_l1", scale_l1)
    scale_l2 = _check_scale("scale_l2", scale_l2)
    if scale_l1 == 0.0 and scale_l2 == 0.0:
        return lambda _: None
    first, second = l1_regularizer(scale_l1), l2_regularizer(scale_l2)

    def l1_l2(weights):
        with tf.name_scope(scope or "l1_l2_regularizer"):
            parts = [p for p in (first(weights), second(weights)) if p is not None]
            return tf.add_n(parts, name="value")

    return l1_l2


class _Namespace(types.SimpleNamespace):
    """A namespace whose missing names say that TensorFlow 2 has no `tf.contrib`."""

    def __init__(self, path: str, **names):
        super().__init__(**names)
        self._path = path

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"{self._path}.{name} does not exist in TensorFlow 2 (tf.contrib was removed); "
            "npu_rec provides only tf.contrib.layers.l1_regularizer, l2_regularizer and "
            "l1_l2_regularizer. Use the tf.compat.v1 or Keras equivalent."
        )


def namespace() -> _Namespace:
    """A new `tf.contrib` namespace with `layers.l1_regularizer`, `l2_regularizer`, `l1_l2_regularizer`."""
    layers = _Namespace(
        "tf.contrib.layers",
        l1_regularizer=l1_regularizer,
        l2_regularizer=l2_regularizer,
        l1_l2_regularizer=l1_l2_regularizer,
    )
    return _Namespace("tf.contrib", layers=layers)


def install() -> None:
    """Sets `tf.compat.v1.contrib` to `namespace()` unless it has one (idempotent)."""
    if not hasattr(tf.compat.v1, "contrib"):
        tf.compat.v1.contrib = namespace()
