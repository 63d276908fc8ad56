"""mx_rec.optimizers.adagrad: Adagrad (`npu_rec.optimizers.Adagrad`, no epsilon)."""

from npu_rec.compat.mx_rec.optimizers.base import _BuiltIn
from npu_rec.optimizers import Adagrad


class CustomizedAdagrad(_BuiltIn):
    """`acc += g*g; row -= lr * g / sqrt(acc)` (TF1 Adagrad's rule) on the looked-up rows."""

    def __init__(
        self, learning_rate=0.001, initial_accumulator_value=0.9, use_locking=False, name="Adagrad"
    ):
        sparse = Adagrad(
            learning_rate,
            initial_accumulator_value=initial_accumulator_value,
            epsilon=0.0,
            name=name,
        )
        super().__init__(sparse, learning_rate, use_locking, name)


def create_hash_optimizer(
    learning_rate=0.001, initial_accumulator_value=0.9, use_locking=False, name="Adagrad"
):
    """A `CustomizedAdagrad`."""
    return CustomizedAdagrad(learning_rate, initial_accumulator_value, use_locking, name)
