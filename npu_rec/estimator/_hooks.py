"""Session-run hooks of the Estimator front end.

Public: `TellMeStepOrLossHook` (tells accelerated training the step or the
loss), `EvictHook` (table eviction by time or steps) and
`SparseCheckpointSaverHook` (dense variables and sparse tables saved at the
same step, full or delta). Internal: `_StepRateHook` (steps/s and
examples/s) and `_PrecisionHook` (the accelerated-training switch and its
per-step record). Ops are made in `begin()`; cadence decisions come from the
shared policies in `npu_rec.training._policies` / `npu_rec.training._precision`.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

import tensorflow as tf

from npu_rec import _log as logging
from npu_rec.estimator import _save
from npu_rec.table import _registry as _table_registry
from npu_rec.table._base import TableEvictor
from npu_rec.training._policies import FULL, EvictPolicy

#: The clock of time-based cadences (replace it in tests).
clock = time.monotonic
PRECISION_TAG = "npu_rec/low_precision"
PRECISION_STATE_FILE = "npu_rec_precision.json"
SessionRunHook = tf.compat.v1.train.SessionRunHook


def _tensor(graph: tf.Graph, value, name: str):
    """A tensor of `graph` from a tensor or a tensor name."""
    if isinstance(value, str):
        value = graph.as_graph_element(value if ":" in value else value + ":0")
    elif getattr(value, "graph", graph) is not graph:
        value = graph.as_graph_element(value.name)
    if isinstance(value, tf.Tensor) and value.dtype == tf.resource:
        # A resource variable's handle ("global_step:0"): read the variable.
        for v in tf.compat.v1.global_variables():
            if v.handle.name == value.name:
                return v.read_value()
    return value


class RunsAfterSaves(SessionRunHook):
    """A hook that runs after npu_rec's checkpoint hook, wherever it is given.

    tf.estimator runs its checkpoint hook (and so the evaluations of
    `train_and_evaluate`) before the users' hooks; npu_rec runs users' hooks
    before its own summary and checkpoint hooks. A hook deciding from the
    evaluation results (the `experimental.stop_if_*` hooks) subclasses this to
    see, as in tf.estimator, the evaluation of the checkpoint written at the
    same step.
    """


class TellMeStepOrLossHook(SessionRunHook):
    """Tells accelerated training (`accelerate_train_mode`) the step or the loss.

    Give either `step` and `total_step` (step trigger) or `loss` and
    `final_loss` (loss trigger). Tensors may be given by name ("global_step:0").

    Args:
      step: Tensor (or name) counting the training steps done, e.g. the global step.
      total_step: Total number of training steps (int >= 1).
      loss: Tensor (or name) of the training loss.
      final_loss: The target loss (number > 0).

    Attributes:
      history: After training, `(step, dtype)` for every step this hook saw,
        dtype "float16", "bfloat16" or "float32".

    Raises:
      ValueError: neither pair, or an incomplete pair, is given.

    Example:
      >>> hook = TellMeStepOrLossHook(step="global_step:0", total_step=10000)
    """

    def __init__(self, step=None, total_step=None, loss=None, final_loss=None):
        by_step = step is not None or total_step is not None
        by_loss = loss is not None or final_loss is not None
        if by_step == by_loss:
            raise ValueError(
                "TellMeStepOrLossHook needs either `step` and `total_step` or `loss` and "
                f"`final_loss`. Received: step={step!r}, total_step={total_step!r}, "
                f"loss={loss!r}, final_loss={final_loss!r}"
            )
        if by_step and (step is None or total_step is None):
            raise ValueError(
                "TellMeStepOrLossHook needs both `step` and `total_step`. "
                f"Received: step={step!r}, total_step={total_step!r}"
            )
        if by_loss and (loss is None or final_loss is None):
            raise ValueError(
                "TellMeStepOrLossHook needs both `loss` and `final_loss`. "
                f"Received: loss={loss!r}, final_loss={final_loss!r}"
            )
        self.trigger = "step" if by_step else "loss"
        self.step, self.total_step = step, total_step
        self.loss, self.final_loss = loss, final_loss
        self.history: list[tuple[int, str]] = []
        self.last_value = None
        self._tensor = None

    def begin(self):
        graph = tf.compat.v1.get_default_graph()
        self._tensor = _tensor(
            graph, self.step if self.trigger == "step" else self.loss, self.trigger
        )

    def before_run(self, run_context):
        if self.trigger == "loss":
            return tf.compat.v1.train.SessionRunArgs(self._tensor)
        return None

    def after_run(self, run_context, run_values):
        if self.trigger == "loss":
            self.last_value = float(run_values.results)
        else:
            self.last_value = int(run_context.session.run(self._tensor))


class _PrecisionHook(SessionRunHook):
    """Runs the `PrecisionSwitch`: records each step's precision, stops the low phase.

    Args:
      switch: The `PrecisionSwitch`.
      low: Whether this session runs the low-precision phase.
      tell: The user's `TellMeStepOrLossHook`, or None (global step decides).
      history: List to append `(step, dtype)` to (shared with the Estimator).
      model_dir: Where the switch state and the summaries go.
      summary_steps: Cadence of the `npu_rec/low_precision` scalar (0/None: none).
    """

    def __init__(self, switch, low, tell, history, model_dir, summary_steps):
        self.switch, self.low, self.tell = switch, low, tell
        self.history, self.model_dir = history, model_dir
        self.summary_steps = summary_steps
        self.switch_requested = False

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()
        self._writer = tf.compat.v1.summary.FileWriterCache.get(self.model_dir)

    def after_create_session(self, session, coord):
        self._step = int(session.run(self._global_step))

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        end = int(run_context.session.run(self._global_step))
        dtype = self.switch.low_dtype if self.low else "float32"
        for s in range(self._step, end):
            self.history.append((s, dtype))
            if self.tell is not None:
                self.tell.history.append((s, dtype))
            if self.summary_steps and s % self.summary_steps == 0:
                value = tf.compat.v1.Summary.Value(tag=PRECISION_TAG, simple_value=float(self.low))
                self._writer.add_summary(tf.compat.v1.Summary(value=[value]), s)
        self._step = end
        if not self.low:
            return
        if self.switch.mode.trigger == "loss":
            self.switch.observe_loss(end - 1, self.tell.last_value)
            next_step = end
        else:
            next_step = end if self.tell is None else self.tell.last_value
        if not self.switch.is_low_precision(next_step):
            self.switch.switched_at = end
            logging.info(
                "npu_rec: accelerated training switches from %s to float32 at step %d.",
                self.switch.low_dtype,
                end,
            )
            self.switch_requested = True
            run_context.request_stop()

    def end(self, session):
        self._writer.flush()


def switch_state(switch) -> dict:
    """The precision switch's state, stored in each version's commit record."""
    return {"precision": {"mode": str(switch.mode), **switch.state()}}


def load_switch_state(model_dir: str, switch, version=None) -> None:
    """Restores `switch` from the restored `version`'s record (or a legacy state file)."""
    state = None if version is None else version.state.get("precision")
    path = os.path.join(model_dir, PRECISION_STATE_FILE)
    if state is None and os.path.exists(path):
        with open(path) as f:
            state = json.load(f)
    if state is not None and state.get("mode") == str(switch.mode):
        switch.restore(state)


