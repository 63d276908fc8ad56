"""mx_rec.graph.modifier: automatic graph modification (not needed on npu_rec).

mx_rec rewrites the graph before the session starts so the NPU's embedding
cache is fed; npu_rec's lookups are ordinary graph ops already.
"""

from __future__ import annotations

import tensorflow as tf


def modify_graph_and_start_emb_cache(dump_graph=False, **kwargs) -> None:
    """No-op (arguments accepted and unused)."""
    del dump_graph, kwargs


class GraphModifierHook(tf.compat.v1.train.SessionRunHook):
    """mx_rec's hook that modifies the graph at session creation: does nothing here."""

    def __init__(self, dump_graph=False, modify_graph=True, **kwargs):
        self.dump_graph = dump_graph
        self.modify_graph = modify_graph
