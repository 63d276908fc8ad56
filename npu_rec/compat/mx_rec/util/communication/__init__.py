"""mx_rec.util.communication on npu_rec (one process: rank 0 of 1)."""

from npu_rec.compat.mx_rec.util.communication import hccl_ops

__all__ = ["hccl_ops"]
