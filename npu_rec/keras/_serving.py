"""`export_for_serving`: a SavedModel that serves raw ids with plain TensorFlow.

Each `SparseEmbedding` is frozen into a static lookup: a
`tf.lookup.StaticHashTable` from the table's keys (those holding a row) to
row numbers, and a variable of their rows. Ids without a row (never
admitted, evicted, or unseen) read as zeros, exactly as a non-training
lookup of the live table does; a table with `not_admitted="hashed"` also
freezes its fallback rows (a variable) and ids without a row read their
fallback row (`npu_rec.table._fallback.bucket_of`, stock ops). The SavedModel holds only standard
TensorFlow ops, so `tf.saved_model.load` works in a process that never
imports npu_rec.

A sparse input (`keras.Input(..., sparse=True)`, e.g. the fixed-shape
multi-valued batches of `npu_rec.data.as_dataset(use_dynamic=False)`) is a
`tf.SparseTensor` for `.serve`; the `serving_default` signature, which takes
plain tensors only, takes it as three: `<name>_indices` int64 [n, rank],
`<name>_values` [n] and `<name>_dense_shape` int64 [rank].
"""

from __future__ import annotations

import contextlib

import keras
import numpy as np
import tensorflow as tf

from npu_rec import _keras_private
from npu_rec import _log as logging
from npu_rec.keras._layers import sparse_embeddings


def _spec_of(t):
    """The `tf.TypeSpec` of a symbolic Keras input: sparse inputs stay sparse."""
    if getattr(t, "sparse", False):
        return tf.SparseTensorSpec(t.shape, t.dtype)
    return tf.TensorSpec(t.shape, t.dtype, name=getattr(t, "name", None))


def _flat_names(model, input_signature, flat_specs) -> list[str]:
    """A distinct signature name per flat input: the spec's or Keras input's name, or input_<i>."""
    sources = flat_specs
    if input_signature is None:
        sources = tf.nest.flatten(_keras_private.inputs_struct(model))
    names = [getattr(s, "name", None) or f"input_{i}" for i, s in enumerate(sources)]
    if len(set(names)) != len(names):
        names = [f"input_{i}" for i in range(len(flat_specs))]
    return names


def _named(spec, name: str):
    if isinstance(spec, tf.SparseTensorSpec):
        return tf.SparseTensorSpec(spec.shape, spec.dtype)
    return tf.TensorSpec(spec.shape, spec.dtype, name=name)


def _signature_specs(spec, name: str) -> list[tf.TensorSpec]:
    """The plain tensors the `serving_default` signature takes for one input."""
    if not isinstance(spec, tf.SparseTensorSpec):
        return [spec]
    rank = spec.shape.rank
    return [
        tf.TensorSpec([None, rank], tf.int64, name=f"{name}_indices"),
        tf.TensorSpec([None], spec.dtype, name=f"{name}_values"),
        tf.TensorSpec([rank], tf.int64, name=f"{name}_dense_shape"),
    ]


def _from_signature(specs, tensors: list) -> list:
    """The model's flat inputs from the signature's tensors (sparse inputs reassembled)."""
    out, i = [], 0
    for spec in specs:
        if isinstance(spec, tf.SparseTensorSpec):
            out.append(tf.SparseTensor(*tensors[i : i + 3]))
            i += 3
        else:
            out.append(tensors[i])
            i += 1
    return out


def _input_specs(model, input_signature):
    if input_signature is not None:
        specs = input_signature
    elif getattr(model, "inputs", None):
        specs = tf.nest.map_structure(_spec_of, _keras_private.inputs_struct(model))
    else:
        raise ValueError(
            "export_for_serving needs `input_signature` for a model without "
            "symbolic inputs (subclassed or wrapper RecModel). Received: "
            "input_signature=None"
        )
    return specs


def _freeze(layer) -> tuple[tf.lookup.StaticHashTable, tf.Variable, tf.Variable | None]:
    state = layer.table.export()
    fallback = None
    if layer.table.fallback is not None:
        rows = layer.table.read_state(0, check=False)["fallback/values"]
        fallback = tf.Variable(
            np.asarray(rows, np.float32), trainable=False, name=f"{layer.table_name}_fallback"
        )
    keys = np.asarray(state["keys"], np.int64)
    values = np.asarray(state["values"], np.float32).reshape([-1, layer.dim])
    index = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(keys, tf.int64), tf.range(len(keys), dtype=tf.int64)
        ),
        default_value=-1,
        name=f"{layer.table_name}_index",
    )
    rows = tf.Variable(values, trainable=False, name=f"{layer.table_name}_rows")
    return index, rows, fallback


@contextlib.contextmanager
def _serving(layers, frozen):
    for layer, snap in zip(layers, frozen, strict=False):
        layer._serving = snap
    try:
        yield
    finally:
        for layer in layers:
            layer._serving = None