class EvictHook(SessionRunHook):
    """Evicts stale keys from the sparse tables during training.

    Eviction frees the rows of keys idle longer than each table's
    `eviction_threshold` (tables created with eviction on).

    Args:
      evict_enable: Whether to evict at all.
      evict_time_interval: Seconds between evictions (number > 0; default 24 h).
      evict_step_interval: Steps between evictions (int >= 1) or None.

    In a graph without a global step (a plain session loop, as mx_rec's
    session samples run), a step is one `run` of the session the hook watches.

    Attributes:
      evictions: `(global_step, rows_freed)` per eviction run.

    Raises:
      TypeError: `evict_enable` is not a bool.
      npu_rec.ConfigError: an interval is not positive.

    Example:
      >>> hook = EvictHook(evict_enable=True, evict_step_interval=1000)
    """

    def __init__(
        self, evict_enable=False, evict_time_interval=24 * 60 * 60, evict_step_interval=None
    ):
        if not isinstance(evict_enable, bool):
            raise TypeError(
                f"`evict_enable` must be a bool. Received: evict_enable={evict_enable!r}"
            )
        self.evict_enable = evict_enable
        self._policy = EvictPolicy(evict_time_interval, evict_step_interval, clock=lambda: clock())
        self.evictions: list[tuple[int, int]] = []

    def begin(self):
        self._tables = [t for t in _table_registry.tables() if t.config.eviction]
        self._global_step = tf.compat.v1.train.get_global_step()  # None: count runs
        self._runs = 0
        if self.evict_enable and not self._tables:
            logging.warning(
                "npu_rec: EvictHook found no table with eviction on "
                "(create_table(..., eviction_threshold=...)); it does nothing."
            )

    def _step(self, session) -> int:
        if self._global_step is None:
            return self._runs
        return int(session.run(self._global_step))

    def after_create_session(self, session, coord):
        self._policy.start(self._step(session))

    def after_run(self, run_context, run_values):
        self._runs += 1
        if not self.evict_enable or not self._tables:
            return
        step = self._step(run_context.session)
        if self._policy.due(step):
            freed = TableEvictor(self._tables)(session=run_context.session)
            self.evictions.append((step, sum(freed.values())))
            self._policy.mark_evicted(step)
            logging.evicted(step, freed)


