"""`InMemoryEvaluatorHook`: evaluation inside the training process, on the training session's state.

As tf.estimator.experimental's: the EVAL graph is built once (in `begin`),
and every `every_n_iter` training runs, and at the end of training (plus once
before the first step), it is evaluated with the training session's current
values: the dense variables are copied by name, and each sparse table's rows,
slots and key map by table name (tf.estimator's hook refused tables; npu_rec's
carry over). No checkpoint is read or written; the results go to
`model_dir/eval[_<name>]` as `evaluate()`'s do.
"""

from __future__ import annotations

import tensorflow as tf

from npu_rec._rec_config import check_int
from npu_rec.estimator._estimator import (
    EvaluationGraph,
    NPUEstimator,
    core_of,
    write_eval_summaries,
)
from npu_rec.table import _registry as _table_registry


def _table_variable_names(tables) -> set[str]:
    return {v.name for t in tables for v in t.variables()}


class InMemoryEvaluatorHook(tf.compat.v1.train.SessionRunHook):
    """Evaluates the model being trained every `every_n_iter` runs, without a checkpoint.

    Args:
      estimator: The `Estimator` being trained.
      input_fn: The evaluation input (as for `evaluate`).
      steps: Evaluation batches (int >= 1), None: until the input ends.
      hooks: `SessionRunHook`s of the evaluation.
      name: Evaluation name (summaries go to `model_dir/eval_<name>`).
      every_n_iter: Training runs between evaluations (int >= 1).

    Attributes:
      results: `evaluate()`-style dicts of every evaluation, in order.

    Raises:
      TypeError: `estimator` is not an npu_rec Estimator.
      ValueError: `every_n_iter` < 1, or the estimator trains on a cluster;
        in `begin`, a `model_fn` whose EVAL scaffold has its own `saver` or
        `init_fn`.
    """

    def __init__(self, estimator, input_fn, steps=None, hooks=None, name=None, every_n_iter=100):
        if not isinstance(estimator, NPUEstimator):
            raise TypeError(
                "`estimator` must be an npu_rec.estimator.Estimator. "
                f"Received: {type(estimator).__name__}"
            )
        if every_n_iter is None or isinstance(every_n_iter, bool) or every_n_iter <= 0:
            raise ValueError(f"`every_n_iter` must be an int >= 1. Received: {every_n_iter!r}")
        if estimator.config.num_ps_replicas > 0 or estimator.config.num_worker_replicas > 1:
            raise ValueError(
                "InMemoryEvaluatorHook supports only training in one process. Received a "
                f"cluster of {estimator.config.num_ps_replicas} ps and "
                f"{estimator.config.num_worker_replicas} trainers."
            )
        for h in hooks or ():
            if not isinstance(h, tf.compat.v1.train.SessionRunHook):
                raise TypeError(f"`hooks` must hold SessionRunHooks. Received: {h!r}")
        self._estimator, self._input_fn = estimator, input_fn
        self._steps = check_int("steps", steps, 1, optional=True)
        self._hooks, self._name = list(hooks or ()), name
        self._timer = tf.compat.v1.train.SecondOrStepTimer(every_steps=every_n_iter)
        self.results: list[dict] = []

    def begin(self):
        self._timer.reset()
        self._iter_count = 0
        self._train_tables = _table_registry.tables()  # the training graph's
        self._eval = EvaluationGraph(core_of(self._estimator), self._input_fn, self._hooks)
        user = self._eval.spec.scaffold
        if user is not None and (user.saver is not None or user.init_fn is not None):
            raise ValueError(
                "InMemoryEvaluatorHook cannot evaluate a model_fn whose EVAL scaffold has its "
                f"own saver or init_fn. Received: saver={user.saver!r}, init_fn={user.init_fn!r}"
            )
        with self._eval.graph.as_default():
            self._eval_tables = {t.name: t for t in _table_registry.tables()}
            skip = _table_variable_names(self._eval_tables.values())
            self._eval_vars = {
                v.name: v for v in tf.compat.v1.global_variables() if v.name not in skip
            }
            self._feeds = {
                name: tf.compat.v1.placeholder(v.dtype.base_dtype, v.shape)
                for name, v in self._eval_vars.items()
            }
            self._values = None
            local_init_op = None if user is None else user.local_init_op
            if local_init_op is not None:  # the metrics' variables start at zero too
                local_init_op = tf.group(
                    local_init_op, tf.compat.v1.train.Scaffold.default_local_init_op()
                )
            self._scaffold = tf.compat.v1.train.Scaffold(
                init_fn=lambda scaffold, session: self._load(session),
                local_init_op=local_init_op,
                copy_from_scaffold=user,
            )

    def after_create_session(self, session, coord):
        skip = _table_variable_names(self._train_tables)
        train_vars = {v.name: v for v in tf.compat.v1.global_variables() if v.name not in skip}
        names = sorted(set(train_vars) & set(self._eval_vars))
        self._train_vars = {n: train_vars[n] for n in names}
        with self._eval.graph.as_default():
            self._assign = tf.group(*[self._eval_vars[n].assign(self._feeds[n]) for n in names])
        self._evaluate(session)

    def _load(self, session):
        """The Scaffold's init_fn: the training session's values into the evaluation session."""
        values, states = self._values
        session.run(self._assign, {self._feeds[n]: v for n, v in values.items()})
        for name, state in states.items():
            self._eval_tables[name].write_state(state, session)

    def _evaluate(self, train_session):
        values = train_session.run(self._train_vars)
        states = {
            t.name: t.read_state(0, train_session, check=False)
            for t in self._train_tables
            if t.name in self._eval_tables
        }
        self._values = (values, states)
        results = self._eval.run(self._scaffold, self._steps)
        self._values = None
        write_eval_summaries(self._estimator.eval_dir(self._name), results)
        self.results.append(results)
        self._timer.update_last_triggered_step(self._iter_count)

    def after_run(self, run_context, run_values):
        self._iter_count += 1
        if self._timer.should_trigger_for_step(self._iter_count):
            self._evaluate(run_context.session)

    def end(self, session):
        self._evaluate(session)
