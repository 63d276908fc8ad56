"""When to save and when to evict: decisions shared by hooks and callbacks.

The Estimator hooks and the Keras callbacks ask these plain objects (no
TensorFlow) after each training step, so the cadence rules live in one place:

* `SavePolicy`: checkpoints every `save_steps` steps, and with incremental
  checkpoints a "full" save every `save_checkpoint_due_time` seconds and a
  "delta" save every `save_delta_checkpoints_secs` seconds.
* `EvictPolicy`: table eviction every `time_interval` seconds and/or every
  `step_interval` steps.

Asking (`decide`, `due`) never changes a policy; the caller reports what it
did (`mark_saved`, `mark_evicted`). Step cadences fire at the first step that
reaches or passes a multiple of the interval (steps 100, 200, ... for 100, even
when the loop advances several steps at a time); time cadences fire once the
interval has elapsed since the last such save (inclusive). Times come from
`now` or, when omitted, from the injectable `clock` (`time.monotonic`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

from npu_rec._rec_config import ConfigError, RecConfig, check_int
from npu_rec._validation import check_number

SaveKind = Literal["full", "delta"]
FULL: SaveKind = "full"
DELTA: SaveKind = "delta"


def _check_seconds(name: str, value: float | None) -> float | None:
    return check_number(
        name, value, 0, lower_open=True, optional=True, rule="None or a number of seconds > 0"
    )


def _crossed(step: int, last: int, every: int) -> bool:
    """Whether a multiple of `every` lies in (last, step]."""
    return step // every > last // every


class SavePolicy:
    """Decides, step by step, whether to write a checkpoint and of which kind.

    Example:
      >>> policy = SavePolicy(save_steps=100)
      >>> policy.start(step=0, now=0.0)
      >>> policy.decide(step=99, now=1.0) is None, policy.decide(step=100, now=1.0)
      (True, 'full')

    Args:
      save_steps: Steps between checkpoints; None, 0 or -1: no step cadence
        (Rec SDK's -1 saves only at the end of training, which the front end
        does itself).
      incremental: `is_incremental_checkpoint`: also save by time.
      full_interval_secs: `save_checkpoint_due_time`: seconds between full saves.
      delta_interval_secs: `save_delta_checkpoints_secs`: seconds between delta saves.
      clock: Returns the current time in seconds; used when `now` is omitted.

    Raises:
      ConfigError: An interval is not positive, or `incremental` lacks one.
    """

    def __init__(
        self,
        *,
        save_steps: int | None = None,
        incremental: bool = False,
        full_interval_secs: float | None = None,
        delta_interval_secs: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        save_steps = check_int("save_steps", save_steps, -1, optional=True)
        self.save_steps = save_steps if save_steps and save_steps > 0 else None
        self.incremental = bool(incremental)
        self.full_interval_secs = _check_seconds("full_interval_secs", full_interval_secs)
        self.delta_interval_secs = _check_seconds("delta_interval_secs", delta_interval_secs)
        if self.incremental and (
            self.full_interval_secs is None or self.delta_interval_secs is None
        ):
            raise ConfigError(
                "An incremental SavePolicy needs both `full_interval_secs` and "
                f"`delta_interval_secs`. Received: full_interval_secs={full_interval_secs}, "
                f"delta_interval_secs={delta_interval_secs}"
            )
        self._clock = clock
        self._started = False
        self._last_full_step = 0
        self._last_full_time = 0.0
        self._last_delta_time = 0.0
        self._has_full = False

    @classmethod
    def from_config(
        cls,
        config: RecConfig,
        *,
        save_steps: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> SavePolicy:
        """Builds the policy of an `init` config.

        Args:
          config: The settings, e.g. `npu_rec.get_config()`.
          save_steps: The resolved cadence from a step check (`ResolvedSteps`);
            `config.save_steps` when omitted.
          clock: See the class.
        """
        return cls(
            save_steps=config.save_steps if save_steps is None else save_steps,
            incremental=config.is_incremental_checkpoint,
            full_interval_secs=config.save_checkpoint_due_time,
            delta_interval_secs=config.save_delta_checkpoints_secs,
            clock=clock,
        )

    def _now(self, now: float | None) -> float:
        return self._clock() if now is None else float(now)

    def start(
        self, step: int = 0, now: float | None = None, *, has_full_save: bool = False
    ) -> None:
        """Starts (or restarts) the cadences at `step` and `now`.

        Call it when training starts, with the global step (restored or 0).
        Without it, the first `decide` starts the policy at step 0 and its `now`.

        Args:
          step: The global step training starts from.
          now: The current time; the clock's when omitted.
          has_full_save: Whether a full save to build deltas on already exists
            (a resumed run). Until one exists, a due delta is upgraded to full.
        """
        now = self._now(now)
        self._started = True
        self._last_full_step = int(step)
        self._last_full_time = now
        self._last_delta_time = now
        self._has_full = bool(has_full_save)

    def decide(self, step: int, now: float | None = None) -> SaveKind | None:
        """Returns what to save after training step `step`: None, "full" or "delta".

        "full" when a multiple of `save_steps` was reached since the last full
        save, or (incremental) `full_interval_secs` have elapsed since it;
        otherwise "delta" (incremental only) when `delta_interval_secs` have
        elapsed since the last save of either kind, upgraded to "full" while no
        full save exists; otherwise None.
        """
        now = self._now(now)
        if not self._started:
            self.start(0, now)
        if self.save_steps is not None and _crossed(step, self._last_full_step, self.save_steps):
            return FULL
        if not self.incremental:
            return None
        if now - self._last_full_time >= self.full_interval_secs:
            return FULL
        if now - self._last_delta_time >= self.delta_interval_secs:
            return DELTA if self._has_full else FULL
        return None

    def mark_saved(self, kind: SaveKind, step: int, now: float | None = None) -> None:
        """Records that a `kind` save was written at `step` and `now`.

        A full save restarts every cadence; a delta save restarts the delta one.

        Raises:
          ValueError: `kind` is not "full" or "delta".
        """
        now = self._now(now)
        if not self._started:
            self.start(0, now)
        if kind == FULL:
            self._last_full_step = int(step)
            self._last_full_time = now
            self._last_delta_time = now
            self._has_full = True
        elif kind == DELTA:
            self._last_delta_time = now
        else:
            raise ValueError(f"`kind` must be 'full' or 'delta'. Received: kind={kind!r}")


class EvictPolicy:
    """Decides when to evict stale keys from the sparse tables.

    Eviction is due when either cadence fires: `time_interval` seconds since
    the last eviction, or a multiple of `step_interval` reached since it.
    With both None it is never due.

    Example:
      >>> policy = EvictPolicy(time_interval=24 * 60 * 60, step_interval=1000)
      >>> policy.start(step=0, now=0.0)
      >>> policy.due(step=999, now=10.0), policy.due(step=1000, now=10.0)
      (False, True)

    Args:
      time_interval: Seconds between evictions (> 0), or None.
      step_interval: Steps between evictions (>= 1), or None.
      clock: Returns the current time in seconds; used when `now` is omitted.

    Raises:
      ConfigTypeError: An interval has the wrong type.
      ConfigError: An interval is not positive.
    """

    def __init__(
        self,
        time_interval: float | None = None,
        step_interval: int | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.time_interval = _check_seconds("time_interval", time_interval)
        self.step_interval = check_int("step_interval", step_interval, 1, optional=True)
        self._clock = clock
        self._started = False
        self._last_step = 0
        self._last_time = 0.0

    def start(self, step: int = 0, now: float | None = None) -> None:
        """Starts (or restarts) both cadences at `step` and `now`.

        Without it, the first `due` starts the policy at step 0 and its `now`.
        """
        self._started = True
        self._last_step = int(step)
        self._last_time = self._clock() if now is None else float(now)

    def due(self, step: int, now: float | None = None) -> bool:
        """Whether to evict after training step `step` (does not change the policy)."""
        now = self._clock() if now is None else float(now)
        if not self._started:
            self.start(0, now)
        if self.step_interval is not None and _crossed(step, self._last_step, self.step_interval):
            return True
        return self.time_interval is not None and now - self._last_time >= self.time_interval

    def mark_evicted(self, step: int, now: float | None = None) -> None:
        """Records an eviction at `step` and `now`; both cadences restart there."""
        self.start(step, now)
