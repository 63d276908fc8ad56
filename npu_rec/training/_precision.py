"""Accelerated (low-precision first) training: parsing and the switch decision.

npu_bridge's `ExperimentalConfig(accelerate_train_mode="fast|step|0.9")` runs
the first part of training in low precision and the rest in full precision.
This module holds the logic both front ends share: the Estimator's
`TellMeStepOrLossHook` and the Keras `AccelerateTrain` callback ask one
`PrecisionSwitch` which precision each step runs in.

Format: `"<type>|<trigger>[|<ratio>]"`.
- type: `fast` = float16 with dynamic loss scaling, `fast1` = bfloat16.
- trigger `step`: the first `ratio * total_step` steps run in low precision;
  ratio in [0.2, 0.9], default 0.9.
- trigger `loss`: low precision until a step's loss is at or below
  `ratio * final_loss`; ratio in [1.01, 1.5], default 1.05.
"""

from __future__ import annotations

import dataclasses

_TYPES = {"fast": "float16", "fast1": "bfloat16"}
_RATIOS = {"step": (0.2, 0.9, 0.9), "loss": (1.01, 1.5, 1.05)}
# Precision modes with which accelerated training may be combined (npu_bridge's rule).
COMPATIBLE_PRECISION_MODES = (None, "allow_fp32_to_fp16", "must_keep_origin_dtype")
COMPATIBLE_PRECISION_MODES_V2 = (None, "origin")


@dataclasses.dataclass(frozen=True)
class AccelerateMode:
    """A parsed `accelerate_train_mode`.

    Attributes:
      kind: "fast" or "fast1".
      dtype: the low precision, "float16" (`fast`) or "bfloat16" (`fast1`).
      trigger: "step" or "loss".
      ratio: the fraction of steps (step) or the loss factor (loss).
    """

    kind: str
    dtype: str
    trigger: str
    ratio: float

    @property
    def loss_scaling(self) -> bool:
        """float16 needs dynamic loss scaling; bfloat16 has float32's range."""
        return self.dtype == "float16"

    def __str__(self) -> str:
        return f"{self.kind}|{self.trigger}|{self.ratio:g}"


def parse_accelerate_train_mode(value: str) -> AccelerateMode:
    """Parses and validates `accelerate_train_mode`.

    Args:
      value: e.g. "fast|step|0.9", "fast1|loss|1.05", "fast|step".

    Returns:
      The `AccelerateMode`.

    Raises:
      TypeError: `value` is not a string.
      ValueError: wrong number of fields, unknown type or trigger, a ratio
        that is not a number or is out of its range. The message names the
        field and the value received.
    """
    if not isinstance(value, str):
        raise TypeError(
            f"`accelerate_train_mode` must be a string like 'fast|step|0.9'. "
            f"Received: accelerate_train_mode={value!r}"
        )
    fields = value.split("|")
    if len(fields) not in (2, 3):
        raise ValueError(
            "`accelerate_train_mode` must have 2 or 3 '|'-separated fields "
            f"(type|trigger[|ratio]). Received: accelerate_train_mode={value!r}"
        )
    kind, trigger = fields[0].strip(), fields[1].strip()
    if kind not in _TYPES:
        raise ValueError(
            f"The type field of `accelerate_train_mode` must be one of {sorted(_TYPES)}. "
            f"Received: {kind!r} in accelerate_train_mode={value!r}"
        )
    if trigger not in _RATIOS:
        raise ValueError(
            f"The trigger field of `accelerate_train_mode` must be one of {sorted(_RATIOS)}. "
            f"Received: {trigger!r} in accelerate_train_mode={value!r}"
        )
    low, high, default = _RATIOS[trigger]
    ratio = default
    if len(fields) == 3:
        try:
            ratio = float(fields[2])
        except ValueError:
            raise ValueError(
                "The ratio field of `accelerate_train_mode` must be a number. "
                f"Received: {fields[2]!r} in accelerate_train_mode={value!r}"
            ) from None
        if not low <= ratio <= high:
            raise ValueError(
                f"The ratio field of `accelerate_train_mode` must be in [{low}, {high}] for "
                f"the {trigger!r} trigger. Received: {fields[2]!r} in "
                f"accelerate_train_mode={value!r}"
            )
    return AccelerateMode(kind=kind, dtype=_TYPES[kind], trigger=trigger, ratio=ratio)


