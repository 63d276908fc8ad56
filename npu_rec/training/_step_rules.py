"""Step-consistency rules between `npu_rec.init` and the training loop.

Rec SDK requires `max_steps`, `train_steps`, `eval_steps` and `save_steps`
given to `init` to equal the counts the training loop really uses, and
forbids -1 there. npu_rec keeps the first rule and relaxes the second:

* a setting left at -1 takes the training loop's value (logged once);
* a setting given to `init` while the loop leaves the matching value unset
  is the value the loop must use (logged once);
* two explicit values that differ are always a `ConfigError` naming both.

The front ends call these checks when training starts and use the
`ResolvedSteps` they return; users of plain `tf.compat.v1.Session` loops call
`npu_rec.check_session_steps` themselves. All are pure functions of their
arguments and the `RecConfig` (the active one unless `config=` is given).
"""

from __future__ import annotations

import dataclasses

from npu_rec._rec_config import RecConfig, get_config
from npu_rec._validation import ConfigError, check_int, log_once


@dataclasses.dataclass(frozen=True)
class ResolvedSteps:
    """The step counts a training run uses once `init` and the loop agree.

    `None` means "not bounded / not periodic": train or evaluate until the
    data runs out, or no step-based checkpoint cadence.

    Attributes:
      max_steps: Total training steps (global step at which training stops).
      train_steps: Training steps between evaluations.
      eval_steps: Steps of each evaluation.
      save_steps: Steps between checkpoints (0 or None: none periodic).
    """

    max_steps: int | None = None
    train_steps: int | None = None
    eval_steps: int | None = None
    save_steps: int | None = None


def _resolve(
    name: str, init_value: int, loop_label: str | None, loop_value: int | None
) -> int | None:
    """Reconciles init's `name=init_value` with the loop's value.

    Args:
      name: The `init` parameter.
      init_value: Its value (-1 = unset).
      loop_label: How the loop's value is shown, e.g. "NPURunConfig(save_checkpoints_steps=50)".
      loop_value: The loop's value, None when the loop leaves it unset.
    """
    if init_value == -1:
        if loop_value is not None:
            log_once(
                f"npu_rec.init({name}=-1) takes the value of {loop_label}: {name}={loop_value}"
            )
        return loop_value
    if loop_value is None:
        if loop_label is not None:
            log_once(
                f"{loop_label.replace('=None', '')} is unset, so the training loop uses "
                f"npu_rec.init({name}={init_value})"
            )
        return init_value
    if init_value != loop_value:
        raise ConfigError(
            f"`npu_rec.init({name}={init_value})` does not match {loop_label}. "
            f"Set them equal, or leave `{name}` at -1 (unset) in npu_rec.init to "
            "take the training loop's value."
        )
    return init_value


def _loop_value(name: str, value: int | None) -> int | None:
    return check_int(name, value, 0, optional=True)


def check_estimator_train(
    *,
    save_checkpoints_steps: int | None = None,
    save_checkpoints_secs: int | float | None = None,
    max_steps: int | None = None,
    max_steps_source: str = "NPUEstimator.train",
    config: RecConfig | None = None,
) -> ResolvedSteps:
    """Checks `init` against an Estimator `train()` (or `TrainSpec`).

    Pass only what the user set explicitly: None for a run-config cadence
    left at its default, None for `max_steps` not given.

    Args:
      save_checkpoints_steps: `NPURunConfig.save_checkpoints_steps`.
      save_checkpoints_secs: `NPURunConfig.save_checkpoints_secs`.
      max_steps: The `max_steps` given to `train()` / `TrainSpec`.
      max_steps_source: Name shown in messages, e.g. "TrainSpec".
      config: The settings to check; the active `get_config()` by default.

    Returns:
      `ResolvedSteps` with `max_steps` and `save_steps` resolved; `train_steps`
      and `eval_steps` are copied from `config` (None for -1).

    Raises:
      ConfigError: `init(save_steps)` differs from `save_checkpoints_steps`,
        `init(save_steps>=1)` meets time-based `save_checkpoints_secs`, or
        `init(max_steps)` differs from `max_steps`.
    """
    config = config or get_config()
    save_checkpoints_steps = _loop_value("save_checkpoints_steps", save_checkpoints_steps)
    max_steps = _loop_value("max_steps", max_steps)
    if (
        config.save_steps >= 1
        and save_checkpoints_steps is None
        and save_checkpoints_secs is not None
    ):
        raise ConfigError(
            f"`npu_rec.init(save_steps={config.save_steps})` asks for a checkpoint every "
            f"{config.save_steps} steps but `NPURunConfig(save_checkpoints_secs="
            f"{save_checkpoints_secs})` asks for time-based ones. Use "
            f"NPURunConfig(save_checkpoints_steps={config.save_steps}) instead, or "
            "leave save_steps at -1."
        )
    save = _resolve(
        "save_steps",
        config.save_steps,
        f"`NPURunConfig(save_checkpoints_steps={save_checkpoints_steps})`",
        save_checkpoints_steps,
    )
    total = _resolve(
        "max_steps", config.max_steps, f"`{max_steps_source}(max_steps={max_steps})`", max_steps
    )
    return ResolvedSteps(
        max_steps=total,
        save_steps=save,
        train_steps=_unset(config.train_steps),
        eval_steps=_unset(config.eval_steps),
    )


