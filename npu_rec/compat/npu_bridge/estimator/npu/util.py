"""npu_bridge.estimator.npu.util: the same as `npu_bridge.util`."""

from npu_rec.compat.npu_bridge.util import npu_hooks_append, set_iteration_per_loop

__all__ = ["npu_hooks_append", "set_iteration_per_loop"]
