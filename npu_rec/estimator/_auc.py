"""Streaming evaluation metrics for `EstimatorSpec(eval_metric_ops=...)`.

`streaming_auc` replaces the deprecated `tf.compat.v1.metrics.auc`: the same
`(value, update_op)` pair over local variables, computed as
`keras.metrics.AUC` does (ROC curve, `num_thresholds` evenly spaced
thresholds, trapezoidal sum), so the Estimator and Keras front ends report the
same AUC for the same predictions.
"""

from __future__ import annotations

import tensorflow as tf

_EPSILON = 1e-7  # as keras.backend.epsilon(): the end thresholds lie just outside [0, 1]


def auc_thresholds(num_thresholds: int) -> list[float]:
    """The `num_thresholds` thresholds: -eps, (i + 1) / (n - 1) for i < n - 2, 1 + eps."""
    inner = [(i + 1) / (num_thresholds - 1) for i in range(num_thresholds - 2)]
    return [-_EPSILON, *inner, 1.0 + _EPSILON]


def _local(name: str, size: int) -> tf.Variable:
    return tf.compat.v1.Variable(
        tf.zeros([size], tf.float32),
        trainable=False,
        name=name,
        collections=[
            tf.compat.v1.GraphKeys.LOCAL_VARIABLES,
            tf.compat.v1.GraphKeys.METRIC_VARIABLES,
        ],
    )


def _area(tp, fp, tn, fn) -> tf.Tensor:
    tpr = tf.math.divide_no_nan(tp, tp + fn)
    fpr = tf.math.divide_no_nan(fp, fp + tn)
    return tf.reduce_sum((fpr[:-1] - fpr[1:]) * (tpr[:-1] + tpr[1:]) / 2.0)


def streaming_auc(
    labels, predictions, weights=None, num_thresholds: int = 200, name: str | None = None
):
    """ROC AUC over every batch evaluated, as `(value, update_op)` for `eval_metric_ops`.

    A drop-in for `tf.compat.v1.metrics.auc(labels, predictions)` (deprecated):
    accumulates true/false positives and negatives at `num_thresholds`
    thresholds in local variables (reset by `NPUEstimator.evaluate`); `value`
    reads them, `update_op` adds one batch and returns the updated AUC.

    Args:
      labels: `[batch]` (any shape) 0/1 labels, bool, int or float.
      predictions: float `[batch]`, same shape: probabilities in [0, 1].
      weights: optional float weights broadcastable to `labels`.
      num_thresholds: int >= 2.
      name: variable scope (default "auc").

    Returns:
      `(value, update_op)`: float32 scalars.

    Raises:
      ValueError: `num_thresholds` < 2.
      RuntimeError: called eagerly (use `keras.metrics.AUC` there).

    Example:
      >>> eval_metric_ops={"auc": E.streaming_auc(labels, tf.sigmoid(logits))}
    """
    if (
        isinstance(num_thresholds, bool)
        or not isinstance(num_thresholds, int)
        or (num_thresholds < 2)
    ):
        raise ValueError(
            f"`num_thresholds` must be an integer >= 2. Received: num_thresholds={num_thresholds!r}"
        )
    if tf.executing_eagerly():
        raise RuntimeError(
            "streaming_auc builds graph metric ops for an Estimator model_fn; "
            "in eager code use keras.metrics.AUC."
        )
    with tf.compat.v1.variable_scope(name, default_name="auc"):
        preds = tf.reshape(tf.cast(predictions, tf.float32), [-1])
        positive = tf.reshape(tf.cast(tf.cast(labels, tf.bool), tf.float32), [-1])
        w = (
            tf.ones_like(preds)
            if weights is None
            else tf.reshape(tf.broadcast_to(tf.cast(weights, tf.float32), tf.shape(positive)), [-1])
        )
        thresholds = tf.constant(auc_thresholds(num_thresholds), tf.float32)
        # A prediction is positive at threshold t when it is > t: at the `above` lowest ones.
        above = tf.searchsorted(thresholds, preds, side="left", out_type=tf.int32)

        def counts_above(weight):
            hist = tf.math.unsorted_segment_sum(weight, above, num_thresholds + 1)
            return tf.reduce_sum(hist) - tf.cumsum(hist)[:num_thresholds]

        tp_batch, fp_batch = counts_above(w * positive), counts_above(w * (1.0 - positive))
        pos, neg = tf.reduce_sum(w * positive), tf.reduce_sum(w * (1.0 - positive))
        tp, fp = _local("true_positives", num_thresholds), _local("false_positives", num_thresholds)
        tn, fn = _local("true_negatives", num_thresholds), _local("false_negatives", num_thresholds)
        value = _area(tp.read_value(), fp.read_value(), tn.read_value(), fn.read_value())
        updated = [
            tp.assign_add(tp_batch),
            fp.assign_add(fp_batch),
            tn.assign_add(neg - fp_batch),
            fn.assign_add(pos - tp_batch),
        ]
        update_op = _area(*updated)
    return value, update_op
