"""mx_rec.optimizers.adagrad_by_addr: Adagrad for dynamic-expansion tables."""

from npu_rec.compat.mx_rec.optimizers.adagrad import CustomizedAdagrad


class CustomizedAdagradByAddress(CustomizedAdagrad):
    """Adagrad; takes rows (`ASCEND_SPARSE_LOOKUP_ID_OFFSET`) or unique-row tensors."""


def create_hash_optimizer_by_address(
    learning_rate=0.001, initial_accumulator_value=0.9, name="Adagrad"
):
    """A `CustomizedAdagradByAddress`."""
    return CustomizedAdagradByAddress(learning_rate, initial_accumulator_value, False, name)