class SparseCheckpointSaverHook(SessionRunHook):
    """Saves the dense variables and the sparse tables at the same global step.

    Dense variables go to `model_dir/model.ckpt-<step>` (a `tf.compat.v1`
    Saver); tables go to `model_dir/tables/ckpt-<step>.<full|delta>.nrc` (a
    `TableCheckpointManager`). A `SavePolicy` decides when and which kind;
    `save_secs` adds a full save every that many seconds. Training's end
    always saves. Each save is one committed version (`_save.save_version`):
    nothing is published until every part is on disk.

    Args:
      model_dir: The checkpoint directory.
      saver: The dense `tf.compat.v1.train.Saver`.
      manager: The `TableCheckpointManager` (None: no tables).
      policy: The `SavePolicy`.
      save_secs: Seconds between time-based full saves, or None.
      has_full_save: Whether restored tables give a base for deltas.
      data_position: A `DataPositionHook` whose input position is saved with
        every checkpoint, or None.
      training_dir: The model_dir opened for training
        (`npu_rec.checkpoint._training_dir.TrainingDir`); every save is one
        committed version of it (`_save.save_version`).
      state_fn: Returns small JSON-able state stored with each version (the
        precision switch), or None.
      pause: `pause(session)` gives the context every save runs in (the ps
        route's chief: the workers paused), or None.
      listeners: The `SavingListeners` of the `train()` call, or None: told
        before and after every save (an `after_save` returning True stops
        training, as tf.estimator's `CheckpointSaverHook` does).
      last_session: Returns whether this session is training's last (False
        when it stopped for the accelerated-training switch): only the last
        one's `end` ends the listeners. None: always the last.

    Attributes:
      saves: `(step, kind)` of every save.
    """

    def __init__(
        self,
        model_dir,
        saver,
        manager,
        policy,
        save_secs=None,
        has_full_save=False,
        data_position=None,
        training_dir=None,
        state_fn=None,
        pause=None,
        listeners=None,
        last_session=None,
    ):
        self.model_dir, self.saver, self.manager = model_dir, saver, manager
        self.listeners, self.last_session = listeners, last_session
        self.pause = pause
        self.training_dir, self.state_fn = training_dir, state_fn
        self.policy, self.save_secs = policy, save_secs
        self.has_full_save = has_full_save
        self.data_position = data_position
        self.saves: list[tuple[int, str]] = []

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()
        if self.listeners is not None:
            self.listeners.begin()

    def after_create_session(self, session, coord):
        self._last = int(session.run(self._global_step))
        self._last_time = clock()
        self.policy.start(self._last, clock(), has_full_save=self.has_full_save)
        tf.io.write_graph(
            session.graph.as_graph_def(add_shapes=True), self.model_dir, "graph.pbtxt"
        )

    def after_run(self, run_context, run_values):
        step = int(run_context.session.run(self._global_step))
        now = clock()
        kind = self.policy.decide(step, now)
        if kind is None and self.save_secs is not None and now - self._last_time >= self.save_secs:
            kind = FULL
        if kind is not None and step != self._last and self.save(run_context.session, step, kind):
            run_context.request_stop()

    def end(self, session):
        step = int(session.run(self._global_step))
        if step != self._last:
            self.save(session, step, FULL)
        if self.listeners is not None and (self.last_session is None or self.last_session()):
            self.listeners.end(session, step)

    def save(self, session, step: int, kind: str) -> bool:
        """Writes version `step`; returns whether a listener asked training to stop."""
        if self.listeners is not None:
            self.listeners.before_save(session, step)
        state = None if self.state_fn is None else self.state_fn()
        pause = contextlib.nullcontext() if self.pause is None else self.pause(session)
        with pause:
            kind = _save.save_version(
                self.training_dir,
                session,
                self.saver,
                self.manager,
                step,
                kind != FULL,
                self.data_position,
                state,
            )
        self.policy.mark_saved(kind, step, clock())
        self._last, self._last_time = step, clock()
        self.saves.append((step, kind))
        logging.info("npu_rec: saved %s checkpoint for step %d in %s.", kind, step, self.model_dir)
        return self.listeners is not None and self.listeners.after_save(session, step)


