"""npu_bridge.hccl on npu_rec (one process)."""
