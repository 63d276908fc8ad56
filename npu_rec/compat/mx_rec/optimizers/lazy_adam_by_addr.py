"""mx_rec.optimizers.lazy_adam_by_addr: lazy Adam for dynamic-expansion tables."""

from npu_rec.compat.mx_rec.optimizers.lazy_adam import CustomizedLazyAdam


class CustomizedLazyAdamByAddress(CustomizedLazyAdam):
    """Lazy Adam; takes rows (`ASCEND_SPARSE_LOOKUP_ID_OFFSET`) or unique-row tensors."""


def create_hash_optimizer_by_address(
    learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, name="LazyAdamByAddress"
):
    """A `CustomizedLazyAdamByAddress`."""
    return CustomizedLazyAdamByAddress(learning_rate, beta1, beta2, epsilon, name)
