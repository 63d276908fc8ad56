"""`AccelerateTrain`: low precision first, then one switch to full precision."""

from __future__ import annotations

import keras

from npu_rec import _log as logging
from npu_rec._rec_config import get_config
from npu_rec.keras import _amp
from npu_rec.keras.callbacks._common import global_step
from npu_rec.training._precision import PrecisionSwitch, parse_accelerate_train_mode


class AccelerateTrain(keras.callbacks.Callback):
    """npu_bridge's `accelerate_train_mode` for `fit`: low precision, then float32.

    The shared `PrecisionSwitch` decides the precision of every step. Low
    precision is `fast` = float16 compute with dynamic loss scaling (the
    compiled optimizer is wrapped in a `keras.optimizers.LossScaleOptimizer`;
    `RecModel` unscales the table gradients by the same factor) or `fast1` =
    bfloat16. The switch changes the dense layers' dtype policies to float32
    and retraces the train function; weights, optimizer slots and tables are
    the same objects before and after, so no state is lost. Tables are
    float32 throughout.

    Args:
      accelerate_train_mode: e.g. "fast|step|0.9" or "fast1|loss|1.05".
      total_step: Step trigger: the run's total steps; default `init(max_steps)`
        if set, else `epochs * steps_per_epoch` of the `fit` call.
      final_loss: Loss trigger: the target loss (> 0). The loss checked is
        the `loss` of the batch logs (Keras' running mean over the epoch).

    Attributes:
      precision_log: One `(global_step, dtype)` per training call (dtype
        "float16", "bfloat16" or "float32"), in order.
      switch: The `PrecisionSwitch` (its `switched_at` is the first full step).

    Example:
      >>> model.fit(ds, epochs=1, steps_per_epoch=100,
      ...           callbacks=[AccelerateTrain("fast1|step|0.5")])
    """

    def __init__(
        self,
        accelerate_train_mode: str,
        *,
        total_step: int | None = None,
        final_loss: float | None = None,
    ):
        super().__init__()
        self.mode = parse_accelerate_train_mode(accelerate_train_mode)
        self.total_step = total_step
        self.final_loss = final_loss
        self.switch: PrecisionSwitch | None = None
        self.precision_log: list[tuple[int, str]] = []
        self._low = None

    def on_train_begin(self, logs=None):
        total = self.total_step
        if total is None and self.mode.trigger == "step":
            max_steps = get_config().max_steps
            steps, epochs = self.params.get("steps"), self.params.get("epochs")
            total = max_steps if max_steps > 0 else (steps * epochs if steps else None)
        spe = getattr(self.model, "steps_per_execution", 1) or 1
        if self.switch is None or self.switch.total_step != total:
            state = self.switch.state() if self.switch is not None else None
            self.switch = PrecisionSwitch(
                self.mode,
                total_step=total,
                final_loss=self.final_loss,
                iterations_per_loop=int(spe),
            )
            if state:
                self.switch.restore(state)
        if self.mode.loss_scaling and not isinstance(
            self.model.optimizer, keras.optimizers.LossScaleOptimizer
        ):
            self.model.optimizer = _amp.wrap_loss_scale(self.model.optimizer)
            if self.model.built:  # now, in the strategy's scope: not inside the traced step
                with self.model.distribute_strategy.scope():
                    self.model.optimizer.build(self.model.trainable_variables)
            self.model.make_train_function(force=True)
        self._low = None

    def on_train_batch_begin(self, batch, logs=None):
        step = global_step(self.model)
        low = self.switch.is_low_precision(step)
        if low != self._low:
            _amp.set_compute_dtype(
                self.model, self.mode.dtype if low else "float32", keep_normalization_float32=True
            )
            self.model.make_train_function(force=True)
            if self._low is not None:
                logging.info("npu_rec: switched to full precision at step %d", step)
            self._low = low
        self.precision_log.append((step, self.mode.dtype if low else "float32"))

    def on_train_batch_end(self, batch, logs=None):
        if self.mode.trigger == "loss" and logs and "loss" in logs:
            self.switch.observe_loss(global_step(self.model) - 1, float(logs["loss"]))

    @property
    def low_precision_steps(self) -> list[int]:
        """1 for each training call run in low precision, 0 in full precision."""
        return [int(dtype != "float32") for _, dtype in self.precision_log]
