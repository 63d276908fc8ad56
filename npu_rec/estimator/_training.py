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
from npu_rec._config import get_config
from npu_rec._validation import log_once
from npu_rec.checkpoint._training_dir import TrainingDir
from npu_rec.estimator import _data_position, _distributed, _hooks, _ps_position, _scaffold
from npu_rec.estimator._graph import RestorePlan, batch_size_of
from npu_rec.estimator._sparse_train import add_missing_sparse_updates, enable_loss_scaling
from npu_rec.estimator._spec import ModeKeys
from npu_rec.training._policies import SavePolicy
from npu_rec.training._precision import PrecisionSwitch
from npu_rec.training._steps import check_estimator_train

UNSET = object()


def _make_switch(est, hooks, last_step, plan):
    """The `PrecisionSwitch` of this run and the user's TellMeStepOrLossHook (or None)."""
    mode = getattr(est.config, "accelerate_mode", None)
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
            mode, final_loss=tell.final_loss, iterations_per_loop=est.config.iterations_per_loop
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
            mode, total_step=total, iterations_per_loop=est.config.iterations_per_loop
        )
    _hooks.load_switch_state(est.model_dir, switch, plan.committed)
    return switch, tell


def train(est, input_fn, hooks, steps, max_steps, resolved=None, listeners=None):
    """Trains `est`; `resolved` (from train_and_evaluate's checks) skips the step checks.

    `listeners`: `CheckpointSaverListener`s told around every save (the chief's
    only on the ps route, as tf.estimator's).

    The model_dir is locked for the whole call (`TrainingDir`): a second
    trainer fails at once; temporary files and uncommitted parts are removed,
    and versions saved after the one training continues from are moved aside.
    """
    config = est.config
    if resolved is None:
        resolved = check_estimator_train(
            save_checkpoints_steps=config.save_checkpoints_steps,
            save_checkpoints_secs=config.save_checkpoints_secs,
            max_steps=max_steps,
        )
    else:
        resolved = dataclasses.replace(resolved, max_steps=max_steps)
    listeners = _hooks.SavingListeners(listeners)
    trainer = _distributed.trainer_for(config)  # None in one process
    if trainer is not None and not trainer.is_chief:
        _train_worker(est, input_fn, hooks, steps, resolved, trainer)
    else:
        with TrainingDir(config.model_dir, keep=config.keep_checkpoint_max) as tdir:
            _train(est, input_fn, hooks, steps, resolved, tdir, trainer, listeners)
    if trainer is not None:
        trainer.done()
    return est


def _train_worker(est, input_fn, hooks, steps, resolved, trainer):
    """A non-chief trainer of the ps route: no restore, no save, until the global step says."""
    last_step = resolved.max_steps if steps is None else None
    _run_session(
        est, input_fn, hooks, last_step, 0, None, None, False, RestorePlan(), None, trainer, steps
    )


def _train(est, input_fn, hooks, steps, resolved, tdir, trainer=None, listeners=None):
    plan = est._restore_plan(training=True)
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
        return est
    save_steps = resolved.save_steps or est.config.checkpoint_steps
    switch, tell = _make_switch(est, hooks, last_step, plan)
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
        switched = _run_session(
            est,
            input_fn,
            hooks,
            last_step,
            save_steps,
            switch,
            tell,
            low,
            plan,
            tdir,
            trainer,
            listeners=listeners,
        )
        est._version_used = est._version_used or plan.from_restore_model_version
        if not switched:
            return est
        plan = est._restore_plan(training=True)
        tdir.start_from(plan.committed)
        start = plan.step


