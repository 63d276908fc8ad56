"""`tf.estimator.export`'s serving input receivers: what a served model is fed.

A `serving_input_receiver_fn()` builds, in the export graph, the tensors a
SavedModel signature takes (`receiver_tensors`, usually placeholders) and the
`features` the `model_fn` is called with in PREDICT mode. Two ready-made
builders: `build_raw_serving_input_receiver_fn` (feed the features
themselves, e.g. int64 ids) and `build_parsing_serving_input_receiver_fn`
(feed serialized `tf.Example`s, parsed by a feature spec; the classify and
regress signatures need this).
"""

from __future__ import annotations

import collections

import tensorflow as tf

#: The key a single tensor gets when a dict is expected, per field (as tf.estimator).
_SINGLE_KEYS = {
    "features": "feature",
    "receiver_tensors": "input",
    "receiver_tensors_alternatives": "input",
}
_TENSOR_TYPES = (tf.Tensor, tf.SparseTensor, tf.RaggedTensor)


def _tensor_dict(tensors, field: str, allow_int_keys: bool = False) -> dict:
    """`tensors` as a dict name -> tensor, checked.

    Raises:
      ValueError: None, a key that is not a string (or int), or a value that
        is not a Tensor / SparseTensor / RaggedTensor.
    """
    if tensors is None:
        raise ValueError(f"`{field}` must be a tensor or a dict of tensors. Received: {field}=None")
    if not isinstance(tensors, dict):
        tensors = {_SINGLE_KEYS[field]: tensors}
    for key, value in tensors.items():
        if not isinstance(key, str) and not (allow_int_keys and isinstance(key, int)):
            raise ValueError(f"`{field}` keys must be strings. Received: key {key!r}")
        if not isinstance(value, _TENSOR_TYPES):
            raise ValueError(
                f"`{field}[{key!r}]` must be a Tensor, SparseTensor or "
                f"RaggedTensor. Received: {value!r}"
            )
    return tensors


def _alternatives(alternatives):
    if alternatives is None:
        return None
    if not isinstance(alternatives, dict):
        raise ValueError(
            "`receiver_tensors_alternatives` must be a dict of name -> tensors. "
            f"Received: {alternatives!r}"
        )
    return {
        name: _tensor_dict(t, "receiver_tensors_alternatives") for name, t in alternatives.items()
    }


class ServingInputReceiver(
    collections.namedtuple(
        "ServingInputReceiver", ["features", "receiver_tensors", "receiver_tensors_alternatives"]
    )
):
    """What a `serving_input_receiver_fn` returns (tf.estimator.export.ServingInputReceiver).

    Args:
      features: A tensor or dict of name -> Tensor / SparseTensor /
        RaggedTensor given to the `model_fn`; a single tensor becomes
        `{"feature": tensor}` (use `TensorServingInputReceiver` to pass it as is).
      receiver_tensors: A tensor or dict of name -> tensor the signatures
        take (a single tensor is named "input").
      receiver_tensors_alternatives: dict name -> tensors of further input
        groups; each gives signatures keyed "<name>:<signature>".

    Raises:
      ValueError: a field is None, has a non-string key, or holds a value
        that is not a tensor.

    Example:
      >>> ids = tf.compat.v1.placeholder(tf.int64, [None, 26], name="cat")
      >>> ServingInputReceiver({"cat": ids}, {"cat": ids})
    """

    def __new__(cls, features, receiver_tensors, receiver_tensors_alternatives=None):
        return super().__new__(
            cls,
            _tensor_dict(features, "features", allow_int_keys=True),
            _tensor_dict(receiver_tensors, "receiver_tensors"),
            _alternatives(receiver_tensors_alternatives),
        )


class TensorServingInputReceiver(
    collections.namedtuple(
        "TensorServingInputReceiver",
        ["features", "receiver_tensors", "receiver_tensors_alternatives"],
    )
):
    """A `ServingInputReceiver` whose single feature tensor reaches the `model_fn` as is.

    Args:
      features: One Tensor / SparseTensor / RaggedTensor.
      receiver_tensors, receiver_tensors_alternatives: As `ServingInputReceiver`.

    Raises:
      ValueError: `features` is not a single tensor, or as `ServingInputReceiver`.
    """

    def __new__(cls, features, receiver_tensors, receiver_tensors_alternatives=None):
        if not isinstance(features, _TENSOR_TYPES):
            raise ValueError(
                "TensorServingInputReceiver `features` must be one Tensor, "
                f"SparseTensor or RaggedTensor. Received: {features!r}"
            )
        receiver = ServingInputReceiver(features, receiver_tensors, receiver_tensors_alternatives)
        return super().__new__(
            cls, features, receiver.receiver_tensors, receiver.receiver_tensors_alternatives
        )


def build_parsing_serving_input_receiver_fn(feature_spec, default_batch_size=None):
    """A `serving_input_receiver_fn` fed serialized `tf.Example`s.

    Args:
      feature_spec: dict name -> `tf.io.FixedLenFeature` / `VarLenFeature` /
        ... (as `tf.io.parse_example`).
      default_batch_size: Fixed number of examples per request, or None for any.

    Returns:
      A function returning a `ServingInputReceiver` whose one receiver tensor
      `examples` is a string placeholder [batch] and whose features are the
      parsed examples.
    """

    def serving_input_receiver_fn():
        examples = tf.compat.v1.placeholder(
            tf.string, [default_batch_size], name="input_example_tensor"
        )
        features = tf.io.parse_example(examples, feature_spec)
        return ServingInputReceiver(features, {"examples": examples})

    return serving_input_receiver_fn


def build_raw_serving_input_receiver_fn(features, default_batch_size=None):
    """A `serving_input_receiver_fn` fed the features themselves (e.g. int64 ids).

    Args:
      features: dict name -> a tensor (its dtype and shape are copied, the
        first dimension replaced by the batch size) or a `tf.TensorSpec`.
      default_batch_size: Fixed batch size, or None for any.

    Returns:
      A function returning a `ServingInputReceiver` whose features and
      receiver tensors are the same placeholders, named as the keys.
    """

    def serving_input_receiver_fn():
        placeholders = {}
        for name, t in features.items():
            shape = tf.TensorShape(t.shape)
            if shape.rank is not None:
                shape = tf.TensorShape([default_batch_size]).concatenate(shape[1:])
            placeholders[name] = tf.compat.v1.placeholder(t.dtype, shape, name=name)
        return ServingInputReceiver(placeholders, placeholders)

    return serving_input_receiver_fn
