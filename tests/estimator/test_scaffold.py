"""`EstimatorSpec(scaffold=...)` is honoured as tf.estimator did."""

import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec import estimator as E

PRETRAINED = np.array([[0.5], [-1.5], [2.0]], np.float32)


def _model_fn(features, labels, mode, params):
    """A linear model with a sparse table; `params["scaffold"](w, b)` builds the scaffold."""
    table = npu_rec.create_table("t", 1, optimizer=npu_rec.optimizers.SGD(0.1))
    emb = npu_rec.sparse_lookup(table, features["id"], is_training=mode == E.ModeKeys.TRAIN)
    w = tf.compat.v1.get_variable("w", [3, 1], initializer=tf.zeros_initializer())
    b = tf.compat.v1.get_variable("b", [1], initializer=tf.zeros_initializer())
    y = (tf.matmul(features["x"], w) + b)[:, 0] + 0.0 * emb[:, 0]  # the table is saved
    extra = params.get("extra", lambda features: {})(features)
    scaffold = params["scaffold"](w, b) if "scaffold" in params else None
    predictions = {"y": y, **extra}
    if mode == E.ModeKeys.PREDICT:
        return E.EstimatorSpec(mode, predictions=predictions, scaffold=scaffold)
    loss = tf.reduce_mean(tf.square(y - labels))
    train_op = E.sparse_train_op(
        loss,
        tf.compat.v1.train.GradientDescentOptimizer(params.get("lr", 1e-9)),
        tf.compat.v1.train.get_global_step(),
    )
    return E.EstimatorSpec(
        mode, loss=loss, train_op=train_op, scaffold=scaffold, predictions=predictions
    )


def _data(n=16):
    x = np.random.RandomState(0).uniform(-1, 1, (n, 3)).astype(np.float32)
    return x, np.arange(n, dtype=np.int64) % 4, (x @ PRETRAINED)[:, 0]


def _input_fn(epochs=1):
    x, ids, y = _data()

    def input_fn():
        return tf.data.Dataset.from_tensor_slices(({"x": x, "id": ids}, y)).repeat(epochs).batch(8)

    return input_fn


def _serving_fn():
    return E.export.build_raw_serving_input_receiver_fn(
        {"x": tf.TensorSpec([None, 3]), "id": tf.TensorSpec([None], tf.int64)}
    )


def _est(model_dir, **params):
    return E.NPUEstimator(
        _model_fn,
        model_dir=str(model_dir),
        params=params,
        config=E.NPURunConfig(log_step_count_steps=None),
    )


def test_init_fn_loads_pretrained_weights_only_without_checkpoint(tmp_path):
    calls = []

    def scaffold(w, b):
        assign = w.assign(PRETRAINED)

        def init_fn(scaffold, session):
            calls.append(type(scaffold).__name__)
            session.run(assign)

        return tf.compat.v1.train.Scaffold(init_fn=init_fn)

    # evaluate / predict without a checkpoint run init_fn (tf.estimator: "running initialization").
    fresh = _est(tmp_path / "fresh", scaffold=scaffold)
    x, _, y = _data()
    preds = [p["y"] for p in fresh.predict(_input_fn())]
    np.testing.assert_allclose(preds, (x @ PRETRAINED)[:, 0], atol=1e-6)
    assert fresh.evaluate(_input_fn())["loss"] < 1e-10
    assert calls == ["Scaffold", "Scaffold"]
    # train starts from the pretrained weights; a resumed train does not run init_fn again.
    est = _est(tmp_path / "train", scaffold=scaffold, lr=0.1)
    est.train(_input_fn(epochs=2), steps=2)
    assert len(calls) == 3
    np.testing.assert_allclose(est.get_variable_value("w"), PRETRAINED, atol=1e-6)
    est.train(_input_fn(epochs=2), steps=2)
    assert len(calls) == 3 and est.latest_checkpoint().endswith("-4")
    assert est.evaluate(_input_fn())["loss"] < 1e-10 and len(calls) == 3


