"""Rec SDK's `mx_rec` package on npu_rec (see `npu_rec.compat` and docs/porting.md).

Importing it does what importing mx_rec does to TensorFlow, for npu_rec's tables:
it records each `tf.compat.v1.Session` made afterwards, so that a table's
`size()` and `capacity()` read a graph's tables without a session argument
(`_sessions`), and it makes `tf.compat.v1.train.Saver` save and restore the
sparse tables beside the dense model (`_saver`), and it gives `tf.data.Dataset`
mx_rec's `eos_map` (`_dataset`; one rank: the dataset as it is). Where TensorFlow has no
`tf.estimator` (2.16 and later), it becomes `npu_rec.estimator`
(`npu_rec.compat._tf_estimator`).
"""

from npu_rec.compat import _tf_estimator
from npu_rec.compat.mx_rec import _dataset, _saver, _sessions

_tf_estimator.install()
_sessions.track()
_saver.patch()
_dataset.patch()
