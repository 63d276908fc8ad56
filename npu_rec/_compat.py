"""Import-time checks of the TensorFlow and Keras versions npu_rec runs on, and the
private TensorFlow names npu_rec uses (fenced here; Keras' are in `_keras_private`).

`TF_PRIVATE` lists each private TensorFlow name used here and why;
tests/test_compat.py checks them against the installed TensorFlow and fails,
naming the version, when one disappears or stops behaving as relied on.
(The multi-worker ones are fenced in `npu_rec.distribute._tf_private`.)
"""

from __future__ import annotations

import os
import re

MIN_TF = (2, 16)
KERAS_MAJOR = 3

_FIX = (
    "npu_rec needs TensorFlow 2.x >= {min_tf} and Keras 3.x. Install the pinned "
    "versions with `pip install -e .` in the npu_rec checkout (or "
    "`pip install 'tensorflow-cpu==2.21.0' 'keras>=3.12,<4'`)."
)


def _parse(version: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", version)
    if not match:
        raise ImportError(f"Cannot parse the version string {version!r}. " + _fix())
    return int(match.group(1)), int(match.group(2))


def _fix() -> str:
    return _FIX.format(min_tf=".".join(map(str, MIN_TF)))


def check_versions(tf_version: str, keras_version: str) -> None:
    """Raises `ImportError` unless the versions are ones npu_rec supports.

    Args:
      tf_version: `tf.__version__`, e.g. "2.21.0".
      keras_version: `keras.__version__`, e.g. "3.12.0".

    Raises:
      ImportError: TensorFlow is not 2.x >= 2.16, or Keras is not 3.x. The
        message names the version found and how to install a supported one.
    """
    tf_major, tf_minor = _parse(tf_version)
    if tf_major != MIN_TF[0] or (tf_major, tf_minor) < MIN_TF:
        raise ImportError(
            f"Found TensorFlow {tf_version}, which npu_rec does not support. " + _fix()
        )
    keras_major, _ = _parse(keras_version)
    if keras_major != KERAS_MAJOR:
        hint = ""
        if os.environ.get("TF_USE_LEGACY_KERAS"):
            hint = (
                " TF_USE_LEGACY_KERAS is set: it must not make `import keras` resolve to tf_keras."
            )
        raise ImportError(
            f"Found Keras {keras_version}, which npu_rec does not support.{hint} " + _fix()
        )


def _installed_version(module: str, distributions: tuple[str, ...]) -> str | None:
    """`module.__version__` when it is imported, else its installed distribution's."""
    import sys
    from importlib import metadata

    loaded = sys.modules.get(module)
    if loaded is not None and isinstance(getattr(loaded, "__version__", None), str):
        return loaded.__version__
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def check_installed_quietly() -> bool:
    """`check_installed` without importing TensorFlow; False when a version is unknown.

    Reads the installed packages' metadata (the modules' own versions when they are
    imported already), so `import npu_rec` stays fast and still fails on versions
    npu_rec does not support.
    """
    tf_version = _installed_version(
        "tensorflow", ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly")
    )
    keras_version = _installed_version("keras", ("keras", "keras-nightly"))
    if tf_version is None or keras_version is None:
        return False
    check_versions(tf_version, keras_version)
    return True


def check_installed() -> None:
    """Checks the TensorFlow and Keras that are installed (see `check_versions`)."""
    import keras
    import tensorflow as tf

    check_versions(tf.__version__, keras.__version__)


# ----------------------------------------------------------------- private APIs fenced here
#: (owner, private name): every private TensorFlow/Keras attribute this module touches.
TF_PRIVATE = (
    # `shown_as_raised`: Keras re-raises a layer's error unchanged when it carries this.
    ("Exception (read by keras.src.utils.traceback_utils)", "_keras_call_info_injected"),
    # `keep_out_of_meta_graphs`: the registry of graph collections' proto functions.
    ("tensorflow.python.framework.ops", "register_proto_function"),
    # `create_v1_slots`: a v1 optimizer's slot creation, outside `apply_gradients`.
    ("tf.compat.v1.train.Optimizer", "_create_slots"),
    # `quiet_retracing`: a `tf.function`'s switch of the "excessive retracing" warning.
    ("tf.function", "_omit_frequent_tracing_warning"),
    # `session_is_closed`: whether a `tf.compat.v1.Session` was closed.
    ("tf.compat.v1.Session", "_closed"),
    # `v1_apply_sparse_rule`: a v1 optimizer's hyperparameter tensors and its per-row rule
    # (what mx_rec programs override in their own optimizer classes).
    ("tf.compat.v1.train.Optimizer", "_prepare"),
    ("tf.compat.v1.train.Optimizer", "_apply_sparse_duplicate_indices"),
    # `rewire_input`: the ps route's batched transfers re-point a receiving op's input
    # once the graph holds every table's lookup (`npu_rec.distribute._ps_transfers`).
    ("tf.Operation", "_update_input"),
    # `in_control_flow`: whether ops built now land inside a v1 `tf.cond` / `tf.while_loop`.
    ("tf.Graph", "_get_control_flow_context"),
)


def session_is_closed(session) -> bool:
    """Whether `session` (a `tf.compat.v1.Session`) has been closed."""
    return bool(session._closed)


def v1_apply_sparse_rule(optimizer, grad, var):
    """Runs the per-row update of a `tf.compat.v1.train.Optimizer` subclass.

    Prepares its hyperparameter tensors (`_prepare`), then applies its
    `_apply_sparse_duplicate_indices(grad, var)` (grad: a `tf.IndexedSlices`
    over the rows of `var`); returns the update op.
    """
    optimizer._prepare()
    return optimizer._apply_sparse_duplicate_indices(grad, var)


def create_v1_slots(optimizer, variables) -> None:
    """Creates the slots of a `tf.compat.v1.train.Optimizer` for `variables` now.

    Other optimizers (Keras 3 ones) create their state themselves: nothing happens.
    """
    import tensorflow as tf

    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        optimizer._create_slots(variables)


def quiet_retracing(function) -> None:
    """Stops `function` (a `tf.function`) from warning about "excessive retracing".

    For functions traced once per object by design (one per table evictor).
    """
    function._omit_frequent_tracing_warning = True


def shown_as_raised(error: Exception) -> Exception:
    """Marks `error`, raised inside a Keras layer's `call`, to reach the user unchanged.

    Keras 3 (`keras/src/utils/traceback_utils.py`, checked on 3.12) re-raises an
    error from `Layer.call` with its message wrapped in terminal bold escapes and the
    call's arguments appended, unless the error carries the attribute below.
    tests/test_messages.py fails if a Keras version stops honouring it.
    """
    error._keras_call_info_injected = True
    return error


def keep_out_of_meta_graphs(collection: str) -> None:
    """Leaves graph collection `collection` (Python objects) out of exported meta graphs.

    TensorFlow serialises every graph collection whenever it writes a meta graph
    (a summary `FileWriter` writes one per graph) and logs a warning for each
    item it cannot convert. A registered `to_proto` that returns None makes it
    skip the items silently (`tensorflow/python/framework/meta_graph.py`,
    `add_collection_def`, checked on 2.21); tests/test_messages.py fails when
    that stops holding.
    """
    from tensorflow.python.framework import ops

    ops.register_proto_function(
        collection, proto_type=None, to_proto=lambda item, export_scope=None: None
    )


def rewire_input(op, index: int, tensor) -> None:
    """Makes input `index` of `op` (a v1 graph's `tf.Operation`) read `tensor` instead.

    Only before any session has run `op`: TensorFlow ignores, and later refuses, a
    change to an op a session has seen.
    """
    op._update_input(index, tensor)


def in_control_flow(graph) -> bool:
    """Whether ops built now in `graph` (a v1 graph) land inside a `tf.cond` or `tf.while_loop`."""
    return graph._get_control_flow_context() is not None
