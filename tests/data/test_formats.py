"""ParquetSource and TFRecordSource specifics: types, malformed records."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from npu_rec.data import (
    MISSING_ID,
    MalformedRecordError,
    ParquetSource,
    TFRecordSource,
    hash_strings,
    read_all,
    write_examples,
)


def test_parquet_integer_ids_are_raw_and_text_numbers_are_parsed(tmp_path):
    path = str(tmp_path / "x.parquet")
    table = pa.table(
        {
            "y": ["1", "0", "1"],
            "d": ["1.5", None, "2"],
            "uid": [7, None, 2**40],
            "g": ["a|b", "", None],
        }
    )
    pq.write_table(table, path, row_group_size=2)
    rows = read_all(
        ParquetSource(path, label="y", dense=["d"], categorical=["uid"], multi_valued=["g"])
    )
    assert rows["y"].tolist() == [1.0, 0.0, 1.0]
    assert rows["d"].tolist() == [1.5, 0.0, 2.0]
    assert rows["uid"].tolist() == [7, MISSING_ID, 2**40]
    assert rows["g"].to_list() == [hash_strings(["a", "b"]).tolist(), [], []]


def test_parquet_bad_number_names_file_and_row(tmp_path):
    path = str(tmp_path / "x.parquet")
    pq.write_table(pa.table({"y": [1.0, 0.0, 1.0], "d": ["1", "zz", "3"]}), path)
    with pytest.raises(MalformedRecordError, match=r"x\.parquet, row 1: unparsable number 'zz'"):
        read_all(ParquetSource(path, label="y", dense=["d"]))
    source = ParquetSource(path, label="y", dense=["d"], on_error="skip")
    assert read_all(source)["d"].tolist() == [1.0, 3.0]
    assert source.error_report()["count"] == 1


def test_parquet_missing_column_and_unreadable_file(tmp_path):
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"y": [1.0]}), str(path))
    with pytest.raises(ValueError, match=r"x\.parquet.*\['d'\] not found"):
        read_all(ParquetSource(str(path), label="y", dense=["d"]))
    path.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(MalformedRecordError, match=r"x\.parquet, row 0: not a readable Parquet"):
        read_all(ParquetSource(str(path), label="y"))


def _examples(tmp_path, n=20):
    path = str(tmp_path / "x.tfrecord")
    write_examples(
        path,
        {
            "y": [float(i % 2) for i in range(n)],
            "d": [float(i) for i in range(n)],
            "c": [i for i in range(n)],
        },
    )
    return path


def test_tfrecord_truncated_file_names_the_record(tmp_path):
    path = _examples(tmp_path)
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) * 3 // 4 - 7])
    with pytest.raises(MalformedRecordError, match=r"x\.tfrecord, record 14: .*truncated record"):
        read_all(TFRecordSource(path, label="y", dense=["d"], categorical=["c"]))
    source = TFRecordSource(path, label="y", dense=["d"], categorical=["c"], on_error="skip")
    rows = read_all(source)
    assert rows["d"].tolist() == [float(i) for i in range(14)]
    assert rows["c"].tolist() == list(range(14))  # int64 ids are raw
    assert source.error_report()["count"] == 1


def test_tfrecord_wrong_value_count_is_malformed(tmp_path):
    path = str(tmp_path / "x.tfrecord")
    write_examples(path, {"y": [1.0, 0.0, [1.0, 0.0]], "c": ["a", "", "b"]})
    with pytest.raises(
        MalformedRecordError, match=r"record 2: a label 'y' must hold 1-1 values, found 2"
    ):
        read_all(TFRecordSource(path, label="y", categorical=["c"]))
    rows = read_all(TFRecordSource(path, label="y", categorical=["c"], on_error="skip"))
    assert rows["c"].tolist() == [hash_strings(["a"])[0], MISSING_ID]
    assert np.asarray(rows["y"]).dtype == np.float32


def test_tfrecord_invalid_examples_are_named_and_skipped(tmp_path):
    import tensorflow as tf

    path = str(tmp_path / "x.tfrecord")
    write_examples(path, {"y": [1.0, 0.0, 1.0, 0.0], "d": [1.0, 2.0, "text", 4.0]})
    with tf.io.TFRecordWriter(str(tmp_path / "y.tfrecord")) as w:
        w.write(b"not an example")
        w.write(b"\xff\xfe not UTF-8 either")  # TensorFlow cannot quote it in its message
    with pytest.raises(
        MalformedRecordError, match=r"x\.tfrecord, record 2: not a valid tf.train.Example"
    ):
        read_all(TFRecordSource(path, label="y", dense=["d"]))
    source = TFRecordSource(
        [path, str(tmp_path / "y.tfrecord")], label="y", dense=["d"], on_error="skip"
    )
    assert read_all(source)["d"].tolist() == [1.0, 2.0, 4.0]
    assert [e["record"] for e in source.error_report()["examples"]] == [2, 0, 1]


def test_tfrecord_first_record_invalid_is_named(tmp_path):
    import tensorflow as tf

    path = str(tmp_path / "x.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        w.write(b"garbage")
    with pytest.raises(MalformedRecordError, match=r"x\.tfrecord, record 0: not a valid"):
        read_all(TFRecordSource(path, label="y"))
    data = bytearray(open(path, "rb").read())
    data[2] ^= 0xFF  # break the length's checksum
    open(path, "wb").write(bytes(data))
    with pytest.raises(MalformedRecordError, match=r"x\.tfrecord, record 0: corrupted"):
        read_all(TFRecordSource(path, label="y"))