def check_train_and_evaluate(
    *,
    save_checkpoints_steps: int | None = None,
    save_checkpoints_secs: int | float | None = None,
    max_steps: int | None = None,
    eval_steps: int | None = None,
    config: RecConfig | None = None,
) -> ResolvedSteps:
    """Checks `init` against `train_and_evaluate(estimator, TrainSpec, EvalSpec)`.

    On top of `check_estimator_train`: evaluation runs after each checkpoint,
    so `init(train_steps)` must equal the checkpoint cadence `save_steps`; and
    `init(eval_steps)` must equal `EvalSpec.steps`.

    Args:
      save_checkpoints_steps: `NPURunConfig.save_checkpoints_steps`, or None.
      save_checkpoints_secs: `NPURunConfig.save_checkpoints_secs`, or None.
      max_steps: `TrainSpec.max_steps`, or None.
      eval_steps: `EvalSpec.steps`, or None (evaluate the whole input).
      config: The settings to check; the active `get_config()` by default.

    Returns:
      `ResolvedSteps` with every count resolved.

    Raises:
      ConfigError: One of the rules of `check_estimator_train` fails, or
        `train_steps != save_steps`, or `eval_steps != EvalSpec.steps`.
    """
    config = config or get_config()
    eval_steps = _loop_value("eval_steps", eval_steps)
    resolved = check_estimator_train(
        save_checkpoints_steps=save_checkpoints_steps,
        save_checkpoints_secs=save_checkpoints_secs,
        max_steps=max_steps,
        max_steps_source="TrainSpec",
        config=config,
    )
    save, train = resolved.save_steps, config.train_steps
    if train == -1:
        if save is not None:
            log_once(
                f"npu_rec.init(train_steps=-1) takes the checkpoint cadence: train_steps={save}"
            )
        train = save
    elif save is None and save_checkpoints_secs is None:
        log_once(
            f"npu_rec.init(train_steps={train}) also sets the checkpoint cadence: "
            f"save_steps={train}"
        )
        save = train
    elif train != save:
        raise ConfigError(
            f"In train_and_evaluate, evaluation follows each checkpoint, so "
            f"`npu_rec.init(train_steps={train})` must equal the checkpoint cadence "
            f"save_steps={save} (from npu_rec.init(save_steps={config.save_steps}) and "
            f"NPURunConfig(save_checkpoints_steps={save_checkpoints_steps}, "
            f"save_checkpoints_secs={save_checkpoints_secs})). "
            f"Received: train_steps={train}, save_steps={save}"
        )
    evals = _resolve("eval_steps", config.eval_steps, f"`EvalSpec(steps={eval_steps})`", eval_steps)
    return ResolvedSteps(
        max_steps=resolved.max_steps, train_steps=train, eval_steps=evals, save_steps=save
    )


