"""mx_rec.graph.acg_push_ops: moving ops into the dataset (not needed on npu_rec)."""

from __future__ import annotations

import tensorflow as tf


class ACGPushOpsToDatasetHook(tf.compat.v1.train.SessionRunHook):
    """mx_rec's hook that pushes graph ops into the input pipeline: does nothing here."""

    def __init__(self, dump_graph=False, **kwargs):
        self.dump_graph = dump_graph
