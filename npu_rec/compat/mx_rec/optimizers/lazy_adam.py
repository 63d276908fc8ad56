"""mx_rec.optimizers.lazy_adam: lazy Adam (`npu_rec.optimizers.Adam`)."""

from npu_rec.compat.mx_rec.optimizers.base import _BuiltIn
from npu_rec.optimizers import Adam


class CustomizedLazyAdam(_BuiltIn):
    """Lazy Adam: only the looked-up rows and their moments move."""

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, name="LazyAdam"):
        sparse = Adam(learning_rate, beta_1=beta1, beta_2=beta2, epsilon=epsilon, name=name)
        super().__init__(sparse, learning_rate, False, name)


def create_hash_optimizer(
    learning_rate=0.001,
    beta1=0.9,
    beta2=0.999,
    epsilon=1e-8,
    name="LazyAdam",
    use_fusion_optim=False,
):
    """A `CustomizedLazyAdam` (`use_fusion_optim`, an NPU operator choice, is unused)."""
    del use_fusion_optim
    return CustomizedLazyAdam(learning_rate, beta1, beta2, epsilon, name)