def export_for_serving(model: keras.Model, export_dir: str, *, input_signature=None) -> str:
    """Writes `model` as a SavedModel whose `serving_default` signature takes raw ids.

    Args:
      model: A (trained) `RecModel` or Keras model with `SparseEmbedding` layers.
      export_dir: Output directory.
      input_signature: The model's input structure as `tf.TensorSpec`s (a dict
        of named specs for dict inputs; `tf.SparseTensorSpec` for sparse
        inputs); default from a functional model's inputs.

    Returns:
      `export_dir`. Load it with `tf.saved_model.load(export_dir)`; call
      `.signatures["serving_default"](**named_inputs)` (outputs are named
      `output_0`, ...; a sparse input `x` is given as `x_indices`, `x_values`,
      `x_dense_shape`) or `.serve(inputs)` with the model's input structure.

    Raises:
      ValueError: no input signature can be derived.

    Example:
      >>> npu_rec.keras.export_for_serving(model, "/tmp/serving")
      >>> tf.saved_model.load("/tmp/serving").serve({"user": tf.constant([42], tf.int64)})
    """
    specs = _input_specs(model, input_signature)
    layers = sparse_embeddings(model)
    frozen = [_freeze(layer) for layer in layers]
    flat_specs = tf.nest.flatten(specs)
    names = _flat_names(model, input_signature, flat_specs)
    flat_specs = [_named(s, n) for s, n in zip(flat_specs, names, strict=True)]
    sig_specs = [t for s, n in zip(flat_specs, names, strict=True) for t in _signature_specs(s, n)]

    def run(inputs):
        with _serving(layers, frozen):
            out = model(inputs, training=False)
        return tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), out)

    serve = tf.function(run, input_signature=[tf.nest.pack_sequence_as(specs, flat_specs)])

    def signature(*flat):
        inputs = tf.nest.pack_sequence_as(specs, _from_signature(flat_specs, list(flat)))
        outputs = tf.nest.flatten(run(inputs))
        return {f"output_{i}": t for i, t in enumerate(outputs)}

    module = tf.Module()
    module.dense_variables = [v.value if hasattr(v, "value") else v for v in model.variables]
    module.indexes = [f[0] for f in frozen]
    module.rows = [f[1] for f in frozen]
    module.fallbacks = [f[2] for f in frozen if f[2] is not None]
    module.serve = serve
    sig_fn = tf.function(signature, input_signature=sig_specs).get_concrete_function()
    tf.saved_model.save(module, export_dir, signatures={"serving_default": sig_fn})
    return export_dir


def _as_spec(x):
    """A `tf.TypeSpec` for one leaf of a Keras `export` input signature."""
    if isinstance(x, tf.TypeSpec):
        return x
    if isinstance(x, keras.InputSpec):
        return tf.TensorSpec(x.shape, x.dtype, name=x.name)
    if isinstance(x, keras.KerasTensor):
        return _spec_of(x)
    return tf.TensorSpec.from_tensor(tf.convert_to_tensor(x))


def keras_export(
    model, filepath, format="tf_saved_model", verbose=None, input_signature=None, **kwargs
) -> None:
    """`RecModel.export`: Keras' serving export, written by `export_for_serving`.

    Keras' own export cannot save the sparse tables' key maps; the SavedModel
    written here serves raw ids with stock TensorFlow ops (`.serve(inputs)`
    and the `serving_default` signature, as in `export_for_serving`).

    Raises:
      ValueError: a format other than "tf_saved_model", an option this export
        does not take, or an `input_signature` that is not a one-entry list.
    """
    if format != "tf_saved_model":
        raise ValueError(
            "RecModel.export writes format='tf_saved_model' only (its sparse tables are "
            "frozen into stock TensorFlow lookups; the other formats cannot hold them). "
            f"Received: format={format!r}"
        )
    if kwargs:
        raise ValueError(
            "RecModel.export takes no options besides `verbose` and `input_signature` for "
            f"format='tf_saved_model'. Received: {sorted(kwargs)}"
        )
    if input_signature is not None:
        # Keras' form: one entry per positional argument of the model's call, i.e. one.
        if not isinstance(input_signature, (list, tuple)) or len(input_signature) != 1:
            raise ValueError(
                "`input_signature` must be a list with one entry, the structure of the "
                "model's inputs (as keras.Model.export takes it), e.g. "
                "[{'user': tf.TensorSpec([None], tf.int64)}]. Received: "
                f"input_signature={input_signature!r}"
            )
        input_signature = tf.nest.map_structure(_as_spec, input_signature[0])
    export_for_serving(model, str(filepath), input_signature=input_signature)
    if verbose or verbose is None:
        logging.info(
            "Saved the serving artifact at %r: load it with tf.saved_model.load and call "
            "`.serve(inputs)` or the 'serving_default' signature.",
            str(filepath),
        )
