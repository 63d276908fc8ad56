"""An NPUEstimator program in mx_rec's style (the call shapes of Rec SDK's estimator demo)."""

import argparse

import numpy as np
import tensorflow as tf

import npu_rec
from npu_rec.compat.mx_rec.core.asc.feature_spec import FeatureSpec
from npu_rec.compat.mx_rec.core.embedding import create_table, sparse_lookup
from npu_rec.compat.mx_rec.graph.modifier import GraphModifierHook
from npu_rec.compat.mx_rec.optimizers.gradient_descent import create_hash_optimizer
from npu_rec.compat.mx_rec.util.initialize import get_rank_size, init, terminate_config_initializer
from npu_rec.compat.mx_rec.util.tf_version_adapter import hccl_ops
from npu_rec.compat.mx_rec.util.variable import get_dense_and_sparse_variable
from npu_rec.compat.npu_bridge.estimator.npu.npu_config import NPURunConfig
from npu_rec.compat.npu_bridge.estimator.npu.npu_estimator import NPUEstimator
from npu_rec.compat.npu_bridge.util import npu_hooks_append


def input_fn():
    rng = np.random.RandomState(0)
    ids = rng.randint(0, 50, (64, 4)).astype(np.int64)
    labels = (ids[:, 0] % 2).astype(np.float32)
    return (
        tf.data.Dataset.from_tensor_slices({"user_ids": ids, "label_0": labels}).repeat().batch(16)
    )


def test_estimator_program_trains_evaluates_and_predicts(tmp_path):
    init(train_steps=3, eval_steps=2, use_dynamic=True, use_mpi=False)
    table = create_table(
        tf.int64,
        tf.TensorShape([4]),
        "user_table",
        tf.compat.v1.truncated_normal_initializer(stddev=0.1),
        device_vocabulary_size=64,
    )
    spec = FeatureSpec("user_ids", table_name="user_table")
    bound = []

    def model_fn(features, labels, mode, params):
        is_train = mode == tf.estimator.ModeKeys.TRAIN
        emb = sparse_lookup(
            table, spec, None, is_train=is_train, batch=features, name="user_table_lookup"
        )
        scale = tf.compat.v1.get_variable("scale", [], initializer=tf.compat.v1.ones_initializer())
        logit = tf.reduce_sum(emb, [1, 2]) * scale
        loss = tf.reduce_mean(
            tf.nn.sigmoid_cross_entropy_with_logits(labels=features["label_0"], logits=logit)
        )
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={"p": tf.sigmoid(logit)})
        if mode == tf.estimator.ModeKeys.EVAL:
            return tf.estimator.EstimatorSpec(mode, loss=loss)
        dense_opt = tf.compat.v1.train.AdamOptimizer(params.learning_rate)
        sparse_opt = create_hash_optimizer(learning_rate=params.learning_rate)
        dense, sparse = get_dense_and_sparse_variable()
        grads = dense_opt.compute_gradients(loss, var_list=[dense])
        pairs = [(hccl_ops.allreduce(g, "sum") if get_rank_size() > 1 else g, v) for g, v in grads]
        sparse_grads = tf.gradients(loss, sparse)
        ops = [
            dense_opt.apply_gradients(pairs),
            sparse_opt.apply_gradients(list(zip(sparse_grads, sparse, strict=True))),
            tf.compat.v1.assign_add(tf.compat.v1.train.get_global_step(), 1),
        ]
        bound.append(type(table.core.optimizer))
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=tf.group(*ops))

    params = argparse.Namespace(learning_rate=0.05)
    est = NPUEstimator(
        model_fn=model_fn,
        params=params,
        model_dir=str(tmp_path),
        config=NPURunConfig(save_checkpoints_steps=3),
    )
    hooks = npu_hooks_append([GraphModifierHook(modify_graph=False)])
    train_spec = tf.estimator.TrainSpec(input_fn, max_steps=3, hooks=hooks)
    eval_spec = tf.estimator.EvalSpec(input_fn, steps=2, hooks=hooks, throttle_secs=0)
    result, _ = tf.estimator.train_and_evaluate(est, train_spec, eval_spec)
    assert result["global_step"] == 3 and np.isfinite(result["loss"])
    preds = [next(iter(est.predict(input_fn, yield_single_examples=False)))]
    assert preds[0]["p"].shape == (16,)
    # the table was trained by the optimizer the program asked for (SGD), and checkpointed
    assert bound == [npu_rec.optimizers.SGD]
    terminate_config_initializer()
