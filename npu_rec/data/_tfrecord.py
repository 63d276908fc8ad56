"""`TFRecordSource`: TFRecord files of `tf.train.Example` protos."""

from __future__ import annotations

import os

import numpy as np

from npu_rec.data import _convert
from npu_rec.data._columns import Ragged
from npu_rec.data._row_source import RowSource

BLOCK_RECORDS = 8192
_CONVERTERS = {}  # graph functions by (column roles, feature kinds)


class TFRecordSource(RowSource):
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
      label_domain: the allowed label values, or None for any finite label (see
        `CsvSource`).

    Example:
      >>> src = TFRecordSource("train-*.tfrecord", label="label", dense=["I1"])
      >>> mb = src.next_minibatch(256)
    """

    unit = "record"

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
        label_domain=None,
    ):
        super().__init__(
            paths,
            label=label,
            dense=dense,
            categorical=categorical,
            multi_valued=multi_valued,
            on_error=on_error,
            label_domain=label_domain,
            log_dense=log_dense,
        )
        self._compression = compression_type or ""
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
        if self._kinds is None:
            try:
                first = list(self._records(path, 0).take(1).as_numpy_iterator())
            except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as err:
                self._errors.record(path, "record", 0, f"corrupted record ({_first_line(err)})")
                return
            if not first:
                return
            self._kinds = self._detect_kinds(first[0])
        nbytes = 0 if start == 0 else None  # bytes of the records read, when known
        batches = None
        while True:
            if batches is None:
                # No prefetch: dropping a reader mid-read (a finaliser) must not wait for a
                # tf.data thread; reading ahead measured no faster here (one block at a time).
                batches = iter(self._records(path, start).batch(BLOCK_RECORDS))
            try:
                n, size, lengths, values = self._converter()(next(batches))
            except StopIteration:
                self._check_complete(path, start, nbytes)
                return
            except (tf.errors.DataLossError, tf.errors.InvalidArgumentError, UnicodeDecodeError):
                # Read the block again record by record to name the bad record(s).
                raw, err = self._salvage(path, start)
                if len(raw):
                    cols, rownums = self._parse_slowly(path, raw, start, min_row)
                    yield cols, rownums, {"file": i, "record": start}
                if err is not None:
                    self._errors.record(
                        path,
                        "record",
                        start + len(raw),
                        f"corrupted or truncated record ({_first_line(err)}); "
                        "the rest of the file cannot be read",
                    )
                    return
                start += len(raw)
                nbytes = None if nbytes is None else nbytes + _size(raw)
                batches = None
                continue
            n = int(n)
            if nbytes is not None:
                nbytes += int(size)
            lengths = {c: v.numpy() for c, v in lengths.items()}
            values = {c: v.numpy() for c, v in values.items()}
            rownums = start + np.arange(n, dtype=np.int64)
            cols, rownums = self._to_columns(path, n, lengths, values, rownums, rownums >= min_row)
            yield cols, rownums, {"file": i, "record": start}
            start += n

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

    def _salvage(self, path, start):
        """Up to one block of records from `start`, read one by one, and the damage met, if any."""
        raw, err = [], None
        try:
            for rec in self._records(path, start).take(BLOCK_RECORDS):
                raw.append(rec.numpy())
        except Exception as e:  # a corrupted or truncated record
            err = e
        return np.array(raw, dtype=object), err

    def _detect_kinds(self, raw: bytes) -> dict:
        import tensorflow as tf

        try:
            example = tf.train.Example.FromString(raw)
        except Exception:  # not an Example: the parser will name the record
            example = tf.train.Example()
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

    def _spec(self) -> dict:
        import tensorflow as tf

        return {c: tf.io.RaggedFeature(dtype=d) for c, d in self._kinds.items()}

    def _converter(self):
        """`_convert_batch` as a graph function, traced once per process and feature kinds."""
        import tensorflow as tf

        key = (self._roles, tuple(sorted((c, d.name) for c, d in self._kinds.items())))
        if key not in _CONVERTERS:
            _CONVERTERS[key] = tf.function(
                self._convert_batch,
                input_signature=[tf.TensorSpec([None], tf.string)],
                autograph=False,
            )
        return _CONVERTERS[key]

    def _convert_batch(self, raw):
        """Graph function: parses serialized Examples; hashes text ids (empty -> MISSING_ID)."""
        import tensorflow as tf

        parsed = tf.io.parse_example(raw, self._spec())
        lengths, values = {}, {}
        for c, ragged in parsed.items():
            v = ragged.values
            if v.dtype == tf.string:
                hashed = tf.strings.to_hash_bucket_fast(v, _convert.HASH_BUCKETS)
                v = tf.where(v == "", tf.constant(_convert.MISSING_ID, tf.int64), hashed)
            lengths[c], values[c] = ragged.row_lengths(), v
        n = tf.size(raw)
        size = tf.reduce_sum(tf.strings.length(raw, unit="BYTE")) + 16 * n
        return n, size, lengths, values

    def _parse_slowly(self, path, raw: np.ndarray, start: int, min_row: int):
        """Parses records one by one, reporting the invalid ones."""
        import tensorflow as tf

        rownums = start + np.arange(len(raw), dtype=np.int64)
        ok = rownums >= min_row
        keep = np.ones(len(raw), bool)
        for j, rec in enumerate(raw):
            try:
                tf.io.parse_example([rec], self._spec())
            except (tf.errors.InvalidArgumentError, UnicodeDecodeError) as err:
                # TensorFlow's message quotes the record: bytes that are not UTF-8 make
                # reading the message fail instead.
                why = _first_line(err) if isinstance(err, tf.errors.OpError) else "unparsable"
                keep[j] = False
                if ok[j]:
                    self._errors.record(
                        path, "record", int(rownums[j]), f"not a valid tf.train.Example ({why})"
                    )
        raw, rownums, ok = raw[keep], rownums[keep], ok[keep]
        if not len(raw):
            return _convert_empty(self), rownums
        _, _, lengths, values = self._converter()(tf.constant(list(raw)))
        lengths = {c: v.numpy() for c, v in lengths.items()}
        values = {c: v.numpy() for c, v in values.items()}
        return self._to_columns(path, len(raw), lengths, values, rownums, ok)

    def _to_columns(self, path, n, lengths, values, rownums, ok):
        """Checks value counts and builds the block's columns from parsed values."""
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
        first = {c: np.concatenate([[0], np.cumsum(lengths[c])])[:-1] for c in lengths}
        for c in (self.label_name, *self._roles[1]):
            has = lengths[c] >= 1
            dense = np.full(n, _convert.DENSE_FILL, np.float32)
            with np.errstate(over="ignore"):  # beyond float32: inf, reported by the caller
                dense[has] = values[c].astype(np.float32)[first[c][has]]
            cols[c] = dense
        for c in self._roles[2]:
            has = lengths[c] >= 1
            ids = np.full(n, _convert.MISSING_ID, np.int64)
            ids[has] = values[c].astype(np.int64)[first[c][has]]
            cols[c] = ids
        for c in self._roles[3]:
            v = values[c].astype(np.int64)
            if self._kinds[c].name == "string":
                keep = v != _convert.MISSING_ID
            else:
                keep = np.ones(len(v), bool)
            rows = np.repeat(np.arange(n), lengths[c])
            cols[c] = Ragged.from_lengths(v[keep], np.bincount(rows[keep], minlength=n))
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


def _size(raw) -> int:
    return sum(len(r) for r in raw) + 16 * len(raw)


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
