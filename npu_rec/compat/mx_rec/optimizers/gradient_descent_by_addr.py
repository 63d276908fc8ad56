"""mx_rec.optimizers.gradient_descent_by_addr: SGD with weight decay, by address."""

from npu_rec.compat.mx_rec.optimizers.gradient_descent import CustomizedGradientDescent


class CustomizedGradientDescentByAddr(CustomizedGradientDescent):
    """SGD; takes rows (`ASCEND_SPARSE_LOOKUP_ID_OFFSET`) or unique-row tensors."""


def create_hash_optimizer_by_addr(
    learning_rate, weight_decay=0.0001, use_locking=False, name="GradientDescentByAddr"
):
    """A `CustomizedGradientDescentByAddr` (weight decay 1e-4 by default, as mx_rec's)."""
    return CustomizedGradientDescentByAddr(learning_rate, use_locking, name, weight_decay)
