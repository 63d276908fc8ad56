"""`SparseEmbedding`: a Keras 3 layer over an npu_rec `SparseTable`.

The table is not a Keras weight: it is trained by its own sparse optimizer
from `RecModel.train_step` (which records the layer's lookups), saved by
`save_own_variables` into `.keras` files, and frozen into static lookups by
`npu_rec.keras.export_for_serving`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from npu_rec import _keras_private, optimizers
from npu_rec._compat import shown_as_raised
from npu_rec._validation import check_int
from npu_rec.keras import _follow
from npu_rec.table import _fallback, _lookup
from npu_rec.table import _registry as _table_registry
from npu_rec.table._base import SparseTable
from npu_rec.table._config import TableConfig
from npu_rec.table._create import create_table
from npu_rec.table._key_pipeline import PreparedIds
from npu_rec.table._rounding import check_value_dtype

#: `create_table` arguments a layer that creates its table accepts: every field of the
#: table's config but its name and dim (derived, so a new table setting reaches the layer).
_TABLE_KWARGS = tuple(
    f.name for f in dataclasses.fields(TableConfig) if f.name not in ("name", "dim")
)
_LAYER_KWARGS = ("name", "trainable", "dtype")
_STATE_PREFIX = "table__"


class TableNotTrainedError(RuntimeError):
    """A `SparseEmbedding` was run in training mode outside `RecModel`'s train step."""


def _serialize_optimizer(opt) -> dict | None:
    if opt is None or _follow.follows_compiled(opt):  # follows the compile again when loaded
        return None
    return {"class_name": type(opt).__name__, "config": opt.get_config()}


def _deserialize_optimizer(value):
    if value is None or isinstance(value, optimizers.SparseOptimizer):
        return value
    cls = getattr(optimizers, value["class_name"], None)
    if cls is None:
        raise ValueError(
            f"Unknown npu_rec sparse optimizer {value['class_name']!r} in the "
            f"layer config. Received: optimizer={value!r}"
        )
    return cls(**value["config"])


def _serialize_initializer(init, layer_name: str):
    if init is None:
        return None
    if isinstance(init, keras.initializers.Initializer):
        return keras.initializers.serialize(init)
    raise ValueError(
        f"SparseEmbedding {layer_name!r} cannot serialise its table initializer: only None "
        f"and keras.initializers.Initializer objects can be saved. Received: initializer={init!r}"
    )


def _deserialize_initializer(value):
    if value is None or callable(value):
        return value
    return keras.initializers.deserialize(value)


