"""mx_rec.core on npu_rec."""
