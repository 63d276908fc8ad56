"""mx_rec.util on npu_rec (`mx_rec.util.communication.hccl_ops` is reachable as an attribute,
as programs doing `import mx_rec.util` expect)."""

from npu_rec.compat.mx_rec.util import communication

__all__ = ["communication"]
