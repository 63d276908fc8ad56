"""`StepConsistency`: checks `npu_rec.init`'s step settings against `fit`'s arguments."""

from __future__ import annotations

import keras

from npu_rec.training._step_rules import check_keras_fit


class StepConsistency(keras.callbacks.Callback):
    """Raises `npu_rec.ConfigError` at `fit` start when `init` and `fit` disagree.

    Rec SDK requires `init(max_steps)` to equal the steps the run trains
    (`epochs * steps_per_epoch`) and `init(save_steps)` to equal the
    checkpoint cadence. `RecModel.fit` adds this callback by itself;
    `online_train` does not (there `max_steps` is the stopping rule).

    Args:
      save_freq: The checkpoint cadence to check against `init(save_steps)`:
        an int (steps), "epoch", or None (no checkpoint callback).
      callback_label: The checkpoint callback's name, shown in messages.

    Attributes:
      resolved: The `npu_rec.ResolvedSteps` of the last `fit` (None before).

    Example:
      >>> npu_rec.init(max_steps=100)
      >>> model.fit(ds, epochs=2, steps_per_epoch=50, callbacks=[StepConsistency()])
    """

    def __init__(
        self, save_freq: int | str | None = None, callback_label: str = "SparseCheckpoint"
    ):
        super().__init__()
        self.save_freq = save_freq
        self.callback_label = callback_label
        self.resolved = None

    def on_train_begin(self, logs=None):
        self.resolved = check_keras_fit(
            epochs=self.params.get("epochs") or 1,
            steps_per_epoch=self.params.get("steps"),
            save_freq=self.save_freq,
            callback_label=self.callback_label,
        )
