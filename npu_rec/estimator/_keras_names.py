"""The same Keras 3 layer names in every graph the Estimator builds.

Keras 3 names unnamed layers (and metrics, seed generators, models) from one
per-thread counter: the first `Dense` of the process is `dense`, the next
`dense_1`, and so on, whatever graph they are built in. `tf.keras` 2 kept that
counter per graph, so a `model_fn` built its layers under the same names in
each fresh graph and the variables matched the checkpoint (`dense/kernel`).
Under Keras 3 the evaluation graph built after training would ask the
checkpoint for `dense_2/kernel`. `fresh_layer_names()` gives each `model_fn`
call a fresh counter and puts the caller's back afterwards, so code outside
the Estimator sees Keras number its layers as it did before.

The counter lives in Keras' private `keras.src.backend.common.global_state`
(attribute `object_name_uids`, read by `keras.src.utils.naming`); this module
is the one place npu_rec uses it, imported through the fence of private Keras
names `npu_rec._keras_private` (`tests/test_keras_private.py` and
`tests/estimator/test_keras_layers.py` name the Keras version if it moves).
"""

from __future__ import annotations

import collections
import contextlib

import keras

from npu_rec import _log as logging
from npu_rec._keras_private import global_state as _global_state
from npu_rec._keras_private import has_global_state

#: The global-state attribute holding Keras' name counters.
UIDS_ATTRIBUTE = "object_name_uids"
_warned: list[bool] = []


def available() -> bool:
    """Whether this Keras exposes the name counter where npu_rec expects it."""
    return has_global_state()


@contextlib.contextmanager
def fresh_layer_names():
    """Inside: Keras names layers as in a fresh process (`dense`, `dense_1`, ...)."""
    if not available():
        if not _warned:
            _warned.append(True)
            logging.warning(
                "npu_rec: Keras %s has no keras.src.backend.common.global_state; unnamed "
                "Keras layers in a model_fn get new names in each graph the Estimator "
                "builds (name them, or use a supported Keras).",
                keras.__version__,
            )
        yield
        return
    saved = _global_state.get_global_attribute(UIDS_ATTRIBUTE)
    _global_state.set_global_attribute(UIDS_ATTRIBUTE, collections.defaultdict(int))
    try:
        yield
    finally:
        _global_state.set_global_attribute(UIDS_ATTRIBUTE, saved)
