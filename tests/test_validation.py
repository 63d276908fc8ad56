"""One rule for bad arguments everywhere: wrong type -> ConfigTypeError, out of range -> ConfigError.

`ConfigTypeError` is a `TypeError` (and a `ConfigError`, so a `ValueError`);
`ConfigError` is a `ValueError`. NumPy integers count as integers, `bool`
never does. Messages name the argument, the rule and the value.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import npu_rec
from npu_rec import _validation
from npu_rec.estimator import NPURunConfig


@pytest.fixture(autouse=True)
def _fresh():
    npu_rec.shutdown()
    yield
    npu_rec.shutdown()


def test_the_errors_are_exported_and_subclass_the_builtin_ones():
    assert issubclass(npu_rec.ConfigTypeError, TypeError)
    assert issubclass(npu_rec.ConfigTypeError, npu_rec.ConfigError)
    assert issubclass(npu_rec.ConfigError, ValueError)
    assert not issubclass(npu_rec.ConfigError, TypeError)
    assert {"ConfigError", "ConfigTypeError"} <= set(npu_rec.__all__)


@pytest.mark.parametrize(
    "call,match",
    [
        (
            lambda: npu_rec.create_table("t", True),
            "`dim` must be an integer >= 1. Received: dim=True",
        ),
        (
            lambda: npu_rec.create_table("t", 2.0),
            "`dim` must be an integer >= 1. Received: dim=2.0",
        ),
        (
            lambda: npu_rec.init(max_steps=True, bind_cpu=False),
            "`max_steps` must be an integer in [-1, 2147483647]. Received: max_steps=True",
        ),
        (lambda: npu_rec.init(bind_cpu=1), "`bind_cpu` must be a bool (True or False)"),
        (
            lambda: NPURunConfig(save_checkpoints_steps=True),
            "`save_checkpoints_steps` must be None or an integer",
        ),
        (lambda: NPURunConfig(save_checkpoints_secs="60"), "`save_checkpoints_secs` must be None"),
        (lambda: npu_rec.optimizers.SGD(learning_rate="0.1"), "`learning_rate` must be a number"),
        (lambda: npu_rec.create_table("t", 2, num_shards=2.0), "`num_shards` must be an integer"),
        (lambda: npu_rec.create_table(7, 2), "`name` must be a non-empty string"),
    ],
)
def test_a_wrong_type_raises_config_type_error(call, match):
    with pytest.raises(npu_rec.ConfigTypeError, match=re.escape(match)) as info:
        call()
    assert "of type" in str(info.value)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: npu_rec.create_table("t", 0), "`dim` must be an integer >= 1. Received: dim=0"),
        (lambda: npu_rec.create_table("t", 2, num_shards=0), "Received: num_shards=0"),
        (lambda: npu_rec.init(max_steps=-2, bind_cpu=False), "Received: max_steps=-2"),
        (lambda: NPURunConfig(save_checkpoints_steps=0), "Received: save_checkpoints_steps=0"),
        (lambda: npu_rec.optimizers.Adam(beta_1=1.0), "`beta_1` must be a number >= 0.0 and < 1.0"),
        (lambda: npu_rec.create_table("t", 2, eviction_threshold=5), "Eviction needs admission"),
    ],
)
def test_an_out_of_range_value_raises_config_error_not_type_error(call, match):
    with pytest.raises(npu_rec.ConfigError, match=re.escape(match)) as info:
        call()
    assert not isinstance(info.value, TypeError)


def test_numpy_integers_are_integers_everywhere():
    npu_rec.init(max_steps=np.int64(5), save_steps=np.int32(5), bind_cpu=False)
    assert npu_rec.get_config().max_steps == 5
    assert type(npu_rec.get_config().max_steps) is int
    table = npu_rec.create_table("t", np.int64(4), capacity=np.int32(64), num_shards=np.int64(2))
    assert (table.dim, table.num_shards) == (4, 2)
    assert type(table.config.dim) is int and type(table.config.capacity) is int
    assert NPURunConfig(save_checkpoints_steps=np.int64(10)).save_checkpoints_steps == 10
    assert npu_rec.optimizers.SGD(learning_rate=np.float32(0.5)).learning_rate == 0.5


def test_numpy_bool_is_not_an_integer():
    with pytest.raises(npu_rec.ConfigTypeError, match="Received: dim=(np.)?True_? of type bool"):
        npu_rec.create_table("t", np.bool_(True))


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        (dict(lower=1), "`n` must be an integer >= 1. Received: n=0"),
        (dict(lower=1, upper=3), "`n` must be an integer in [1, 3]. Received: n=0"),
        (dict(lower=1, optional=True), "`n` must be None or an integer >= 1. Received: n=0"),
        (
            dict(lower=1, rule="an integer >= 1 (or None)"),
            "`n` must be an integer >= 1 (or None). Received: n=0",
        ),
    ],
)
def test_check_int_states_the_rule_from_its_bounds(kwargs, expected):
    kwargs.setdefault("upper", None)
    with pytest.raises(npu_rec.ConfigError, match=re.escape(expected)):
        _validation.check_int("n", 0, **kwargs)
    assert _validation.check_int("n", None, 1, optional=True) is None


def test_check_number_bounds_and_nan():
    assert _validation.check_number("x", 1, 0, lower_open=True) == 1.0
    with pytest.raises(npu_rec.ConfigError, match=re.escape("`x` must be a number > 0")):
        _validation.check_number("x", 0, 0, lower_open=True)
    with pytest.raises(npu_rec.ConfigError, match="Received: x=nan"):
        _validation.check_number("x", float("nan"), 0)
    with pytest.raises(npu_rec.ConfigTypeError, match="of type bool"):
        _validation.check_number("x", False, 0)


def test_check_choice_lists_the_choices():
    assert _validation.check_choice("mode", "a", ("a", "b")) == "a"
    with pytest.raises(
        npu_rec.ConfigError, match=re.escape("`mode` must be one of ['a', 'b']. Received: mode='c'")
    ):
        _validation.check_choice("mode", "c", ("a", "b"))


def test_log_once_logs_once_until_shutdown(monkeypatch):
    seen = []
    monkeypatch.setattr(_validation.logging, "info", lambda msg, *a, **k: seen.append(msg))
    for _ in range(3):
        _validation.log_once("hello")
    assert seen == ["hello"]
    npu_rec.shutdown()
    _validation.log_once("hello")
    assert seen == ["hello", "hello"]


def test_warn_once_warns_once():
    with pytest.warns(UserWarning, match="careful") as record:
        _validation.warn_once("careful")
        _validation.warn_once("careful")
    assert len(record) == 1
