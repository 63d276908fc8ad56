"""Training and evaluation data of the scripts, from `--data` / `--format`."""

from __future__ import annotations

import dataclasses
import glob
import os

import numpy as np
import tensorflow as tf

from npu_rec import data as npd

EVAL_START_ROW = 1 << 30  # held-out synthetic rows: far beyond anything trained on
_EXTENSIONS = {".parquet": "parquet", ".tfrecord": "tfrecord", ".tfrecords": "tfrecord",
               ".csv": "csv", ".tsv": "criteo", ".txt": "criteo"}
_CRITEO = dict(label="label", dense=npd.DENSE_NAMES, categorical=npd.CATEGORICAL_NAMES)


@dataclasses.dataclass
class DataPlan:
    """Where the data comes from: source builders and the column roles.

    Attributes:
      name: `--data` as given.
      label, dense, categorical: column roles (multi-valued columns are not used).
      train_source: a zero-argument callable making the training `MinibatchSource`.
      eval_source: a zero-argument callable making the evaluation source, or None for
        held-out synthetic rows.
      positive_rating: when set, labels are `label >= positive_rating` (MovieLens).
      seed: the synthetic generator's seed.
    """

    name: str
    label: str
    dense: tuple
    categorical: tuple
    train_source: object
    eval_source: object
    positive_rating: float | None = None
    seed: int = 0


def _format_of(path: str, fmt: str | None) -> str:
    if fmt:
        return fmt
    ext = os.path.splitext(path.replace("*", ""))[1].lower()
    if ext not in _EXTENSIONS:
        raise ValueError(f"--format is needed: the extension of --data={path!r} is not one of "
                         f"{sorted(_EXTENSIONS)}")
    return _EXTENSIONS[ext]


def _file_source(paths: str, fmt: str, label: str, dense, categorical):
    files = sorted(glob.glob(paths)) or [paths]
    if not all(os.path.exists(f) for f in files):
        raise ValueError(f"--data/--eval_data matches no file. Received: {paths!r}")
    if fmt in ("criteo", "tsv"):
        return lambda: npd.CsvSource.criteo(files)
    roles = dict(label=label, dense=tuple(dense), categorical=tuple(categorical))
    if fmt == "csv":
        return lambda: npd.CsvSource(files, **roles)
    if fmt == "parquet":
        return lambda: npd.ParquetSource(files, **roles)
    return lambda: npd.TFRecordSource(files, **roles)


def plan(data: str, *, fmt=None, eval_data=None, label="label", dense=None, categorical=None,
         seed: int = 0) -> DataPlan:
    """The `DataPlan` of `--data` and friends (see scripts/_flags.py)."""
    if data == "synthetic":
        return DataPlan(data, "label", tuple(npd.DENSE_NAMES), tuple(npd.CATEGORICAL_NAMES),
                        lambda: npd.SyntheticSource(seed=seed), None, seed=seed)
    if data in npd.SAMPLES:
        roles = npd.SAMPLES[data]
        return DataPlan(data, roles["label"], tuple(roles["dense"]),
                        tuple(roles["categorical"]), lambda: npd.sample_source(data),
                        lambda: npd.sample_source(data),
                        positive_rating=4.0 if data == "movielens_sample" else None)
    fmt = _format_of(data, fmt)
    if fmt in ("criteo", "tsv"):
        label, dense, categorical = _CRITEO["label"], _CRITEO["dense"], _CRITEO["categorical"]
    if not categorical:
        raise ValueError(f"--categorical_features is needed for --format={fmt} "
                         f"(--data={data!r})")
    dense = tuple(dense or ())
    train = _file_source(data, fmt, label, dense, categorical)
    evals = _file_source(eval_data, _format_of(eval_data, fmt), label, dense,
                         categorical) if eval_data else train
    return DataPlan(data, label, dense, tuple(categorical), train, evals)


def _select(p: DataPlan):
    keep = (*p.dense, *p.categorical)

    def fn(features, label):
        label = tf.cast(label, tf.float32)
        if p.positive_rating is not None:
            label = tf.cast(label >= p.positive_rating, tf.float32)
        return {k: features[k] for k in keep}, label

    return fn


def train_dataset(p: DataPlan, batch_size: int, source=None):
    """(dataset, source, reading_position): endless fixed-shape batches of the training data."""
    source = source if source is not None else p.train_source()
    ds = npd.as_dataset(source, batch_size, num_sweeps=None, use_dynamic=False)
    position = ds.reading_position
    return ds.map(_select(p)), source, position


def train_input_fn(p: DataPlan, batch_size: int):
    """An Estimator `input_fn` of `train_dataset`'s batches whose reading position is tracked.

    It carries `source` and `reading_position` like `npu_rec.data.as_input_fn`, so
    `NPUEstimator.train` saves the position with every checkpoint and resumes there.
    """
    base = npd.as_input_fn(p.train_source(), batch_size, num_sweeps=None, use_dynamic=False)

    def input_fn(params=None, config=None):
        return base(params, config).map(_select(p))

    input_fn.source, input_fn.reading_position = base.source, base.reading_position
    return input_fn


def eval_dataset(p: DataPlan, batch_size: int, steps: int):
    """At most `steps` evaluation batches: held-out synthetic rows or one sweep of files."""
    if p.eval_source is None:
        n = batch_size * steps
        rows = npd.SyntheticCriteo(seed=p.seed).rows(EVAL_START_ROW, EVAL_START_ROW + n)
        label = rows.pop("label").astype(np.float32)
        ds = tf.data.Dataset.from_tensor_slices((rows, label)).batch(batch_size)
        return ds.map(_select(p))
    ds = npd.as_dataset(p.eval_source(), batch_size, num_sweeps=1, use_dynamic=True)
    return ds.map(_select(p)).take(steps)
