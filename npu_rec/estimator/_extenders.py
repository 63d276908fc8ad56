"""tf.estimator's helpers around a model: `add_metrics` and the parse-example specs.

- `add_metrics(estimator, metric_fn)`: a new Estimator (same model_dir,
  config, params and warm start) whose evaluation also reports the metrics of
  `metric_fn(features, labels, predictions, config)` (it may name only the
  arguments it uses).
- `classifier_parse_example_spec` / `regressor_parse_example_spec`: the
  `tf.io.parse_example` spec of feature columns plus the label (and weight).
"""

from __future__ import annotations

import inspect

import tensorflow as tf

from npu_rec.estimator._estimator import NPUEstimator
from npu_rec.estimator._graph import call_model_fn
from npu_rec.estimator._spec import EstimatorSpec, ModeKeys

_METRIC_FN_ARGS = ("features", "labels", "predictions", "config")


def add_metrics(estimator, metric_fn):
    """A copy of `estimator` whose evaluation adds `metric_fn`'s metrics.

    Args:
      estimator: An `Estimator`.
      metric_fn: Returns a dict name -> `(value, update_op)` or Keras metric
        object (updated); takes any of `features`, `labels`, `predictions`,
        `config`.

    Raises:
      TypeError: `estimator` is not an npu_rec Estimator.
      ValueError: `metric_fn` takes another argument.
    """
    if not isinstance(estimator, NPUEstimator):
        raise TypeError(
            "`estimator` must be an npu_rec.estimator.Estimator. "
            f"Received: {type(estimator).__name__}"
        )
    names = list(inspect.signature(metric_fn).parameters)
    extra = [n for n in names if n not in _METRIC_FN_ARGS]
    if extra:
        raise ValueError(
            f"`metric_fn` may take only {list(_METRIC_FN_ARGS)}. Received arguments {extra}"
        )
    inner = estimator.model_fn

    def model_fn(features, labels, mode, params, config):
        spec = call_model_fn(inner, features, labels, mode, params, config)
        if mode != ModeKeys.EVAL:
            return spec
        given = {"features": features, "labels": labels, "predictions": spec.predictions}
        given["config"] = config
        metrics = dict(spec.eval_metric_ops)
        metrics.update(metric_fn(**{n: given[n] for n in names}))
        return EstimatorSpec(**{**spec._asdict(), "eval_metric_ops": metrics})

    return NPUEstimator(
        model_fn,
        model_dir=estimator.model_dir,
        config=estimator.config,
        params=estimator.params,
        warm_start_from=estimator.warm_start_settings,
    )


def _parse_spec(feature_columns, label_key, label_spec, weight_column):
    columns = list(feature_columns)
    if weight_column is not None:
        if isinstance(weight_column, str):
            weight_column = tf.compat.v1.feature_column.numeric_column(weight_column)
        columns.append(weight_column)
    spec = tf.compat.v1.feature_column.make_parse_example_spec(columns)
    if label_key in spec:
        raise ValueError(
            f"`label_key` {label_key!r} is also a feature column's key; give the label its "
            f"own key. Received: label_key={label_key!r}"
        )
    spec[label_key] = label_spec
    return spec


def classifier_parse_example_spec(
    feature_columns, label_key, label_dtype=tf.int64, label_default=None, weight_column=None
) -> dict:
    """The parse spec of `feature_columns` plus an int (or string) class label of shape [1].

    Raises:
      ValueError: `label_key` is a feature key too.
    """
    label = tf.io.FixedLenFeature([1], label_dtype, label_default)
    return _parse_spec(feature_columns, label_key, label, weight_column)


def regressor_parse_example_spec(
    feature_columns,
    label_key,
    label_dtype=tf.float32,
    label_default=None,
    label_dimension=1,
    weight_column=None,
) -> dict:
    """The parse spec of `feature_columns` plus a float label of shape [label_dimension].

    Raises:
      ValueError: `label_key` is a feature key too.
    """
    label = tf.io.FixedLenFeature([label_dimension], label_dtype, label_default)
    return _parse_spec(feature_columns, label_key, label, weight_column)


def call_logit_fn(logit_fn, features, mode, params, config):
    """Calls `logit_fn` with the arguments it names among features, mode, params, config.

    Raises:
      ValueError: `logit_fn` takes another argument, or returns neither a
        Tensor nor a dict of Tensors.
    """
    given = {"features": features, "mode": mode, "params": params, "config": config}
    names = list(inspect.signature(logit_fn).parameters)
    extra = [n for n in names if n not in given]
    if extra:
        raise ValueError(f"`logit_fn` may take only {list(given)}. Received arguments {extra}")
    logits = logit_fn(**{n: given[n] for n in names})
    values = logits.values() if isinstance(logits, dict) else [logits]
    if not all(isinstance(v, tf.Tensor) for v in values):
        raise ValueError(
            f"`logit_fn` must return a Tensor or a dict of Tensors. Received: {logits!r}"
        )
    return logits
