"""mx_rec.core.feature_process: `EvictHook` (npu_rec's `npu_rec.estimator.EvictHook`)."""

from npu_rec.estimator import EvictHook

__all__ = ["EvictHook"]
