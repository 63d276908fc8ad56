"""`TFRecordSource`: TFRecord files of `tf.train.Example` protos."""

from __future__ import annotations

import os

import numpy as np

from npu_rec.data import _convert
from npu_rec.data._columns import Ragged
from npu_rec.data._source import _RowSource

BLOCK_RECORDS = 8192


class TFRecordSource(_RowSource):
    """A minibatch source over TFRecord files of `tf.train.Example`s.

    Each column is a feature of the Example: the label and dense features hold
    one float or int value (an absent dense feature -> `DENSE_FILL`);
    categorical features hold at most one bytes value (hashed with FarmHash64)
    or int64 value (a raw id), absent/"" -> `MISSING_ID`; multi-valued
    features hold any number of bytes or int64 values. The kind of each
    feature is read from the first record. Records are numbered from 0 within
    each file; errors name the file and the record.

    Args:
      paths: a file, a glob pattern, or a list of them (read in order).
      label: the label feature.
      dense: dense features.
      categorical: categorical features.
      multi_valued: multi-valued features.
      on_error: "raise" or "skip" (see `CsvSource`). A corrupted or truncated
        file cannot be read past the damage: with "skip" the rest of that file
        is skipped and counted as one error.
      compression_type: "", "GZIP" or "ZLIB".
      log_dense: map dense values through `log1p(max(x, 0))`.

    Example:
      >>> src = TFRecordSource("train-*.tfrecord", label="label", dense=["I1"])
      >>> mb = src.next_minibatch(256)
    """

    def __init__(
        self,
        paths,
        *,
        label: str,
        dense=(),
        categorical=(),
        multi_valued=(),
        on_error: str = "raise",
        compression_type: str = "",
        log_dense: bool = False,
    ):
        super().__init__(on_error)
        self._roles = _convert.check_columns(label, dense, categorical, multi_valued)
        self.label_name = label
        self._files = _convert.expand_paths(paths)
        self._compression = compression_type or ""
        self._log_dense = bool(log_dense)
        self._streams = _convert.column_streams(*self._roles)
        self._kinds = None

    def _open(self, loc, min_row):
        first = 0 if loc is None else loc["file"]
        for i in range(first, len(self._files)):
            start = loc["record"] if (loc is not None and i == first) else 0
            yield from self._read_file(i, start, min_row if i == first and loc else 0)

    def _records(self, path: str, start: int):
        import tensorflow as tf

        return tf.data.TFRecordDataset(path, compression_type=self._compression).skip(start)

    def _read_file(self, i: int, start: int, min_row: int):
        import tensorflow as tf

        path = self._files[i]
        batches = iter(self._records(path, start).batch(BLOCK_RECORDS))
        nbytes = 0 if start == 0 else None  # bytes of the records read, when known
        while True:
            try:
                raw = next(batches)
            except StopIteration:
                self._check_complete(path, start, nbytes)
                return
            except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as err:
                good, bad_at = self._salvage(path, start, err)
                if len(good):
                    yield (*self._parse(path, good, start, min_row), {"file": i, "record": start})
                self._errors.record(
                    path,
                    "record",
                    bad_at,
                    f"corrupted or truncated record ({_first_line(err)}); "
                    "the rest of the file cannot be read",
                )
                return
            raw = raw.numpy()
            if nbytes is not None:
                nbytes += sum(len(r) for r in raw) + 16 * len(raw)
            yield (*self._parse(path, raw, start, min_row), {"file": i, "record": start})
            start += len(raw)

    def _check_complete(self, path: str, records: int, nbytes: int | None) -> None:
        """TensorFlow ends quietly at a truncated last record: compare sizes to notice it."""
        if self._compression:
            return
        if nbytes is None:
            nbytes = _scan(path, records)
        if nbytes < os.path.getsize(path):
            self._errors.record(
                path, "record", records, "truncated record: the file ends inside it"
            )

    def _salvage(self, path, start, err):
        """Reads records one by one from `start` up to the damage; returns them and its index."""
        good = []
        try:
            for rec in self._records(path, start):
                good.append(rec.numpy())
        except Exception:  # noqa: BLE001 - the same damage as `err`
            pass
        return np.array(good, dtype=object), start + len(good)

    def _detect_kinds(self, raw: bytes) -> dict:
        import tensorflow as tf

        example = tf.train.Example.FromString(raw)
        kinds = {}
        for c in (self.label_name, *self._roles[1], *self._roles[2], *self._roles[3]):
            feature = example.features.feature.get(c)
            kind = feature.WhichOneof("kind") if feature is not None else None
            if kind is None:
                kind = "float_list" if c in (self.label_name, *self._roles[1]) else "bytes_list"
            kinds[c] = {"float_list": tf.float32, "int64_list": tf.int64, "bytes_list": tf.string}[
                kind
            ]
        return kinds

    def _parse(self, path, raw: np.ndarray, start: int, min_row: int):
        import tensorflow as tf

        rownums = start + np.arange(len(raw), dtype=np.int64)
        ok = rownums >= min_row
        if self._kinds is None:
            self._kinds = self._detect_kinds(raw[0])
        spec = {c: tf.io.RaggedFeature(dtype=d) for c, d in self._kinds.items()}
        try:
            parsed = tf.io.parse_example(raw, spec)
        except tf.errors.InvalidArgumentError:
            keep = np.ones(len(raw), bool)
            for j, rec in enumerate(raw):
                try:
                    tf.io.parse_example(rec[None], spec)
                except tf.errors.InvalidArgumentError as err:
                    keep[j] = False
                    if ok[j]:
                        self._errors.record(
                            path,
                            "record",
                            int(rownums[j]),
                            f"not a valid tf.train.Example ({_first_line(err)})",
                        )
            raw, rownums, ok = raw[keep], rownums[keep], ok[keep]
            parsed = tf.io.parse_example(raw, spec) if len(raw) else None
        if parsed is None:
            return _convert_empty(self), rownums
        lengths = {c: parsed[c].row_lengths().numpy() for c in spec}
        values = {c: parsed[c].values for c in spec}
        limits = [(self.label_name, 1, 1, "a label")]
        limits += [(c, 0, 1, "a dense feature") for c in self._roles[1]]
        limits += [(c, 0, 1, "a categorical feature") for c in self._roles[2]]
        for c, low, high, what in limits:
            wrong = (lengths[c] < low) | (lengths[c] > high)
            for j in np.flatnonzero(wrong & ok):
                self._errors.record(
                    path,
                    "record",
                    int(rownums[j]),
                    f"{what} {c!r} must hold {low}-{high} values, found {lengths[c][j]}",
                )
            ok &= ~wrong
        cols = {}
        first = {c: np.concatenate([[0], np.cumsum(lengths[c])])[:-1] for c in spec}
        for c in (self.label_name, *self._roles[1]):
            has = lengths[c] >= 1
            dense = np.full(len(raw), _convert.DENSE_FILL, np.float32)
            dense[has] = values[c].numpy().astype(np.float32)[first[c][has]]
            if c != self.label_name and self._log_dense:
                dense = np.log1p(np.maximum(dense, 0.0)).astype(np.float32)
            cols[c] = dense
        for c in self._roles[2]:
            has = lengths[c] >= 1
            ids = np.full(len(raw), _convert.MISSING_ID, np.int64)
            ids[has] = _ids(values[c])[first[c][has]]
            cols[c] = ids
        for c in self._roles[3]:
            v = _ids(values[c])
            keep = (
                v != _convert.MISSING_ID if self._kinds[c] == tf.string else np.ones(len(v), bool)
            )
            rows = np.repeat(np.arange(len(raw)), lengths[c])
            cols[c] = Ragged.from_lengths(v[keep], np.bincount(rows[keep], minlength=len(raw)))
        if not ok.all():
            from npu_rec.data._columns import take_rows

            cols, rownums = take_rows(cols, ok), rownums[ok]
        return cols, rownums


