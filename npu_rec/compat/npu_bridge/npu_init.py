"""`from npu_bridge.npu_init import *`: what TF 1.15 + npu_bridge programs expect.

The star import gives `tf` as `tf.compat.v1` with TensorFlow 2 behaviour off
(`disable_v2_behavior()` runs on import, as a TF 1.15 program expects graphs,
sessions and `tf.placeholder`), plus npu_bridge's `util`, `npu_plugin`,
`hccl_ops`, `npu_ops`, `npu_hooks_append`, `NPUEstimator`, `NPURunConfig`,
`NPUEstimatorSpec`, `NPUCheckpointSaverHook` and `ExperimentalConfig`.
Importing it also gives `tf.compat.v1` the few `tf.contrib` names TF 1.15
model code uses (`npu_rec.compat._tf_contrib`: `tf.contrib.layers`'
regularizers).
"""

import tensorflow as _tf

from npu_rec.compat import _tf_contrib
from npu_rec.compat.npu_bridge import npu_plugin, util
from npu_rec.compat.npu_bridge.estimator import npu_ops
from npu_rec.compat.npu_bridge.estimator.npu.npu_config import (
    DumpConfig,
    ExperimentalConfig,
    NPURunConfig,
)
from npu_rec.compat.npu_bridge.estimator.npu.npu_estimator import NPUEstimator, NPUEstimatorSpec
from npu_rec.compat.npu_bridge.estimator.npu.npu_hook import NPUCheckpointSaverHook
from npu_rec.compat.npu_bridge.hccl import hccl_ops
from npu_rec.compat.npu_bridge.util import npu_hooks_append

_tf.compat.v1.disable_v2_behavior()
_tf_contrib.install()
tf = _tf.compat.v1

__all__ = [
    "DumpConfig",
    "ExperimentalConfig",
    "NPUCheckpointSaverHook",
    "NPUEstimator",
    "NPUEstimatorSpec",
    "NPURunConfig",
    "hccl_ops",
    "npu_hooks_append",
    "npu_ops",
    "npu_plugin",
    "tf",
    "util",
]
