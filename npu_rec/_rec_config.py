"""`npu_rec.init`: the Rec SDK framework settings, validated once, read everywhere.

The settings are those of Rec SDK's `mx_rec.util.initialize.init` (see
`docs/configuration.md`). `init` validates them eagerly and keeps one
read-only `RecConfig` for the process; the sparse-table core and the front
ends read it with `get_config()`. `shutdown()` forgets the settings and, through
callbacks registered by the core, the tables.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from collections.abc import Callable
from typing import Any

from npu_rec import _cpu, _validation
from npu_rec import _log as logging
from npu_rec._validation import (  # re-exported: the settings' errors and checks
    INT32_MAX,
    ConfigError,
    ConfigTypeError,
    check_bool,
    check_int,
)


@dataclasses.dataclass(frozen=True)
class RecConfig:
    """The read-only settings of `npu_rec.init` (Rec SDK `init` parameters).

    Every field has the name, default and range of the Rec SDK parameter; see
    `docs/configuration.md` for what each one does. Build a changed copy with
    `replace(**kwargs)`, which re-validates.

    Example:
      >>> cfg = npu_rec.RecConfig(max_steps=200, save_steps=100)
      >>> cfg.replace(save_steps=50).save_steps
      50

    Raises:
      ConfigTypeError: A field has the wrong type.
      ConfigError: A field is out of range, or the fields contradict each other.
    """

    max_steps: int = -1
    train_steps: int = -1
    eval_steps: int = -1
    if_load: bool = False
    use_dynamic: bool = True
    use_dynamic_expansion: bool = False
    bind_cpu: bool = True
    save_steps: int = -1
    save_checkpoint_due_time: int | None = None
    save_delta_checkpoints_secs: int | None = None
    is_incremental_checkpoint: bool = False
    restore_model_version: int | None = None
    recent_key_count_threshold: int = 0
    use_lccl: bool = False

    def __post_init__(self) -> None:
        self._validate()

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _validate(self) -> None:
        """The rules of the Rec SDK `init` table, one line per parameter."""
        s = self._set
        s("max_steps", check_int("max_steps", self.max_steps, -1))
        s("train_steps", check_int("train_steps", self.train_steps, -1))
        s("eval_steps", check_int("eval_steps", self.eval_steps, -1))
        s("if_load", check_bool("if_load", self.if_load))
        s("use_dynamic", check_bool("use_dynamic", self.use_dynamic))
        s("use_dynamic_expansion", check_bool("use_dynamic_expansion", self.use_dynamic_expansion))
        s("bind_cpu", check_bool("bind_cpu", self.bind_cpu))
        s("save_steps", check_int("save_steps", self.save_steps, -1))
        s(
            "save_checkpoint_due_time",
            check_int("save_checkpoint_due_time", self.save_checkpoint_due_time, 1, optional=True),
        )
        s(
            "save_delta_checkpoints_secs",
            check_int(
                "save_delta_checkpoints_secs", self.save_delta_checkpoints_secs, 1, optional=True
            ),
        )
        s(
            "is_incremental_checkpoint",
            check_bool("is_incremental_checkpoint", self.is_incremental_checkpoint),
        )
        s(
            "restore_model_version",
            check_int("restore_model_version", self.restore_model_version, 0, optional=True),
        )
        s(
            "recent_key_count_threshold",
            check_int("recent_key_count_threshold", self.recent_key_count_threshold, 0),
        )
        s("use_lccl", check_bool("use_lccl", self.use_lccl))

        # Cross-rules.
        if self.max_steps == 0 and self.train_steps == 0 and self.eval_steps == 0:
            raise ConfigError(
                "`max_steps`, `train_steps` and `eval_steps` must not all be 0. "
                f"Received: max_steps={self.max_steps}, train_steps={self.train_steps}, "
                f"eval_steps={self.eval_steps}"
            )
        if self.is_incremental_checkpoint:
            missing = [
                n
                for n in ("save_checkpoint_due_time", "save_delta_checkpoints_secs")
                if getattr(self, n) is None
            ]
            if missing:
                raise ConfigError(
                    "`is_incremental_checkpoint=True` needs both "
                    "`save_checkpoint_due_time` and `save_delta_checkpoints_secs` "
                    f"(seconds, in [1, {INT32_MAX}]). Missing: "
                    + ", ".join(f"`{n}`" for n in missing)
                    + ". Received: "
                    f"save_checkpoint_due_time={self.save_checkpoint_due_time}, "
                    f"save_delta_checkpoints_secs={self.save_delta_checkpoints_secs}"
                )
        if self.use_lccl:
            raise ConfigError(
                "`use_lccl=True` asks for the Low Latency Collective Communication "
                "Library (LCCL), which is not available on this platform (it exists "
                "only on Ascend NPUs). Received: use_lccl=True; leave it False."
            )

    def advisories(self) -> list[str]:
        """Returns the warnings `init` gives for valid but doubtful settings."""
        out = []
        full, delta = self.save_checkpoint_due_time, self.save_delta_checkpoints_secs
        if full is not None and delta is not None and full <= delta:
            out.append(
                "`save_checkpoint_due_time` (full saves) should be greater than "
                "`save_delta_checkpoints_secs` (delta saves); otherwise every save "
                f"is a full one. Received: save_checkpoint_due_time={full}, "
                f"save_delta_checkpoints_secs={delta}"
            )
        if self.restore_model_version is not None and not self.if_load:
            out.append(
                "`restore_model_version` has no effect unless `if_load=True`. "
                f"Received: restore_model_version={self.restore_model_version}, "
                "if_load=False"
            )
        if not self.is_incremental_checkpoint:
            for name in (
                "save_checkpoint_due_time",
                "save_delta_checkpoints_secs",
                "recent_key_count_threshold",
            ):
                value = getattr(self, name)
                if value not in (None, 0):
                    out.append(
                        f"`{name}` has no effect unless `is_incremental_checkpoint=True`. "
                        f"Received: {name}={value}, is_incremental_checkpoint=False"
                    )
        return out

    def replace(self, **kwargs: Any) -> RecConfig:
        """Returns a copy with `kwargs` changed, validated like the original.

        Raises:
          ConfigTypeError: A key is not a setting, or a value has the wrong type.
          ConfigError: A value is out of range or breaks a cross-rule.
        """
        unknown = sorted(set(kwargs) - set(PARAMETERS))
        if unknown:
            raise ConfigTypeError(
                f"RecConfig.replace() got unknown settings {unknown}. "
                f"Known settings: {list(PARAMETERS)}"
            )
        return dataclasses.replace(self, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        """Returns the settings as a plain `dict` (parameter name -> value)."""
        return dataclasses.asdict(self)


PARAMETERS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RecConfig))
_DEFAULT = RecConfig()

_lock = threading.RLock()
_active: RecConfig | None = None
_shutdown_callbacks: list[Callable[[], None]] = []


def init(**kwargs: Any) -> None:
    """Initialises npu_rec with the settings of Rec SDK's `init`.

    Every parameter is optional and keeps Rec SDK's name, default and range
    (see `RecConfig` and `docs/configuration.md`). Unknown keys are ignored
    with one `UserWarning` that names them all. Calling `init` again replaces
    all settings (unpassed ones go back to their defaults); tables are kept.

    Example:
      >>> npu_rec.init(max_steps=200, train_steps=100, eval_steps=10,
      ...              save_steps=100, use_dynamic=True, use_dynamic_expansion=False)

    Args:
      **kwargs: Rec SDK settings, e.g. `max_steps=200, save_steps=100`.

    Raises:
      ConfigTypeError: A setting has the wrong type (it is also a `TypeError`).
      ConfigError: A setting is out of range, or settings contradict each other
        (all of `max_steps`, `train_steps`, `eval_steps` 0; incremental
        checkpoints without both intervals; `use_lccl=True`).
    """
    global _active
    unknown = sorted(k for k in kwargs if k not in PARAMETERS)
    known = {k: v for k, v in kwargs.items() if k in PARAMETERS}
    config = RecConfig(**known)  # raises before anything changes
    if unknown:
        warnings.warn(
            f"npu_rec.init() ignores unknown settings: {', '.join(unknown)}. "
            f"Known settings: {', '.join(PARAMETERS)}",
            UserWarning,
            stacklevel=2,
        )
    for message in config.advisories():
        warnings.warn(message, UserWarning, stacklevel=2)

    with _lock:
        if _active is not None:
            logging.info("npu_rec.init() called again: replacing the earlier settings.")
        _active = config
        if config.bind_cpu:
            _cpu.bind()
        else:
            _cpu.unbind()
    logging.info("npu_rec initialised: %s", config)


def get_config() -> RecConfig:
    """Returns the active settings, or the defaults when `init` was not called.

    Returns:
      The read-only `RecConfig` of the last `init` (a default `RecConfig()`
      before `init` and after `shutdown`).
    """
    with _lock:
        return _active if _active is not None else _DEFAULT


def is_initialized() -> bool:
    """Whether `init` was called since the start or the last `shutdown`."""
    with _lock:
        return _active is not None


def shutdown() -> None:
    """Forgets the settings and the tables (for tests and notebooks).

    Resets `get_config()` to the defaults, restores the CPU affinity the
    process had before `bind_cpu`, lets messages logged once be logged again,
    and runs every callback registered with `register_shutdown_callback` (the
    sparse-table core uses one to drop its tables). All callbacks run even
    if one fails; the first failure is then re-raised.
    """
    global _active
    with _lock:
        _active = None
        _cpu.unbind()
        _validation.forget_logged()
        callbacks = list(_shutdown_callbacks)
    first_error: BaseException | None = None
    for callback in callbacks:
        try:
            callback()
        except Exception as error:  # every callback must run
            logging.error("npu_rec.shutdown(): callback %r failed: %s", callback, error)
            first_error = first_error or error
    if first_error is not None:
        raise first_error


def register_shutdown_callback(callback: Callable[[], None]) -> Callable[[], None]:
    """Registers `callback()` to run at every `shutdown()`, in registration order.

    Registering the same callable twice has no extra effect. Usable as a
    decorator; returns `callback`.
    """
    if not callable(callback):
        raise ConfigTypeError(f"`callback` must be callable. Received: callback={callback!r}")
    with _lock:
        if callback not in _shutdown_callbacks:
            _shutdown_callbacks.append(callback)
    return callback


def unregister_shutdown_callback(callback: Callable[[], None]) -> None:
    """Removes a callback added by `register_shutdown_callback` (no-op if absent)."""
    with _lock:
        if callback in _shutdown_callbacks:
            _shutdown_callbacks.remove(callback)
