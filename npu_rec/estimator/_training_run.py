"""The training loop of `NPUEstimator.train`, with accelerated training's two phases.

Accelerated training (`accelerate_train_mode`) runs the low-precision phase
in a session whose Grappler config turns on TensorFlow's automatic mixed
precision (oneDNN bfloat16 for `fast1`, float16 for `fast`, plus dynamic
loss scaling in `sparse_train_op`); the variables stay float32, so the weights,
optimizer slots and table rows are the same objects in both phases. When the
`PrecisionSwitch` says so, the phase stops, the saver hook writes a full
checkpoint (dense + tables), and a fresh float32 graph restores it and
trains on: the Estimator's own "recompile", like npu_bridge's.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from npu_rec import _log as logging
from npu_rec._rec_config import get_config
from npu_rec._validation import log_once
from npu_rec.checkpoint._training_dir import TrainingDir
from npu_rec.estimator import _data_position_hook, _hooks, _ps, _scaffold
from npu_rec.estimator._graph import RestorePlan, batch_size_of
from npu_rec.estimator._sparse_train import add_missing_sparse_updates, enable_loss_scaling
from npu_rec.estimator._spec import ModeKeys
from npu_rec.training._policies import SavePolicy
from npu_rec.training._precision import PrecisionSwitch
from npu_rec.training._step_rules import check_estimator_train


def _make_switch(core, hooks, last_step, plan):
    """The `PrecisionSwitch` of this run and the user's TellMeStepOrLossHook (or None)."""
    mode = getattr(core.config, "accelerate_mode", None)
    if mode is None:
        return None, None
    tells = [h for h in hooks if isinstance(h, _hooks.TellMeStepOrLossHook)]
    tell = tells[0] if tells else None
    if tell is not None and tell.trigger != mode.trigger:
        raise ValueError(
            f"accelerate_train_mode={str(mode)!r} uses the {mode.trigger!r} "
            f"trigger but TellMeStepOrLossHook was given the {tell.trigger!r} "
            "values. Give it "
            + ("step= and total_step=." if mode.trigger == "step" else "loss= and final_loss=")
        )
    if mode.trigger == "loss":
        if tell is None:
            raise ValueError(
                f"accelerate_train_mode={str(mode)!r} (loss trigger) needs a "
                "TellMeStepOrLossHook(loss=..., final_loss=...) in `hooks` of train(); "
                "Received: no TellMeStepOrLossHook."
            )
        switch = PrecisionSwitch(
            mode, final_loss=tell.final_loss, iterations_per_loop=core.config.iterations_per_loop
        )
    else:
        total = tell.total_step if tell is not None else last_step
        if total is None:
            raise ValueError(
                f"accelerate_train_mode={str(mode)!r} (step trigger) needs the "
                "total step count: pass max_steps or steps to train(), or a "
                "TellMeStepOrLossHook(step=..., total_step=...). "
                "Received: max_steps=None"
            )
        if tell is None:
            log_once(
                f"npu_rec: accelerate_train_mode={str(mode)!r} without "
                f"TellMeStepOrLossHook: step = global step, total_step = {total}."
            )
        switch = PrecisionSwitch(
            mode, total_step=total, iterations_per_loop=core.config.iterations_per_loop
        )
    _hooks.load_switch_state(core.model_dir, switch, plan.committed)
    return switch, tell


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """What every session of one `train()` call runs with.

    Attributes:
      input_fn: The training input.
      hooks: The user's `SessionRunHook`s.
      last_step: The global step to stop at, or None (`num_steps`, or the input's end).
      num_steps: Steps to run from the global step a session starts at (a ps
        route worker's `steps`), or None.
      save_steps: The checkpoint cadence in steps (0: none).
      trainer: The ps route's chief or worker (`_ps.Trainer`), or None.
      listeners: The call's `_hooks.SavingListeners`, or None.
    """

    input_fn: object
    hooks: tuple
    last_step: int | None = None
    num_steps: int | None = None
    save_steps: int = 0
    trainer: object = None
    listeners: object = None

    @property
    def chief(self) -> bool:
        return self.trainer is None or self.trainer.is_chief


