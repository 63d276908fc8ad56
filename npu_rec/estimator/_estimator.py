"""`NPUEstimator`: tf.estimator's train / evaluate / predict on `tf.compat.v1` graphs.

Each call builds a fresh graph, calls the `model_fn` in it, restores the
latest (or requested) checkpoint, dense variables and sparse tables at the
same step, when the session is created, and runs a `MonitoredTrainingSession`
(training) or `MonitoredSession` (evaluation, prediction). The graphs, restore
plans, Scaffolds and session configs are made by the estimator's
`EstimatorCore` (`_core.py`), which the other modules reach through
`core_of(estimator)`; export lives in `_export.py`, the training run in
`_training_run.py`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping

import numpy as np
import tensorflow as tf

from npu_rec import _log as logging
from npu_rec._paths import make_directory
from npu_rec._rec_config import check_int
from npu_rec.estimator import _export, _ps, _training_run
from npu_rec.estimator._core import EstimatorCore
from npu_rec.estimator._graph import latest_dense
from npu_rec.estimator._run_config import NPURunConfig, RunConfig
from npu_rec.estimator._spec import ModeKeys
from npu_rec.estimator._warm_start import warm_start_settings


def _check_hooks(hooks) -> list:
    hooks = list(hooks or [])
    for h in hooks:
        if not isinstance(h, tf.compat.v1.train.SessionRunHook):
            raise TypeError(
                f"`hooks` must hold tf.compat.v1.train.SessionRunHook objects. Received: {h!r}"
            )
    return hooks


def _batch_length(out) -> int:
    """The common first dimension of a batch of predictions (one example per row).

    Raises:
      ValueError: a prediction is a scalar, or two have different first dimensions.
    """
    items = out.items() if isinstance(out, dict) else [("predictions", out)]
    lengths = {}
    for key, value in items:
        if np.ndim(value) == 0:
            raise ValueError(
                f"Prediction {key!r} is a scalar, so it has no row per example. "
                "Give every prediction a first (batch) dimension, or call "
                "predict(..., yield_single_examples=False)."
            )
        lengths[key] = len(value)
    if len(set(lengths.values())) > 1:
        raise ValueError(
            "Every prediction must have the same first dimension (the batch) to "
            "be split into examples. Received first dimensions "
            f"{dict(sorted(lengths.items()))}; give every prediction one row per "
            "example, or call predict(..., yield_single_examples=False)."
        )
    return next(iter(lengths.values()))


class NPUEstimator:
    """npu_bridge's `NPUEstimator` (tf.estimator's `Estimator`) for npu_rec models.

    Args:
      model_fn: `model_fn(features, labels, mode, params, config)` returning an
        `EstimatorSpec` (it may name only the arguments it uses).
      model_dir: Checkpoint / event directory; None = the config's, or a new
        temporary directory (logged).
      config: An `NPURunConfig` (or `RunConfig`); None = defaults.
      params: passed to `model_fn` (and an `input_fn` that takes it): a dict
        (copied), or any object such as an `argparse.Namespace` (as given).
      warm_start_from: A checkpoint path, a directory of checkpoints, a
        SavedModel directory or `WarmStartSettings`: the variables it names
        (a path: every trainable dense variable) are initialised from it
        while model_dir has no checkpoint yet (train, evaluate, predict and
        export, as tf.estimator); sparse tables start empty.

    Raises:
      TypeError: `model_fn` is not callable, or `config` is not a RunConfig.
      ValueError: `model_dir` differs from `config.model_dir`, or is (inside) a
        file, or `warm_start_from` is neither a path nor `WarmStartSettings`.

    Example:
      >>> est = NPUEstimator(model_fn, config=NPURunConfig(model_dir="/tmp/m"))
      >>> est.train(input_fn, max_steps=1000)
      >>> est.evaluate(eval_input_fn, steps=10)["loss"]
    """

    def __init__(self, model_fn, model_dir=None, config=None, params=None, warm_start_from=None):
        if not callable(model_fn):
            raise TypeError(f"`model_fn` must be callable. Received: model_fn={model_fn!r}")
        config = NPURunConfig() if config is None else config
        if not isinstance(config, RunConfig):
            raise TypeError(f"`config` must be an NPURunConfig. Received: config={config!r}")
        if (
            model_dir is not None
            and config.model_dir is not None
            and (os.path.abspath(model_dir) != os.path.abspath(config.model_dir))
        ):
            raise ValueError(
                "`model_dir` are set both in constructor and `NPURunConfig`, but with "
                f"different values. In constructor: '{model_dir}', in NPURunConfig: "
                f"'{config.model_dir}'."
            )
        model_dir = model_dir or config.model_dir
        if model_dir is None:
            model_dir = tempfile.mkdtemp(prefix="npu_rec_model_")
            logging.warning("Using temporary folder as model directory: %s", model_dir)
        make_directory(model_dir, "model_dir")
        self._config = config.replace(model_dir=os.fspath(model_dir))
        self._model_fn = model_fn
        # A dict is copied, as tf.estimator does; any other object (an
        # argparse.Namespace, a config class) is passed to the model_fn as given.
        self._params = dict(params) if isinstance(params, Mapping) else params
        if self._params is None:
            self._params = {}
        self._warm_start = warm_start_settings(warm_start_from)
        self._core = EstimatorCore(model_fn, self._params, self._config, self._warm_start)

    @property
    def model_dir(self) -> str:
        return self._config.model_dir

    @property
    def config(self):
        return self._config

    @property
    def params(self):
        """A copy of `params` when it is a dict; else the object given."""
        return dict(self._params) if isinstance(self._params, dict) else self._params

    @property
    def model_fn(self):
        return self._model_fn

    @property
    def precision_history(self) -> list[tuple[int, str]]:
        """`(step, dtype)` of every training step run by this estimator."""
        return self._core.precision_history

    @property
    def warm_start_settings(self):
        """The `WarmStartSettings` of `warm_start_from`, or None."""
        return self._warm_start

    def eval_dir(self, name=None) -> str:
        """Where `evaluate(name=name)` writes its summaries: `model_dir/eval[_<name>]`."""
        return os.path.join(self.model_dir, "eval" if not name else f"eval_{name}")

    def latest_checkpoint(self) -> str | None:
        """The path prefix of the newest committed dense checkpoint in `model_dir`, or None."""
        return latest_dense(self.model_dir)

    def _trained_checkpoint(self) -> str:
        path = self.latest_checkpoint()
        if path is None:
            raise ValueError(
                f"Could not find trained model in model_dir: {self.model_dir}. "
                "Train the estimator first (no checkpoint there yet)."
            )
        return path

    def get_variable_names(self) -> list[str]:
        """The names of the dense variables in the latest checkpoint.

        Raises:
          ValueError: `model_dir` has no checkpoint yet.
        """
        return [name for name, _ in tf.train.list_variables(self._trained_checkpoint())]

    def get_variable_value(self, name: str) -> np.ndarray:
        """The value of dense variable `name` in the latest checkpoint.

        Raises:
          ValueError: `model_dir` has no checkpoint yet.
        """
        return tf.train.load_variable(self._trained_checkpoint(), name)

    # ------------------------------------------------------------------ train
    def train(self, input_fn, hooks=None, steps=None, max_steps=None, saving_listeners=None):
        """Trains the model (see `_training_run.train`).

        On a `TF_CONFIG` cluster with ps tasks (docs/distributed.md, "The
        Estimator route"): a ps task serves until every trainer has finished;
        the chief and the workers train asynchronously, the chief restoring and
        saving checkpoints.

        Args:
          input_fn: Returns `(features, labels)` or a dataset of them.
          hooks: `SessionRunHook`s, called in order after npu_rec's own.
          steps: Steps to train from the current global step (int >= 1).
          max_steps: Global step to train to (int >= 1). Not with `steps`.
          saving_listeners: `CheckpointSaverListener`s whose `before_save` /
            `after_save` run around every checkpoint save (an `after_save`
            returning True stops training), `begin` before training and
            `end` after its last save.

        Returns:
          self.

        Raises:
          TypeError: a hook or a saving listener of the wrong type.
          ValueError: both `steps` and `max_steps`, one of them < 1,
            accelerated training without what it needs (or with ps tasks), or
            the evaluator task of a cluster.
          npu_rec.ConfigError: the step settings of `npu_rec.init` disagree.
        """
        if steps is not None and max_steps is not None:
            raise ValueError(
                "Can not provide both steps and max_steps. "
                f"Received: steps={steps}, max_steps={max_steps}"
            )
        steps = check_int("steps", steps, 1, optional=True)
        max_steps = check_int("max_steps", max_steps, 1, optional=True)
        hooks = _check_hooks(hooks)
        listeners = list(saving_listeners or ())
        for listener in listeners:
            if not isinstance(listener, tf.compat.v1.train.CheckpointSaverListener):
                raise TypeError(
                    "`saving_listeners` must hold tf.compat.v1.train.CheckpointSaverListener "
                    f"objects. Received: {listener!r}"
                )
        if self._config.cluster.distributed:
            if self._config.task_type == "ps":
                _ps.serve(self._config)  # until every trainer has finished
                return self
            _ps.check_trainable(self._config)
        _training_run.train(self._core, input_fn, hooks, steps, max_steps, listeners=listeners)
        return self

    # --------------------------------------------------------------- evaluate
    def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None, name=None):
        """Evaluates the model on `input_fn` for `steps` batches (or until its end).

        Returns:
          dict with `loss` (mean over batches), `global_step` and every
          `eval_metric_ops` value.

        Raises:
          ValueError: `steps` < 1.
        """
        steps = check_int("steps", steps, 1, optional=True)
        evaluation = EvaluationGraph(self._core, input_fn, _check_hooks(hooks))
        with evaluation.graph.as_default():
            plan = self._core.restore_plan(checkpoint_path)
            if plan.dense_path is None:
                logging.warning(
                    "Could not find trained model in model_dir: %s, running "
                    "initialization to evaluate.",
                    self.model_dir,
                )
            saver, _, manager = evaluation.savers
            scaffold = self._core.scaffold(evaluation.spec, plan, saver, manager, evaluation=True)
        results = evaluation.run(scaffold, steps)
        write_eval_summaries(self.eval_dir(name), results)
        logging.info("Saving dict for global step %d: %s", results["global_step"], results)
        return results

    # ---------------------------------------------------------------- predict
    def predict(
        self,
        input_fn,
        predict_keys=None,
        hooks=None,
        checkpoint_path=None,
        yield_single_examples=True,
    ):
        """Yields predictions: one dict per example (or per batch) when predictions are a dict.

        Without a checkpoint in `model_dir` (and no `checkpoint_path`), the
        model is initialised: from `warm_start_from` if given, else afresh.

        Raises:
          ValueError: a `predict_keys` entry is not a prediction key; with
            `yield_single_examples`, a prediction is a scalar or predictions
            have different first dimensions.
        """
        hooks = _check_hooks(hooks)
        graph, spec, _, data_hooks = self._core.build(input_fn, ModeKeys.PREDICT)
        with graph.as_default():
            preds = spec.predictions
            if predict_keys is not None:
                keys = [predict_keys] if isinstance(predict_keys, str) else list(predict_keys)
                if not isinstance(preds, dict) or any(k not in preds for k in keys):
                    known = sorted(preds) if isinstance(preds, dict) else []
                    raise ValueError(
                        f"`predict_keys` must name prediction keys {known}. "
                        f"Received: predict_keys={predict_keys!r}"
                    )
                preds = {k: preds[k] for k in keys}
            saver, _, manager = self._core.savers(spec)
            plan = self._core.restore_plan(checkpoint_path)
            if plan.dense_path is None:
                logging.warning(
                    "Could not find trained model in model_dir: %s, running "
                    "initialization to predict.",
                    self.model_dir,
                )
            creator = tf.compat.v1.train.ChiefSessionCreator(
                scaffold=self._core.scaffold(spec, plan, saver, manager),
                config=self._core.session_config(),
            )
            all_hooks = data_hooks + hooks + list(spec.prediction_hooks)
            with tf.compat.v1.train.MonitoredSession(creator, hooks=all_hooks) as sess:
                while not sess.should_stop():
                    out = sess.run(preds)
                    if not yield_single_examples:
                        yield out
                        continue
                    n = _batch_length(out)
                    for i in range(n):
                        yield (
                            {k: v[i] for k, v in out.items()} if isinstance(out, dict) else out[i]
                        )

    # ----------------------------------------------------------------- export
    def export_saved_model(
        self,
        export_dir_base,
        serving_input_receiver_fn,
        assets_extra=None,
        as_text=False,
        checkpoint_path=None,
        experimental_mode=ModeKeys.PREDICT,
    ):
        """Exports a SavedModel for serving (docs/estimator.md, "Export").

        The `model_fn` runs in PREDICT mode on the receiver's features; the
        signatures are its `export_outputs` (default: `serving_default` over
        the predictions). Tables and dense weights of the checkpoint are inside.

        Args:
          export_dir_base: Directory that gets a new `<timestamp>` subdirectory.
          serving_input_receiver_fn: Returns a `ServingInputReceiver` (see
            `npu_rec.estimator.export`).
          assets_extra: dict destination (relative to `assets.extra`) -> source path.
          as_text: Write the SavedModel proto as text.
          checkpoint_path: Checkpoint to export; default the latest.
          experimental_mode: Only `ModeKeys.PREDICT`.

        Returns:
          The export directory as bytes.

        Raises:
          ValueError: no checkpoint to export, or a mode other than PREDICT.
        """
        if experimental_mode != ModeKeys.PREDICT:
            raise ValueError(
                "npu_rec exports the PREDICT graph only. "
                f"Received: experimental_mode={experimental_mode!r}"
            )
        return _export.export_saved_model(
            self._core,
            export_dir_base,
            serving_input_receiver_fn,
            assets_extra=assets_extra,
            as_text=as_text,
            checkpoint_path=checkpoint_path,
        )


def write_eval_summaries(directory: str, results: dict) -> None:
    """Writes the scalar `results` of an evaluation as summaries at their `global_step`."""
    with tf.Graph().as_default():
        writer = tf.compat.v1.summary.FileWriterCache.get(directory)
    values = [
        tf.compat.v1.Summary.Value(tag=k, simple_value=float(v))
        for k, v in results.items()
        if k != "global_step" and np.ndim(v) == 0
    ]
    writer.add_summary(tf.compat.v1.Summary(value=values), results["global_step"])
    writer.flush()


class EvaluationGraph:
    """The EVAL graph of an estimator's model (`EstimatorCore`), built once, run as often as needed.

    `evaluate()` runs it once with a Scaffold restoring a checkpoint;
    `experimental.InMemoryEvaluatorHook` runs it repeatedly with a Scaffold
    copying the training session's state.

    Attributes:
      graph: The graph.
      spec: The model_fn's EVAL `EstimatorSpec`.
      savers: `(dense Saver in use, npu_rec's dense Saver, table manager)`.
    """

    def __init__(self, core, input_fn, hooks):
        self._core = core
        self.graph, self.spec, _, data_hooks = core.build(input_fn, ModeKeys.EVAL)
        with self.graph.as_default():
            metrics = {"loss": tf.compat.v1.metrics.mean(self.spec.loss)}
            metrics.update(self.spec.eval_metric_ops)
            self._values = {k: m[0] for k, m in metrics.items()}
            self._values["global_step"] = tf.compat.v1.train.get_global_step()
            self._update = tf.group(*[m[1] for m in metrics.values()])
            self.savers = core.savers(self.spec)
        self._hooks = data_hooks + list(hooks) + list(self.spec.evaluation_hooks)

    def run(self, scaffold, steps=None) -> dict:
        """Runs `steps` batches (None: until the input ends); returns the metric values."""
        with self.graph.as_default():
            final = tf.compat.v1.train.FinalOpsHook(self._values)
            creator = tf.compat.v1.train.ChiefSessionCreator(
                scaffold=scaffold, config=self._core.session_config()
            )
            done = 0
            with tf.compat.v1.train.MonitoredSession(creator, hooks=[*self._hooks, final]) as sess:
                while not sess.should_stop() and (steps is None or done < steps):
                    sess.run(self._update)
                    done += 1
        return {
            k: (v.item() if isinstance(v, np.generic) else v)
            for k, v in final.final_ops_values.items()
        }


def core_of(estimator: NPUEstimator) -> EstimatorCore:
    """The `EstimatorCore` of `estimator`: the package's interface to its model."""
    return estimator._core