class SavingListeners:
    """The `CheckpointSaverListener`s of one `train()` call, over all its sessions.

    As tf.estimator's `CheckpointSaverHook` calls them: `begin` once before
    training, `before_save` / `after_save` around every save, `end` once after
    the last save. Accelerated training's sessions share them: its hand-over
    checkpoint is a save like any other.

    Raises:
      TypeError: a listener is not a `tf.compat.v1.train.CheckpointSaverListener`.
    """

    def __init__(self, listeners):
        self.listeners = list(listeners or ())
        for listener in self.listeners:
            if not isinstance(listener, tf.compat.v1.train.CheckpointSaverListener):
                raise TypeError(
                    "`saving_listeners` must hold CheckpointSaverListener objects. "
                    f"Received: {listener!r}"
                )
        self._begun = False

    def begin(self) -> None:
        if not self._begun:
            self._begun = True
            for listener in self.listeners:
                listener.begin()

    def before_save(self, session, step: int) -> None:
        for listener in self.listeners:
            listener.before_save(session, step)

    def after_save(self, session, step: int) -> bool:
        stop = False
        for listener in self.listeners:
            if listener.after_save(session, step):
                logging.info("A CheckpointSaverListener asked training to stop: %r", listener)
                stop = True
        return stop

    def end(self, session, step: int) -> None:
        for listener in self.listeners:
            listener.end(session, step)


class _StepRateHook(SessionRunHook):
    """Logs global_step/sec and examples/sec every `every_n_steps` (and summarises them)."""

    def __init__(self, every_n_steps, batch_size_tensor, model_dir):
        self.every, self._batch, self.model_dir = every_n_steps, batch_size_tensor, model_dir

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()
        self._writer = tf.compat.v1.summary.FileWriterCache.get(self.model_dir)

    def after_create_session(self, session, coord):
        self._last_step = self._prev = int(session.run(self._global_step))
        self._last_time, self._examples = time.time(), 0

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._batch)

    def after_run(self, run_context, run_values):
        step = int(run_context.session.run(self._global_step))
        self._examples += int(run_values.results) * max(step - self._prev, 0)
        self._prev = step
        if step // self.every > self._last_step // self.every:
            elapsed = max(time.time() - self._last_time, 1e-9)
            rate = (step - self._last_step) / elapsed
            logging.info(
                "global_step/sec: %.4g, examples/sec: %.4g (step %d)",
                rate,
                self._examples / elapsed,
                step,
            )
            value = tf.compat.v1.Summary.Value(tag="global_step/sec", simple_value=rate)
            self._writer.add_summary(tf.compat.v1.Summary(value=[value]), step)
            self._last_step, self._last_time, self._examples = step, time.time(), 0
