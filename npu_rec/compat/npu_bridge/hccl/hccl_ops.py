"""npu_bridge's `hccl_ops`: collectives over one process (identities)."""

from __future__ import annotations

import tensorflow as tf


def allreduce(tensor, reduction="sum", fusion=1, fusion_id=-1, group="hccl_world_group"):
    """The all-reduce of one rank: `tensor` itself (sum, max, min and prod alike)."""
    if reduction not in ("sum", "max", "min", "prod"):
        raise ValueError(
            f"`reduction` must be 'sum', 'max', 'min' or 'prod'. Received: {reduction!r}"
        )
    return tf.identity(tensor)


def broadcast(tensor, root_rank=0, fusion=2, fusion_id=0, group="hccl_world_group"):
    """The broadcast of one rank: the tensors themselves."""
    return [tf.identity(t) for t in tensor] if isinstance(tensor, (list, tuple)) else tensor


def allgather(tensor, rank_size=1, group="hccl_world_group"):
    """The all-gather of one rank: `tensor` itself."""
    return tf.identity(tensor)
