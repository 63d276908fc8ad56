"""Tests of npu_rec.init / get_config / shutdown and the RecConfig rules."""

import dataclasses
import re
import warnings

import numpy as np
import pytest

import npu_rec
from npu_rec import _rec_config

MAX = 2147483647


@pytest.fixture(autouse=True)
def _fresh():
    npu_rec.shutdown()
    yield
    npu_rec.shutdown()


def _quiet_init(**kwargs):
    """init() ignoring advisory warnings (e.g. an interval without incremental)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        npu_rec.init(**kwargs)


# name, lower, upper, optional (None allowed), default
INT_PARAMS = [
    ("max_steps", -1, MAX, False, -1),
    ("train_steps", -1, MAX, False, -1),
    ("eval_steps", -1, MAX, False, -1),
    ("save_steps", -1, MAX, False, -1),
    ("save_checkpoint_due_time", 1, MAX, True, None),
    ("save_delta_checkpoints_secs", 1, MAX, True, None),
    ("restore_model_version", 0, MAX, True, None),
    ("recent_key_count_threshold", 0, MAX, False, 0),
]
BOOL_PARAMS = [
    ("if_load", False),
    ("use_dynamic", True),
    ("use_dynamic_expansion", False),
    ("bind_cpu", True),
    ("is_incremental_checkpoint", False),
    ("use_lccl", False),
]


def _int_cases():
    for name, lower, upper, optional, _ in INT_PARAMS:
        yield pytest.param(name, lower, None, id=f"{name}-lower")
        yield pytest.param(name, upper, None, id=f"{name}-upper")
        yield pytest.param(name, lower - 1, ValueError, id=f"{name}-below")
        yield pytest.param(name, upper + 1, ValueError, id=f"{name}-above")
        yield pytest.param(name, True, TypeError, id=f"{name}-bool")
        yield pytest.param(name, 10.0, TypeError, id=f"{name}-float")
        yield pytest.param(name, "10", TypeError, id=f"{name}-str")
        yield pytest.param(name, None, None if optional else TypeError, id=f"{name}-None")


def _rule(name):
    for n, lower, upper, optional, _ in INT_PARAMS:
        if n == name:
            return ("None or " if optional else "") + f"an integer in [{lower}, {upper}]"
    raise AssertionError(name)


@pytest.mark.parametrize("name, value, error", list(_int_cases()))
def test_int_parameter_range_and_type(name, value, error):
    kwargs = {name: value}
    if error is None:
        _quiet_init(**kwargs)
        assert getattr(npu_rec.get_config(), name) == value
        return
    expected = f"`{name}` must be {_rule(name)}. Received: {name}={value!r}"
    with pytest.raises(error, match=re.escape(expected)):
        npu_rec.init(**kwargs)
    # A rejected init changes nothing.
    assert npu_rec.get_config() == npu_rec.RecConfig()


def test_range_message_is_exact():
    with pytest.raises(npu_rec.ConfigError) as info:
        npu_rec.init(save_steps=-2)
    assert str(info.value) == (
        "`save_steps` must be an integer in [-1, 2147483647]. Received: save_steps=-2"
    )


@pytest.mark.parametrize("name, default", BOOL_PARAMS)
@pytest.mark.parametrize(
    "value", [1, 0, "True", None, np.bool_(True)], ids=["int1", "int0", "str", "None", "numpy_bool"]
)
def test_bool_parameter_rejects_non_bool(name, default, value):
    with pytest.raises(
        TypeError,
        match=re.escape(f"`{name}` must be a bool (True or False). Received: {name}={value!r}"),
    ):
        npu_rec.init(**{name: value})


@pytest.mark.parametrize("name, default", [p for p in BOOL_PARAMS if p[0] != "use_lccl"])
@pytest.mark.parametrize("value", [True, False])
def test_bool_parameter_accepts_bool(name, default, value):
    kwargs = {name: value}
    if name == "is_incremental_checkpoint" and value:
        kwargs.update(save_checkpoint_due_time=60, save_delta_checkpoints_secs=10)
    npu_rec.init(**kwargs)
    assert getattr(npu_rec.get_config(), name) is value


def test_type_error_is_also_a_config_error_and_value_error():
    with pytest.raises(npu_rec.ConfigError) as info:
        npu_rec.init(max_steps=False)
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, ValueError)


def test_numpy_integers_are_accepted_as_int():
    npu_rec.init(max_steps=np.int64(200), save_steps=np.int32(100))
    cfg = npu_rec.get_config()
    assert cfg.max_steps == 200 and type(cfg.max_steps) is int
    assert cfg.save_steps == 100 and type(cfg.save_steps) is int


def test_defaults_before_init_and_after_shutdown():
    expected = {name: default for name, *_, default in INT_PARAMS}
    expected.update(dict(BOOL_PARAMS))
    assert npu_rec.get_config().to_dict() == expected
    npu_rec.init(max_steps=5, if_load=True)
    assert npu_rec.get_config().max_steps == 5
    npu_rec.shutdown()
    assert npu_rec.get_config().to_dict() == expected
    assert not _rec_config.is_initialized()


def test_seed_example():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        npu_rec.init(
            max_steps=200,
            train_steps=100,
            eval_steps=10,
            save_steps=100,
            use_dynamic=True,
            use_dynamic_expansion=False,
        )
    cfg = npu_rec.get_config()
    assert (cfg.max_steps, cfg.train_steps, cfg.eval_steps, cfg.save_steps) == (200, 100, 10, 100)
    assert cfg.use_dynamic is True and cfg.use_dynamic_expansion is False
    assert _rec_config.is_initialized()


def test_unknown_keys_warn_once_naming_all():
    with pytest.warns(UserWarning) as record:
        npu_rec.init(max_steps=10, mystery=1, another_one="x")
    assert len(record) == 1
    message = str(record[0].message)
    assert "another_one" in message and "mystery" in message
    assert npu_rec.get_config().max_steps == 10
    assert not hasattr(npu_rec.get_config(), "mystery")


def test_no_warning_without_unknown_keys():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        npu_rec.init(max_steps=10)


def test_reinit_replaces_all_settings():
    npu_rec.init(max_steps=10, save_steps=5)
    npu_rec.init(eval_steps=3)
    cfg = npu_rec.get_config()
    assert (cfg.max_steps, cfg.save_steps, cfg.eval_steps) == (-1, -1, 3)


def test_config_is_read_only_and_replace_revalidates():
    npu_rec.init(save_steps=100)
    cfg = npu_rec.get_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.save_steps = 5
    changed = cfg.replace(save_steps=50)
    assert changed.save_steps == 50 and cfg.save_steps == 100
    assert npu_rec.get_config().save_steps == 100
    with pytest.raises(ValueError, match=re.escape("Received: save_steps=-5")):
        cfg.replace(save_steps=-5)
    with pytest.raises(TypeError, match="unknown settings.*'nope'"):
        cfg.replace(nope=1)


# Cross-rules.


def test_steps_all_zero_is_an_error_naming_all_three():
    with pytest.raises(
        npu_rec.ConfigError, match=re.escape("Received: max_steps=0, train_steps=0, eval_steps=0")
    ):
        npu_rec.init(max_steps=0, train_steps=0, eval_steps=0)


@pytest.mark.parametrize("values", [(0, 0, 1), (0, 1, 0), (1, 0, 0), (0, 0, -1)])
def test_steps_not_all_zero_pass(values):
    npu_rec.init(max_steps=values[0], train_steps=values[1], eval_steps=values[2])
    assert npu_rec.get_config().max_steps == values[0]


@pytest.mark.parametrize(
    "given, missing",
    [
        ({}, "`save_checkpoint_due_time`, `save_delta_checkpoints_secs`"),
        ({"save_checkpoint_due_time": 60}, "`save_delta_checkpoints_secs`"),
        ({"save_delta_checkpoints_secs": 10}, "`save_checkpoint_due_time`"),
    ],
)
def test_incremental_needs_both_intervals(given, missing):
    full = given.get("save_checkpoint_due_time")
    delta = given.get("save_delta_checkpoints_secs")
    with pytest.raises(
        npu_rec.ConfigError,
        match=re.escape(
            f"Missing: {missing}. Received: save_checkpoint_due_time={full}, "
            f"save_delta_checkpoints_secs={delta}"
        ),
    ):
        npu_rec.init(is_incremental_checkpoint=True, **given)


def test_incremental_with_both_intervals_passes_without_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        npu_rec.init(
            is_incremental_checkpoint=True,
            save_checkpoint_due_time=60,
            save_delta_checkpoints_secs=10,
            recent_key_count_threshold=2,
        )
    cfg = npu_rec.get_config()
    assert (cfg.save_checkpoint_due_time, cfg.save_delta_checkpoints_secs) == (60, 10)


@pytest.mark.parametrize("full, delta", [(10, 10), (5, 10)])
def test_full_interval_not_greater_than_delta_warns_naming_both(full, delta):
    with pytest.warns(
        UserWarning,
        match=re.escape(f"save_checkpoint_due_time={full}, save_delta_checkpoints_secs={delta}"),
    ):
        npu_rec.init(
            is_incremental_checkpoint=True,
            save_checkpoint_due_time=full,
            save_delta_checkpoints_secs=delta,
        )
    assert npu_rec.get_config().save_checkpoint_due_time == full


def test_use_lccl_true_is_not_available():
    with pytest.raises(
        npu_rec.ConfigError, match=r"`use_lccl=True`.*not available on this platform"
    ):
        npu_rec.init(use_lccl=True)
    assert not _rec_config.is_initialized()


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"restore_model_version": 7}, "restore_model_version=7, if_load=False"),
        (
            {"recent_key_count_threshold": 3},
            "recent_key_count_threshold=3, is_incremental_checkpoint=False",
        ),
        (
            {"save_delta_checkpoints_secs": 3},
            "save_delta_checkpoints_secs=3, is_incremental_checkpoint=False",
        ),
    ],
)
def test_settings_without_effect_warn(kwargs, fragment):
    with pytest.warns(UserWarning, match=re.escape(fragment)):
        npu_rec.init(**kwargs)


def test_restore_model_version_with_if_load_is_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        npu_rec.init(if_load=True, restore_model_version=0)
    assert npu_rec.get_config().restore_model_version == 0


# shutdown callbacks.


def test_shutdown_runs_callbacks_in_order_once_each():
    calls = []

    def first():
        calls.append("first")

    def second():
        calls.append("second")

    _rec_config.register_shutdown_callback(first)
    _rec_config.register_shutdown_callback(second)
    _rec_config.register_shutdown_callback(first)  # no duplicate
    try:
        npu_rec.init(max_steps=3)
        npu_rec.shutdown()
        assert calls == ["first", "second"]
        assert npu_rec.get_config().max_steps == -1
        _rec_config.unregister_shutdown_callback(first)
        npu_rec.shutdown()
        assert calls == ["first", "second", "second"]
    finally:
        _rec_config.unregister_shutdown_callback(first)
        _rec_config.unregister_shutdown_callback(second)


def test_failing_shutdown_callback_does_not_stop_the_others():
    calls = []

    def broken():
        raise RuntimeError("table registry exploded")

    def after():
        calls.append("after")

    _rec_config.register_shutdown_callback(broken)
    _rec_config.register_shutdown_callback(after)
    try:
        npu_rec.init(max_steps=3)
        with pytest.raises(RuntimeError, match="table registry exploded"):
            npu_rec.shutdown()
        assert calls == ["after"]
        assert not _rec_config.is_initialized()
    finally:
        _rec_config.unregister_shutdown_callback(broken)
        _rec_config.unregister_shutdown_callback(after)


def test_register_rejects_non_callable():
    with pytest.raises(TypeError, match="`callback` must be callable"):
        _rec_config.register_shutdown_callback(42)
