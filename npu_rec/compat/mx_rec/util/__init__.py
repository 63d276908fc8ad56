"""mx_rec.util on npu_rec."""
