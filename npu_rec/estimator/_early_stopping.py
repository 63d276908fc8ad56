"""Early stopping by evaluation results, and stopping at a checkpoint step (tf.estimator.experimental).

The `stop_if_*` hooks read the evaluation results that `evaluate()` /
`train_and_evaluate` write as summaries into `estimator.eval_dir()` and, every
`run_every_secs` seconds or `run_every_steps` steps of training, decide as
tf.estimator's do:

- `stop_if_higher_hook` / `stop_if_lower_hook`: some evaluation at a step >=
  `min_steps` has the metric above / below `threshold`.
- `stop_if_no_increase_hook` / `stop_if_no_decrease_hook`: going through the
  evaluations at steps >= `min_steps` in step order, one comes
  `max_steps_without_*` or more steps after the best so far.

On the chief (or in one process) the hook sets the `signal_early_stopping/STOP`
variable and stops training; on a cluster's other trainers the hook stops
them once that variable is set.
"""

from __future__ import annotations

import collections
import glob
import operator
import os
import time

import tensorflow as tf

from npu_rec import _log as logging
from npu_rec.estimator._estimator import NPUEstimator
from npu_rec.estimator._graph import latest_dense
from npu_rec.estimator._hooks import RunsAfterSaves


def read_eval_metrics(eval_dir: str) -> collections.OrderedDict:
    """`{global_step: {metric: value}}` of the evaluation summaries in `eval_dir`, by step."""
    by_step: dict = collections.defaultdict(dict)
    for path in sorted(glob.glob(os.path.join(eval_dir, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            if not event.HasField("summary"):
                continue
            metrics = {
                v.tag: v.simple_value for v in event.summary.value if v.HasField("simple_value")
            }
            if metrics:
                by_step[event.step].update(metrics)
    return collections.OrderedDict(sorted(by_step.items()))


def _stop_variable():
    with tf.compat.v1.variable_scope("signal_early_stopping", reuse=tf.compat.v1.AUTO_REUSE):
        return tf.compat.v1.get_variable(
            "STOP",
            shape=[],
            dtype=tf.bool,
            initializer=tf.compat.v1.constant_initializer(False),
            collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES],
            trainable=False,
        )


class _StopOnPredicateHook(RunsAfterSaves):
    """Calls `should_stop_fn` on a timer; when it says True, sets STOP and stops training."""

    def __init__(self, should_stop_fn, run_every_secs=60, run_every_steps=None):
        if not callable(should_stop_fn):
            raise TypeError(
                f"`should_stop_fn` must be callable. Received: should_stop_fn={should_stop_fn!r}"
            )
        self._should_stop_fn = should_stop_fn
        self._timer = tf.compat.v1.train.SecondOrStepTimer(
            every_secs=run_every_secs, every_steps=run_every_steps
        )

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()
        self._stop_op = tf.compat.v1.assign(_stop_variable(), True)

    def after_run(self, run_context, run_values):
        # Read after the run (not fetched with it): the step just reached, deterministically.
        step = int(run_context.session.run(self._global_step))
        if self._timer.should_trigger_for_step(step):
            self._timer.update_last_triggered_step(step)
            if self._should_stop_fn():
                logging.info("Requesting early stopping at global step %d", step)
                run_context.session.run(self._stop_op)
                run_context.request_stop()


class _CheckForStoppingHook(tf.compat.v1.train.SessionRunHook):
    """A non-chief trainer's hook: stops once the chief has set STOP."""

    def begin(self):
        self._stop = _stop_variable()

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._stop)

    def after_run(self, run_context, run_values):
        if run_values.results:
            logging.info("Early stopping requested, suspending run.")
            run_context.request_stop()


def _check_estimator(estimator):
    if not isinstance(estimator, NPUEstimator):
        raise TypeError(
            "`estimator` must be an npu_rec.estimator.Estimator. "
            f"Received: {type(estimator).__name__}"
        )


def make_early_stopping_hook(estimator, should_stop_fn, run_every_secs=60, run_every_steps=None):
    """A hook that stops training when `should_stop_fn()` returns True.

    Args:
      estimator: The `Estimator` being trained.
      should_stop_fn: Callable without arguments returning a bool.
      run_every_secs: Call it every that many seconds (default 60)...
      run_every_steps: ... or every that many global steps (then give
        `run_every_secs=None`).

    Raises:
      TypeError: `estimator` is not an npu_rec Estimator, or `should_stop_fn`
        is not callable.
      ValueError: both `run_every_secs` and `run_every_steps` are set.
    """
    _check_estimator(estimator)
    if run_every_secs is not None and run_every_steps is not None:
        raise ValueError(
            "Only one of `run_every_secs` and `run_every_steps` must be set. "
            f"Received: run_every_secs={run_every_secs!r}, run_every_steps={run_every_steps!r}"
        )
    if estimator.config.is_chief:
        return _StopOnPredicateHook(should_stop_fn, run_every_secs, run_every_steps)
    return _CheckForStoppingHook()


def _threshold_hook(estimator, metric_name, threshold, higher, eval_dir, min_steps, secs, steps):
    _check_estimator(estimator)
    eval_dir = estimator.eval_dir() if eval_dir is None else eval_dir
    crossed = operator.gt if higher else operator.lt

    def should_stop():
        for step, metrics in read_eval_metrics(eval_dir).items():
            if step < min_steps:
                continue
            if crossed(metrics[metric_name], threshold):
                logging.info(
                    'At step %s, metric "%s" has value %s, %s the threshold %s for early stopping.',
                    step,
                    metric_name,
                    metrics[metric_name],
                    "above" if higher else "below",
                    threshold,
                )
                return True
        return False

    return make_early_stopping_hook(estimator, should_stop, secs, steps)


def _no_improvement_hook(
    estimator, metric_name, max_steps, higher, eval_dir, min_steps, secs, steps
):
    _check_estimator(estimator)
    eval_dir = estimator.eval_dir() if eval_dir is None else eval_dir
    better = operator.gt if higher else operator.lt

    def should_stop():
        best, best_step = None, None
        for step, metrics in read_eval_metrics(eval_dir).items():
            if step < min_steps:
                continue
            value = metrics[metric_name]
            if best is None or better(value, best):
                best, best_step = value, step
            if step - best_step >= max_steps:
                logging.info(
                    'No %s in metric "%s" for %s steps (limit %s): early stopping.',
                    "increase" if higher else "decrease",
                    metric_name,
                    step - best_step,
                    max_steps,
                )
                return True
        return False

    return make_early_stopping_hook(estimator, should_stop, secs, steps)


def stop_if_higher_hook(
    estimator,
    metric_name,
    threshold,
    eval_dir=None,
    min_steps=0,
    run_every_secs=60,
    run_every_steps=None,
):
    """Stops training once an evaluation at step >= `min_steps` has `metric_name > threshold`.

    `eval_dir`: where the evaluation summaries are (default `estimator.eval_dir()`).
    """
    return _threshold_hook(
        estimator,
        metric_name,
        threshold,
        True,
        eval_dir,
        min_steps,
        run_every_secs,
        run_every_steps,
    )


def stop_if_lower_hook(
    estimator,
    metric_name,
    threshold,
    eval_dir=None,
    min_steps=0,
    run_every_secs=60,
    run_every_steps=None,
):
    """Stops training once an evaluation at step >= `min_steps` has `metric_name < threshold`."""
    return _threshold_hook(
        estimator,
        metric_name,
        threshold,
        False,
        eval_dir,
        min_steps,
        run_every_secs,
        run_every_steps,
    )


def stop_if_no_increase_hook(
    estimator,
    metric_name,
    max_steps_without_increase,
    eval_dir=None,
    min_steps=0,
    run_every_secs=60,
    run_every_steps=None,
):
    """Stops training when `metric_name` has not increased for `max_steps_without_increase` steps."""
    return _no_improvement_hook(
        estimator,
        metric_name,
        max_steps_without_increase,
        True,
        eval_dir,
        min_steps,
        run_every_secs,
        run_every_steps,
    )


def stop_if_no_decrease_hook(
    estimator,
    metric_name,
    max_steps_without_decrease,
    eval_dir=None,
    min_steps=0,
    run_every_secs=60,
    run_every_steps=None,
):
    """Stops training when `metric_name` has not decreased for `max_steps_without_decrease` steps."""
    return _no_improvement_hook(
        estimator,
        metric_name,
        max_steps_without_decrease,
        False,
        eval_dir,
        min_steps,
        run_every_secs,
        run_every_steps,
    )


class _StopAtCheckpointStepHook(tf.compat.v1.train.SessionRunHook):
    """A non-chief trainer's hook: stops once `model_dir` holds a checkpoint at `last_step`."""

    def __init__(self, model_dir, last_step, wait_after_file_check_secs=30):
        self._model_dir, self._last_step = model_dir, last_step
        self._wait = wait_after_file_check_secs

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        if run_values.results + 1 < self._last_step:
            return
        path = latest_dense(self._model_dir)
        step = 0 if path is None else int(path.rsplit("-", 1)[1])
        if step >= self._last_step:
            run_context.request_stop()
        else:
            time.sleep(self._wait)


def make_stop_at_checkpoint_step_hook(estimator, last_step, wait_after_file_check_secs=30):
    """Stops training at `last_step`: the chief at that global step, other trainers once the
    chief's checkpoint at that step exists (checked at most every `wait_after_file_check_secs`).
    """
    _check_estimator(estimator)
    if last_step is None:
        raise ValueError("`last_step` must be specified. Received: last_step=None")
    if estimator.config.is_chief:
        return tf.compat.v1.train.StopAtStepHook(last_step=last_step)
    return _StopAtCheckpointStepHook(estimator.model_dir, last_step, wait_after_file_check_secs)
