"""`npu_rec.estimator.experimental` driver hooks, checked against tf.estimator's behaviour.

tf.estimator's early-stopping hooks read the evaluation summaries of
`estimator.eval_dir()` after each training run (its checkpoint hook, which
runs the evaluations of `train_and_evaluate`, runs first), and stop at the
first run where their rule holds:

- threshold hooks: some evaluation at a step >= `min_steps` is above / below it;
- no-improvement hooks: in step order, an evaluation `max_steps_without_*`
  or more steps after the best one.

The model's "score" metric is -(step - 10)^2: it rises to its best at step 10
and falls after; evaluations come every 5 steps (5, 10, 15, 20, ...).
"""

import json

import numpy as np
import pytest
import tensorflow as tf

from npu_rec import estimator as E
from npu_rec.estimator import experimental
from tests.estimator.test_train_and_evaluate import (
    _est,
    _eval_steps,
    batches_input_fn,
    counting_model_fn,
    eval_input_fn,
)


def _run(est, hook, max_steps=40):
    result, _ = E.train_and_evaluate(
        est,
        E.TrainSpec(batches_input_fn(40), max_steps=max_steps, hooks=[hook]),
        E.EvalSpec(eval_input_fn, steps=1),
    )
    return result["global_step"]


EVERY_STEP = {"run_every_secs": None, "run_every_steps": 1}


@pytest.mark.parametrize(
    "make, stop",
    [
        # score: 5 -> -25, 10 -> 0, 15 -> -25, 20 -> -100, 25 -> -225
        (lambda est: experimental.stop_if_higher_hook(est, "score", -10, **EVERY_STEP), 10),
        (
            lambda est: experimental.stop_if_higher_hook(
                est, "score", -30, min_steps=15, **EVERY_STEP
            ),
            15,
        ),
        (lambda est: experimental.stop_if_lower_hook(est, "score", -50, **EVERY_STEP), 20),
        (lambda est: experimental.stop_if_no_increase_hook(est, "score", 10, **EVERY_STEP), 20),
        (lambda est: experimental.stop_if_no_increase_hook(est, "score", 15, **EVERY_STEP), 25),
        (lambda est: experimental.stop_if_no_decrease_hook(est, "score_neg", 10, **EVERY_STEP), 20),
    ],
    ids=["higher", "higher-min-steps", "lower", "no-increase-10", "no-increase-15", "no-decrease"],
)
def test_early_stopping_hooks_stop_where_tf_estimators_would(tmp_path, make, stop):
    est = _est(tmp_path)
    assert _run(est, make(est)) == stop
    assert _eval_steps(est)[-1] == stop
    assert est.latest_checkpoint().endswith(f"model.ckpt-{stop}")


def test_make_early_stopping_hook_calls_its_function_on_the_step_timer(tmp_path):
    calls = []

    def should_stop():
        calls.append(1)
        return len(calls) == 3

    est = _est(tmp_path)
    hook = experimental.make_early_stopping_hook(
        est, should_stop, run_every_secs=None, run_every_steps=3
    )
    est.train(batches_input_fn(), max_steps=20, hooks=[hook])
    # Checked after the runs of steps 1, 4 and 7: the third says stop.
    assert est.latest_checkpoint().endswith("model.ckpt-7") and len(calls) == 3


def test_early_stopping_arguments_are_checked(tmp_path):
    est = _est(tmp_path)
    with pytest.raises(ValueError, match="Only one of `run_every_secs` and `run_every_steps`"):
        experimental.stop_if_higher_hook(est, "loss", 1, run_every_steps=5)
    with pytest.raises(TypeError, match="`estimator` must be an npu_rec"):
        experimental.stop_if_lower_hook(object(), "loss", 1)
    with pytest.raises(TypeError, match="`should_stop_fn` must be callable"):
        experimental.make_early_stopping_hook(est, 3)


def test_stop_at_checkpoint_step(tmp_path):
    est = _est(tmp_path)
    hook = experimental.make_stop_at_checkpoint_step_hook(est, 7)
    assert isinstance(hook, tf.compat.v1.train.StopAtStepHook)  # the chief
    est.train(batches_input_fn(), hooks=[hook])
    assert est.latest_checkpoint().endswith("model.ckpt-7")


def test_in_memory_evaluator_evaluates_the_training_state(tmp_path):
    est = _est(tmp_path)
    hook = experimental.InMemoryEvaluatorHook(est, eval_input_fn, steps=1, every_n_iter=5)
    est.train(batches_input_fn(), max_steps=12, hooks=[hook])
    # Before the first step, every 5 runs, and at the end.
    assert [r["global_step"] for r in hook.results] == [0, 5, 10, 12]
    assert _eval_steps(est) == [0, 5, 10, 12]
    expected = est.evaluate(eval_input_fn, steps=1)
    assert hook.results[-1]["loss"] == pytest.approx(expected["loss"], rel=1e-6)
    assert hook.results[0]["loss"] == pytest.approx(1.0)  # w = 0 before training
    with pytest.raises(ValueError, match="every_n_iter"):
        experimental.InMemoryEvaluatorHook(est, eval_input_fn, every_n_iter=0)


def test_in_memory_evaluator_carries_the_sparse_tables(tmp_path):
    from tests.estimator import models

    est = E.NPUEstimator(
        models.deepfm_model_fn,
        params={},
        config=E.NPURunConfig(model_dir=str(tmp_path), random_seed=1, log_step_count_steps=None),
    )
    eval_fn = models.synthetic_input_fn(3200, 3840)
    hook = experimental.InMemoryEvaluatorHook(est, eval_fn, every_n_iter=1000)
    est.train(models.synthetic_input_fn(0, 3200), max_steps=30, hooks=[hook])
    expected = est.evaluate(eval_fn)
    assert hook.results[-1]["global_step"] == 30
    np.testing.assert_allclose(
        [hook.results[-1]["loss"], hook.results[-1]["auc"]],
        [expected["loss"], expected["auc"]],
        rtol=1e-5,
    )
    assert hook.results[-1]["loss"] != pytest.approx(hook.results[0]["loss"])


class _Context:
    stopped = False

    def request_stop(self):
        self.stopped = True


def _after_run(hook, step):
    context = _Context()
    hook.after_run(context, tf.compat.v1.train.SessionRunValues(step, None, None))
    return context.stopped


def test_other_trainers_stop_at_the_chiefs_checkpoint_or_stop_signal(tmp_path, monkeypatch):
    _est(tmp_path).train(batches_input_fn(), max_steps=10)
    cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
    )
    worker = E.Estimator(counting_model_fn, config=E.RunConfig(model_dir=str(tmp_path)))
    assert not worker.config.is_chief
    at_10 = experimental.make_stop_at_checkpoint_step_hook(worker, 10, 0)
    at_20 = experimental.make_stop_at_checkpoint_step_hook(worker, 20, 0)
    # The run fetching global step 9 makes step 10; the checkpoint at 10 exists.
    assert not _after_run(at_10, 8) and _after_run(at_10, 9)
    assert not _after_run(at_20, 19)  # no checkpoint at 20 yet: wait, go on
    hook = experimental.stop_if_lower_hook(worker, "loss", 1.0)
    assert not _after_run(hook, False) and _after_run(hook, True)  # the STOP variable's value
