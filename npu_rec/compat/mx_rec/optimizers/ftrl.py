"""mx_rec.optimizers.ftrl: FTRL-proximal (`npu_rec.optimizers.Ftrl`)."""

from npu_rec.compat.mx_rec.optimizers.base import _BuiltIn
from npu_rec.optimizers import Ftrl

_KWARGS = (
    "learning_rate_power",
    "initial_accumulator_value",
    "l1_regularization_strength",
    "l2_regularization_strength",
    "accum_name",
    "linear_name",
    "l2_shrinkage_regularization_strength",
)


class CustomizedFtrl(_BuiltIn):
    """FTRL-proximal on the looked-up rows (no L2 shrinkage)."""

    def __init__(self, learning_rate, use_locking=False, name="Ftrl", **kwargs):
        unknown = sorted(set(kwargs) - set(_KWARGS))
        if unknown:
            raise TypeError(f"ftrl.create_hash_optimizer got unexpected keywords: {unknown}")
        shrinkage = kwargs.get("l2_shrinkage_regularization_strength", 0.0)
        if shrinkage:
            raise ValueError(
                "npu_rec's Ftrl has no L2 shrinkage. Received: "
                f"l2_shrinkage_regularization_strength={shrinkage}"
            )
        sparse = Ftrl(
            learning_rate,
            learning_rate_power=kwargs.get("learning_rate_power", -0.5),
            initial_accumulator_value=kwargs.get("initial_accumulator_value", 0.1),
            l1=kwargs.get("l1_regularization_strength", 0.0),
            l2=kwargs.get("l2_regularization_strength", 0.0),
            name=name,
        )
        super().__init__(sparse, learning_rate, use_locking, name)


def create_hash_optimizer(learning_rate, use_locking=False, name="Ftrl", **kwargs):
    """A `CustomizedFtrl` (`accum_name`/`linear_name` name nothing on npu_rec)."""
    return CustomizedFtrl(learning_rate, use_locking, name, **kwargs)
