"""`tf.estimator.export`'s export outputs: what a SavedModel signature returns.

A `model_fn` names its serving signatures in `EstimatorSpec(export_outputs=
{signature_name: ExportOutput})` (PREDICT mode). Each output turns into a
`SignatureDef` over the serving receiver's tensors with the standard
`tf.compat.v1.saved_model.*_signature_def` builders:

| output | signature method | inputs it needs |
| --- | --- | --- |
| `PredictOutput(outputs)` | `tensorflow/serving/predict` | any receiver tensors |
| `ClassificationOutput(scores, classes)` | `tensorflow/serving/classify` | one string tensor (serialized `tf.Example`s) |
| `RegressionOutput(value)` | `tensorflow/serving/regress` | one string tensor |

Rules as in tf.estimator: without `export_outputs` the default signature
`serving_default` is a `PredictOutput(predictions)`; a single output is also
the default; several need one keyed `serving_default`. A signature that its
receiver cannot serve (a classification over raw float inputs) is left out
and logged, as tf.estimator did.
"""

from __future__ import annotations

import tensorflow as tf

from npu_rec import _log as logging

DEFAULT_SERVING_KEY = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY


def _is_dense_tensor(x) -> bool:
    return isinstance(x, tf.Tensor)


class ExportOutput:
    """Base class of the outputs of a served model (tf.estimator.export.ExportOutput).

    Subclasses implement `as_signature_def(receiver_tensors)`.
    """

    def as_signature_def(self, receiver_tensors: dict):
        """The `SignatureDef` of this output over `receiver_tensors` (name -> tensor)."""
        raise NotImplementedError


def _output_dict(outputs, default_name: str, label: str) -> dict:
    if not isinstance(outputs, dict):
        outputs = {default_name: outputs}
    checked = {}
    for key, value in outputs.items():
        if isinstance(key, tuple):
            key = "/".join(key)
        if not isinstance(key, str):
            raise ValueError(
                f"{label} output keys must be strings (or tuples of strings). Received: key {key!r}"
            )
        if not _is_dense_tensor(value):
            raise ValueError(f"{label} output values must be Tensors. Received: {key}={value!r}")
        checked[key] = value
    return checked


def _single_string_input(receiver_tensors: dict, kind: str):
    examples = list(receiver_tensors.values())
    if len(examples) != 1 or examples[0].dtype != tf.string:
        found = {k: getattr(v, "dtype", v) for k, v in receiver_tensors.items()}
        raise ValueError(
            f"{kind} signatures take a single tf.string input (serialized tf.Examples, e.g. "
            "from build_parsing_serving_input_receiver_fn). Received receiver tensors "
            f"{found}."
        )
    return examples[0]


class PredictOutput(ExportOutput):
    """Named prediction tensors, served by the `predict` method.

    Args:
      outputs: A tensor or a dict of name (str, or tuple of str joined by
        "/") -> tensor.

    Raises:
      ValueError: a key is not a string, or a value is not a Tensor.

    Example:
      >>> export_outputs = {"serving_default": PredictOutput({"probabilities": probs})}
    """

    def __init__(self, outputs):
        self._outputs = _output_dict(outputs, "output", "Prediction")

    @property
    def outputs(self) -> dict:
        return self._outputs

    def as_signature_def(self, receiver_tensors):
        return tf.compat.v1.saved_model.predict_signature_def(receiver_tensors, self._outputs)


class ClassificationOutput(ExportOutput):
    """Class scores and/or class labels, served by the `classify` method.

    Args:
      scores: float Tensor [batch, num_classes] (or [batch]), or None.
      classes: string Tensor of class labels, same shape, or None.

    Raises:
      ValueError: both are None, `scores` is not a float Tensor, or
        `classes` is not a string Tensor.
    """

    def __init__(self, scores=None, classes=None):
        if scores is not None and not (_is_dense_tensor(scores) and scores.dtype.is_floating):
            raise ValueError(
                f"ClassificationOutput `scores` must be a float Tensor. Received: scores={scores!r}"
            )
        if classes is not None and not (_is_dense_tensor(classes) and classes.dtype == tf.string):
            raise ValueError(
                "ClassificationOutput `classes` must be a string Tensor (class "
                "names, e.g. tf.as_string(class_ids)). "
                f"Received: classes={classes!r}"
            )
        if scores is None and classes is None:
            raise ValueError(
                "ClassificationOutput needs `scores`, `classes` or both. "
                "Received: scores=None, classes=None"
            )
        self._scores, self._classes = scores, classes

    @property
    def scores(self):
        return self._scores

    @property
    def classes(self):
        return self._classes

    def as_signature_def(self, receiver_tensors):
        examples = _single_string_input(receiver_tensors, "Classification")
        return tf.compat.v1.saved_model.classification_signature_def(
            examples, self._classes, self._scores
        )


