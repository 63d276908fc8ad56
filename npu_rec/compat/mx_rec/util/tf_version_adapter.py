"""mx_rec.util.tf_version_adapter: `hccl_ops` and `npu_ops` of npu_bridge."""

from npu_rec.compat.npu_bridge.estimator import npu_ops
from npu_rec.compat.npu_bridge.hccl import hccl_ops

__all__ = ["hccl_ops", "npu_ops"]
