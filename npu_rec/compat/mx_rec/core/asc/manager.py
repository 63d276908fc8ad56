"""mx_rec.core.asc.manager: starting the host pipeline (nothing to start on npu_rec)."""


def start_asc_pipeline() -> None:
    """No-op: npu_rec's lookups run inside the TensorFlow graph, no host pipeline."""
