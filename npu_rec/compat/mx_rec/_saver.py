"""mx_rec's `tf.compat.v1.train.Saver` behaviour: sparse tables saved beside the dense model.

mx_rec patches TensorFlow's `Saver` so that a program's plain
`saver.save(sess, "dir/model-0", global_step=N)` also writes the sparse tables
(`dir/sparse-model-0-N`), and `saver.restore(sess, "dir/model-0-N")` reads them
back. Importing `npu_rec.compat.mx_rec` does the same for the tables its
`create_table` made (other npu_rec tables and programs are left alone):

* A `Saver` built without `var_list` leaves the tables' variables out (a
  table's hash map is not a variable: restoring its rows alone would not
  restore the table).
* `save` writes each table of the session's graph to
  `<dir>/sparse-model-<rank>[-<step>]/<table>.npr` (`SparseTable.save`).
* `restore` reads them back when that directory exists. A table restored
  without an optimizer (prediction) takes the rows and leaves the slots.
"""

from __future__ import annotations

import os
import re
import weakref

import tensorflow as tf
from tensorflow.python.training import saver as _tf_saver

_patched = False


#: Tables made by `create_table` of the compat package: the only ones the patch touches.
COMPAT_TABLES: weakref.WeakSet = weakref.WeakSet()


def _tables(graph):
    from npu_rec.table import _registry

    with graph.as_default():
        return [t for t in _registry.tables() if t in COMPAT_TABLES]


def _sparse_dir(save_path: str, global_step) -> str:
    dirname = os.path.dirname(save_path) or "."
    suffix = "" if global_step is None else f"-{int(global_step)}"
    return os.path.join(dirname, f"sparse-model-0{suffix}")


def _restore_table(table, path, session):
    from npu_rec.checkpoint import _file_format

    arrays, meta = _file_format.read_file(path)
    desc = meta.get("tables", {}).get(table.name, {})
    if desc.get("dim") != table.dim:
        table.check_compatible(meta, path)  # raises with the reason
    table.write_state(_file_format.table_state(table.name, arrays), session)


def patch() -> None:
    """Patches `Saver` (idempotent); see the module docstring."""
    global _patched
    if _patched:
        return
    _patched = True
    cls = _tf_saver.Saver
    init, save, restore = cls.__init__, cls.save, cls.restore

    def __init__(self, var_list=None, *args, **kwargs):
        if var_list is None and not tf.executing_eagerly():
            graph = tf.compat.v1.get_default_graph()
            skip = {v.ref() for t in _tables(graph) for s in t.shards for v in s.variables()}
            if skip:
                var_list = [
                    v for v in tf.compat.v1.global_variables() if v.ref() not in skip
                ] + tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)
        init(self, var_list, *args, **kwargs)

    def save_(self, sess, save_path, global_step=None, *args, **kwargs):
        result = save(self, sess, save_path, global_step, *args, **kwargs)
        tables = _tables(sess.graph)
        if tables and result is not None:
            step = global_step
            if step is not None and not isinstance(step, int):
                step = tf.compat.v1.train.global_step(sess, step)
            target = _sparse_dir(save_path, step)
            os.makedirs(target, exist_ok=True)
            for table in tables:
                table.save(os.path.join(target, f"{table.name}.npr"), session=sess)
        return result

    def restore_(self, sess, save_path):
        result = restore(self, sess, save_path)
        match = re.search(r"-(\d+)$", os.path.basename(save_path or ""))
        dirname = os.path.dirname(save_path) or "."
        candidates = [_sparse_dir(save_path, int(match.group(1)))] if match else []
        candidates.append(os.path.join(dirname, "sparse-model-0"))
        for target in candidates:
            if os.path.isdir(target):
                for table in _tables(sess.graph):
                    path = os.path.join(target, f"{table.name}.npr")
                    if os.path.exists(path):
                        _restore_table(table, path, sess)
                break
        return result

    cls.__init__ = __init__
    cls.save = save_
    cls.restore = restore_
