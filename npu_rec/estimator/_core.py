"""`EstimatorCore`: what every call of an `NPUEstimator` does with its model, in one object.

It holds the estimator's settings (config, model_fn, params, warm start) and
builds a mode's graph, chooses what a session restores, and makes its
Scaffold, Savers and ConfigProto; it also keeps what runs leave behind (the
`restore_model_version` applied once, the precision of every step). Training
(`_training_run.TrainingRun`), evaluation, prediction and export reach the model
through it: no module calls `NPUEstimator`'s private methods.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

from npu_rec._rec_config import get_config
from npu_rec.estimator._graph import (
    call_input_fn,
    call_model_fn,
    dense_saver,
    plan_restore,
)
from npu_rec.estimator._run_config import session_config_for
from npu_rec.estimator._scaffold import session_scaffold, user_saver
from npu_rec.estimator._warm_start import apply as apply_warm_start

#: `session_config(dtype=UNSET)`: the config's own compute dtype.
UNSET = object()


class EstimatorCore:
    """An estimator's model, graphs and sessions (see the module docstring).

    Args:
      model_fn: The user's `model_fn`.
      params: passed to it (a dict, or any object the estimator was given).
      config: The `NPURunConfig` (its `model_dir` set).
      warm_start: `WarmStartSettings`, or None.

    Attributes:
      precision_history: `(step, dtype)` of every training step run.
      version_used: Whether `npu_rec.init(restore_model_version=...)` was applied.
    """

    def __init__(self, model_fn, params, config, warm_start):
        self.model_fn, self.params, self.config = model_fn, params, config
        self.warm_start = warm_start
        self.precision_history: list[tuple[int, str]] = []
        self.version_used = False

    @property
    def model_dir(self) -> str:
        return self.config.model_dir

    def build(self, input_fn, mode, build_hook=None, placement=None):
        """A new graph with global step, input and the model_fn's spec.

        Returns:
          `(graph, spec, features, input hooks)`.

        `build_hook(graph)` runs between the input and the model_fn;
        `placement(graph)`: a context manager entered in the graph around all
        of it (the ps route's device placement, `_ps.Trainer.placement`).
        """
        graph = tf.Graph()
        place = contextlib.nullcontext if placement is None else placement
        with graph.as_default(), place(graph):
            if self.config.tf_random_seed is not None:
                tf.compat.v1.set_random_seed(self.config.tf_random_seed)
            tf.compat.v1.train.get_or_create_global_step()
            features, labels, hooks = call_input_fn(input_fn, mode, self.params, self.config)
            if build_hook is not None:
                build_hook(graph)
            spec = call_model_fn(self.model_fn, features, labels, mode, self.params, self.config)
        return graph, spec, features, hooks

    def restore_plan(self, checkpoint_path=None, training=False):
        """What a new session restores: `checkpoint_path`, init's version (training, once),
        or the latest; the warm start when `model_dir` has no checkpoint."""
        cfg = get_config()
        version = None
        if training and cfg.if_load and cfg.restore_model_version is not None:
            version = None if self.version_used else cfg.restore_model_version
        plan = plan_restore(
            self.model_dir,
            checkpoint_path,
            version,
            fallback=getattr(self.config, "checkpoint_fallback", True),
        )
        if plan.dense_path is None:
            # As tf.estimator: every mode warm-starts while model_dir has no checkpoint.
            plan.warm_start = self.warm_start
        return plan

    def scaffold(self, spec, plan, saver, manager, evaluation=False):
        """The session's Scaffold: the restore `plan` and `spec.scaffold` (see `_scaffold`).

        Called in the graph: a warm start of the plan sets its variables' initialisers.
        """
        if plan.warm_start is not None:
            apply_warm_start(plan.warm_start)
        return session_scaffold(spec, plan, saver, manager, evaluation=evaluation)

    def savers(self, spec):
        """(dense Saver in use, npu_rec's dense Saver, table manager) of the current graph."""
        default, manager = dense_saver(self.config)
        return user_saver(spec) or default, default, manager

    def session_config(self, dtype=UNSET):
        """The session's ConfigProto for compute `dtype` (default: the config's)."""
        dtype = self.config_dtype() if dtype is UNSET else dtype
        return session_config_for(self.config.session_config, dtype)

    def config_dtype(self):
        """The compute dtype the config's precision mode asks for, or None (float32)."""
        return getattr(self.config, "compute_dtype", None)
