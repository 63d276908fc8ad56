"""mx_rec's `logger`: npu_rec's logger (absl's logger object)."""

from absl import logging as _absl

logger = _absl.get_absl_logger()

__all__ = ["logger"]
