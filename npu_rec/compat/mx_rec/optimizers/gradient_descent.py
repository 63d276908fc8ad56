"""mx_rec.optimizers.gradient_descent: plain SGD (`npu_rec.optimizers.SGD`)."""

from npu_rec.compat.mx_rec.optimizers.base import _BuiltIn
from npu_rec.optimizers import SGD


class CustomizedGradientDescent(_BuiltIn):
    """`row -= learning_rate * (grad + weight_decay * row)` on the looked-up rows."""

    def __init__(self, learning_rate, use_locking=False, name="GradientDescent", weight_decay=None):
        self.weight_decay = weight_decay
        sparse = SGD(learning_rate, name=name, weight_decay=weight_decay or 0.0)
        super().__init__(sparse, learning_rate, use_locking, name)


def create_hash_optimizer(
    learning_rate,
    use_locking=False,
    name="GradientDescent",
    use_fusion_optim=False,
    weight_decay=None,
):
    """A `CustomizedGradientDescent` (`use_fusion_optim` is unused)."""
    del use_fusion_optim
    return CustomizedGradientDescent(learning_rate, use_locking, name, weight_decay)