def _scan(path: str, records: int) -> int:
    """Bytes taken by the first `records` records of an uncompressed TFRecord file."""
    pos = 0
    with open(path, "rb") as f:
        for _ in range(records):
            f.seek(pos)
            header = f.read(8)
            if len(header) < 8:
                break
            pos += 16 + int.from_bytes(header, "little")
    return pos


def _ids(values) -> np.ndarray:
    import tensorflow as tf

    if values.dtype == tf.string:
        ids = tf.strings.to_hash_bucket_fast(values, _convert.HASH_BUCKETS).numpy()
        ids[(values == "").numpy()] = _convert.MISSING_ID
        return ids.astype(np.int64)
    return values.numpy().astype(np.int64)


def _convert_empty(source) -> dict:
    from npu_rec.data._columns import empty_like

    return empty_like(source._streams)


def _first_line(err) -> str:
    return str(getattr(err, "message", err)).splitlines()[0]


def write_examples(path: str, columns: dict) -> None:
    """Writes equal-length columns to a TFRecord file of `tf.train.Example`s (for tests/tools).

    Args:
      columns: name -> list of per-row values: a float, int, str/bytes, None
        (feature left out) or a list of str/int (multi-valued).
    """
    import tensorflow as tf

    def feature(v):
        if v is None:
            return None
        items = v if isinstance(v, (list, tuple)) else [v]
        if all(isinstance(x, (str, bytes)) for x in items) and items:
            data = [x.encode() if isinstance(x, str) else x for x in items]
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=data))
        if all(isinstance(x, (int, np.integer)) for x in items):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(x) for x in items]))
        return tf.train.Feature(float_list=tf.train.FloatList(value=[float(x) for x in items]))

    n = len(next(iter(columns.values())))
    with tf.io.TFRecordWriter(path) as w:
        for j in range(n):
            feats = {k: feature(v[j]) for k, v in columns.items()}
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={k: f for k, f in feats.items() if f is not None}
                )
            )
            w.write(example.SerializeToString())