def check_keras_fit(
    *,
    epochs: int,
    steps_per_epoch: int | None = None,
    save_freq: int | str | None = None,
    callback_label: str = "SparseCheckpoint",
    config: RecConfig | None = None,
) -> ResolvedSteps:
    """Checks `init` against `RecModel.fit` and its checkpoint callback.

    Args:
      epochs: `fit(epochs=...)`; the run ends at global step
        `epochs * steps_per_epoch` (resumed runs included).
      steps_per_epoch: Steps per epoch, None when unknown (e.g. a dataset of
        unknown length): `max_steps` is then not checked.
      save_freq: The checkpoint callback's cadence: an int (batches), "epoch",
        or None when there is no checkpoint callback.
      callback_label: The callback's name, shown in messages.
      config: The settings to check; the active `get_config()` by default.

    Returns:
      `ResolvedSteps` with `max_steps` (None when not known) and `save_steps`
      (None when the callback saves per epoch of unknown length, or nothing
      is set anywhere).

    Raises:
      ConfigError: `init(max_steps)` differs from `epochs * steps_per_epoch`,
        `init(save_steps)` differs from the callback's cadence, or
        `init(save_steps>=1)` meets `save_freq="epoch"` of unknown length.
    """
    config = config or get_config()
    epochs = check_int("epochs", epochs, 0)
    steps_per_epoch = _loop_value("steps_per_epoch", steps_per_epoch)
    total = None if steps_per_epoch is None else epochs * steps_per_epoch
    label = (
        "`fit(steps_per_epoch)`"
        if total is None
        else f"`fit(epochs={epochs}, steps_per_epoch={steps_per_epoch})`, i.e. max_steps={total}"
    )
    resolved_max = _resolve("max_steps", config.max_steps, label, total)

    if save_freq == "epoch":
        if steps_per_epoch is None:
            if config.save_steps >= 1:
                raise ConfigError(
                    f"`npu_rec.init(save_steps={config.save_steps})` asks for a checkpoint "
                    f"every {config.save_steps} steps but `{callback_label}(save_freq="
                    "'epoch')` saves once per epoch, whose length is unknown. Use "
                    f"{callback_label}(save_freq={config.save_steps}), pass "
                    "steps_per_epoch, or leave save_steps at -1."
                )
            cadence = None
        else:
            cadence = steps_per_epoch
        cadence_label = f"`{callback_label}(save_freq='epoch')`, i.e. every {cadence} steps"
    elif save_freq is None:
        cadence, cadence_label = None, f"`{callback_label}(save_freq)`"
    else:
        cadence = check_int("save_freq", save_freq, 1)
        cadence_label = f"`{callback_label}(save_freq={cadence})`"
    save = _resolve("save_steps", config.save_steps, cadence_label, cadence)
    return ResolvedSteps(
        max_steps=resolved_max,
        save_steps=save,
        train_steps=_unset(config.train_steps),
        eval_steps=_unset(config.eval_steps),
    )


def check_session_steps(
    *,
    max_steps: int | None = None,
    train_steps: int | None = None,
    eval_steps: int | None = None,
    save_steps: int | None = None,
    config: RecConfig | None = None,
) -> ResolvedSteps:
    """Checks the step counts of a `tf.compat.v1.Session` loop against `init`.

    Call it before the loop with the counts the loop will run; leave out
    (None) the ones it does not bound.

    Example:
      >>> npu_rec.init(train_steps=100, eval_steps=10, save_steps=100)
      >>> steps = npu_rec.check_session_steps(train_steps=100, eval_steps=10)
      >>> steps.save_steps
      100

    Args:
      max_steps: Total training steps the loop runs.
      train_steps: Training steps between evaluations.
      eval_steps: Steps of each evaluation.
      save_steps: Steps between checkpoints.
      config: The settings to check; the active `get_config()` by default.

    Returns:
      `ResolvedSteps`: each count from the loop or from `init` (None if neither).

    Raises:
      ConfigTypeError: A count is not an integer (bool included).
      ConfigError: A count is negative, or differs from the one given to `init`.
    """
    config = config or get_config()
    values = {
        "max_steps": max_steps,
        "train_steps": train_steps,
        "eval_steps": eval_steps,
        "save_steps": save_steps,
    }
    resolved = {}
    for name, value in values.items():
        value = _loop_value(name, value)
        label = None if value is None else f"the session loop's `{name}={value}`"
        resolved[name] = _resolve(name, getattr(config, name), label, value)
    return ResolvedSteps(**resolved)


def _unset(value: int) -> int | None:
    return None if value == -1 else value
