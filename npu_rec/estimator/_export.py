"""SavedModel export: raw ids in, trained tables and dense weights inside.

The serving graph is the `model_fn` in PREDICT mode fed by a
`ServingInputReceiver`; its signatures are the spec's `export_outputs`
(keyed by signature name; default `serving_default` = the predictions, see
`export/_outputs.py`). The dense variables and the sparse tables are
restored into it (tables from the table checkpoint of the same step) and
written by a `tf.compat.v1.saved_model.Builder`, whose saver also writes the
tables' hash maps (`DenseHashTable` and `MutableHashTable` saveables). The
SavedModel uses only standard TensorFlow ops: `tf.saved_model.load` serves it
without npu_rec. Keys without a row (never admitted, or evicted) read as zeros,
as in `sparse_lookup(..., is_training=False)`.
"""

from __future__ import annotations

import os
import shutil
import time

import tensorflow as tf

from npu_rec import _log as logging
from npu_rec._kernels import _build as _kernel_build
from npu_rec.estimator import _scaffold, _warm_start
from npu_rec.estimator._graph import call_model_fn, dense_saver
from npu_rec.estimator._spec import ModeKeys
from npu_rec.estimator.export._outputs import serving_export_outputs, signature_def_map
from npu_rec.table import _registry as _table_registry


def _index_variables(sess, table) -> tf.Operation:
    """Variables holding `table`'s live keys and rows, and the op re-inserting them.

    `table` is one shard (`SparseTable.shards`): each has its own hash map.
    """
    keys, rows = sess.run(table.key_index.export())
    live = rows >= 0
    with tf.name_scope(f"npu_rec_export_{table.name}"):
        feeds = [tf.compat.v1.placeholder(tf.int64, [None]) for _ in range(2)]
        k = tf.compat.v1.Variable(
            feeds[0],
            trainable=False,
            validate_shape=False,
            name="keys",
            shape=tf.TensorShape([None]),
        )
        r = tf.compat.v1.Variable(
            feeds[1],
            trainable=False,
            validate_shape=False,
            name="rows",
            shape=tf.TensorShape([None]),
        )
        sess.run([k.initializer, r.initializer], {feeds[0]: keys[live], feeds[1]: rows[live]})
        return table.key_index.insert(k.read_value(), r.read_value())


def _export_dir(base: str) -> str:
    """`<base>/<timestamp>`, later than every export already there.

    Exports made faster than one a second take the next free second after the
    newest one, so the newest directory is always the newest export, even after
    an exporter deleted older ones (a stamp reused below a kept export would be
    the first one deleted).
    """
    stamp = int(time.time())
    if os.path.isdir(base):
        taken = [int(n) for n in os.listdir(base) if n.isdigit()]
        if taken:
            stamp = max(stamp, max(taken) + 1)
    return os.path.join(base, str(stamp))


def export_saved_model(
    core,
    export_dir_base,
    serving_input_receiver_fn,
    *,
    assets_extra=None,
    as_text=False,
    checkpoint_path=None,
):
    """Writes the SavedModel into a new `<export_dir_base>/<timestamp>`; returns its path.

    The SavedModel is written into `temp-<timestamp>` and renamed when complete,
    so a failed export leaves no partial version a server could load.

    Raises:
      ValueError: no checkpoint to export (nor a `warm_start_from`).
    """
    plan = core.restore_plan(checkpoint_path)
    if plan.dense_path is None and plan.warm_start is None:
        raise ValueError(f"Couldn't find trained model at {core.model_dir}.")
    export_dir = _export_dir(os.fspath(export_dir_base))
    temp_dir = os.path.join(os.path.dirname(export_dir), "temp-" + os.path.basename(export_dir))
    try:
        _write(core, plan, serving_input_receiver_fn, temp_dir, as_text)
        if assets_extra:
            _copy_assets_extra(assets_extra, temp_dir)
        os.rename(temp_dir, export_dir)
    finally:
        if os.path.exists(temp_dir):
            shutil.rmtree(temp_dir)
    logging.info("npu_rec: exported step %d to %s", plan.step, export_dir)
    return export_dir.encode()


def _copy_assets_extra(assets_extra: dict, export_dir: str) -> None:
    """Copies `{relative destination: source path}` into `<export_dir>/assets.extra`."""
    for dest, source in assets_extra.items():
        target = os.path.join(export_dir, "assets.extra", dest)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(source, target)


def _write(core, plan, serving_input_receiver_fn, export_dir, as_text):
    # The serving graph's tables use the stock key map (`DenseHashTable`), never
    # the kernels' `NpuRecKeyMap`: the SavedModel must load without npu_rec.
    with _kernel_build.forced(False):
        _write_graph(core, plan, serving_input_receiver_fn, export_dir, as_text)


def _write_graph(core, plan, serving_input_receiver_fn, export_dir, as_text):
    graph = tf.Graph()
    with graph.as_default():
        if core.config.tf_random_seed is not None:
            tf.compat.v1.set_random_seed(core.config.tf_random_seed)
        tf.compat.v1.train.get_or_create_global_step()
        receiver = serving_input_receiver_fn()
        spec = call_model_fn(
            core.model_fn, receiver.features, None, ModeKeys.PREDICT, core.params, core.config
        )
        signatures = signature_def_map(
            receiver.receiver_tensors,
            serving_export_outputs(spec.export_outputs, spec.predictions),
            getattr(receiver, "receiver_tensors_alternatives", None),
        )
        saver, manager = dense_saver(core.config)
        saver = _scaffold.user_saver(spec) or saver
        local_init_op = _scaffold.export_local_init_op(spec)
        if plan.warm_start is not None:
            _warm_start.apply(plan.warm_start)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(
                [
                    tf.compat.v1.global_variables_initializer(),
                    tf.compat.v1.local_variables_initializer(),
                    tf.compat.v1.tables_initializer(),
                ]
            )
            plan.init_fn(saver, manager)(None, sess)
            # Each table's key -> row map is rebuilt at load time by the main op
            # from two variables (standard ops only), so the SavedModel needs no
            # hash-table saveables and no npu_rec.
            rebuild = [
                _index_variables(sess, shard)
                for t in _table_registry.tables()
                for shard in t.shards
            ]
            export_saver = tf.compat.v1.train.Saver(
                var_list=tf.compat.v1.global_variables(), sharded=True, allow_empty=True
            )
            # The model's own lookup tables (vocabulary feature columns, tf.lookup)
            # are initialised by the main op, their vocabulary files copied as
            # assets: both taken before the collections are cleared.
            table_init = tf.compat.v1.tables_initializer()
            assets = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.ASSET_FILEPATHS)
            for key in graph.get_all_collection_keys():
                if key not in (
                    tf.compat.v1.GraphKeys.GLOBAL_VARIABLES,
                    tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES,
                ):
                    graph.clear_collection(key)
            main_op = [table_init, *rebuild]
            if local_init_op is not None:
                main_op.append(local_init_op)
            builder = tf.compat.v1.saved_model.Builder(export_dir)
            builder.add_meta_graph_and_variables(
                sess,
                saver=export_saver,
                tags=[tf.saved_model.SERVING],
                signature_def_map=signatures,
                assets_collection=assets or None,
                main_op=tf.group(*main_op),
                strip_default_attrs=True,
            )
            builder.save(as_text=as_text)
