"""mx_rec.graph.hooks: graph slicers that move id-preparing ops (not needed on npu_rec).

mx_rec's slicer hooks cut the ops that compute a lookup's ids out of the
training graph and run them in the input pipeline, so the NPU receives ready
ids. npu_rec's lookups read their ids in the graph as they are, so the hooks
accept mx_rec's arguments and do nothing.
"""

from __future__ import annotations

import tensorflow as tf


class _SlicerHook(tf.compat.v1.train.SessionRunHook):
    """A slicer hook that records its arguments and does nothing."""

    def __init__(self, op_types=None, full_graph=None, **kwargs):
        self.op_types = list(op_types) if op_types is not None else []
        self.full_graph = full_graph
        self.kwargs = dict(kwargs)


class OrphanLookupKeySlicerHook(_SlicerHook):
    """mx_rec's slicer of ids computed without the dataset: does nothing here."""


class LookupSubgraphSlicerHook(_SlicerHook):
    """mx_rec's slicer of the ops (`op_types`) before a lookup: does nothing here."""
