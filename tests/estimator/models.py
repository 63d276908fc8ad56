"""A DeepFM `model_fn` written the tf.estimator way, and input functions, for the tests.

Only the imports differ from a `tf.estimator` model_fn: `npu_rec.estimator`
for EstimatorSpec/ModeKeys, `npu_rec.create_table` / `sparse_lookup` for the
embeddings.
"""

import numpy as np
import tensorflow as tf

import npu_rec
from npu_rec.data import SyntheticCriteo
from npu_rec.estimator import EstimatorSpec, ModeKeys, export, sparse_train_op

NUM_CAT = 26
NUM_DENSE = 13


def deepfm_model_fn(features, labels, mode, params):
    dim = params.get("dim", 4)
    is_training = mode == ModeKeys.TRAIN
    table = npu_rec.create_table(
        "cat",
        dim,
        optimizer=npu_rec.optimizers.Adagrad(params.get("sparse_lr", 0.05)),
        access_threshold=params.get("access_threshold", -1),
        **params.get("table_kwargs", {}),
    )
    linear = npu_rec.create_table(
        "cat_linear",
        1,
        optimizer=npu_rec.optimizers.Adagrad(params.get("sparse_lr", 0.05)),
        access_threshold=params.get("access_threshold", -1),
        **params.get("table_kwargs", {}),
    )
    ids = features["cat"]  # int64 [b, 26]
    emb = npu_rec.sparse_lookup(table, ids, is_training=is_training)  # [b, 26, d]
    lin = npu_rec.sparse_lookup(linear, ids, is_training=is_training)  # [b, 26, 1]
    dense = features["dense"]  # float32 [b, 13]
    # FM second-order term.
    sum_sq = tf.square(tf.reduce_sum(emb, 1))
    sq_sum = tf.reduce_sum(tf.square(emb), 1)
    fm = 0.5 * tf.reduce_sum(sum_sq - sq_sum, 1, keepdims=True)
    # Deep part.
    init = tf.compat.v1.glorot_uniform_initializer()
    x = tf.concat([tf.reshape(emb, [-1, NUM_CAT * dim]), dense], 1)
    for i, units in enumerate(params.get("hidden", (16,))):
        w = tf.compat.v1.get_variable(f"w{i}", [x.shape[1], units], initializer=init)
        b = tf.compat.v1.get_variable(f"b{i}", [units], initializer=tf.zeros_initializer())
        x = tf.nn.relu(tf.matmul(x, w) + b)
    w_out = tf.compat.v1.get_variable("w_out", [x.shape[1], 1], initializer=init)
    w_dense = tf.compat.v1.get_variable("w_dense", [NUM_DENSE, 1], initializer=init)
    bias = tf.compat.v1.get_variable("bias", [1], initializer=tf.zeros_initializer())
    logits = tf.matmul(x, w_out) + tf.matmul(dense, w_dense) + fm + tf.reduce_sum(lin, 1) + bias
    logits = tf.reshape(logits, [-1])
    probs = tf.sigmoid(logits)
    predictions = {"probabilities": probs, "logits": logits}
    if mode == ModeKeys.PREDICT:
        export_outputs = None
        if params.get("export_outputs"):  # as public DeepFM estimators write it
            export_outputs = {
                tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY: export.PredictOutput(predictions)
            }
        return EstimatorSpec(mode, predictions=predictions, export_outputs=export_outputs)
    loss = tf.reduce_mean(
        tf.compat.v1.nn.sigmoid_cross_entropy_with_logits(
            labels=tf.cast(labels, tf.float32), logits=logits
        ),
        name="loss",
    )
    if mode == ModeKeys.EVAL:
        return EstimatorSpec(
            mode,
            loss=loss,
            eval_metric_ops={"auc": tf.compat.v1.metrics.auc(labels, probs, num_thresholds=2000)},
        )
    optimizer = tf.compat.v1.train.AdamOptimizer(params.get("lr", 0.01))
    global_step = tf.compat.v1.train.get_global_step()
    if params.get("use_minimize"):
        train_op = optimizer.minimize(loss, global_step=global_step)
    else:
        train_op = sparse_train_op(loss, optimizer, global_step)
    return EstimatorSpec(mode, loss=loss, train_op=train_op, predictions=predictions)


def synthetic_arrays(start, stop, seed=3):
    rows = SyntheticCriteo(seed=seed, vocab_sizes=(50,) * NUM_CAT).rows(start, stop)
    cat = np.stack([rows[f"C{i}"] for i in range(1, NUM_CAT + 1)], 1)
    dense = np.log1p(np.stack([rows[f"I{i}"] for i in range(1, NUM_DENSE + 1)], 1))
    return {"cat": cat, "dense": dense.astype(np.float32)}, rows["label"].astype(np.int64)


def make_input_fn(features, labels, batch_size=64, epochs=1, shuffle=False):
    def input_fn():
        ds = tf.data.Dataset.from_tensor_slices((features, labels))
        if shuffle:
            ds = ds.shuffle(1024, seed=1)
        return ds.repeat(epochs).batch(batch_size, drop_remainder=True)

    return input_fn


def synthetic_input_fn(start=0, stop=6400, batch_size=64, epochs=1, seed=3):
    features, labels = synthetic_arrays(start, stop, seed)
    return make_input_fn(features, labels, batch_size, epochs)
