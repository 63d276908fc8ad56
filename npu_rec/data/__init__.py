"""Training data for npu_rec: feature specs, minibatch sources, tf.data adapters."""

from npu_rec.data._convert import DENSE_FILL, MISSING_ID, PAD_ID, hash_strings
from npu_rec.data._csv import CsvSource
from npu_rec.data._dataset import DEFAULT_PAD_LENGTH, ReadingPosition, as_dataset, as_input_fn
from npu_rec.data._errors import MalformedRecordError
from npu_rec.data._feature_spec import (
    FeatureSpec,
    feature_key_salt,
    table_keys,
    table_settings,
    validate_feature_specs,
)
from npu_rec.data._kafka import KafkaSource
from npu_rec.data._parquet import ParquetSource
from npu_rec.data._samples import (
    SAMPLES,
    load_sample,
    read_all,
    read_csv,
    sample_path,
    sample_source,
)
from npu_rec.data._source import MinibatchData, MinibatchSource, StreamInformation
from npu_rec.data._synthetic import (
    CATEGORICAL_NAMES,
    DENSE_NAMES,
    SyntheticCriteo,
)
from npu_rec.data._synthetic_source import SyntheticSource
from npu_rec.data._tfrecord import TFRecordSource, write_examples
from npu_rec.table._key_pipeline import prepare_keys

__all__ = [
    "CATEGORICAL_NAMES",
    "DEFAULT_PAD_LENGTH",
    "DENSE_FILL",
    "DENSE_NAMES",
    "MISSING_ID",
    "PAD_ID",
    "SAMPLES",
    "CsvSource",
    "prepare_keys",
    "FeatureSpec",
    "KafkaSource",
    "MalformedRecordError",
    "MinibatchData",
    "MinibatchSource",
    "ParquetSource",
    "ReadingPosition",
    "StreamInformation",
    "SyntheticCriteo",
    "SyntheticSource",
    "TFRecordSource",
    "as_dataset",
    "as_input_fn",
    "feature_key_salt",
    "hash_strings",
    "load_sample",
    "read_all",
    "read_csv",
    "sample_path",
    "sample_source",
    "table_keys",
    "table_settings",
    "validate_feature_specs",
    "write_examples",
]