@keras.saving.register_keras_serializable(package="npu_rec")
class SparseEmbedding(keras.layers.Layer):
    """Embeds raw integer ids through an npu_rec sparse table.

    Inputs are ids of any shape (int32/int64, raw 64-bit values, no
    vocabulary), a `tf.RaggedTensor` or a rank-2 `tf.SparseTensor` for
    multi-valued features. With `combiner` the last (ragged) axis is reduced.
    Every id value is looked up (-1 included); the fixed-shape batches of
    `npu_rec.data.as_dataset(use_dynamic=False)` are `tf.SparseTensor`s
    [batch, pad_length] (`keras.Input(shape=(pad_length,), dtype="int64",
    sparse=True)`) whose absent entries are the padding.

    In training mode (`training=True`) each lookup counts the ids, admits new
    keys (see `access_threshold`) and is recorded, so that `RecModel.train_step`
    applies the table's sparse optimizer to the rows of this batch only.
    Running it in training mode anywhere else raises `TableNotTrainedError`:
    a plain `keras.Model` would otherwise train silently without its tables.

    Args:
      table_or_name: An existing `npu_rec.SparseTable`, or the name of the
        table to create in `build()` (unique in the program).
      dim: Embedding width; required with a name, optional (checked) with a table.
      combiner: None, "sum", "mean" or "sqrtn".
      **table_kwargs: `npu_rec.create_table` arguments (`optimizer`,
        `initializer`, `capacity`, `access_threshold`, `eviction_threshold`,
        `key_dtype`, `dynamic_expansion`, `max_pending_keys`, `num_shards`,
        `value_dtype` (the rows' storage dtype; the layer still returns float32),
        `memory_rows` and `ssd_path` (a tiered table, also under a multi-worker
        strategy): every field of `npu_rec.TableConfig` but `name` and `dim`) when a name
        is given, plus the Keras layer arguments `name` and `trainable`.

    Call args:
      inputs: int ids [...] (dense), ragged [batch, (k)] or sparse [batch, k].
      timestamps: Optional int64 seconds per id or per example (eviction clock).
      training: Training mode (count, admit, record for the sparse update).

    Returns:
      float32 [..., dim] without combiner; float32 [batch, dim] with one
      (dense ids [batch, k] reduce over k; rank-1 ids [batch] are bags of one
      id). The static shape is declared, also inside `fit` on ragged ids.

    Example:
      >>> ids = keras.Input(shape=(), dtype="int64")
      >>> emb = SparseEmbedding("user", 8, optimizer=npu_rec.optimizers.Adagrad(0.05))(ids)
    """

    def __init__(
        self, table_or_name, dim: int | None = None, *, combiner: str | None = None, **table_kwargs
    ):
        layer_kwargs = {k: table_kwargs.pop(k) for k in _LAYER_KWARGS if k in table_kwargs}
        unknown = sorted(set(table_kwargs) - set(_TABLE_KWARGS))
        if unknown:
            raise TypeError(
                f"SparseEmbedding got unknown arguments {unknown}; table arguments "
                f"are {list(_TABLE_KWARGS)}. Received: {unknown}"
            )
        if combiner not in (None, "sum", "mean", "sqrtn"):
            raise ValueError(
                "`combiner` must be None, 'sum', 'mean' or 'sqrtn'. "
                f"Received: combiner={combiner!r}"
            )
        if isinstance(table_or_name, SparseTable):
            table = table_or_name
            if table_kwargs:
                raise ValueError(
                    "Table arguments only apply when SparseEmbedding creates the "
                    f"table from a name. Received: {sorted(table_kwargs)} with "
                    f"table={table.name!r}"
                )
            if dim is not None and dim != table.dim:
                raise ValueError(
                    f"`dim` must match the table's dim {table.dim}. Received: dim={dim!r}"
                )
            dim = table.dim
            table_kwargs = {k: getattr(table.config, k) for k in _TABLE_KWARGS}
            table_name = table.name
        elif isinstance(table_or_name, str) and table_or_name:
            table = None
            table_name = table_or_name
            dim = check_int(
                "dim",
                dim,
                1,
                None,
                rule=f"an integer >= 1 when SparseEmbedding creates table {table_name!r}",
            )
        else:
            raise TypeError(
                "`table_or_name` must be an npu_rec.SparseTable or a non-empty "
                f"table name. Received: table_or_name={table_or_name!r}"
            )
        layer_kwargs.setdefault("name", f"{table_name}_embedding")
        layer_kwargs.setdefault("dtype", "float32")
        super().__init__(**layer_kwargs)
        self.table_name = table_name
        self.dim = dim
        self.combiner = combiner
        self._table_kwargs = table_kwargs
        self._table = table
        self._replace_registered = False
        # In an export: (keys -> rows StaticHashTable, rows, fallback rows or None).
        self._serving = None

    @property
    def table(self) -> SparseTable:
        """The `npu_rec.SparseTable` (created on first use when built from a name)."""
        if self._table is None:
            self._create_table()
        return self._table

    @property
    def table_created(self) -> bool:
        """True once the table exists (a layer built from a name creates it in `build`)."""
        return self._table is not None

    @property
    def given_optimizer(self):
        """The `optimizer=` this layer was given (None: it follows the compiled optimizer)."""
        return self._table_kwargs.get("optimizer")

    def _create_table(self) -> None:
        kwargs = dict(self._table_kwargs)
        kwargs["key_dtype"] = tf.as_dtype(kwargs.get("key_dtype") or tf.int64)
        if self._replace_registered and _table_registry.get(self.table_name) is not None:
            # A loaded or cloned model takes over the name; the earlier table keeps
            # working for its own model but is no longer registered.
            _table_registry.unregister(self.table_name)
        self._table = create_table(self.table_name, self.dim, **kwargs)

    def build(self, input_shape=None):
        if self._table is None:
            self._create_table()
        self.built = True

    def call(self, inputs, timestamps=None, training=None):
        if self._serving is not None:
            return self._serve(inputs)
        training = bool(training)
        if training and not _lookup.recording():
            raise shown_as_raised(
                TableNotTrainedError(
                    f"SparseEmbedding {self.name!r} (table {self.table_name!r}) ran with "
                    "training=True outside npu_rec.keras.RecModel's train step, so its table "
                    "would not be trained. Build the model as npu_rec.keras.RecModel(inputs, "
                    "outputs) (or RecModel(network=...)) instead of keras.Model, or record the "
                    "lookups yourself with npu_rec.record_lookups(tape)."
                )
            )
        inputs = self._bags(inputs)
        out = _lookup.sparse_lookup(
            self.table, inputs, combiner=self.combiner, timestamps=timestamps, is_training=training
        )
        return self._with_static_shape(out, inputs)

    def _bags(self, inputs):
        """With a combiner, rank-1 ids [batch] are bags of one id each: [batch, 1]."""
        if self.combiner is not None and isinstance(inputs, tf.Tensor) and inputs.shape.rank == 1:
            return inputs[:, None]
        return inputs

    def _with_static_shape(self, out, inputs):
        """Declares a dense output's static shape, as `compute_output_shape` gives it.

        The lookup reshapes through dynamic shapes: without this, a combined
        output traced from ragged ids has an unknown shape inside `fit`, and a
        `Dense` right after the layer cannot build.
        """
        shape = _static_shape(inputs)
        if isinstance(out, tf.Tensor) and shape is not None:
            out.set_shape(self.compute_output_shape(shape))
        return out

    def _serve(self, inputs):
        index, values, fallback = self._serving
        inputs = self._bags(inputs)
        flat = _flat_int64(inputs)
        rows = index.lookup(flat)
        emb = tf.gather(values, tf.maximum(rows, 0)) * tf.cast(rows >= 0, tf.float32)[:, None]
        if fallback is not None:  # not_admitted="hashed": ids without a row read their bucket
            buckets = _fallback.bucket_of(flat, self.table.config.fallback_buckets)
            emb = tf.where((rows < 0)[:, None], tf.gather(fallback, buckets), emb)
        out = _lookup._shape_output(emb, inputs, self.combiner, self.dim)
        return self._with_static_shape(out, inputs)

    def compute_output_spec(self, inputs, timestamps=None, training=None):
        return keras.KerasTensor(
            self.compute_output_shape(inputs.shape),
            dtype="float32",
            ragged=bool(getattr(inputs, "ragged", False)) and self.combiner is None,
        )

    def compute_output_shape(self, input_shape):
        """[..., dim] without combiner; with one the last axis is reduced: [batch, dim]."""
        shape = tuple(input_shape)
        if self.combiner is not None and len(shape) > 1:
            shape = shape[:-1]  # rank-1 ids are bags of one id each
        return shape + (self.dim,)

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        # tf.saved_model.save of a model holding this layer: its table's key index
        # is not a SavedModel resource, and TensorFlow's own error does not say so.
        if save_type == "savedmodel":
            raise ValueError(
                f"tf.saved_model.save cannot write the sparse table of layer {self.name!r} "
                "(its key index is not a SavedModel resource). To serve the model, export it "
                "with model.export(path) (RecModel) or npu_rec.keras.export_for_serving(model, "
                "path): a SavedModel of stock TensorFlow ops; to keep its training state, "
                "model.save('model.keras'). Received: save_type='savedmodel'"
            )
        return super()._trackable_children(save_type, **kwargs)

    def get_config(self) -> dict[str, Any]:
        base_config = super().get_config()
        kw = dict(self._table_kwargs)
        kw["optimizer"] = _serialize_optimizer(kw.get("optimizer"))
        kw["initializer"] = _serialize_initializer(kw.get("initializer"), self.name)
        if kw.get("key_dtype") is not None:
            kw["key_dtype"] = tf.as_dtype(kw["key_dtype"]).name
        if kw.get("value_dtype") is not None:
            kw["value_dtype"] = check_value_dtype(kw["value_dtype"]).name
        config = {
            "table_or_name": self.table_name,
            "dim": self.dim,
            "combiner": self.combiner,
            **kw,
        }
        return {**base_config, **config}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> SparseEmbedding:
        config = dict(config)
        config["optimizer"] = _deserialize_optimizer(config.get("optimizer"))
        config["initializer"] = _deserialize_initializer(config.get("initializer"))
        config = {k: v for k, v in config.items() if v is not None or k in ("dim", "combiner")}
        layer = cls(**config)
        layer._replace_registered = True
        return layer

    # Table state goes into `.keras` files beside the layer (no Keras weights).
    def save_own_variables(self, store):
        state = self.table.read_state(0)
        for key, value in state.items():
            store[_STATE_PREFIX + key.replace("/", "__")] = np.asarray(value)

    def load_own_variables(self, store):
        state = {
            k[len(_STATE_PREFIX) :].replace("__", "/"): np.asarray(store[k])
            for k in store.keys()
            if k.startswith(_STATE_PREFIX)
        }
        if not state:
            raise ValueError(
                f"The saved file holds no table state for SparseEmbedding "
                f"{self.name!r} (table {self.table_name!r})."
            )
        self.table.write_state(state)


