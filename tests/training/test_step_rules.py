"""Tests of the step-consistency rules between npu_rec.init and training loops."""

import logging as pylog
import re

import pytest

import npu_rec
from npu_rec.training import _step_rules
from npu_rec.training._step_rules import ResolvedSteps


@pytest.fixture(autouse=True)
def _fresh():
    npu_rec.shutdown()
    yield
    npu_rec.shutdown()


def cfg(**kwargs):
    return npu_rec.RecConfig(bind_cpu=False, **kwargs)


def _messages(caplog, fragment):
    return [r.getMessage() for r in caplog.records if fragment in r.getMessage()]


# Estimator train().


@pytest.mark.parametrize(
    "init, loop, expected",
    [
        # init save_steps, run-config save_checkpoints_steps -> resolved save_steps
        (
            dict(save_steps=100, max_steps=200),
            dict(save_checkpoints_steps=100, max_steps=200),
            (200, 100),
        ),
        (dict(), dict(save_checkpoints_steps=50, max_steps=300), (300, 50)),
        (dict(save_steps=100, max_steps=200), dict(), (200, 100)),
        (dict(), dict(), (None, None)),
        (dict(save_steps=0), dict(save_checkpoints_steps=0), (None, 0)),
        (dict(save_steps=-1), dict(save_checkpoints_secs=600), (None, None)),
    ],
)
def test_estimator_train_consistent(init, loop, expected):
    resolved = _step_rules.check_estimator_train(config=cfg(**init), **loop)
    assert (resolved.max_steps, resolved.save_steps) == expected


@pytest.mark.parametrize(
    "init, loop, message",
    [
        (
            dict(save_steps=100),
            dict(save_checkpoints_steps=50),
            "`npu_rec.init(save_steps=100)` does not match "
            "`NPURunConfig(save_checkpoints_steps=50)`",
        ),
        (
            dict(max_steps=200),
            dict(max_steps=300),
            "`npu_rec.init(max_steps=200)` does not match `NPUEstimator.train(max_steps=300)`",
        ),
        (  # a step cadence against a time cadence
            dict(save_steps=100),
            dict(save_checkpoints_secs=600),
            "`npu_rec.init(save_steps=100)` asks for a checkpoint every 100 steps but "
            "`NPURunConfig(save_checkpoints_secs=600)`",
        ),
    ],
)
def test_estimator_mismatch_names_both_settings(init, loop, message):
    with pytest.raises(npu_rec.ConfigError, match=re.escape(message)):
        _step_rules.check_estimator_train(config=cfg(**init), **loop)


def test_estimator_uses_active_config_by_default():
    npu_rec.init(save_steps=100, bind_cpu=False)
    with pytest.raises(npu_rec.ConfigError, match="save_checkpoints_steps=7"):
        _step_rules.check_estimator_train(save_checkpoints_steps=7)


def test_estimator_rejects_bad_loop_values():
    with pytest.raises(TypeError, match=re.escape("Received: max_steps=True")):
        _step_rules.check_estimator_train(config=cfg(), max_steps=True)
    with pytest.raises(ValueError, match=re.escape("Received: save_checkpoints_steps=-1")):
        _step_rules.check_estimator_train(config=cfg(), save_checkpoints_steps=-1)


def test_unset_value_taken_from_loop_is_logged_once(caplog):
    with caplog.at_level(pylog.INFO, logger="absl"):
        for _ in range(3):
            _step_rules.check_estimator_train(config=cfg(), save_checkpoints_steps=50)
    assert _messages(caplog, "npu_rec.init(save_steps=-1)") == [
        "npu_rec.init(save_steps=-1) takes the value of "
        "`NPURunConfig(save_checkpoints_steps=50)`: save_steps=50"
    ]
    npu_rec.shutdown()  # forgets what was logged
    caplog.clear()
    with caplog.at_level(pylog.INFO, logger="absl"):
        _step_rules.check_estimator_train(config=cfg(), save_checkpoints_steps=50)
    assert len(_messages(caplog, "npu_rec.init(save_steps=-1)")) == 1


# train_and_evaluate.


def test_train_and_evaluate_seed_settings():
    resolved = _step_rules.check_train_and_evaluate(
        config=cfg(max_steps=200, train_steps=100, eval_steps=10, save_steps=100),
        save_checkpoints_steps=100,
        max_steps=200,
        eval_steps=10,
    )
    assert resolved == ResolvedSteps(max_steps=200, train_steps=100, eval_steps=10, save_steps=100)


def test_train_and_evaluate_resolves_unset_values_from_the_specs():
    resolved = _step_rules.check_train_and_evaluate(
        config=cfg(), save_checkpoints_steps=100, max_steps=200, eval_steps=10
    )
    assert resolved == ResolvedSteps(max_steps=200, train_steps=100, eval_steps=10, save_steps=100)


def test_train_and_evaluate_train_steps_sets_unset_save_cadence():
    resolved = _step_rules.check_train_and_evaluate(config=cfg(train_steps=40))
    assert (resolved.train_steps, resolved.save_steps) == (40, 40)


def test_train_and_evaluate_train_steps_must_equal_save_steps():
    with pytest.raises(
        npu_rec.ConfigError, match=re.escape("Received: train_steps=50, save_steps=100")
    ):
        _step_rules.check_train_and_evaluate(config=cfg(train_steps=50, save_steps=100))
    with pytest.raises(
        npu_rec.ConfigError, match=re.escape("Received: train_steps=50, save_steps=100")
    ):
        _step_rules.check_train_and_evaluate(config=cfg(train_steps=50), save_checkpoints_steps=100)


