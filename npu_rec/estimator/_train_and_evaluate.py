"""`train_and_evaluate`: one training run, evaluated (and exported) after each checkpoint interval.

As tf.estimator's local `train_and_evaluate`: `train()` runs once over the
whole `TrainSpec` (the input is read once, from its start), and a saving
listener evaluates the checkpoints it writes, then runs the `EvalSpec`'s
exporters. The cadence is mx_rec's: an evaluation after each `train_steps`
interval (= the checkpoint cadence) and one of training's last checkpoint.
"""

from __future__ import annotations

import os

import tensorflow as tf

from npu_rec import _log as logging
from npu_rec.estimator import _training_run
from npu_rec.estimator._estimator import core_of
from npu_rec.estimator._ps import EVALUATOR, evaluate_checkpoints
from npu_rec.estimator._spec import EvalSpec, TrainSpec
from npu_rec.training._step_rules import check_train_and_evaluate


class _Evaluator:
    """Evaluates a checkpoint with the `EvalSpec`, then runs its exporters."""

    def __init__(self, estimator, eval_spec, max_steps):
        self.estimator, self.eval_spec, self.max_steps = estimator, eval_spec, max_steps

    def __call__(self, checkpoint_path):
        """`(eval_result, export_results)` of `checkpoint_path`."""
        result = self.estimator.evaluate(
            self.eval_spec.input_fn,
            steps=self.eval_spec.steps,
            hooks=self.eval_spec.hooks,
            checkpoint_path=checkpoint_path,
            name=self.eval_spec.name,
        )
        logging.info("train_and_evaluate: step %d: %s", result["global_step"], result)
        return result, self.export(result, checkpoint_path)

    def export(self, result, checkpoint_path):
        final = self.max_steps is not None and result["global_step"] >= self.max_steps
        base = os.path.join(self.estimator.model_dir, "export")
        return [
            exporter.export(
                estimator=self.estimator,
                export_path=os.path.join(base, exporter.name),
                checkpoint_path=checkpoint_path,
                eval_result=result,
                is_the_final_export=final,
            )
            for exporter in self.eval_spec.exporters
        ]


class _EvaluateEachInterval(tf.compat.v1.train.CheckpointSaverListener):
    """Evaluates the save that ends each `interval` of steps, and training's last one.

    `interval` None (time-based checkpoints): every save.
    """

    def __init__(self, evaluator, interval):
        self._evaluator, self._interval = evaluator, interval
        self._evaluated = None  # the step of the last evaluation
        self.eval_result, self.export_results = None, None

    def after_save(self, session, global_step_value):
        last = self._evaluated
        if (
            self._interval is None
            or last is None
            or (global_step_value // self._interval > last // self._interval)
        ):
            self._evaluate(global_step_value)

    def end(self, session, global_step_value):
        if global_step_value != self._evaluated:
            self._evaluate(global_step_value)

    def _evaluate(self, step):
        self._evaluated = step
        path = self._evaluator.estimator.latest_checkpoint()
        self.eval_result, self.export_results = self._evaluator(path)


def train_and_evaluate(estimator, train_spec, eval_spec):
    """Trains once over `train_spec`, evaluating after each checkpoint interval.

    The interval is the checkpoint cadence (`init(train_steps)` = `save_steps`
    = `NPURunConfig.save_checkpoints_steps`, checked when training starts);
    evaluation runs `EvalSpec.steps` batches on each new checkpoint, then
    the `EvalSpec`'s exporters into `model_dir/export/<exporter name>`.
    Training's last checkpoint is always evaluated. The `input_fn` is called
    once: each of its batches trains once, as in tf.estimator.

    On a `TF_CONFIG` cluster with ps tasks, as tf.estimator: the ps tasks serve,
    the chief and the workers train to `max_steps` (and return `(None, None)`),
    and the `evaluator` task evaluates (and exports) each new checkpoint of
    `model_dir` until it has evaluated one at `max_steps` or later.

    Args:
      estimator: An `NPUEstimator`.
      train_spec: A `TrainSpec`; `max_steps=None` trains until the input ends.
      eval_spec: An `EvalSpec`.

    Returns:
      `(eval_result, export_results)`: the last evaluation's dict and the list
      of what each exporter returned at it (an export path, or None where it
      skipped); `(None, None)` when nothing was trained (max_steps already
      reached), and on a cluster's ps, chief and worker tasks.

    Raises:
      TypeError: a spec of the wrong type.
      ValueError: the evaluator task of a cluster without `max_steps`.
      npu_rec.ConfigError: the step settings of `npu_rec.init` disagree.
    """
    if not isinstance(train_spec, TrainSpec):
        raise TypeError(f"`train_spec` must be a TrainSpec. Received: {train_spec!r}")
    if not isinstance(eval_spec, EvalSpec):
        raise TypeError(f"`eval_spec` must be an EvalSpec. Received: {eval_spec!r}")
    config = estimator.config
    resolved = check_train_and_evaluate(
        save_checkpoints_steps=config.save_checkpoints_steps,
        save_checkpoints_secs=config.save_checkpoints_secs,
        max_steps=train_spec.max_steps,
        eval_steps=eval_spec.steps,
    )
    evaluator = _Evaluator(estimator, eval_spec, resolved.max_steps)
    if config.task_type == EVALUATOR:  # a TF_CONFIG cluster's evaluator
        if resolved.max_steps is None:
            raise ValueError(
                "The evaluator task of train_and_evaluate needs TrainSpec(max_steps=...) or "
                "npu_rec.init(max_steps=...) to know when training ends. Received: max_steps=None"
            )
        return evaluate_checkpoints(estimator, eval_spec, resolved.max_steps, evaluate=evaluator)
    if config.cluster.distributed:  # ps tasks serve, the chief and the workers train
        estimator.train(
            train_spec.input_fn,
            hooks=list(train_spec.hooks),
            max_steps=resolved.max_steps,
            saving_listeners=list(train_spec.saving_listeners),
        )
        return None, None
    # None with time-based checkpoints only: every save is evaluated.
    interval = resolved.train_steps or resolved.save_steps or config.checkpoint_steps
    listener = _EvaluateEachInterval(evaluator, interval)
    _training_run.train(
        core_of(estimator),
        train_spec.input_fn,
        list(train_spec.hooks),
        None,
        resolved.max_steps,
        resolved=resolved,
        listeners=[*train_spec.saving_listeners, listener],
    )
    return listener.eval_result, listener.export_results