def test_custom_saver_writes_and_restores_the_dense_checkpoint(tmp_path):
    def scaffold(w, b):
        return tf.compat.v1.train.Scaffold(
            saver=tf.compat.v1.train.Saver(
                {"renamed_w": w, "global_step": tf.compat.v1.train.get_global_step()}
            )
        )

    est = _est(tmp_path, scaffold=scaffold, lr=0.1)
    est.train(_input_fn(epochs=2), steps=3)
    assert sorted(est.get_variable_names()) == ["global_step", "renamed_w"]
    w = est.get_variable_value("renamed_w")
    assert not np.allclose(w, 0)
    x, _, _ = _data()
    preds = [p["y"] for p in est.predict(_input_fn())]  # b is not saved: zeros
    np.testing.assert_allclose(preds, (x @ w)[:, 0], atol=1e-6)
    est.train(_input_fn(epochs=2), steps=1)
    assert est.latest_checkpoint().endswith("-4")
    w = est.get_variable_value("renamed_w")
    path = est.export_saved_model(str(tmp_path / "export"), _serving_fn())  # restores with it
    served = tf.saved_model.load(path.decode()).signatures["serving_default"]
    _, ids, _ = _data()
    np.testing.assert_allclose(
        served(x=tf.constant(x), id=tf.constant(ids))["y"].numpy(), (x @ w)[:, 0], atol=1e-6
    )
    # The tables are still saved next to the dense checkpoint.
    assert sorted(f for f in (tmp_path / "tables").iterdir() if f.name.endswith(".nrc"))


def test_a_custom_saver_without_the_global_step_is_named(tmp_path):
    est = _est(
        tmp_path,
        lr=0.1,
        scaffold=lambda w, b: tf.compat.v1.train.Scaffold(saver=tf.compat.v1.train.Saver([w])),
    )
    est.train(_input_fn(), steps=1)
    with pytest.raises(
        ValueError,
        match=r"has no `global_step`.*must save "
        r"tf.compat.v1.train.get_global_step\(\) too",
    ):
        est.train(_input_fn(), steps=1)


def test_local_init_op_runs_in_every_mode(tmp_path):
    def extra(features):
        v = tf.compat.v1.get_local_variable("local_v", initializer=tf.constant(0.0))
        return {"local": v.read_value() + tf.zeros_like(features["x"][:, 0])}

    def scaffold(w, b):
        (v,) = [v for v in tf.compat.v1.local_variables() if v.op.name == "local_v"]
        return tf.compat.v1.train.Scaffold(local_init_op=tf.compat.v1.assign(v, 42.0).op)

    seen = []

    class ReadLocal(tf.compat.v1.train.SessionRunHook):
        def after_create_session(self, session, coord):
            (v,) = [v for v in tf.compat.v1.local_variables() if v.op.name == "local_v"]
            seen.append(float(session.run(v)))

    est = _est(tmp_path, scaffold=scaffold, extra=extra)
    est.train(_input_fn(), steps=1, hooks=[ReadLocal()])
    est.evaluate(_input_fn(), hooks=[ReadLocal()])  # metrics' local variables too
    preds = list(est.predict(_input_fn()))
    assert seen == [42.0, 42.0]
    assert all(p["local"] == 42.0 for p in preds)
    path = est.export_saved_model(str(tmp_path / "export"), _serving_fn())  # in the main op
    x, ids, _ = _data()
    served = tf.saved_model.load(path.decode()).signatures["serving_default"]
    np.testing.assert_array_equal(
        served(x=tf.constant(x), id=tf.constant(ids))["local"].numpy(), np.full(16, 42.0)
    )


def test_ready_op_is_checked(tmp_path):
    def scaffold(w, b):
        return tf.compat.v1.train.Scaffold(ready_op=tf.constant(["my_resource_not_ready"]))

    est = _est(tmp_path, scaffold=scaffold)
    with pytest.raises(RuntimeError, match="my_resource_not_ready"):
        est.train(_input_fn(), steps=1)
    with pytest.raises(RuntimeError, match="my_resource_not_ready"):
        next(est.predict(_input_fn()))
