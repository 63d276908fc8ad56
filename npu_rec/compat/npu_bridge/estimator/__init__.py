"""npu_bridge.estimator on npu_rec."""