def train(core, input_fn, hooks, steps, max_steps, resolved=None, listeners=None):
    """Trains the estimator whose `EstimatorCore` is `core`.

    `resolved` (from train_and_evaluate's checks) skips the step checks.
    `listeners`: `CheckpointSaverListener`s told around every save (the chief's
    only on the ps route, as tf.estimator's).

    The model_dir is locked for the whole call (`TrainingDir`): a second
    trainer fails at once; temporary files and uncommitted parts are removed,
    and versions saved after the one training continues from are moved aside.
    """
    config = core.config
    if resolved is None:
        resolved = check_estimator_train(
            save_checkpoints_steps=config.save_checkpoints_steps,
            save_checkpoints_secs=config.save_checkpoints_secs,
            max_steps=max_steps,
        )
    else:
        resolved = dataclasses.replace(resolved, max_steps=max_steps)
    listeners = _hooks.SavingListeners(listeners)
    trainer = _ps.trainer_for(config)  # None in one process
    if trainer is not None and not trainer.is_chief:
        # A worker of the ps route: no restore, no save, until the global step says.
        settings = RunSettings(
            input_fn,
            tuple(hooks),
            last_step=resolved.max_steps if steps is None else None,
            num_steps=steps,
            trainer=trainer,
        )
        TrainingRun(core, settings).session(RestorePlan())
    else:
        with TrainingDir(config.model_dir, keep=config.keep_checkpoint_max) as tdir:
            _train_chief(core, input_fn, hooks, steps, resolved, tdir, trainer, listeners)
    if trainer is not None:
        trainer.done()


def _train_chief(core, input_fn, hooks, steps, resolved, tdir, trainer, listeners):
    """Training in one process, or the ps route's chief: restores, saves, switches precision."""
    plan = core.restore_plan(training=True)
    tdir.start_from(plan.committed)
    start = plan.step
    if steps is not None:
        last_step = start + steps
        if resolved.max_steps is not None:
            last_step = min(last_step, resolved.max_steps)
    else:
        last_step = resolved.max_steps
    if last_step is not None and start >= last_step and trainer is None:
        # (The chief of the ps route still opens its session: the workers wait for it.)
        logging.info("Skipping training since max_steps has already saved.")
        return
    settings = RunSettings(
        input_fn,
        tuple(hooks),
        last_step=last_step,
        save_steps=resolved.save_steps or core.config.checkpoint_steps,
        trainer=trainer,
        listeners=listeners,
    )
    switch, tell = _make_switch(core, hooks, last_step, plan)
    run = TrainingRun(core, settings, tdir, switch, tell)
    while True:
        low = switch is not None and switch.is_low_precision(start)
        if low:
            logging.info(
                "npu_rec: steps from %d run in %s (accelerate_train_mode=%s).",
                start,
                switch.low_dtype,
                switch.mode,
            )
        elif switch is not None:
            logging.info("npu_rec: steps from %d run in float32.", start)
        switched = run.session(plan, low)
        core.version_used = core.version_used or plan.from_restore_model_version
        if not switched:
            return
        plan = core.restore_plan(training=True)
        tdir.start_from(plan.committed)
        start = plan.step


