"""npu_bridge.estimator.npu on npu_rec."""