def _run_session(
    est,
    input_fn,
    hooks,
    last_step,
    save_steps,
    switch,
    tell,
    low,
    plan,
    tdir,
    trainer=None,
    num_steps=None,
    listeners=None,
):
    """One MonitoredTrainingSession; returns whether it stopped to switch precision.

    `trainer`: the ps route's chief or worker (`_distributed.Trainer`), or None.
    A worker (not the chief) gets neither `tdir` nor a restore plan: it saves,
    restores and summarises nothing; `num_steps` then counts from the global
    step it starts at.
    """
    config = est.config
    chief = trainer is None or trainer.is_chief
    dtype = (switch.low_dtype if low else None) if switch is not None else est._config_dtype()
    loss_scaling = dtype == "float16"

    def build_hook(graph):
        if loss_scaling:
            enable_loss_scaling(graph)

    data = _data_position.tracked(input_fn)
    if data is not None and trainer is None:
        _data_position.restore(plan.position_path, plan.step if plan.dense_path else None, data[0])
    # (On the ps route each trainer restores its own position once its session exists.)
    placement = None if trainer is None else trainer.placement
    graph, spec, features, data_hooks = est._build(input_fn, ModeKeys.TRAIN, build_hook, placement)
    with graph.as_default():
        train_op = add_missing_sparse_updates(spec.loss, spec.train_op)
        position_hook = None
        if data is not None and trainer is not None:
            position_hook = trainer.position_hook(data, config.model_dir)
            train_op = position_hook.advance(train_op)
        elif data is not None:
            position_hook = _data_position.DataPositionHook(data[1], config.model_dir)
        global_step = tf.compat.v1.train.get_global_step()
        if not any(
            s.op.name.endswith("loss")
            for s in tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SUMMARIES)
        ):
            tf.compat.v1.summary.scalar("loss", spec.loss)
        summary_op = _scaffold.summary_op(spec, tf.compat.v1.summary.merge_all())
        saver, _, manager = est._savers(spec)
        policy = SavePolicy.from_config(
            get_config(), save_steps=save_steps or 0, clock=lambda: _hooks.clock()
        )
        saver_hook = _hooks.SparseCheckpointSaverHook(
            config.model_dir,
            saver,
            manager,
            policy,
            save_secs=config.save_checkpoints_secs,
            has_full_save=plan.version is not None,
            data_position=position_hook,
            training_dir=tdir,
            state_fn=None if switch is None else lambda: _hooks.switch_state(switch),
            pause=None if trainer is None else trainer.paused,
            listeners=listeners,
            last_session=lambda: precision_hook is None or not precision_hook.switch_requested,
        )
        # The position first: it restores or notes the source before the iterator starts reading.
        own = ([position_hook] if position_hook is not None else []) + list(data_hooks)
        if last_step is not None:
            own.append(tf.compat.v1.train.StopAtStepHook(last_step=last_step))
        elif num_steps is not None:
            own.append(tf.compat.v1.train.StopAtStepHook(num_steps=num_steps))
        own.append(tf.compat.v1.train.NanTensorHook(spec.loss))
        if config.log_step_count_steps and chief:
            own.append(
                _hooks._StepRateHook(
                    config.log_step_count_steps, batch_size_of(features), config.model_dir
                )
            )
        tail = []
        precision_hook = None
        if switch is not None:
            precision_hook = _hooks._PrecisionHook(
                switch,
                low,
                tell,
                est.precision_history,
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
        given = [*hooks, *spec.training_hooks]
        late = [h for h in given if isinstance(h, _hooks.RunsAfterSaves)]
        all_hooks = own + [h for h in given if h not in late] + tail + late
        scaffold = est._scaffold(spec, plan, saver, manager)
        loop = getattr(config, "iterations_per_loop", 1)
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
                config=est._session_config(dtype),
            )
        else:
            session = trainer.session(
                scaffold,
                all_hooks,
                list(spec.training_chief_hooks),
                est._session_config(dtype),
                positions=_ps_position.committed_states(plan.position_path) if chief else None,
            )
        with session as sess:
            while not sess.should_stop():
                if loop == 1:
                    sess.run(train_op)
                else:
                    sess.run_step_fn(_loop_step(train_op, global_step, loop, last_step))
    with tf.Graph().as_default():  # FileWriterCache needs graph mode
        tf.compat.v1.summary.FileWriterCache.get(config.model_dir).flush()
    return precision_hook is not None and precision_hook.switch_requested


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