def check_precision_compatibility(
    mode: AccelerateMode, precision_mode=None, precision_mode_v2=None
):
    """Raises `ValueError` when accelerated training conflicts with a precision mode.

    npu_bridge allows it only with `precision_mode` in (allow_fp32_to_fp16,
    must_keep_origin_dtype, unset) or `precision_mode_v2` in (origin, unset).
    """
    if precision_mode not in COMPATIBLE_PRECISION_MODES:
        raise ValueError(
            f"`accelerate_train_mode`={str(mode)!r} can only be combined with `precision_mode` "
            f"allow_fp32_to_fp16, must_keep_origin_dtype or unset. "
            f"Received: precision_mode={precision_mode!r}"
        )
    if precision_mode_v2 not in COMPATIBLE_PRECISION_MODES_V2:
        raise ValueError(
            f"`accelerate_train_mode`={str(mode)!r} can only be combined with "
            f"`precision_mode_v2` origin or unset. Received: precision_mode_v2={precision_mode_v2!r}"
        )


class PrecisionSwitch:
    """Decides, step by step, whether training runs in low or full precision.

    Training starts in low precision and switches once, for good, to full
    precision:
    - trigger "step": at the first step `s` (0-based, the global step before it
      runs) with `s >= ratio * total_step`, or `s + iterations_per_loop >=
      total_step` (the last loop always runs in full precision);
    - trigger "loss": after the first step whose loss `l` has
      `0 < l <= ratio * final_loss`; the steps after it run in full precision.

    Args:
      mode: an `AccelerateMode` (or its string form).
      total_step: the number of training steps (step trigger; >= 1).
      final_loss: the target loss (loss trigger; > 0).
      iterations_per_loop: steps per loop (>= 1).

    Example:
      >>> switch = PrecisionSwitch("fast1|step|0.5", total_step=100)
      >>> [switch.is_low_precision(s) for s in (0, 49, 50, 99)]
      [True, True, False, False]
    """

    def __init__(self, mode, *, total_step=None, final_loss=None, iterations_per_loop: int = 1):
        if isinstance(mode, str):
            mode = parse_accelerate_train_mode(mode)
        self.mode = mode
        if (
            isinstance(iterations_per_loop, bool)
            or not isinstance(iterations_per_loop, int)
            or (iterations_per_loop < 1)
        ):
            raise ValueError(
                "`iterations_per_loop` must be an integer >= 1. "
                f"Received: iterations_per_loop={iterations_per_loop!r}"
            )
        if mode.trigger == "step":
            if isinstance(total_step, bool) or not isinstance(total_step, int) or total_step < 1:
                raise ValueError(
                    f"The step trigger of accelerate_train_mode={str(mode)!r} needs "
                    f"`total_step`, an integer >= 1. Received: total_step={total_step!r}"
                )
        else:
            if (
                isinstance(final_loss, bool)
                or not isinstance(final_loss, (int, float))
                or not (final_loss > 0)
            ):
                raise ValueError(
                    f"The loss trigger of accelerate_train_mode={str(mode)!r} needs "
                    f"`final_loss`, a number > 0. Received: final_loss={final_loss!r}"
                )
        self.total_step = total_step
        self.final_loss = final_loss
        self.iterations_per_loop = iterations_per_loop
        self.switched_at: int | None = None  # the first step run in full precision

    @property
    def low_dtype(self) -> str:
        return self.mode.dtype

    @property
    def target_loss(self) -> float | None:
        return None if self.final_loss is None else self.mode.ratio * self.final_loss

    @property
    def switched(self) -> bool:
        return self.switched_at is not None

    def is_low_precision(self, step: int) -> bool:
        """Whether step `step` (the global step before it runs) is low precision.

        With the step trigger this also records the switch at the first full
        precision step.
        """
        if self.switched_at is not None:
            return step < self.switched_at
        if self.mode.trigger == "step" and (
            step >= self.mode.ratio * self.total_step
            or step + self.iterations_per_loop >= self.total_step
        ):
            self.switched_at = step
            return False
        return True

    def observe_loss(self, step: int, loss: float) -> None:
        """Reports the loss of step `step`; the loss trigger switches after it."""
        if self.switched_at is None and self.mode.trigger == "loss":
            if 0 < loss <= self.target_loss:
                self.switched_at = step + 1

    def state(self) -> dict:
        """What a checkpoint must keep so a resumed run stays switched."""
        return {"switched_at": self.switched_at}

    def restore(self, state: dict) -> None:
        self.switched_at = state.get("switched_at")
