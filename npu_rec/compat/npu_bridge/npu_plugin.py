"""npu_bridge's `npu_plugin`: device settings with no CPU meaning (no-ops)."""


def set_device_sat_mode(mode=0) -> None:
    """No-op: saturation mode of the NPU's float arithmetic."""


def npu_resource_init(*args, **kwargs) -> None:
    """No-op: there is no NPU resource to open."""


def npu_resource_shutdown(*args, **kwargs) -> None:
    """No-op."""
