"""`KeyMap`: TF's `DenseHashTable` API over npu_rec's own map kernel (`NpuRecKeyMap`).

`NpuRecKeyMap` (`key_map.cc`) is an int64 -> int64 open-addressing map with
one array of 12-byte {int64 key, int32 value} buckets (values are rows or
record locations; a value outside int32 is refused), behind TensorFlow's lookup
interface: the stock lookup ops (find, insert, remove, size, export, import)
work on it unchanged, so this class only replaces `_create_resource` and
keeps `DenseHashTable`'s methods and checkpoint saveable (the same `-keys` /
`-values` tensors: a checkpoint of either map restores into the other). The
table kernels probe it directly (`NpuRecTrainLookup`), without the per-call
tensors and the second cache miss of `DenseHashTable`'s split key and value
arrays. A SavedModel holding it needs the op library: serving exports use the
stock map (`_build.forced(False)`).
"""

from __future__ import annotations

import contextlib
import threading

import tensorflow as tf

from npu_rec._kernels import _build

_LOCAL = threading.local()

#: The private members of TensorFlow's `DenseHashTable` that `KeyMap` overrides
#: (`_create_resource`) or reads to create its resource with the same arguments
#: (tests/test_keras_private.py checks them on the installed TensorFlow).
TF_PRIVATE = (
    "_create_resource",
    "_empty_key",
    "_deleted_key",
    "_shared_name",
    "_checkpoint",
    "_value_dtype",
    "_value_shape",
    "_initial_num_buckets",
    "_name",
    "_table_name",
)


def wanted() -> bool:
    """True unless inside `dense_maps()`: new key indexes on the kernel path use `KeyMap`."""
    return not getattr(_LOCAL, "dense", False)


@contextlib.contextmanager
def dense_maps():
    """Within the block (this thread), new key indexes keep `DenseHashTable`.

    For benchmarks comparing the kernel path with and without the owned map
    in one run (`benchmarks/step_trace.py --paths kernels_dense`).
    """
    old = getattr(_LOCAL, "dense", False)
    _LOCAL.dense = True
    try:
        yield
    finally:
        _LOCAL.dense = old


class KeyMap(tf.lookup.experimental.DenseHashTable):
    """`tf.lookup.experimental.DenseHashTable` (int64 -> int64) on `NpuRecKeyMap`.

    Takes `DenseHashTable`'s arguments (`experimental_is_anonymous` is not
    supported). Needs the kernels loaded (`_build.library()` not None).

    Args:
      key_dtype, value_dtype: `tf.int64` both.
      default_value: int64 scalar returned for absent keys.
      empty_key, deleted_key: the two reserved key values (bucket markers).
      initial_num_buckets: at least 8; rounded up to a power of two when
        `growth_factor` is 2.
      name: the op name (and, in graphs, the shared resource name).
      checkpoint: whether the contents are saved in checkpoints.
      max_load_factor: the array grows when the live keys would pass this
        share of its buckets, in (0, 1).
      growth_factor: the array grows by this factor, in (1, 4]: 2 keeps
        power-of-two sizes; another factor sizes it exactly (at least
        `keys / max_load_factor` buckets), so it holds at most
        `12 * growth_factor / max_load_factor` bytes per key.

    Raises:
      ValueError: a dtype other than int64.
    """

    #: Bytes of one bucket ({int64 key, int32 value}).
    BUCKET_BYTES = 12

    def __init__(
        self,
        key_dtype,
        value_dtype,
        default_value,
        empty_key,
        deleted_key,
        initial_num_buckets=None,
        name="NpuRecKeyMap",
        checkpoint=True,
        max_load_factor=0.8,
        growth_factor=2.0,
    ):
        if tf.as_dtype(key_dtype) != tf.int64 or tf.as_dtype(value_dtype) != tf.int64:
            raise ValueError(
                "KeyMap maps int64 keys to int64 values. "
                f"Received: key_dtype={key_dtype!r}, value_dtype={value_dtype!r}"
            )
        if not 0.0 < max_load_factor < 1.0 or not 1.0 < growth_factor <= 4.0:
            raise ValueError(
                "KeyMap needs 0 < max_load_factor < 1 and 1 < growth_factor <= 4. "
                f"Received: max_load_factor={max_load_factor!r}, growth_factor={growth_factor!r}"
            )
        self.max_load_factor = float(max_load_factor)
        self.growth_factor = float(growth_factor)
        super().__init__(
            key_dtype,
            value_dtype,
            default_value=default_value,
            empty_key=empty_key,
            deleted_key=deleted_key,
            initial_num_buckets=initial_num_buckets,
            name=name,
            checkpoint=checkpoint,
        )

    def _create_resource(self):
        handle = _build.library().npu_rec_key_map(
            empty_key=tf.constant(self._empty_key, tf.int64, name="empty_key"),
            deleted_key=tf.constant(self._deleted_key, tf.int64, name="deleted_key"),
            shared_name=self._shared_name,
            use_node_name_sharing=self._checkpoint and self._shared_name is None,
            value_dtype=self._value_dtype,
            value_shape=self._value_shape,
            initial_num_buckets=self._initial_num_buckets or 131072,
            max_load_factor=self.max_load_factor,
            growth_factor=self.growth_factor,
            name=self._name,
        )
        self._table_name = None if tf.executing_eagerly() else handle.op.name.split("/")[-1]
        return handle

    def reserve(self, keys) -> tf.Operation:
        """Grows the array once so that `keys` keys in all fit (it never shrinks)."""
        return _build.library().npu_rec_key_map_reserve(
            table_handle=self.resource_handle, keys=tf.cast(keys, tf.int64)
        )

    def counts(self) -> tf.Tensor:
        """int64 [3]: buckets, live keys and tombstones of the array."""
        return _build.library().npu_rec_key_map_counts(table_handle=self.resource_handle)
