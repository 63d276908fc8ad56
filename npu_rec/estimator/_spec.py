"""`ModeKeys`, `EstimatorSpec`, `TrainSpec` and `EvalSpec`, validated like tf.estimator's."""

from __future__ import annotations

import collections

import tensorflow as tf

from npu_rec._rec_config import check_int
from npu_rec.estimator._exporter import check_exporters
from npu_rec.estimator._metrics import metric_pairs
from npu_rec.estimator.export._outputs import serving_export_outputs


class ModeKeys:
    """The three modes a `model_fn` is called in."""

    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "infer"


def _is_tensor(x) -> bool:
    return isinstance(x, (tf.Tensor, tf.Variable)) or tf.is_tensor(x)


def _check_graph(name: str, x) -> None:
    graph = tf.compat.v1.get_default_graph()
    if getattr(x, "graph", graph) is not graph:
        raise ValueError(
            f"`{name}` must be from the default graph (the one the model_fn "
            f"is called in). Received: {name}={x!r}"
        )


class EstimatorSpec(
    collections.namedtuple(
        "EstimatorSpec",
        [
            "mode",
            "predictions",
            "loss",
            "train_op",
            "eval_metric_ops",
            "export_outputs",
            "training_chief_hooks",
            "training_hooks",
            "scaffold",
            "evaluation_hooks",
            "prediction_hooks",
        ],
    )
):
    """What a `model_fn` returns: the ops and tensors of one mode.

    Args:
      mode: A `ModeKeys` value.
      predictions: A tensor or dict of tensors [batch, ...] (required in PREDICT).
      loss: A float scalar tensor (required in TRAIN and EVAL).
      train_op: The op of one training step (required in TRAIN).
      eval_metric_ops: dict name -> `(value_tensor, update_op)` (a
        `tf.compat.v1.metrics` result) or a Keras metric object on which the
        model_fn called `update_state`; the spec holds pairs (see `_metrics`).
      export_outputs: dict signature name -> `npu_rec.estimator.export`
        output (`PredictOutput`, `ClassificationOutput`, `RegressionOutput`);
        in PREDICT mode None means `{"serving_default": PredictOutput(predictions)}`
        and a single output is also the default signature.
      training_chief_hooks, training_hooks, evaluation_hooks, prediction_hooks:
        `SessionRunHook`s for that mode.
      scaffold: A `tf.compat.v1.train.Scaffold` or None, honoured as by
        tf.estimator: its `saver` writes and restores the dense checkpoint,
        `init_fn` runs when no checkpoint is restored, its init / ready /
        local-init ops and `summary_op` are used (see `_scaffold.py`).

    Raises:
      ValueError: a required field is missing, a tensor has the wrong rank
        or comes from another graph (the message names the field), or several
        `export_outputs` without a `serving_default` one.
      TypeError: a field has the wrong type.

    Example:
      >>> spec = EstimatorSpec(ModeKeys.TRAIN, loss=loss, train_op=train_op)
    """

    def __new__(
        cls,
        mode,
        predictions=None,
        loss=None,
        train_op=None,
        eval_metric_ops=None,
        export_outputs=None,
        training_chief_hooks=None,
        training_hooks=None,
        scaffold=None,
        evaluation_hooks=None,
        prediction_hooks=None,
    ):
        if mode not in (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT):
            raise ValueError(
                f"`mode` must be one of ModeKeys.TRAIN/EVAL/PREDICT. Received: mode={mode!r}"
            )
        if loss is None and mode in (ModeKeys.TRAIN, ModeKeys.EVAL):
            raise ValueError(f"`loss` is required in mode {mode!r}. Received: loss=None")
        if loss is not None:
            if not _is_tensor(loss):
                raise TypeError(f"`loss` must be a scalar tensor. Received: loss={loss!r}")
            _check_graph("loss", loss)
            if loss.shape.rank not in (None, 0) and loss.shape.num_elements() != 1:
                raise ValueError(f"`loss` must be a scalar. Received: loss shape {loss.shape}")
            loss = tf.reshape(loss, [])
        if train_op is None and mode == ModeKeys.TRAIN:
            raise ValueError("`train_op` is required in mode 'train'. Received: train_op=None")
        if train_op is not None:
            if not isinstance(train_op, tf.Operation) and not _is_tensor(train_op):
                raise TypeError(
                    f"`train_op` must be an Operation or a tensor. Received: train_op={train_op!r}"
                )
            _check_graph("train_op", train_op)
        if predictions is None and mode == ModeKeys.PREDICT:
            raise ValueError(
                "`predictions` are required in mode 'infer'. Received: predictions=None"
            )
        if predictions is not None:
            items = predictions.values() if isinstance(predictions, dict) else [predictions]
            for p in items:
                if not _is_tensor(p):
                    raise TypeError(
                        f"`predictions` must be a tensor or a dict of tensors. Received: {p!r}"
                    )
                _check_graph("predictions", p)
        metrics = metric_pairs(eval_metric_ops, after=loss)
        if mode == ModeKeys.PREDICT:
            export_outputs = serving_export_outputs(export_outputs, predictions)
        hooks = {}
        for field, value in (
            ("training_chief_hooks", training_chief_hooks),
            ("training_hooks", training_hooks),
            ("evaluation_hooks", evaluation_hooks),
            ("prediction_hooks", prediction_hooks),
        ):
            value = tuple(value or ())
            for h in value:
                if not isinstance(h, tf.compat.v1.train.SessionRunHook):
                    raise TypeError(f"`{field}` must hold SessionRunHooks. Received: {h!r}")
            hooks[field] = value
        if scaffold is not None and not isinstance(scaffold, tf.compat.v1.train.Scaffold):
            raise TypeError(f"`scaffold` must be a Scaffold. Received: scaffold={scaffold!r}")
        return super().__new__(
            cls,
            mode,
            predictions,
            loss,
            train_op,
            metrics,
            export_outputs,
            hooks["training_chief_hooks"],
            hooks["training_hooks"],
            scaffold,
            hooks["evaluation_hooks"],
            hooks["prediction_hooks"],
        )


