"""mx_rec.graph (automatic graph modification) on npu_rec."""
