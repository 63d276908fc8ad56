"""model_fns using tf.compat.v1.layers work with tf_keras and TF_USE_LEGACY_KERAS=1."""

import concurrent.futures
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CODE = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    import numpy as np, tensorflow as tf, keras
    import npu_rec
    from npu_rec import estimator as E

    def model_fn(features, labels, mode):
        table = npu_rec.create_table("t", 4, optimizer=npu_rec.optimizers.SGD(0.1))
        emb = npu_rec.sparse_lookup(table, features, combiner="sum",
                                    is_training=mode == E.ModeKeys.TRAIN)
        logits = tf.compat.v1.layers.dense(tf.compat.v1.layers.dense(emb, 8, tf.nn.relu), 1)
        loss = tf.compat.v1.losses.sigmoid_cross_entropy(tf.reshape(labels, [-1, 1]), logits)
        train_op = E.sparse_train_op(loss, tf.compat.v1.train.AdamOptimizer(0.01),
                                     tf.compat.v1.train.get_global_step())
        mean_loss = tf.keras.metrics.Mean()        # tf_keras under TF_USE_LEGACY_KERAS=1
        mean_loss.update_state(loss)
        return E.EstimatorSpec(mode, loss=loss, train_op=train_op,
                               eval_metric_ops={{"mean_loss": mean_loss}})

    def input_fn():
        ids = np.arange(64, dtype=np.int64).reshape(32, 2)
        return tf.data.Dataset.from_tensor_slices((ids, (ids[:, 0] % 2).astype(np.float32))).batch(8)

    est = E.NPUEstimator(model_fn, model_dir={model_dir!r})
    est.train(input_fn, max_steps=4)
    assert keras.__version__.startswith("3."), keras.__version__
    result = est.evaluate(input_fn)
    assert abs(result["mean_loss"] - result["loss"]) < 1e-6, result     # tf_keras metric object
    print("LOSS", result["loss"])
""")


def _run(tmp_path, env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _CODE.format(root=ROOT, model_dir=str(tmp_path))],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The model_fn's process with TF_USE_LEGACY_KERAS=1 ("legacy") and without ("keras3"),
    run side by side once (each mostly imports TensorFlow)."""
    envs = {
        "legacy": {**os.environ, "TF_USE_LEGACY_KERAS": "1"},
        "keras3": {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"},
    }
    dirs = [tmp_path_factory.mktemp(name) for name in envs]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return dict(zip(envs, pool.map(_run, dirs, envs.values()), strict=True))


def test_legacy_layers_model_fn_in_subprocess(runs):
    pytest.importorskip("tf_keras")
    out = runs["legacy"]
    assert out.returncode == 0, out.stderr[-2000:]
    assert "LOSS" in out.stdout


def test_legacy_layers_without_env_var_fail_as_documented(runs):
    out = runs["keras3"]
    assert out.returncode != 0
    assert "not available with Keras 3" in out.stderr
