"""What each task of the ps route does: the ps tasks serve, the trainers train, the evaluator evaluates.

* `ps`: `train()` serves its `tf.distribute.Server` until every trainer has
  finished (`_servers.serve`), then returns;
* `chief` and `worker` (the trainers, a `Trainer` each): `train()` builds the
  graph under the replica device setter (dense variables on the ps tasks) with
  each table's shards placed on the ps tasks by key hash, merges what a step
  sends between it and each ps task over all tables (`batch_transfers`: a
  handful of tensors per ps task and step), and trains asynchronously in a `MonitoredSession` on the task's own server. Only the
  chief restores checkpoints, writes them (npu_rec's committed versions) and
  summaries, and locks `model_dir`; the workers wait until the chief has
  restored (a `ready_op` on a flag the chief sets after its restore, polled
  every `RECOVERY_WAIT_SECS`) and then train. Each trainer's reading position
  is a variable on a ps task that the chief commits with each checkpoint and
  loads on resume (`_position`); the chief pauses the workers around each
  save, so that a checkpoint is a consistent cut (`_pause`). Each trainer
  tells the ps tasks when it is done;
* `evaluator`: `train_and_evaluate` evaluates each new checkpoint of
  `model_dir` and returns once one at `max_steps` (or later) is evaluated
  (`evaluate_checkpoints`).
"""

from __future__ import annotations

import contextlib
import time

import tensorflow as tf

from npu_rec import _log as logging
from npu_rec.distribute._ps import batch_transfers, ps_device, table_placement
from npu_rec.estimator._ps import _servers
from npu_rec.estimator._ps._cluster import EVALUATOR, PS
from npu_rec.estimator._ps._pause import PauseBarrier, PauseHook
from npu_rec.estimator._ps._position import (
    TrainerPositionHook,
    TrainerPositions,
    committed_states,
    trainer_names,
)

#: How often a waiting worker checks whether the chief has prepared the session (s).
RECOVERY_WAIT_SECS = 0.5
#: How long a worker waits for that at most (s).
MAX_WAIT_SECS = 7200
#: How often the evaluator looks for a new checkpoint (s).
EVAL_POLL_SECS = 1.0
_READY_FLAG = "npu_rec_chief_ready"


def check_trainable(config) -> None:
    """Raises what the ps route cannot train with (checked before training starts).

    Raises:
      ValueError: the task is the evaluator, or accelerated training is on.
    """
    if config.task_type == EVALUATOR:
        raise ValueError(
            "The evaluator task does not train: call npu_rec.estimator.train_and_evaluate "
            "on every task, which evaluates each new checkpoint there. "
            f"Received: TF_CONFIG task type {config.task_type!r}"
        )
    if getattr(config, "accelerate_mode", None) is not None:
        raise ValueError(
            "accelerate_train_mode is not supported with ps tasks (its precision switch "
            "restarts the session of one trainer). Received: "
            f"accelerate_train_mode={str(config.accelerate_mode)!r}, "
            f"num_ps_replicas={config.num_ps_replicas}"
        )


def serve(config) -> None:
    """A ps task: serves until every trainer (chief and workers) has finished."""
    info = config.cluster
    logging.info(
        "npu_rec: ps:%d serves the cluster until its %d trainers finish.",
        info.task_id,
        info.num_worker_replicas,
    )
    _servers.serve(info.cluster_spec, info.task_id, info.num_worker_replicas)


class _WorkerSessionCreator(tf.compat.v1.train.SessionCreator):
    """tf's WorkerSessionCreator, polling every `RECOVERY_WAIT_SECS` instead of 30 s."""

    def __init__(self, scaffold, master, config):
        self._scaffold, self._master, self._config = scaffold, master, config

    def create_session(self):
        self._scaffold.finalize()
        manager = tf.compat.v1.train.SessionManager(
            local_init_op=self._scaffold.local_init_op,
            local_init_feed_dict=self._scaffold.local_init_feed_dict,
            ready_op=self._scaffold.ready_op,
            ready_for_local_init_op=self._scaffold.ready_for_local_init_op,
            graph=tf.compat.v1.get_default_graph(),
            recovery_wait_secs=RECOVERY_WAIT_SECS,
        )
        return manager.wait_for_session(
            self._master, config=self._config, max_wait_secs=MAX_WAIT_SECS
        )


