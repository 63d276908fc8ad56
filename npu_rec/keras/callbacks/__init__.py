"""Keras callbacks of npu_rec: precision switch, eviction, table checkpoints, step checks.

The decisions (when to switch precision, evict or save) are the shared core
objects `npu_rec.training._precision.PrecisionSwitch`, `npu_rec.training._policies.EvictPolicy`
and `npu_rec.training._policies.SavePolicy`, which the Estimator hooks use too.
"""

from npu_rec.keras.callbacks._accelerate import AccelerateTrain
from npu_rec.keras.callbacks._evict import Evict
from npu_rec.keras.callbacks._sparse_checkpoint import SparseCheckpoint
from npu_rec.keras.callbacks._step_consistency import StepConsistency

__all__ = ["AccelerateTrain", "Evict", "SparseCheckpoint", "StepConsistency"]
