"""Unnamed Keras 3 layers in a model_fn: every graph the Estimator builds sees the same names."""

import keras
import numpy as np
import tensorflow as tf

from npu_rec import estimator as E
from npu_rec.estimator import _keras_names


def _model_fn(features, labels, mode):
    """DeepCTR / official-mnist style: unnamed Keras layers, v1 optimizer and metrics."""
    hidden = keras.layers.Dense(8, activation="relu")(features["x"])
    logits = keras.layers.Dense(1)(hidden)[:, 0]
    predictions = {"logits": logits, "probabilities": tf.sigmoid(logits)}
    if mode == E.ModeKeys.PREDICT:
        return E.EstimatorSpec(mode, predictions=predictions)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    if mode == E.ModeKeys.EVAL:
        return E.EstimatorSpec(
            mode,
            loss=loss,
            eval_metric_ops={
                "accuracy": tf.compat.v1.metrics.accuracy(
                    labels, tf.round(predictions["probabilities"])
                )
            },
        )
    train_op = tf.compat.v1.train.AdamOptimizer(0.05).minimize(
        loss, tf.compat.v1.train.get_global_step()
    )
    return E.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _data(n=64, seed=0):
    x = np.random.RandomState(seed).uniform(-1, 1, (n, 3)).astype(np.float32)
    return x, (x[:, 0] + x[:, 1] > 0).astype(np.float32)


def _input_fn(epochs=1):
    x, y = _data()

    def input_fn():
        return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).repeat(epochs).batch(8)

    return input_fn


def _layers(est):
    """The two Dense layers' variable scopes, in order (Keras 3 in a v1 graph: `dense`,
    `dense_1_1`: the graph uniquifies the name scope Keras opens twice for the first layer)."""
    kernels = sorted(n for n in est.get_variable_names() if n.endswith("/kernel"))
    assert len(kernels) == 2, kernels
    return [k[: -len("/kernel")] for k in kernels]


def _numpy_logits(est, x):
    first, second = _layers(est)
    value = est.get_variable_value
    h = np.maximum(x @ value(f"{first}/kernel") + value(f"{first}/bias"), 0)
    return (h @ value(f"{second}/kernel") + value(f"{second}/bias"))[:, 0]


def test_train_evaluate_predict_train_again_in_one_process(tmp_path):
    # The process has numbered layers before the Estimator runs ("dense" or "dense_N").
    first = keras.layers.Dense(2).name
    numbered = 0 if first == "dense" else int(first.rsplit("_", 1)[1])
    est = E.NPUEstimator(
        _model_fn, model_dir=str(tmp_path), config=E.NPURunConfig(log_step_count_steps=None)
    )
    est.train(_input_fn(epochs=5), steps=20)
    names = set(est.get_variable_names())
    assert _layers(est)[0] == "dense"  # as in a fresh process
    result = est.evaluate(_input_fn())
    assert result["global_step"] == 20 and 0.5 < result["accuracy"] <= 1.0
    x, _ = _data()
    preds = list(est.predict(_input_fn()))
    np.testing.assert_allclose([p["logits"] for p in preds], _numpy_logits(est, x), atol=1e-5)
    est.train(_input_fn(epochs=5), steps=20)  # resumes from the checkpoint's names
    assert est.latest_checkpoint().endswith("model.ckpt-40")
    assert set(est.get_variable_names()) == names
    # Outside the Estimator, Keras numbers layers on from where the process was.
    assert keras.layers.Dense(2).name == f"dense_{numbered + 1}"


def test_train_and_evaluate_over_four_intervals(tmp_path):
    evaluations = []

    class Count(tf.compat.v1.train.SessionRunHook):
        def end(self, session):
            evaluations.append(int(session.run(tf.compat.v1.train.get_global_step())))

    est = E.NPUEstimator(
        _model_fn,
        model_dir=str(tmp_path),
        config=E.NPURunConfig(
            save_checkpoints_steps=5, keep_checkpoint_max=2, log_step_count_steps=None
        ),
    )
    result, _ = E.train_and_evaluate(
        est,
        E.TrainSpec(_input_fn(epochs=10), max_steps=20),
        E.EvalSpec(_input_fn(), steps=4, hooks=[Count()]),
    )
    assert evaluations == [5, 10, 15, 20]
    assert result["global_step"] == 20
    # keep_checkpoint_max=2 counts every save of the run (four intervals).
    assert sorted(p.name for p in tmp_path.glob("model.ckpt-*")) == [
        "model.ckpt-15.data-00000-of-00001",
        "model.ckpt-15.index",
        "model.ckpt-20.data-00000-of-00001",
        "model.ckpt-20.index",
    ]
    assert len(list((tmp_path / "commits").iterdir())) == 2
    state = tf.train.get_checkpoint_state(str(tmp_path))
    assert [p.rsplit("/", 1)[-1] for p in state.all_model_checkpoint_paths] == [
        "model.ckpt-15",
        "model.ckpt-20",
    ]
    x, _ = _data()
    preds = list(est.predict(_input_fn()))
    np.testing.assert_allclose([p["logits"] for p in preds], _numpy_logits(est, x), atol=1e-5)


def test_keras_keeps_the_layer_name_counter_where_npu_rec_resets_it():
    assert _keras_names.available(), (
        f"Keras {keras.__version__} moved keras.src.backend.common.global_state "
        "(get/set_global_attribute): update npu_rec/estimator/_keras_names.py"
    )
    with _keras_names.fresh_layer_names():
        first = keras.layers.Dense(1).name
    with _keras_names.fresh_layer_names():
        second = keras.layers.Dense(1).name
    assert first == second == "dense", (
        f"Keras {keras.__version__} no longer names layers from "
        f"global_state.{_keras_names.UIDS_ATTRIBUTE}: update npu_rec/estimator/_keras_names.py"
    )
