"""`train_and_evaluate`, `EvalSpec(exporters=...)` and `train(saving_listeners=...)` as tf.estimator.

Written from tf.estimator's behaviour: the local `train_and_evaluate` calls
`train()` once over the `TrainSpec` (the input is read once) and evaluates
from a saving listener; the exporters run after each evaluation into
`model_dir/export/<name>` and their results come back with the last
evaluation's; `BestExporter` exports when `compare_fn` prefers the new
result; `FinalExporter` only when the evaluated step reaches `max_steps`.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from npu_rec import estimator as E

BATCHES = 20


def counting_model_fn(features, labels, mode):
    """Counts, in a variable, how often each batch (by its id) was trained on."""
    w = tf.compat.v1.get_variable("w", [1], initializer=tf.compat.v1.zeros_initializer())
    pred = features["x"] * w
    if mode == E.ModeKeys.PREDICT:
        return E.EstimatorSpec(mode, predictions={"y": pred})
    loss = tf.reduce_mean(tf.square(pred - labels))
    step = tf.compat.v1.train.get_global_step()
    # "score" is best (highest) at step 10: BestExporter keeps that export.
    score = -tf.square(tf.cast(step, tf.float32) - 10.0)
    metrics = {
        "score": tf.compat.v1.metrics.mean(score),
        "score_neg": tf.compat.v1.metrics.mean(-score),
    }
    if mode == E.ModeKeys.EVAL:
        return E.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)
    seen = tf.compat.v1.get_variable(
        "seen", [64], tf.int32, tf.compat.v1.zeros_initializer(), trainable=False
    )
    count = tf.compat.v1.scatter_add(seen, features["batch"][:1], [1])
    minimize = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss, step)
    return E.EstimatorSpec(mode, loss=loss, train_op=tf.group(minimize, count))


def batches_input_fn(batches=BATCHES):
    def input_fn():
        batch = np.repeat(np.arange(batches, dtype=np.int64), 4)
        x = np.linspace(0, 1, batch.size).astype(np.float32)
        return tf.data.Dataset.from_tensor_slices(({"batch": batch, "x": x}, 2 * x)).batch(4)

    return input_fn


def eval_input_fn():
    x = np.ones(4, np.float32)
    return tf.data.Dataset.from_tensor_slices(({"batch": np.zeros(4, np.int64), "x": x}, x)).batch(
        4
    )


def serving_fn():
    return E.export.build_raw_serving_input_receiver_fn(
        {"x": tf.TensorSpec([None], tf.float32), "batch": tf.TensorSpec([None], tf.int64)}
    )


def _est(model_dir, **config):
    config.setdefault("log_step_count_steps", None)
    return E.Estimator(
        counting_model_fn,
        model_dir=str(model_dir),
        config=E.RunConfig(save_checkpoints_steps=5, **config),
    )


def _eval_steps(est, name=None):
    steps = []
    for path in sorted(tf.io.gfile.glob(os.path.join(est.eval_dir(name), "events.out.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            if event.HasField("summary") and any(v.tag == "loss" for v in event.summary.value):
                steps.append(event.step)
    return steps


def _exported_step(path):
    return int(tf.train.load_variable(os.path.join(path, "variables", "variables"), "global_step"))


def _larger_score(best_eval_result, current_eval_result):
    return current_eval_result["score"] > best_eval_result["score"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One train_and_evaluate over 20 distinct batches, checkpoints every 5 steps, 3 exporters."""
    model_dir = tmp_path_factory.mktemp("tae")
    est = _est(model_dir)
    exporters = [
        E.LatestExporter("latest", serving_fn(), exports_to_keep=2),
        E.BestExporter("best", serving_fn(), compare_fn=_larger_score, exports_to_keep=None),
        E.FinalExporter("final", serving_fn()),
    ]
    result, exports = E.train_and_evaluate(
        est,
        E.TrainSpec(batches_input_fn(), max_steps=20),
        E.EvalSpec(eval_input_fn, steps=1, exporters=exporters, throttle_secs=0),
    )
    return est, result, exports


def test_each_batch_trains_once(run):
    est, result, _ = run
    assert result["global_step"] == 20
    seen = est.get_variable_value("seen")
    np.testing.assert_array_equal(seen[:BATCHES], np.ones(BATCHES))
    assert not seen[BATCHES:].any()


def test_evaluation_follows_each_checkpoint_interval(run):
    est, _, _ = run
    assert _eval_steps(est) == [5, 10, 15, 20]


