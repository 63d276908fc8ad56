"""The `npu_bridge` paths Rec SDK programs use, on npu_rec (see docs/porting.md).

Where TensorFlow has no `tf.estimator` (2.16 and later), importing it makes
`tf.estimator` `npu_rec.estimator` (`npu_rec.compat._tf_estimator`).
"""

from npu_rec.compat import _tf_estimator

_tf_estimator.install()
