"""Training data for npu_rec: feature specs, minibatch sources, tf.data adapters."""

from npu_rec.data._convert import DENSE_FILL, MISSING_ID, PAD_ID, hash_strings
from npu_rec.data._csv import CsvSource
from npu_rec.data._errors import MalformedRecordError
from npu_rec.data._samples import SAMPLES, load_sample, read_all, read_csv, sample_path
from npu_rec.data._source import MinibatchData, MinibatchSource, StreamInformation
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
    "PAD_ID",
    "SAMPLES",
    "CsvSource",
    "MalformedRecordError",
    "MinibatchData",
    "MinibatchSource",
    "StreamInformation",
    "SyntheticCriteo",
    "hash_strings",
    "load_sample",
    "read_all",
    "read_csv",
    "sample_path",
]
