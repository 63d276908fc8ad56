"""mx_rec.core.asc.helper: the host pipeline's dataset hook (identity on npu_rec)."""

from __future__ import annotations

from npu_rec.compat.mx_rec.core.asc.feature_spec import FeatureSpec

__all__ = ["FeatureSpec", "get_asc_insert_func"]


def get_asc_insert_func(tgt_key_specs=None, is_training=True, dump_graph=False, **kwargs):
    """Returns the function mx_rec maps over a dataset to feed the NPU's data channel.

    npu_rec reads the ids in the graph (`sparse_lookup` takes them from the
    batch), so the function returns its batch unchanged. Arguments are accepted
    and unused.
    """
    del tgt_key_specs, is_training, dump_graph, kwargs

    def insert(*batch):
        return batch[0] if len(batch) == 1 else batch

    return insert
