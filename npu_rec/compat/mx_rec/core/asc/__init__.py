"""mx_rec.core.asc (the host data pipeline) on npu_rec."""
