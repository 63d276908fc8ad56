"""Files that changed after a save, empty files, gzip text, uint64 ids."""

import gzip
import json
import logging
import os
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from npu_rec.data import CsvSource, MalformedRecordError, ParquetSource, read_all
from tests.data.conftest import N_ROWS, make_source, open_source, rids


def _saved_after(kind, tmp_path, batches=2, batch=10):
    source = make_source(kind, tmp_path)
    got = [r for _ in range(batches) for r in rids(source.next_minibatch(batch))]
    return got, json.loads(json.dumps(source.get_checkpoint_state()))


def _data_file(kind, tmp_path):
    return {
        "csv": tmp_path / "part-0.csv",
        "parquet": tmp_path / "data.parquet",
        "tfrecord": tmp_path / "data.tfrecord",
    }[kind]


def test_unchanged_files_resume_without_a_warning(kind, tmp_path, caplog):
    got, state = _saved_after(kind, tmp_path)
    fresh = open_source(kind, tmp_path)
    with caplog.at_level(logging.WARNING, logger="npu_rec.data"):
        fresh.restore_from_checkpoint(state)
    assert not [r for r in caplog.records if "changed" in r.getMessage()]
    assert got + rids(fresh.next_minibatch(10)) == list(range(30))


@pytest.mark.parametrize("change", ["truncated", "rewritten"])
def test_a_file_changed_after_the_save_is_named_in_a_warning(kind, change, tmp_path, caplog):
    _, state = _saved_after(kind, tmp_path)
    path = _data_file(kind, tmp_path)
    data = path.read_bytes()
    if change == "truncated":
        path.write_bytes(data[: len(data) * 2 // 3])
    else:  # the same size, one byte changed
        make_source(kind, tmp_path, n=N_ROWS)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    fresh = open_source(kind, tmp_path)
    with caplog.at_level(logging.WARNING, logger="npu_rec.data"):
        fresh.restore_from_checkpoint(state)
    warnings = [r.getMessage() for r in caplog.records if "changed" in r.getMessage()]
    assert len(warnings) == 1 and os.path.basename(path) in warnings[0], caplog.text


def test_an_old_state_without_fingerprints_restores_quietly(kind, tmp_path, caplog):
    got, state = _saved_after(kind, tmp_path)
    state.pop("fingerprint", None)
    fresh = open_source(kind, tmp_path)
    with caplog.at_level(logging.WARNING, logger="npu_rec.data"):
        fresh.restore_from_checkpoint(state)
    assert not caplog.records
    assert got + rids(fresh.next_minibatch(10)) == list(range(30))


def test_empty_csv_files_among_good_ones_hold_no_rows(tmp_path):
    make_source("csv", tmp_path)
    (tmp_path / "part-00.csv").write_bytes(b"")
    (tmp_path / "part-2.csv").write_bytes(b"")
    source = open_source("csv", tmp_path)
    rows = read_all(source)
    assert rows["rid"].astype(int).tolist() == list(range(N_ROWS))
    (tmp_path / "part-3.csv").write_bytes(b"\n\nlabel,rid\n")
    with pytest.raises(MalformedRecordError, match=r"part-3\.csv, line 1: .*header.*empty"):
        read_all(open_source("csv", tmp_path))


def test_gzip_csv_is_read_like_the_plain_file_and_resumes(tmp_path):
    make_source("csv", tmp_path)
    for name in ("part-0.csv", "part-1.csv"):
        plain = (tmp_path / name).read_bytes()
        (tmp_path / name).unlink()
        (tmp_path / (name + ".gz")).write_bytes(gzip.compress(plain))
    source = CsvSource(
        str(tmp_path / "part-*.csv.gz"),
        label="label",
        dense=("rid", "x"),
        categorical=("c",),
        multi_valued=("tags",),
        block_bytes=64,
    )
    first = rids(source.next_minibatch(30))
    state = json.loads(json.dumps(source.get_checkpoint_state()))
    again = CsvSource(
        str(tmp_path / "part-*.csv.gz"),
        label="label",
        dense=("rid", "x"),
        categorical=("c",),
        multi_valued=("tags",),
    )
    again.restore_from_checkpoint(state)
    assert first + rids(again.next_minibatch(N_ROWS)) == list(range(N_ROWS))


def test_parquet_uint64_ids_above_2_63_are_read_bit_for_bit(tmp_path):
    path = str(tmp_path / "x.parquet")
    ids = [1, 2**63 + 5, 2**64 - 2, None]
    table = pa.table(
        {
            "y": [1.0, 0.0, 1.0, 0.0],
            "uid": pa.array(ids, pa.uint64()),
            "tags": pa.array([[2**63], [], [7, 2**64 - 3], None], pa.list_(pa.uint64())),
        }
    )
    pq.write_table(table, path)
    rows = read_all(ParquetSource(path, label="y", categorical=["uid"], multi_valued=["tags"]))
    want = np.array([1, 2**63 + 5, 2**64 - 2, 0], np.uint64).view(np.int64)
    assert rows["uid"].tolist() == want.tolist()  # distinct ids stay distinct; null -> 0
    assert rows["tags"].to_list() == [
        np.array([2**63], np.uint64).view(np.int64).tolist(),
        [],
        np.array([7, 2**64 - 3], np.uint64).view(np.int64).tolist(),
        [],
    ]


def test_truncated_gzip_csv_names_the_file_and_keeps_the_rows_before(tmp_path):
    lines = "label,a\n" + "".join(f"1,{i}\n" for i in range(2000))
    packed = gzip.compress(lines.encode())
    path = tmp_path / "x.csv.gz"
    path.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(
        MalformedRecordError,
        match=r"x\.csv\.gz, line \d+: compressed stream ends early",
    ):
        read_all(CsvSource(str(path), label="label", dense=["a"], block_bytes=256))
    source = CsvSource(str(path), label="label", dense=["a"], block_bytes=256, on_error="skip")
    values = read_all(source)["a"].astype(int).tolist()
    assert values == list(range(len(values))) and len(values) > 100
    assert source.error_report()["count"] == 1


def _decodable_lines(packed: bytes) -> int:
    """Complete lines (header included) in the bytes that decode from a cut gzip stream."""
    return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(packed).count(b"\n")


@pytest.mark.parametrize("block_bytes", [None, 4096])
def test_a_gzip_csv_cut_at_90_percent_yields_every_decodable_row_then_one_report(
    tmp_path, block_bytes
):
    rows = 60_000  # one default read block decompressed: every row used to be lost
    lines = "label,a\n" + "".join(f"1,{i}\n" for i in range(rows))
    packed = gzip.compress(lines.encode(), compresslevel=1)
    cut = packed[: len(packed) * 9 // 10]
    path = tmp_path / "day.csv.gz"
    path.write_bytes(cut)
    complete = _decodable_lines(cut)  # the header is line 1
    assert 1 < complete < rows
    extra = {} if block_bytes is None else {"block_bytes": block_bytes}
    source = CsvSource(str(path), label="label", dense=["a"], on_error="skip", **extra)
    values = read_all(source)["a"].astype(int).tolist()
    assert values == list(range(complete - 1))
    report = source.error_report()
    assert report["count"] == 1, report
    with pytest.raises(MalformedRecordError) as raised:
        read_all(CsvSource(str(path), label="label", dense=["a"], **extra))
    message = str(raised.value)
    assert f"day.csv.gz, line {complete + 1}: compressed stream ends early" in message
    assert f"after line {complete}, the last complete line" in message


def test_a_utf8_byte_order_mark_before_the_header_is_stripped(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbflabel,a\n1,5\n0,6\n")
    values = read_all(CsvSource(str(path), label="label", dense=["a"]))
    assert values["label"].tolist() == [1, 0] and values["a"].tolist() == [5, 6]
    plain = tmp_path / "bom_no_header.csv"
    plain.write_bytes(b"\xef\xbb\xbf1,5\n0,6\n")
    source = CsvSource(
        str(plain), label="label", dense=["a"], header=False, column_names=["label", "a"]
    )
    assert read_all(source)["label"].tolist() == [1, 0]
