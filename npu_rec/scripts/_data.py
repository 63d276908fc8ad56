"""Training and evaluation data of the scripts, from `--data` / `--format`."""

from __future__ import annotations

import dataclasses
import glob
import os

import numpy as np
import tensorflow as tf

from npu_rec import data as npd
from npu_rec.scripts import _workers

EVAL_START_ROW = 1 << 30  # held-out synthetic rows: far beyond anything trained on
HOLD_OUT_EVERY = 10  # without --eval_data, one row in 10 of the files is held out
_EXTENSIONS = {
    ".parquet": "parquet",
    ".tfrecord": "tfrecord",
    ".tfrecords": "tfrecord",
    ".csv": "csv",
    ".tsv": "criteo",
    ".txt": "criteo",
}
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
      eval_name: what is evaluated, in words (printed before evaluating).
      positive_rating: when set, labels are `label >= positive_rating` (MovieLens).
      seed: the synthetic generator's seed.
    """

    name: str
    label: str
    dense: tuple
    categorical: tuple
    train_source: object
    eval_source: object
    eval_name: str = ""
    positive_rating: float | None = None
    seed: int = 0


def _format_of(path: str, fmt: str | None) -> str:
    if fmt:
        return fmt
    ext = os.path.splitext(path.replace("*", ""))[1].lower()
    if ext not in _EXTENSIONS:
        raise ValueError(
            f"--format is needed: the extension of --data={path!r} is not one of "
            f"{sorted(_EXTENSIONS)}"
        )
    return _EXTENSIONS[ext]


def _file_source(paths: str, fmt: str, label: str, dense, categorical, part=None):
    """A source builder over the files; `part` ("train"/"eval") keeps that part of the rows."""
    files = sorted(glob.glob(paths)) or [paths]
    if not all(os.path.exists(f) for f in files):
        raise ValueError(f"--data/--eval_data matches no file. Received: {paths!r}")
    # The reference models are binary classifiers: any other label is a malformed record.
    roles = dict(
        label=label, dense=tuple(dense), categorical=tuple(categorical), label_domain=(0, 1)
    )
    make = {
        "criteo": lambda: npd.CsvSource.criteo(files),
        "tsv": lambda: npd.CsvSource.criteo(files),
        "csv": lambda: npd.CsvSource(files, **roles),
        "parquet": lambda: npd.ParquetSource(files, **roles),
        "tfrecord": lambda: npd.TFRecordSource(files, **roles),
    }[fmt]
    return _part_of(make, part)


def _part_of(make, part):
    if part is None:
        return make
    return lambda: make().split(part, every=HOLD_OUT_EVERY)


def plan(
    data: str,
    *,
    fmt=None,
    eval_data=None,
    label="label",
    dense=None,
    categorical=None,
    seed: int = 0,
    kafka: str | None = None,
    topic: str | None = None,
) -> DataPlan:
    """The `DataPlan` of `--data` and friends (see _flags.py).

    Without --eval_data, one row in `HOLD_OUT_EVERY` of the training files (or
    sample) is held out for evaluation and never trained on. With `kafka`, training
    reads `topic` (comma-separated lines: label, dense, categorical) and evaluation
    uses held-out synthetic rows, or --eval_data.
    """
    if kafka:
        return _kafka_plan(kafka, topic, eval_data, fmt, label, dense, categorical, seed)
    if data == "synthetic":
        return DataPlan(
            data,
            "label",
            tuple(npd.DENSE_NAMES),
            tuple(npd.CATEGORICAL_NAMES),
            lambda: npd.SyntheticSource(seed=seed),
            None,
            eval_name=f"held-out synthetic rows (seed {seed}, never trained on)",
            seed=seed,
        )
    held_out = (
        f"the rows of {data} held out from training (one in {HOLD_OUT_EVERY}; "
        "--eval_data to evaluate other data)"
    )
    if data in npd.SAMPLES:
        roles = npd.SAMPLES[data]
        return DataPlan(
            data,
            roles["label"],
            tuple(roles["dense"]),
            tuple(roles["categorical"]),
            _part_of(lambda: npd.sample_source(data), "train"),
            _part_of(lambda: npd.sample_source(data), "eval"),
            eval_name=held_out,
            positive_rating=4.0 if data == "movielens_sample" else None,
        )
    fmt = _format_of(data, fmt)
    if fmt in ("criteo", "tsv"):
        label, dense, categorical = _CRITEO["label"], _CRITEO["dense"], _CRITEO["categorical"]
    if not categorical:
        raise ValueError(f"--categorical_features is needed for --format={fmt} (--data={data!r})")
    dense = tuple(dense or ())
    if eval_data:
        train = _file_source(data, fmt, label, dense, categorical)
        evals = _file_source(eval_data, _format_of(eval_data, fmt), label, dense, categorical)
        eval_name = f"--eval_data={eval_data}"
    else:
        train = _file_source(data, fmt, label, dense, categorical, "train")
        evals = _file_source(data, fmt, label, dense, categorical, "eval")
        eval_name = held_out
    return DataPlan(data, label, dense, tuple(categorical), train, evals, eval_name=eval_name)


def _kafka_plan(kafka, topic, eval_data, fmt, label, dense, categorical, seed) -> DataPlan:
    if categorical is None:
        label, dense, categorical = _CRITEO["label"], _CRITEO["dense"], _CRITEO["categorical"]
    dense, categorical = tuple(dense or ()), tuple(categorical)
    columns = [label, *dense, *categorical]

    def train():
        return npd.KafkaSource(
            topic,
            bootstrap_servers=kafka,
            columns=columns,
            label=label,
            dense=dense,
            categorical=categorical,
        )

    evals, eval_name = None, f"held-out synthetic rows (seed {seed}; --eval_data for files)"
    if eval_data:
        evals = _file_source(eval_data, _format_of(eval_data, fmt), label, dense, categorical)
        eval_name = f"--eval_data={eval_data}"
    return DataPlan(
        f"kafka topic {topic} at {kafka}",
        label,
        dense,
        categorical,
        train,
        evals,
        eval_name,
        seed=seed,
    )


def _select(p: DataPlan):
    keep = (*p.dense, *p.categorical)

    def fn(features, label):
        label = tf.cast(label, tf.float32)
        if p.positive_rating is not None:
            label = tf.cast(label >= p.positive_rating, tf.float32)
        return {k: features[k] for k in keep}, label

    return fn


def _fixed_shapes(p: DataPlan, batch_size: int) -> bool:
    """Fixed-shape batches, unless the training data is smaller than one batch (said once).

    With fixed shapes the short last batch of each sweep is dropped, so data smaller
    than a batch would give no batch at all: it is trained on in short batches instead.
    """
    if p.eval_source is None:  # endless synthetic rows
        return True
    with p.train_source() as probe:
        first = next(iter(probe.next_minibatch(batch_size).values()))
    if not first.sweep_end or first.num_samples >= batch_size:
        return True
    print(
        f"npu_rec: the training data ({p.name}) has {first.num_samples} rows, fewer than "
        f"--batch_size={batch_size}: each step trains on all of them",
        flush=True,
    )
    return False


def train_dataset(p: DataPlan, batch_size: int, source=None):
    """(dataset, source, reading_position): endless batches of the training data.

    Fixed-shape batches of `batch_size` (the short last one of a sweep dropped), or
    all the rows in each batch when there are fewer than `batch_size`.
    """
    static = _fixed_shapes(p, batch_size)
    source = source if source is not None else p.train_source()
    workers, rank = _workers.shard()  # each worker reads its own share
    ds = npd.as_dataset(
        source,
        batch_size,
        num_sweeps=None,
        use_dynamic=not static,
        number_of_workers=workers,
        worker_rank=rank,
    )
    position = ds.reading_position
    return ds.map(_select(p)), source, position


def train_input_fn(p: DataPlan, batch_size: int):
    """An Estimator `input_fn` of `train_dataset`'s batches whose reading position is tracked.

    It carries `source` and `reading_position` like `npu_rec.data.as_input_fn`, so
    `NPUEstimator.train` saves the position with every checkpoint and resumes there.
    """
    static = _fixed_shapes(p, batch_size)
    workers, rank = _workers.shard()  # the ps route: each trainer reads its own share
    base = npd.as_input_fn(
        p.train_source(),
        batch_size,
        num_sweeps=None,
        use_dynamic=not static,
        number_of_workers=workers,
        worker_rank=rank,
    )

    def input_fn(params=None, config=None):
        return base(params, config).map(_select(p))

    input_fn.source, input_fn.reading_position = base.source, base.reading_position
    return input_fn


def eval_dataset(p: DataPlan, batch_size: int, steps: int):
    """At most `steps` evaluation batches: held-out synthetic rows or one sweep of files.

    Prints what is evaluated (`p.eval_name`).
    """
    print(f"npu_rec: evaluating on {p.eval_name}", flush=True)
    if p.eval_source is None:
        n = batch_size * steps
        rows = npd.SyntheticCriteo(seed=p.seed).rows(EVAL_START_ROW, EVAL_START_ROW + n)
        label = rows.pop("label").astype(np.float32)
        ds = tf.data.Dataset.from_tensor_slices((rows, label)).batch(batch_size)
        return ds.map(_select(p))
    ds = npd.as_dataset(p.eval_source(), batch_size, num_sweeps=1, use_dynamic=True)
    return ds.map(_select(p)).take(steps)
