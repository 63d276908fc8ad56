"""mx_rec.constants on npu_rec."""