def _static_shape(ids) -> tuple | None:
    """The static shape of dense, ragged, sparse or prepared ids (None entries: unknown), or None."""
    if isinstance(ids, PreparedIds):
        ids = ids.ids
    shape = (
        ids.shape
        if isinstance(ids, (tf.RaggedTensor, tf.SparseTensor))
        else (tf.convert_to_tensor(ids).shape)
    )
    return None if shape.rank is None else tuple(shape.as_list())


def _flat_int64(ids) -> tf.Tensor:
    if isinstance(ids, tf.RaggedTensor):
        ids = ids.flat_values
    elif isinstance(ids, tf.SparseTensor):
        ids = ids.values
    return tf.reshape(tf.cast(ids, tf.int64), [-1])


def sparse_embeddings(model: keras.layers.Layer) -> list[SparseEmbedding]:
    """The `SparseEmbedding` layers of `model` (nested models included), deduplicated."""
    found, seen = [], set()
    for layer in _keras_private.flatten_layers(model):
        if isinstance(layer, SparseEmbedding) and id(layer) not in seen:
            seen.add(id(layer))
            found.append(layer)
    return found


def model_tables(model: keras.layers.Layer) -> list[SparseTable]:
    """The distinct sparse tables of `model`, in layer order."""
    tables, seen = [], set()
    for layer in sparse_embeddings(model):
        if id(layer.table) not in seen:
            seen.add(id(layer.table))
            tables.append(layer.table)
    return tables