class Trainer:
    """The chief or a worker of the ps route: its server, graph placement and session."""

    def __init__(self, config):
        check_trainable(config)
        self.info = config.cluster
        self.server = _servers.start_server(
            self.info.cluster_spec, self.info.task_type, self.info.task_id
        )

    @property
    def is_chief(self) -> bool:
        return self.info.is_chief

    @property
    def name(self) -> str:
        return f"{self.info.task_type}:{self.info.task_id}"

    @contextlib.contextmanager
    def placement(self, graph: tf.Graph):
        """Inside `graph`: dense variables on the ps tasks, table shards by key hash."""
        setter = _servers.device_setter(
            self.info.cluster_spec, self.info.task_type, self.info.task_id
        )
        with graph.device(setter), table_placement(self.info.num_ps_replicas):
            yield
            # Not in any collection: no Saver holds it, no init_op initialises it.
            self._flag = tf.compat.v1.Variable(
                False, trainable=False, name=_READY_FLAG, collections=[], use_resource=True
            )
            names = trainer_names(self.info.cluster_spec)
            self.positions = TrainerPositions(names)
            workers = [n for n in names if not n.startswith("chief:")]
            self.barrier = PauseBarrier(workers, ps_device(0))

    def position_hook(self, data, model_dir: str) -> TrainerPositionHook:
        """This trainer's reading position of `data = (source, ReadingPosition)` (`_position`)."""
        return TrainerPositionHook(self.positions, self.name, data[0], data[1], model_dir)

    def session_config(self, base):
        return _servers.session_config(self.info.task_type, self.info.task_id, base)

    def session(self, scaffold, hooks, chief_hooks, config, position_path=None):
        """The `MonitoredSession` of this trainer (`hooks` run on all, `chief_hooks` on the chief).

        `position_path`: the chief's restored version's `data_position-<step>.json`
        (or None); its `{trainer: source state}` is set before the workers may start.
        """
        # The graph is complete: what a step sends to each ps task goes as a few tensors
        # for all tables (before any session runs the graph).
        merged = batch_transfers(tf.compat.v1.get_default_graph())
        logging.info("npu_rec: %s merged %d trainer <-> ps tensors of a step.", self.name, merged)
        config = self.session_config(config)
        positions = committed_states(position_path) if self.is_chief else None
        flag = self._flag
        if self.is_chief:
            set_flag = flag.assign(True, read_value=False)
            restore = scaffold.init_fn

            def init_fn(unused_scaffold, session):
                if restore is not None:
                    restore(session)
                self.positions.load(session, positions or {})
                self.barrier.reset(session)
                session.run(set_flag)  # the workers may start now

            scaffold = tf.compat.v1.train.Scaffold(init_fn=init_fn, copy_from_scaffold=scaffold)
            creator = tf.compat.v1.train.ChiefSessionCreator(
                scaffold=scaffold, master=self.server.target, config=config
            )
            return tf.compat.v1.train.MonitoredSession(creator, hooks=chief_hooks + hooks)
        ready = tf.compat.v1.report_uninitialized_variables()
        # [1] until the chief has set the flag, then [0]. (A `tf.where` of a [0] and a
        # [1] branch broadcast to [0]: it never waited.)
        waiting = tf.boolean_mask(
            tf.constant([f"{_READY_FLAG} (the chief is restoring the checkpoint)"]),
            tf.reshape(tf.logical_not(tf.compat.v1.is_variable_initialized(flag)), [1]),
        )
        scaffold = tf.compat.v1.train.Scaffold(
            ready_op=tf.concat([ready, waiting], 0), copy_from_scaffold=scaffold
        )
        creator = _WorkerSessionCreator(scaffold, self.server.target, config)
        # The pause hook first: it acknowledges a pause after a run, before other hooks wait.
        pause = PauseHook(self.barrier, self.name)
        return tf.compat.v1.train.MonitoredSession(creator, hooks=[pause] + hooks)

    def paused(self, session):
        """The chief: a context in which every started worker is paused (`_pause`)."""
        return self.barrier.paused(session)

    def done(self) -> None:
        """Tells the ps tasks that this trainer finished."""
        _servers.signal_done(
            self.server.target,
            self.info.num_ps_replicas,
            self.info.task_type,
            self.info.task_id,
        )


def trainer_for(config) -> Trainer | None:
    """The `Trainer` of this task on the ps route, None in one process (no ps tasks)."""
    if not config.cluster.distributed or config.task_type in (PS, EVALUATOR):
        return None
    return Trainer(config)


def _checkpoint_step(path: str) -> int:
    return int(path.rsplit("-", 1)[1])


def evaluate_checkpoints(estimator, eval_spec, max_steps: int, timeout_secs=None, evaluate=None):
    """The evaluator task: evaluates each new checkpoint until one at `max_steps` or later.

    `evaluate(checkpoint_path)` returns `(eval_result, export_results)`
    (train_and_evaluate's evaluation and exporters); default: `evaluate()`
    with the `eval_spec` and no exports.

    Returns:
      `(eval_result, export_results)` of the last evaluation (None, None when
      `timeout_secs` passed before any).

    Raises:
      TimeoutError: `timeout_secs` passed before the checkpoint at `max_steps`.
    """
    if evaluate is None:

        def evaluate(path):
            result = estimator.evaluate(
                eval_spec.input_fn,
                steps=eval_spec.steps,
                hooks=eval_spec.hooks,
                checkpoint_path=path,
                name=eval_spec.name,
            )
            return result, []

    start = time.monotonic()
    done, result, exports = None, None, None
    while True:
        path = estimator.latest_checkpoint()
        if path is not None and path != done:
            try:
                result, exports = evaluate(path)
            except (tf.errors.NotFoundError, FileNotFoundError) as err:
                # Deleted by keep_checkpoint_max meanwhile: take the next one.
                logging.warning("npu_rec: evaluator skipped %s: %s", path, err)
                result, exports = None, None
            done = path
            if result is not None:
                logging.info("npu_rec: evaluator: step %d: %s", result["global_step"], result)
            if _checkpoint_step(path) >= max_steps:
                return result, exports
        if timeout_secs is not None and time.monotonic() - start > timeout_secs:
            raise TimeoutError(
                f"The evaluator saw no checkpoint at step {max_steps} in "
                f"{estimator.model_dir!r} within {timeout_secs:g} s."
            )
        time.sleep(EVAL_POLL_SECS)
