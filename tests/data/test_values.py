"""Non-finite dense values and labels outside the label domain are malformed records."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from npu_rec.data import (
    DENSE_FILL,
    CsvSource,
    MalformedRecordError,
    ParquetSource,
    TFRecordSource,
    load_sample,
    read_all,
    sample_source,
    write_examples,
)

NON_FINITE_TEXT = ["NAN", "Nan", "+nan", "inf", "-inf", "Infinity", "1e999", "1e39"]


def _csv(tmp_path, label="1", x="2.5", name="x.csv"):
    path = tmp_path / name
    path.write_text(f"label,x,c\n0,1,a\n{label},{x},b\n1,3,c\n")
    return str(path)


@pytest.mark.parametrize("text", NON_FINITE_TEXT)
def test_csv_non_finite_dense_value_names_file_line_column_and_value(text, tmp_path):
    path = _csv(tmp_path, x=text)
    with pytest.raises(
        MalformedRecordError,
        match=r"x\.csv, line 3: non-finite value .* in "
        r"column 'x'",
    ) as info:
        read_all(CsvSource(path, label="label", dense=["x"], categorical=["c"]))
    assert info.value.row == 3
    source = CsvSource(
        path, label="label", dense=["x"], categorical=["c"], on_error="skip", log_dense=True
    )
    rows = read_all(source)
    assert rows["x"].tolist() == pytest.approx(np.log1p([1.0, 3.0]).tolist())
    assert source.error_report()["count"] == 1


def test_csv_empty_markers_stay_empty(tmp_path):
    for i, text in enumerate(["NaN", "nan", "NA", ""]):
        rows = read_all(
            CsvSource(_csv(tmp_path, x=text, name=f"{i}.csv"), label="label", dense=["x"])
        )
        assert rows["x"].tolist() == [1.0, DENSE_FILL, 3.0]


@pytest.mark.parametrize("label", ["2", "-1", "0.5", "inf"])
def test_csv_label_outside_its_domain_is_malformed(label, tmp_path):
    path = _csv(tmp_path, label=label)
    reason = r"(label 'label' = .* is not one of|non-finite value inf in column 'label')"
    with pytest.raises(MalformedRecordError, match=rf"x\.csv, line 3: {reason}"):
        read_all(CsvSource(path, label="label", dense=["x"], label_domain=(0, 1)))
    source = CsvSource(path, label="label", dense=["x"], label_domain=(0, 1), on_error="skip")
    assert read_all(source)["label"].tolist() == [0.0, 1.0]


def test_label_domain_defaults_binary_for_click_logs_and_free_for_ratings(tmp_path):
    fields = ["2", "5"] + [""] * 12 + ["abc"] + [""] * 25
    path = tmp_path / "day_0"
    path.write_text("\t".join(fields) + "\n")
    with pytest.raises(
        MalformedRecordError,
        match=r"day_0, line 1: label 'label' = 2.0 is not "
        r"one of \[0.0, 1.0\]",
    ):
        read_all(CsvSource.criteo(str(path)))
    assert sample_source("criteo_sample").label_domain == (0.0, 1.0)
    assert sample_source("avazu_sample").label_domain == (0.0, 1.0)
    assert sample_source("movielens_sample").label_domain is None
    assert set(load_sample("movielens_sample")["rating"].tolist()) > {1.0, 5.0}
    # Without label_domain any finite label is read (regression targets).
    rows = read_all(CsvSource(_csv(tmp_path, label="0.25"), label="label", dense=["x"]))
    assert rows["label"].tolist() == [0.0, 0.25, 1.0]


def test_label_domain_is_checked():
    with pytest.raises(ValueError, match="label_domain"):
        CsvSource(__file__, label="label", label_domain=())
    with pytest.raises(ValueError, match="label_domain"):
        CsvSource(__file__, label="label", label_domain=(0, float("nan")))


def _parquet(tmp_path, x, label):
    path = str(tmp_path / "x.parquet")
    pq.write_table(pa.table({"label": [0.0, label, 1.0], "x": [1.0, x, 3.0]}), path)
    return path


def _tfrecord(tmp_path, x, label):
    path = str(tmp_path / "x.tfrecord")
    write_examples(path, {"label": [0.0, label, 1.0], "x": [1.0, x, 3.0]})
    return path


@pytest.mark.parametrize("write, unit", [(_parquet, "row"), (_tfrecord, "record")])
@pytest.mark.parametrize(
    "x, label, reason",
    [
        (float("nan"), 1.0, "non-finite value nan in column 'x'"),
        (float("inf"), 1.0, "non-finite value inf in column 'x'"),
        (2.0, 2.0, r"label 'label' = 2.0 is not one of \[0.0, 1.0\]"),
    ],
)
def test_parquet_and_tfrecord_apply_the_same_rules(write, unit, x, label, reason, tmp_path):
    path = write(tmp_path, x, label)
    make = ParquetSource if unit == "row" else TFRecordSource
    with pytest.raises(MalformedRecordError, match=rf"x\.\w+, {unit} 1: {reason}"):
        read_all(make(path, label="label", dense=["x"], label_domain=(0, 1)))
    source = make(path, label="label", dense=["x"], label_domain=(0, 1), on_error="skip")
    assert read_all(source)["x"].tolist() == [1.0, 3.0]
    assert source.error_report()["count"] == 1