def test_train_and_evaluate_train_steps_against_time_cadence_is_an_error():
    with pytest.raises(
        npu_rec.ConfigError, match=re.escape("Received: train_steps=50, save_steps=None")
    ):
        _step_rules.check_train_and_evaluate(config=cfg(train_steps=50), save_checkpoints_secs=600)


def test_train_and_evaluate_eval_steps_mismatch_names_both():
    with pytest.raises(
        npu_rec.ConfigError,
        match=re.escape("`npu_rec.init(eval_steps=10)` does not match `EvalSpec(steps=20)`"),
    ):
        _step_rules.check_train_and_evaluate(config=cfg(eval_steps=10), eval_steps=20)


def test_train_and_evaluate_max_steps_mismatch_names_trainspec():
    with pytest.raises(
        npu_rec.ConfigError,
        match=re.escape("`npu_rec.init(max_steps=200)` does not match `TrainSpec(max_steps=100)`"),
    ):
        _step_rules.check_train_and_evaluate(config=cfg(max_steps=200), max_steps=100)


# Keras fit().


@pytest.mark.parametrize(
    "init, fit, expected",
    [
        (
            dict(max_steps=300, save_steps=100),
            dict(epochs=3, steps_per_epoch=100, save_freq=100),
            (300, 100),
        ),
        (dict(), dict(epochs=3, steps_per_epoch=100, save_freq="epoch"), (300, 100)),
        (dict(save_steps=100), dict(epochs=3, steps_per_epoch=100, save_freq="epoch"), (300, 100)),
        (dict(max_steps=300, save_steps=100), dict(epochs=3), (300, 100)),
        (dict(), dict(epochs=3, save_freq="epoch"), (None, None)),
        (dict(), dict(epochs=2, save_freq=25), (None, 25)),
    ],
)
def test_keras_fit_consistent(init, fit, expected):
    resolved = _step_rules.check_keras_fit(config=cfg(**init), **fit)
    assert (resolved.max_steps, resolved.save_steps) == expected


def test_keras_max_steps_mismatch_names_both():
    with pytest.raises(
        npu_rec.ConfigError,
        match=re.escape(
            "`npu_rec.init(max_steps=200)` does not match "
            "`fit(epochs=3, steps_per_epoch=100)`, i.e. max_steps=300"
        ),
    ):
        _step_rules.check_keras_fit(config=cfg(max_steps=200), epochs=3, steps_per_epoch=100)


def test_keras_save_steps_mismatch_names_both():
    with pytest.raises(
        npu_rec.ConfigError,
        match=re.escape(
            "`npu_rec.init(save_steps=100)` does not match `SparseCheckpoint(save_freq=50)`"
        ),
    ):
        _step_rules.check_keras_fit(config=cfg(save_steps=100), epochs=1, save_freq=50)
    with pytest.raises(
        npu_rec.ConfigError,
        match=re.escape(
            "`npu_rec.init(save_steps=100)` does not match "
            "`SparseCheckpoint(save_freq='epoch')`, i.e. every 80 steps"
        ),
    ):
        _step_rules.check_keras_fit(
            config=cfg(save_steps=100), epochs=1, steps_per_epoch=80, save_freq="epoch"
        )


def test_keras_epoch_cadence_of_unknown_length_against_save_steps_is_an_error():
    with pytest.raises(
        npu_rec.ConfigError,
        match=re.escape(
            "`npu_rec.init(save_steps=100)` asks for a checkpoint every 100 steps but "
            "`SparseCheckpoint(save_freq='epoch')`"
        ),
    ):
        _step_rules.check_keras_fit(config=cfg(save_steps=100), epochs=1, save_freq="epoch")


def test_keras_rejects_bad_save_freq():
    with pytest.raises(ValueError, match=re.escape("Received: save_freq=0")):
        _step_rules.check_keras_fit(config=cfg(), epochs=1, save_freq=0)


# tf.compat.v1.Session loops.


def test_session_steps_match_the_seed_example():
    npu_rec.init(max_steps=200, train_steps=100, eval_steps=10, save_steps=100, bind_cpu=False)
    resolved = npu_rec.check_session_steps(
        max_steps=200, train_steps=100, eval_steps=10, save_steps=100
    )
    assert resolved == ResolvedSteps(200, 100, 10, 100)
    # Counts the loop does not state come from init.
    assert npu_rec.check_session_steps() == resolved


@pytest.mark.parametrize("name", ["max_steps", "train_steps", "eval_steps", "save_steps"])
def test_session_mismatch_names_both(name):
    npu_rec.init(**{name: 100}, bind_cpu=False)
    with pytest.raises(
        npu_rec.ConfigError,
        match=re.escape(
            f"`npu_rec.init({name}=100)` does not match the session loop's `{name}=50`"
        ),
    ):
        npu_rec.check_session_steps(**{name: 50})


def test_session_unset_init_takes_loop_values():
    resolved = npu_rec.check_session_steps(config=cfg(), train_steps=30, save_steps=30)
    assert resolved == ResolvedSteps(max_steps=None, train_steps=30, eval_steps=None, save_steps=30)


def test_session_rejects_bad_counts():
    with pytest.raises(TypeError, match=re.escape("Received: eval_steps=True")):
        npu_rec.check_session_steps(config=cfg(), eval_steps=True)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "`train_steps` must be None or an integer in [0, 2147483647]. Received: train_steps=-1"
        ),
    ):
        npu_rec.check_session_steps(config=cfg(), train_steps=-1)
