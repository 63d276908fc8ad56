"""mx_rec.util.variable: `get_dense_and_sparse_variable`."""

from __future__ import annotations

import tensorflow as tf

import npu_rec


def get_dense_and_sparse_variable():
    """(dense, sparse) of the current `tf.compat.v1` graph.

    dense: the trainable variables. sparse: one tensor per table looked up for
    training (npu_rec's tables are not dense variables), in the order of the
    tables' first lookups: a table looked up once is represented by that
    lookup's unique-row tensor; a table looked up several times, as in mx_rec,
    by one stand-in whose gradient is a `tf.IndexedSlices` covering all its
    lookups. `tf.gradients(loss, sparse)` gives their gradients, and a hash
    optimizer's `apply_gradients(zip(grads, sparse))` updates the tables.
    Lookups with `is_grad=False` have no sparse variable.
    """
    from npu_rec.compat.mx_rec.core.embedding import _NO_GRAD, _TableLookups

    graph = tf.compat.v1.get_default_graph()
    skip = {t.ref() for t in graph.get_collection(_NO_GRAD)}
    dense = list(tf.compat.v1.trainable_variables())
    routed = {}
    for table in _TableLookups.in_graph(graph):
        for rec in table.records:
            routed[rec.embeddings.ref()] = table
    sparse, seen = [], set()
    for r in graph.get_collection(npu_rec.LOOKUP_COLLECTION):
        if r.embeddings.ref() in skip:
            continue
        table = routed.get(r.embeddings.ref())
        if table is None:
            sparse.append(r.embeddings)
        elif id(table) not in seen:
            seen.add(id(table))
            sparse.append(table.sparse_variable)
    return dense, sparse
