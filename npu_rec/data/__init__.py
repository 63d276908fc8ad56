"""Training data for npu_rec: sources, samples and the synthetic generator."""

from npu_rec.data._csv import (
    DENSE_FILL,
    MISSING_ID,
    SAMPLES,
    hash_strings,
    load_sample,
    read_csv,
)
from npu_rec.data._synthetic import (
    CATEGORICAL_NAMES,
    DENSE_NAMES,
    SyntheticCriteo,
)

__all__ = [
    "CATEGORICAL_NAMES",
    "DENSE_FILL",
    "DENSE_NAMES",
    "MISSING_ID",
    "SAMPLES",
    "SyntheticCriteo",
    "hash_strings",
    "load_sample",
    "read_csv",
]
