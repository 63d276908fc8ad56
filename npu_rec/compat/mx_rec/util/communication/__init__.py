"""mx_rec.util.communication on npu_rec (one process: rank 0 of 1)."""
