"""npu_bridge.estimator.npu.npu_hook: `NPUCheckpointSaverHook` (TF's saver hook)."""

import tensorflow as tf

NPUCheckpointSaverHook = tf.compat.v1.train.CheckpointSaverHook

__all__ = ["NPUCheckpointSaverHook"]
