"""mx_rec.util.ops: `import_host_pipeline_ops`."""

from npu_rec.compat.mx_rec.util.initialize import get_host_pipeline_ops


def import_host_pipeline_ops(so_path=None):
    """The host pipeline ops (`return_timestamp`, `clear_channel`); npu_rec needs no
    custom op library, so `so_path` (mx_rec's `LIBREC_CPU_SO`) is accepted and unused."""
    del so_path
    return get_host_pipeline_ops()
