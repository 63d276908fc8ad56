"""NPUEstimator(params=<any object>): the object reaches model_fn as given."""

import argparse

import tensorflow as tf

from npu_rec import estimator as E


def test_namespace_params_reach_model_fn(tmp_path):
    seen = []

    def model_fn(features, labels, mode, params):
        seen.append(params)
        w = tf.compat.v1.get_variable("w", [], initializer=tf.zeros_initializer())
        loss = tf.square(w - params.target)
        step = tf.compat.v1.train.get_global_step()
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, step)
        return E.EstimatorSpec(mode, loss=loss, train_op=train_op)

    params = argparse.Namespace(target=1.0)
    est = E.NPUEstimator(model_fn, model_dir=str(tmp_path), params=params)
    assert est.params is params
    est.train(lambda: tf.data.Dataset.from_tensors(({"x": [0.0]}, [0.0])).repeat(), max_steps=2)
    assert seen and seen[0] is params
    assert E.NPUEstimator(model_fn, model_dir=str(tmp_path), params={"a": 1}).params == {"a": 1}
