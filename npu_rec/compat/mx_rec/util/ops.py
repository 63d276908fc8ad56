"""mx_rec.util.ops: `import_host_pipeline_ops`."""

from npu_rec.compat.mx_rec.util.initialize import get_host_pipeline_ops


def import_host_pipeline_ops():
    """The host pipeline ops (`return_timestamp`); npu_rec needs no custom op library."""
    return get_host_pipeline_ops()
