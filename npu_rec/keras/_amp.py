"""`amp_level` (MindSpore's mixed-precision levels) mapped onto Keras dtype policies.

| level  | layer compute dtype            | BatchNorm/LayerNorm | loss scaling        |
|--------|--------------------------------|---------------------|---------------------|
| "O0"   | float32                        | float32             | none                |
| "O2"   | float16 (weights float32)      | float32             | dynamic (Keras LSO) |
| "O3"   | float16 (weights float32)      | float16             | none                |
| "auto" | "O2" with a GPU, "O0" on CPU   |                     |                     |

Sparse tables always stay float32 (`SparseEmbedding` outputs float32; the
next layer casts), and the layers producing the model outputs stay float32
(as Keras' mixed-precision guide recommends) so losses and metrics see
float32 predictions.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from npu_rec import _keras_private
from npu_rec._validation import check_choice
from npu_rec.keras._layers import SparseEmbedding

AMP_LEVELS = ("O0", "O2", "O3", "auto")
BOOST_LEVELS = ("O0", "O1", "O2")
_NORMALIZATIONS = (keras.layers.BatchNormalization, keras.layers.LayerNormalization)


def check_level(name: str, value, allowed) -> str:
    """Validates a level string; raises ConfigError naming `name`, the choices and `value`."""
    return check_choice(name, value, allowed)


def resolve_amp_level(level: str) -> str:
    """ "auto" -> "O2" when a GPU is visible, else "O0" (float16 is slow on CPUs)."""
    check_level("amp_level", level, AMP_LEVELS)
    if level != "auto":
        return level
    return "O2" if tf.config.list_physical_devices("GPU") else "O0"


def _output_layers(model) -> set[int]:
    out = set()
    for t in getattr(model, "outputs", None) or []:
        if isinstance(t, keras.KerasTensor):
            out.add(id(_keras_private.producing_layer(t)))
    return out


def set_compute_dtype(
    model: keras.Model, compute_dtype: str, *, keep_normalization_float32: bool = True
) -> None:
    """Sets the dtype policy of every dense layer of `model` (in place).

    Args:
      model: A built or unbuilt Keras model.
      compute_dtype: "float32", "float16" or "bfloat16". Weights stay float32
        (policy "mixed_<dtype>"), so switching back loses nothing.
      keep_normalization_float32: Leave BatchNormalization/LayerNormalization
        in float32 (O2) or cast them too (O3).
    """
    policy = "float32" if compute_dtype == "float32" else f"mixed_{compute_dtype}"
    keep = _output_layers(model)
    for layer in _keras_private.flatten_layers(model, include_self=False):
        if isinstance(layer, (SparseEmbedding, keras.layers.InputLayer, keras.Model)):
            continue
        if id(layer) in keep and compute_dtype != "float32":
            continue
        if keep_normalization_float32 and isinstance(layer, _NORMALIZATIONS):
            continue
        layer.dtype_policy = policy


def apply_amp_level(model: keras.Model, level: str) -> str:
    """Applies a resolved `amp_level` to the layers of `model`; returns the resolved level."""
    level = resolve_amp_level(level)
    if level == "O2":
        set_compute_dtype(model, "float16", keep_normalization_float32=True)
    elif level == "O3":
        set_compute_dtype(model, "float16", keep_normalization_float32=False)
    return level


def wrap_loss_scale(optimizer):
    """Wraps a Keras optimizer in a dynamic `LossScaleOptimizer` (once)."""
    if optimizer is None or isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer
    return keras.optimizers.LossScaleOptimizer(optimizer)
