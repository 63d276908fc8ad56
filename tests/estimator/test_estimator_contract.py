"""tf.estimator behaviours a ported model_fn relies on."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from npu_rec import estimator as E


def _linear_model_fn(features, labels, mode, params):
    w = tf.compat.v1.get_variable(
        "w", [3, 1], initializer=tf.compat.v1.glorot_uniform_initializer(seed=params.get("seed", 1))
    )
    b = tf.compat.v1.get_variable("b", [1], initializer=tf.zeros_initializer())
    y = (tf.matmul(features["x"], w) + b)[:, 0]
    predictions = {"y": y}
    if params.get("extra_prediction") is not None:
        predictions["extra"] = params["extra_prediction"]()
    if mode == E.ModeKeys.PREDICT:
        return E.EstimatorSpec(mode, predictions=predictions)
    loss = tf.reduce_mean(tf.square(y - labels))
    metrics = {}
    if params.get("keras_metric"):
        mean = keras.metrics.Mean()
        mean.update_state(y)
        mae = keras.metrics.MeanAbsoluteError()
        mae.update_state(labels, y)
        metrics = {"mean_y": mean, "mae": mae}
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, tf.compat.v1.train.get_global_step()
    )
    return E.EstimatorSpec(
        mode, loss=loss, train_op=train_op, eval_metric_ops=metrics, predictions=predictions
    )


def _data(n=32):
    x = np.random.RandomState(0).uniform(-1, 1, (n, 3)).astype(np.float32)
    return x, (x @ np.array([1.0, -2.0, 0.5], np.float32) + 0.3).astype(np.float32)


def _input_fn(epochs=1, batch=8):
    x, y = _data()

    def input_fn():
        return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).repeat(epochs).batch(batch)

    return input_fn


def _est(model_dir, **kwargs):
    params = kwargs.pop("params", {})
    return E.NPUEstimator(
        _linear_model_fn,
        model_dir=str(model_dir),
        params=params,
        config=E.NPURunConfig(log_step_count_steps=None),
        **kwargs,
    )


def test_predict_with_predictions_of_different_batch_length_raises(tmp_path):
    est = _est(tmp_path, params={"extra_prediction": lambda: tf.zeros([3])})
    with pytest.raises(ValueError, match=r"first dimension.*'extra'.*3.*'y'.*8"):
        next(est.predict(_input_fn()))
    # Whole batches are fine: yield_single_examples=False does not split rows.
    batch = next(est.predict(_input_fn(), yield_single_examples=False))
    assert batch["y"].shape == (8,) and batch["extra"].shape == (3,)


def test_predict_with_a_scalar_prediction_asks_for_whole_batches(tmp_path):
    est = _est(tmp_path, params={"extra_prediction": lambda: tf.constant(1.0)})
    with pytest.raises(ValueError, match=r"'extra' is a scalar.*yield_single_examples=False"):
        next(est.predict(_input_fn()))


def test_warm_start_from_applies_to_evaluate_and_predict_without_checkpoint(tmp_path):
    source = _est(tmp_path / "source")
    source.train(_input_fn(epochs=4), steps=16)
    x, y = _data()
    w, b = source.get_variable_value("w"), source.get_variable_value("b")
    expected = (x @ w + b)[:, 0]
    for warm in (source.model_dir, source.latest_checkpoint()):
        est = _est(tmp_path / f"warm{len(warm)}", params={"seed": 7}, warm_start_from=warm)
        preds = [p["y"] for p in est.predict(_input_fn())]
        np.testing.assert_allclose(preds, expected, rtol=1e-5, atol=1e-6)
        loss = est.evaluate(_input_fn(batch=32))["loss"]
        np.testing.assert_allclose(loss, np.mean((expected - y) ** 2), rtol=1e-5)
        assert est.latest_checkpoint() is None  # evaluate/predict write nothing


def test_variable_access_before_training_names_the_missing_checkpoint(tmp_path):
    est = _est(tmp_path)
    with pytest.raises(ValueError, match="Could not find trained model in model_dir"):
        est.get_variable_names()
    with pytest.raises(ValueError, match="Could not find trained model in model_dir"):
        est.get_variable_value("w")


def test_keras_metric_objects_in_eval_metric_ops(tmp_path):
    est = _est(tmp_path, params={"keras_metric": True})
    est.train(_input_fn(epochs=2), steps=8)
    x, y = _data()
    pred = (x @ est.get_variable_value("w") + est.get_variable_value("b"))[:, 0]
    for _ in range(2):  # metric state starts at zero in every evaluation
        result = est.evaluate(_input_fn())
        np.testing.assert_allclose(result["mean_y"], pred.mean(), rtol=1e-5)
        np.testing.assert_allclose(result["mae"], np.abs(pred - y).mean(), rtol=1e-5)
    # The metric's variables are local: the checkpoint holds only the model.
    assert sorted(est.get_variable_names()) == ["b", "global_step", "w"]


def test_eval_metric_ops_rules():
    with tf.Graph().as_default():
        loss = tf.constant(1.0)
        with pytest.raises(ValueError, match=r"update_state\(\.\.\.\) was never called"):
            E.EstimatorSpec(E.ModeKeys.EVAL, loss=loss, eval_metric_ops={"m": keras.metrics.Mean()})
        for name in ("loss", "global_step"):
            with pytest.raises(ValueError, match=f"may not use the name '{name}'"):
                E.EstimatorSpec(
                    E.ModeKeys.EVAL,
                    loss=loss,
                    eval_metric_ops={name: tf.compat.v1.metrics.mean(loss)},
                )
        with pytest.raises(TypeError, match=r"`eval_metric_ops\['m'\]` must be a \(value"):
            E.EstimatorSpec(E.ModeKeys.EVAL, loss=loss, eval_metric_ops={"m": loss})
