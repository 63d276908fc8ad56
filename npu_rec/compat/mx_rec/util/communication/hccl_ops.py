"""mx_rec.util.communication.hccl_ops: rank helpers (one process on npu_rec)."""

from npu_rec.compat.mx_rec.util.initialize import get_rank_id, get_rank_size

__all__ = ["get_rank_id", "get_rank_size"]
