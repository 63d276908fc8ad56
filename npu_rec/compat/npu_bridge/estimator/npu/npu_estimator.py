"""npu_bridge.estimator.npu.npu_estimator: `NPUEstimator` and `NPUEstimatorSpec`."""

from npu_rec.estimator import EstimatorSpec as NPUEstimatorSpec
from npu_rec.estimator import NPUEstimator

__all__ = ["NPUEstimator", "NPUEstimatorSpec"]
