"""One rule for checking arguments, used by every npu_rec module that validates.

* A value of the wrong type raises `ConfigTypeError` (a `TypeError`, and a
  `ConfigError` too, so `except ValueError` written for earlier releases
  still catches it). `bool` is never an integer or a number here, although
  Python makes it one; NumPy integers are integers and NumPy floats numbers
  (a value read from an array is accepted like the Python value), and the
  checks return plain Python `int` / `float`.
* A value of the right type outside its range raises `ConfigError` (a
  `ValueError`).
* Messages name the argument, the rule and the value:
  `` `dim` must be an integer >= 1. Received: dim=0 ``; a type error adds
  the type: `` Received: dim=True of type bool ``.

`log_once` / `warn_once` report a message once per process (until
`npu_rec.shutdown()`, which calls `forget_logged`).

This module imports nothing of npu_rec but `_log`, so every layer may use it.
"""

from __future__ import annotations

import numbers
import threading
import warnings
from collections.abc import Iterable
from typing import Any

from npu_rec import _log as logging

INT32_MAX = 2147483647


class ConfigError(ValueError):
    """An `npu_rec` setting is out of range or contradicts another setting.

    Its message names the setting(s), the rule and the value(s) received.
    """


class ConfigTypeError(ConfigError, TypeError):
    """A setting has the wrong type (e.g. a `bool` or a `float` for an int).

    It is both a `TypeError` and a `ConfigError` (hence a `ValueError`), so
    `except TypeError` and `except npu_rec.ConfigError` both catch it.
    """


def _type_error(name: str, value: Any, rule: str) -> ConfigTypeError:
    return ConfigTypeError(
        f"`{name}` must be {rule}. Received: {name}={value!r} of type {type(value).__name__}"
    )


def check_int(
    name: str,
    value: Any,
    lower: int | None = None,
    upper: int | None = INT32_MAX,
    *,
    optional: bool = False,
    rule: str | None = None,
) -> int | None:
    """`value` as an `int` in [lower, upper] (either bound None = open), or None if optional.

    Args:
      name: The argument's name, used in the message.
      value: The value received.
      lower: Smallest allowed value (None: no lower bound).
      upper: Largest allowed value (None: no upper bound).
      optional: Whether None ("not set") is allowed.
      rule: The rule as the message states it (default: from the bounds).

    Returns:
      `value` as a Python `int`, or None.

    Raises:
      ConfigTypeError: `value` is not an integer (bool and float included).
      ConfigError: `value` is outside [lower, upper].
    """
    if value is None and optional:
        return None
    if rule is None:
        if lower is not None and upper is not None:
            rule = f"an integer in [{lower}, {upper}]"
        elif lower is not None:
            rule = f"an integer >= {lower}"
        else:
            rule = "an integer" if upper is None else f"an integer <= {upper}"
        rule = "None or " + rule if optional else rule
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _type_error(name, value, rule)
    value = int(value)
    if (lower is not None and value < lower) or (upper is not None and value > upper):
        raise ConfigError(f"`{name}` must be {rule}. Received: {name}={value}")
    return value


def check_number(
    name: str,
    value: Any,
    lower: float | None = None,
    upper: float | None = None,
    *,
    lower_open: bool = False,
    upper_open: bool = False,
    optional: bool = False,
    rule: str | None = None,
) -> float | None:
    """`value` as a `float` within the bounds (open or closed), or None if optional.

    Raises:
      ConfigTypeError: `value` is not a real number (bool included).
      ConfigError: `value` is outside the bounds (NaN is outside every bound).
    """
    if value is None and optional:
        return None
    if rule is None:
        parts = []
        if lower is not None:
            parts.append(f"{'>' if lower_open else '>='} {lower}")
        if upper is not None:
            parts.append(f"{'<' if upper_open else '<='} {upper}")
        rule = "a number" + (" " + " and ".join(parts) if parts else "")
        rule = "None or " + rule if optional else rule
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _type_error(name, value, rule)
    number = float(value)
    ok = number == number
    if lower is not None:
        ok = ok and (number > lower if lower_open else number >= lower)
    if upper is not None:
        ok = ok and (number < upper if upper_open else number <= upper)
    if not ok:
        raise ConfigError(f"`{name}` must be {rule}. Received: {name}={value!r}")
    return number


def check_bool(
    name: str, value: Any, *, optional: bool = False, rule: str | None = None
) -> bool | None:
    """`value` if it is exactly `True` or `False` (not 0/1, not a string), or None if optional.

    Raises:
      ConfigTypeError: `value` is not a bool.
    """
    if value is None and optional:
        return None
    if not isinstance(value, bool):
        if rule is None:
            rule = "a bool (True or False)" + (" or None" if optional else "")
        raise _type_error(name, value, rule)
    return value


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """`value` if it is one of `choices`.

    Raises:
      ConfigError: `value` is not one of them (the message lists them).
    """
    choices = list(choices)
    if value not in choices:
        raise ConfigError(f"`{name}` must be one of {choices}. Received: {name}={value!r}")
    return value


_reported: set[tuple[str, str]] = set()
_reported_lock = threading.Lock()


def _first_time(kind: str, message: str) -> bool:
    with _reported_lock:
        if (kind, message) in _reported:
            return False
        _reported.add((kind, message))
        return True


def log_once(message: str) -> None:
    """Logs `message` at INFO level the first time it is given (per process)."""
    if _first_time("info", message):
        logging.info(message, stacklevel=2)  # the line of the caller, not this one


def warn_once(message: str, stacklevel: int = 2) -> None:
    """Issues `message` as a `UserWarning` the first time it is given (per process)."""
    if _first_time("warn", message):
        warnings.warn(message, UserWarning, stacklevel=stacklevel + 1)


def forget_logged() -> None:
    """Lets every message of `log_once` / `warn_once` be reported again."""
    with _reported_lock:
        _reported.clear()