def test_exporters_write_and_return_their_exports(run):
    est, _, exports = run
    latest, best, final = exports
    base = os.path.join(est.model_dir, "export")
    # LatestExporter keeps its newest two of four exports; the last is step 20.
    assert len(os.listdir(os.path.join(base, "latest"))) == 2
    assert os.path.dirname(latest.decode()) == os.path.join(base, "latest")
    assert _exported_step(latest.decode()) == 20
    # BestExporter: step 5 (its first), then 10 (higher score); 15 and 20 are worse.
    assert best is None
    best_dirs = sorted(os.listdir(os.path.join(base, "best")))
    assert [_exported_step(os.path.join(base, "best", d)) for d in best_dirs] == [5, 10]
    # FinalExporter: once, at max_steps.
    assert os.listdir(os.path.join(base, "final")) == [os.path.basename(final.decode())]
    assert _exported_step(final.decode()) == 20
    served = tf.saved_model.load(final.decode()).signatures["serving_default"]
    out = served(x=tf.constant([1.0]), batch=tf.constant([0], tf.int64))["y"]
    np.testing.assert_allclose(out.numpy(), est.get_variable_value("w"), rtol=1e-6)


def test_max_steps_none_trains_until_the_input_ends(tmp_path):
    est = _est(tmp_path)
    result, exports = E.train_and_evaluate(
        est,
        E.TrainSpec(batches_input_fn(13), max_steps=None),
        E.EvalSpec(
            eval_input_fn,
            steps=1,
            exporters=[
                E.LatestExporter("latest", serving_fn()),
                E.FinalExporter("final", serving_fn()),
            ],
        ),
    )
    assert result["global_step"] == 13 and _eval_steps(est) == [5, 10, 13]
    np.testing.assert_array_equal(est.get_variable_value("seen")[:13], np.ones(13))
    # As tf.estimator: without max_steps no evaluation is "the final export".
    assert exports[0] is not None and exports[1] is None


def test_nothing_left_to_train_returns_none(tmp_path):
    est = _est(tmp_path)
    est.train(batches_input_fn(), max_steps=5)
    spec = E.TrainSpec(batches_input_fn(), max_steps=5)
    assert E.train_and_evaluate(est, spec, E.EvalSpec(eval_input_fn, steps=1)) == (None, None)


class Recorder(E.CheckpointSaverListener):
    def __init__(self, stop_at=None):
        self.calls, self.stop_at = [], stop_at

    def begin(self):
        self.calls.append("begin")

    def before_save(self, session, global_step_value):
        self.calls.append(("before", global_step_value))

    def after_save(self, session, global_step_value):
        self.calls.append(("after", global_step_value))
        # The checkpoint is on disk when after_save runs.
        assert tf.train.latest_checkpoint(self.model_dir).endswith(f"-{global_step_value}")
        return global_step_value == self.stop_at

    def end(self, session, global_step_value):
        self.calls.append(("end", global_step_value))


def test_saving_listeners_run_around_every_save(tmp_path):
    est = _est(tmp_path)
    listener = Recorder()
    listener.model_dir = str(tmp_path)
    est.train(batches_input_fn(), max_steps=12, saving_listeners=[listener])
    assert listener.calls == [
        "begin",
        ("before", 5),
        ("after", 5),
        ("before", 10),
        ("after", 10),
        ("before", 12),
        ("after", 12),
        ("end", 12),
    ]


def test_a_listener_returning_true_stops_training(tmp_path):
    est = _est(tmp_path)
    listener = Recorder(stop_at=10)
    listener.model_dir = str(tmp_path)
    est.train(batches_input_fn(), max_steps=20, saving_listeners=[listener])
    assert listener.calls[-1] == ("end", 10)
    assert est.latest_checkpoint().endswith("model.ckpt-10")


def test_train_spec_saving_listeners_run_in_train_and_evaluate(tmp_path):
    est = _est(tmp_path)
    listener = Recorder()
    listener.model_dir = str(tmp_path)
    E.train_and_evaluate(
        est,
        E.TrainSpec(batches_input_fn(), max_steps=10, saving_listeners=[listener]),
        E.EvalSpec(eval_input_fn, steps=1),
    )
    assert listener.calls == ["begin", ("before", 5), ("after", 5), ("before", 10)] + [
        ("after", 10),
        ("end", 10),
    ]


def test_spec_and_exporter_arguments_are_checked():
    with pytest.raises(TypeError, match="saving_listeners"):
        E.NPUEstimator(counting_model_fn).train(batches_input_fn(), saving_listeners=[object()])
    with pytest.raises(TypeError, match="saving_listeners"):
        E.TrainSpec(batches_input_fn(), saving_listeners=[object()])
    with pytest.raises(TypeError, match="exporters"):
        E.EvalSpec(eval_input_fn, exporters=[object()])
    with pytest.raises(ValueError, match="unique names"):
        E.EvalSpec(
            eval_input_fn,
            exporters=[E.LatestExporter("a", serving_fn()), E.FinalExporter("a", serving_fn())],
        )
    with pytest.raises(ValueError, match="throttle_secs"):
        E.EvalSpec(eval_input_fn, throttle_secs=-1)
    with pytest.raises(ValueError, match="exports_to_keep"):
        E.LatestExporter("a", serving_fn(), exports_to_keep=0)
    with pytest.raises(ValueError, match="compare_fn"):
        E.BestExporter(compare_fn=lambda a, b: True)
    spec = E.EvalSpec(eval_input_fn, exporters=E.LatestExporter("a", serving_fn()))
    assert [e.name for e in spec.exporters] == ["a"]