class RegressionOutput(ExportOutput):
    """One predicted value per example, served by the `regress` method.

    Args:
      value: float Tensor [batch] (or [batch, 1]).

    Raises:
      ValueError: `value` is not a float Tensor.
    """

    def __init__(self, value):
        if not (_is_dense_tensor(value) and value.dtype.is_floating):
            raise ValueError(
                f"RegressionOutput `value` must be a float Tensor. Received: value={value!r}"
            )
        self._value = value

    @property
    def value(self):
        return self._value

    def as_signature_def(self, receiver_tensors):
        examples = _single_string_input(receiver_tensors, "Regression")
        return tf.compat.v1.saved_model.regression_signature_def(examples, self._value)


def serving_export_outputs(export_outputs, predictions) -> dict:
    """`export_outputs` checked, with the default signature `serving_default` present.

    Args:
      export_outputs: dict signature name -> `ExportOutput`, or None.
      predictions: The spec's predictions (the default `PredictOutput`).

    Returns:
      A new dict: `{"serving_default": PredictOutput(predictions)}` for None;
      a single output also under `serving_default`.

    Raises:
      TypeError: `export_outputs` is not a dict, or a value is not an `ExportOutput`.
      ValueError: several outputs and none keyed `serving_default`.
    """
    if export_outputs is None:
        return {DEFAULT_SERVING_KEY: PredictOutput(predictions)}
    if not isinstance(export_outputs, dict):
        raise TypeError(
            "`export_outputs` must be a dict of signature name -> ExportOutput. "
            f"Received: export_outputs={export_outputs!r}"
        )
    for key, value in export_outputs.items():
        if not isinstance(value, ExportOutput):
            raise TypeError(
                f"`export_outputs[{key!r}]` must be an npu_rec.estimator.export.ExportOutput "
                f"(PredictOutput, ClassificationOutput, RegressionOutput). Received: {value!r}"
            )
    outputs = dict(export_outputs)
    if len(outputs) == 1:
        outputs.setdefault(DEFAULT_SERVING_KEY, next(iter(outputs.values())))
    elif DEFAULT_SERVING_KEY not in outputs:
        raise ValueError(
            f"Several `export_outputs` {sorted(outputs)} and none is the default: key one "
            f"of them {DEFAULT_SERVING_KEY!r} (tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY)."
        )
    return outputs


def signature_def_map(
    receiver_tensors: dict, export_outputs: dict, alternatives: dict | None = None
) -> dict:
    """The SignatureDefs of every export output over the receiver (and its alternatives).

    Signatures over `alternatives[name]` are keyed `"<name>:<signature>"`.
    Outputs the receiver cannot serve are left out and logged.
    """
    groups = [("", receiver_tensors)] + [(f"{n}:", t) for n, t in (alternatives or {}).items()]
    signatures, excluded = {}, {}
    for prefix, tensors in groups:
        for key, output in export_outputs.items():
            name = f"{prefix}{key}"
            try:
                signature = output.as_signature_def(tensors)
            except ValueError as e:
                excluded[name] = str(e)
                continue
            if tf.compat.v1.saved_model.is_valid_signature(signature):
                signatures[name] = signature
            else:
                excluded[name] = "not a valid serving signature"
    for name, reason in excluded.items():
        logging.warning("npu_rec: export leaves out signature %r: %s", name, reason)
    if DEFAULT_SERVING_KEY not in signatures:
        logging.warning("npu_rec: the export has no default signature %r.", DEFAULT_SERVING_KEY)
    return signatures
