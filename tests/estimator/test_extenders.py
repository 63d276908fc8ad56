"""`add_metrics` and the parse-example specs, as tf.estimator's."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from npu_rec import estimator as E
from tests.estimator.test_train_and_evaluate import _est, batches_input_fn, eval_input_fn


def test_add_metrics_adds_to_evaluation_only(tmp_path):
    est = _est(tmp_path)
    est.train(batches_input_fn(), max_steps=3)

    def keras_metric_fn(labels):
        metric = keras.metrics.Sum()
        metric.update_state(tf.ones_like(labels))
        return {"n": metric}

    extended = E.add_metrics(
        E.add_metrics(est, lambda features: {"mean_x": tf.compat.v1.metrics.mean(features["x"])}),
        keras_metric_fn,
    )
    assert extended.model_dir == est.model_dir
    result = extended.evaluate(eval_input_fn, steps=1)
    assert result["mean_x"] == pytest.approx(1.0) and result["n"] == pytest.approx(4.0)
    assert result["score"] == est.evaluate(eval_input_fn, steps=1)["score"]
    with pytest.raises(ValueError, match="`metric_fn` may take only"):
        E.add_metrics(est, lambda features, mode: {})


def test_parse_example_specs():
    columns = [tf.compat.v1.feature_column.numeric_column("a", shape=[2])]
    spec = E.classifier_parse_example_spec(columns, "label", weight_column="w")
    assert spec == {
        "a": tf.io.FixedLenFeature((2,), tf.float32),
        "w": tf.io.FixedLenFeature((1,), tf.float32),
        "label": tf.io.FixedLenFeature([1], tf.int64),
    }
    spec = E.regressor_parse_example_spec(columns, "y", label_dimension=3)
    assert spec["y"] == tf.io.FixedLenFeature([3], tf.float32)
    with pytest.raises(ValueError, match="`label_key` 'a'"):
        E.classifier_parse_example_spec(columns, "a")
    assert np.all([isinstance(v, tf.io.FixedLenFeature) for v in spec.values()])
