"""mx_rec.util.variable: `get_dense_and_sparse_variable`."""

from __future__ import annotations

import tensorflow as tf

import npu_rec


def get_dense_and_sparse_variable():
    """(dense, sparse) of the current `tf.compat.v1` graph.

    dense: the trainable variables. sparse: one tensor per training lookup,
    its unique-row tensor (npu_rec's tables are not dense variables):
    `tf.gradients(loss, sparse)` gives their gradients, and a hash optimizer's
    `apply_gradients(zip(grads, sparse))` updates the tables.
    """
    from npu_rec.compat.mx_rec.core.embedding import _NO_GRAD

    graph = tf.compat.v1.get_default_graph()
    skip = {t.ref() for t in graph.get_collection(_NO_GRAD)}
    dense = list(tf.compat.v1.trainable_variables())
    sparse = [
        r.embeddings
        for r in graph.get_collection(npu_rec.LOOKUP_COLLECTION)
        if r.embeddings.ref() not in skip
    ]
    return dense, sparse