class TrainSpec(
    collections.namedtuple("TrainSpec", ["input_fn", "max_steps", "hooks", "saving_listeners"])
):
    """The training half of `train_and_evaluate`.

    Args:
      input_fn: Returns `(features, labels)` or a `tf.data.Dataset` of them.
      max_steps: Global step to train to (int >= 1) or None: until the input
        ends (or `npu_rec.init(max_steps)`), then the last evaluation.
      hooks: `SessionRunHook`s for training.
      saving_listeners: `CheckpointSaverListener`s for training (see
        `NPUEstimator.train`).

    Raises:
      TypeError: `input_fn` is not callable, or a hook or listener of the wrong type.
      ValueError: `max_steps` < 1.
    """

    def __new__(cls, input_fn, max_steps=None, hooks=None, saving_listeners=None):
        if not callable(input_fn):
            raise TypeError(f"`input_fn` must be callable. Received: input_fn={input_fn!r}")
        max_steps = check_int("max_steps", max_steps, 1, optional=True)
        hooks = tuple(hooks or ())
        for h in hooks:
            if not isinstance(h, tf.compat.v1.train.SessionRunHook):
                raise TypeError(f"`hooks` must hold SessionRunHooks. Received: {h!r}")
        listeners = tuple(saving_listeners or ())
        for listener in listeners:
            if not isinstance(listener, tf.compat.v1.train.CheckpointSaverListener):
                raise TypeError(
                    f"`saving_listeners` must hold CheckpointSaverListeners. Received: {listener!r}"
                )
        return super().__new__(cls, input_fn, max_steps, hooks, listeners)


class EvalSpec(
    collections.namedtuple(
        "EvalSpec",
        ["input_fn", "steps", "name", "hooks", "exporters", "start_delay_secs", "throttle_secs"],
    )
):
    """The evaluation half of `train_and_evaluate`.

    Args:
      input_fn: Returns `(features, labels)` or a dataset of them.
      steps: Evaluation steps (int >= 1) or None (until input ends).
      name: Evaluation name (events go to `model_dir/eval_<name>`).
      hooks: `SessionRunHook`s for evaluation.
      exporters: An `Exporter` (`LatestExporter`, `BestExporter`,
        `FinalExporter`), an iterable of them, or None: run after each
        evaluation, their paths returned by `train_and_evaluate`.
      start_delay_secs, throttle_secs: Numbers >= 0, checked and kept;
        npu_rec evaluates after each checkpoint interval instead (mx_rec's
        cadence, docs/estimator.md "train_and_evaluate").

    Raises:
      TypeError: `input_fn` is not callable, or `exporters` holds something
        that is not an `Exporter`.
      ValueError: `steps` < 1, a negative delay, or exporters without
        (unique) names.
    """

    def __new__(
        cls,
        input_fn,
        steps=100,
        name=None,
        hooks=None,
        exporters=None,
        start_delay_secs=120,
        throttle_secs=600,
    ):
        if not callable(input_fn):
            raise TypeError(f"`input_fn` must be callable. Received: input_fn={input_fn!r}")
        steps = check_int("steps", steps, 1, optional=True)
        for label, value in (
            ("start_delay_secs", start_delay_secs),
            ("throttle_secs", throttle_secs),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"`{label}` must be a number >= 0. Received: {label}={value!r}")
        return super().__new__(
            cls,
            input_fn,
            steps,
            name,
            tuple(hooks or ()),
            check_exporters(exporters),
            start_delay_secs,
            throttle_secs,
        )
