"""A Keras run stops on a non-finite loss, and a non-finite model is never saved.

The Estimator front end stops on a NaN loss with `NanTensorHook`, which raises
`tf.compat.v1.train.NanLossDuringTrainingError`. `RecModel` does the same, and
earlier: its train step checks the loss of the batch before any update, so the
failing step changes no dense weight, optimizer slot, table row or step
counter, and no callback (checkpoints, backups) runs after it. The model keeps
the state of the last finite step.

With `keras.callbacks.TerminateOnNaN` among the callbacks of `fit`, the run
stops as Keras stops it instead: the failing batch's logs carry the non-finite
loss, `TerminateOnNaN` sets `stop_training`, the epoch and the run end and
`on_train_end` runs; the failing step still updated nothing, so whatever the
callbacks save is the finite state of the last step.
"""

from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf

from npu_rec import _log as logging

#: Marks the train step's assertion in the `InvalidArgumentError` TensorFlow raises.
_MARKER = "npu_rec: non-finite training loss"


class NanLossDuringTrainingError(tf.compat.v1.train.NanLossDuringTrainingError):
    """Training stopped: the loss of a batch was NaN or infinite.

    A subclass of `tf.compat.v1.train.NanLossDuringTrainingError`, the error the
    Estimator front end raises (from `NanTensorHook`), so one `except` catches
    both front ends.
    """

    def __init__(self, message: str):
        super().__init__()
        self.message = message

    def __str__(self) -> str:
        return self.message


def check_loss(loss: tf.Tensor) -> tf.Operation:
    """An op that fails (with `_MARKER`) when `loss` holds a NaN or an infinity."""
    return tf.debugging.Assert(tf.reduce_all(tf.math.is_finite(loss)), [_MARKER, loss])


def stop_on_nan(model, train_function):
    """Wraps a Keras train function: the loss check's error becomes `NanLossDuringTrainingError`."""

    @functools.wraps(train_function)
    def function(*args, **kwargs):
        try:
            return train_function(*args, **kwargs)
        except tf.errors.InvalidArgumentError as err:
            if _MARKER not in str(err):
                raise
            step = model.global_step
            if getattr(model, "nan_stops_gracefully", False):
                return _stopped_logs(model, step)
            raise NanLossDuringTrainingError(
                f"NaN loss during training: the loss of training step {step + 1} is not "
                f"finite (NaN or inf). Training stopped before that step changed any weight "
                f"or table; the model keeps the state after step {step}, and no callback "
                f"ran after the failing step. Look for NaN/inf values or out-of-range "
                f"labels in the batch, or lower the learning rate."
            ) from None

    return function


def _stopped_logs(model, step: int) -> dict:
    """The logs of a batch whose loss was not finite, for `TerminateOnNaN` to stop on."""
    logging.warning(
        "npu_rec: the loss of training step %d is not finite (NaN or inf); that step updated "
        "nothing, and TerminateOnNaN stops training with the state after step %d.",
        step + 1,
        step,
    )
    model.stop_training = True
    logs = dict(model.get_metrics_result())
    logs["loss"] = float("nan")
    return logs


def check_finite_state(model, action: str) -> None:
    """Raises ValueError naming the first non-finite dense weight or optimizer variable.

    Args:
      model: A Keras model.
      action: What was refused, for the message (e.g. "model.save").
    """
    optimizer = getattr(model, "optimizer", None)
    variables = [("weight", v) for v in model.weights]
    if optimizer is not None and optimizer.built:
        variables += [("optimizer variable", v) for v in optimizer.variables]
    for kind, var in variables:
        value = np.asarray(var.numpy() if hasattr(var, "numpy") else var)
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            bad = int(np.size(value) - np.isfinite(value).sum())
            raise ValueError(
                f"{action} refused: {kind} {var.path if hasattr(var, 'path') else var.name!r} "
                f"of model {model.name!r} holds {bad} non-finite value(s) (NaN or inf); "
                f"a checkpoint of this state would poison every run restored from it. "
                f"Restore an earlier checkpoint instead."
            )