class TrainingRun:
    """The sessions of one `train()` call: each builds the TRAIN graph and runs it.

    Args:
      core: The estimator's `EstimatorCore`.
      settings: The `RunSettings`.
      tdir: The model_dir opened for training (`TrainingDir`), or None (a ps
        route worker: it saves, restores and summarises nothing).
      switch, tell: Accelerated training's `PrecisionSwitch` and the user's
        `TellMeStepOrLossHook`, or None.
    """

    def __init__(self, core, settings, tdir=None, switch=None, tell=None):
        self.core, self.settings, self.tdir = core, settings, tdir
        self.switch, self.tell = switch, tell

    def session(self, plan, low=False) -> bool:
        """One MonitoredTrainingSession from `plan`; returns whether it stopped to switch precision.

        `low`: whether it runs accelerated training's low-precision phase.
        """
        core, settings, switch = self.core, self.settings, self.switch
        config, trainer = core.config, settings.trainer
        dtype = (switch.low_dtype if low else None) if switch is not None else core.config_dtype()
        loss_scaling = dtype == "float16"

        def build_hook(graph):
            if loss_scaling:
                enable_loss_scaling(graph)

        data = _data_position_hook.tracked(settings.input_fn)
        if data is not None and trainer is None:
            _data_position_hook.restore(
                plan.position_path, plan.step if plan.dense_path else None, data[0]
            )
        # (On the ps route each trainer restores its own position once its session exists.)
        placement = None if trainer is None else trainer.placement
        graph, spec, features, data_hooks = core.build(
            settings.input_fn, ModeKeys.TRAIN, build_hook, placement
        )
        with graph.as_default():
            train_op = add_missing_sparse_updates(spec.loss, spec.train_op)
            position_hook = None
            if data is not None and trainer is not None:
                position_hook = trainer.position_hook(data, config.model_dir)
                train_op = position_hook.advance(train_op)
            elif data is not None:
                position_hook = _data_position_hook.DataPositionHook(data[1], config.model_dir)
            saver, _, manager = core.savers(spec)
            all_hooks, precision_hook = self._hooks(
                spec, features, plan, low, saver, manager, position_hook, data_hooks
            )
            scaffold = core.scaffold(spec, plan, saver, manager)
            self._run(scaffold, all_hooks, spec, train_op, dtype, plan)
        with tf.Graph().as_default():  # FileWriterCache needs graph mode
            tf.compat.v1.summary.FileWriterCache.get(config.model_dir).flush()
        return precision_hook is not None and precision_hook.switch_requested

    def _hooks(self, spec, features, plan, low, saver, manager, position_hook, data_hooks):
        """The session's hooks in their order, and the precision hook (or None)."""
        core, settings, switch = self.core, self.settings, self.switch
        config, chief = core.config, settings.chief
        if not any(
            s.op.name.endswith("loss")
            for s in tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SUMMARIES)
        ):
            tf.compat.v1.summary.scalar("loss", spec.loss)
        summary_op = _scaffold.summary_op(spec, tf.compat.v1.summary.merge_all())
        policy = SavePolicy.from_config(
            get_config(), save_steps=settings.save_steps or 0, clock=lambda: _hooks.clock()
        )
        precision_hook = None
        saver_hook = _hooks.SparseCheckpointSaverHook(
            config.model_dir,
            saver,
            manager,
            policy,
            save_secs=config.save_checkpoints_secs,
            has_full_save=plan.version is not None,
            data_position=position_hook,
            training_dir=self.tdir,
            state_fn=None if switch is None else lambda: _hooks.switch_state(switch),
            pause=None if settings.trainer is None else settings.trainer.paused,
            listeners=settings.listeners,
            last_session=lambda: precision_hook is None or not precision_hook.switch_requested,
        )
        # The position first: it restores or notes the source before the iterator starts reading.
        own = ([position_hook] if position_hook is not None else []) + list(data_hooks)
        if settings.last_step is not None:
            own.append(tf.compat.v1.train.StopAtStepHook(last_step=settings.last_step))
        elif settings.num_steps is not None:
            own.append(tf.compat.v1.train.StopAtStepHook(num_steps=settings.num_steps))
        own.append(tf.compat.v1.train.NanTensorHook(spec.loss))
        if config.log_step_count_steps and chief:
            own.append(
                _hooks._StepRateHook(
                    config.log_step_count_steps, batch_size_of(features), config.model_dir
                )
            )
        tail = []
        if switch is not None:
            precision_hook = _hooks._PrecisionHook(
                switch,
                low,
                self.tell,
                core.precision_history,
                config.model_dir,
                config.save_summary_steps,
            )
            tail.append(precision_hook)
        if config.save_summary_steps and summary_op is not None and chief:
            tail.append(
                tf.compat.v1.train.SummarySaverHook(
                    save_steps=config.save_summary_steps,
                    output_dir=config.model_dir,
                    summary_op=summary_op,
                )
            )
        if chief:
            tail.append(saver_hook)
        given = [*settings.hooks, *spec.training_hooks]
        late = [h for h in given if isinstance(h, _hooks.RunsAfterSaves)]
        return own + [h for h in given if h not in late] + tail + late, precision_hook

    def _run(self, scaffold, all_hooks, spec, train_op, dtype, plan):
        """Opens the session and runs training steps until a hook stops it."""
        core, settings = self.core, self.settings
        trainer = settings.trainer
        session_config = core.session_config(dtype)
        if trainer is None:
            session = tf.compat.v1.train.MonitoredTrainingSession(
                checkpoint_dir=None,
                scaffold=scaffold,
                hooks=all_hooks,
                chief_only_hooks=list(spec.training_chief_hooks),
                save_checkpoint_secs=None,
                save_checkpoint_steps=None,
                save_summaries_steps=None,
                save_summaries_secs=None,
                log_step_count_steps=None,
                config=session_config,
            )
        else:
            session = trainer.session(
                scaffold,
                all_hooks,
                list(spec.training_chief_hooks),
                session_config,
                position_path=plan.position_path,
            )
        loop = getattr(core.config, "iterations_per_loop", 1)
        global_step = tf.compat.v1.train.get_global_step()
        with session as sess:
            while not sess.should_stop():
                if loop == 1:
                    sess.run(train_op)
                else:
                    sess.run_step_fn(_loop_step(train_op, global_step, loop, settings.last_step))


def _loop_step(train_op, global_step, loop, last_step):
    """`iterations_per_loop` steps per hooked run: hooks see one run per loop."""

    def step_fn(step_context):
        n = loop
        if last_step is not None:
            n = min(loop, last_step - int(step_context.session.run(global_step)))
        for _ in range(max(n, 1) - 1):
            step_context.session.run(train_op)
        return step_context.run_with_hooks(train_op)

    return step_fn
