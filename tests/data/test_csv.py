import csv
import json

import numpy as np
import pytest
import tensorflow as tf

from npu_rec.data import (
    DENSE_FILL,
    MISSING_ID,
    SAMPLES,
    CsvSource,
    MalformedRecordError,
    hash_strings,
    load_sample,
    read_all,
    read_csv,
    sample_path,
)


def _python_rows(name):
    with open(sample_path(name), newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_samples_load_with_dtypes_shapes_and_empty_fields(name):
    spec = SAMPLES[name]
    rows = load_sample(name)
    expected = _python_rows(name)
    n = len(expected)
    assert n >= 100
    np.testing.assert_allclose(rows[spec["label"]], [float(r[spec["label"]]) for r in expected])
    for col in spec["dense"]:
        assert rows[col].dtype == np.float32 and rows[col].shape == (n,)
        want = [float(r[col]) if r[col] != "" else DENSE_FILL for r in expected]
        np.testing.assert_allclose(rows[col], want, rtol=1e-6)
    for col in spec["categorical"]:
        assert rows[col].dtype == np.int64 and rows[col].shape == (n,)
        texts = [r[col] for r in expected]
        empty = np.array([t == "" for t in texts])
        np.testing.assert_array_equal(rows[col] == MISSING_ID, empty)
        # Equal texts get equal ids, different texts different ids.
        for t in set(texts):
            mask = np.array([x == t for x in texts])
            assert len(set(rows[col][mask])) == 1
        assert len(set(rows[col])) == len(set(texts))
    for col in spec.get("multi_valued", ()):
        ragged = rows[col]
        assert isinstance(ragged, tf.RaggedTensor) and ragged.dtype == tf.int64
        lengths = [len([v for v in r[col].split("|") if v]) for r in expected]
        np.testing.assert_array_equal(ragged.row_lengths().numpy(), lengths)


def test_criteo_sample_really_has_empty_fields():
    rows = load_sample("criteo_sample")
    expected = _python_rows("criteo_sample")
    assert sum(r["C20"] == "" for r in expected) > 0
    assert (rows["C20"] == MISSING_ID).sum() == sum(r["C20"] == "" for r in expected)
    empty_i1 = sum(r["I1"] == "" for r in expected)
    zero_i1 = sum(r["I1"] != "" and float(r["I1"]) == 0.0 for r in expected)
    assert empty_i1 > 0
    assert (rows["I1"] == DENSE_FILL).sum() == empty_i1 + zero_i1


def test_log_dense_transform():
    raw = load_sample("criteo_sample")
    logged = load_sample("criteo_sample", log_dense=True)
    np.testing.assert_allclose(logged["I2"], np.log1p(np.maximum(raw["I2"], 0)), rtol=1e-6)
    np.testing.assert_array_equal(logged["label"], raw["label"])


def test_hash_is_stable_farmhash_and_empty_is_reserved():
    ids = hash_strings(["05db9164", "", "05db9164", "68fd1e64", None])
    want = tf.strings.to_hash_bucket_fast(["05db9164", "68fd1e64"], 2**63 - 1).numpy()
    np.testing.assert_array_equal(ids, [want[0], MISSING_ID, want[0], want[1], MISSING_ID])
    assert ids.dtype == np.int64 and (ids >= 0).all()


def test_tsv_without_header(tmp_path):
    path = tmp_path / "day_0.tsv"
    path.write_text("1\t3\tab\n0\t\t\n")
    rows = read_csv(
        str(path),
        label="label",
        dense=("I1",),
        categorical=("C1",),
        delimiter="\t",
        header=False,
        column_names=["label", "I1", "C1"],
    )
    np.testing.assert_array_equal(rows["label"], [1.0, 0.0])
    np.testing.assert_array_equal(rows["I1"], [3.0, DENSE_FILL])
    assert rows["C1"][1] == MISSING_ID and rows["C1"][0] != MISSING_ID


def test_missing_column_error_names_file_and_column(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("label,a\n1,2\n")
    with pytest.raises(ValueError, match=r"x\.csv.*nope"):
        read_csv(str(path), label="label", dense=("nope",))
    with pytest.raises(ValueError, match="column_names"):
        read_csv(str(path), label="label", header=False)
    with pytest.raises(ValueError, match="name='imagenet'"):
        load_sample("imagenet")


# -- CsvSource: malformed records --------------------------------------------------------

FAULTS = {
    # name: (function of a data line -> corrupted line, expected reason)
    "column_count": (lambda ln: ln + b",extra", "wrong number of fields"),
    "number": (lambda ln: ln.replace(b",", b",x1x,", 1).replace(b",", b"", 1), "unparsable number"),
    "utf8": (lambda ln: ln[:-3] + b"\xff\xfe" + ln[-3:], "invalid UTF-8"),
}


def _corrupt_copy(name, tmp_path, line_no, fault):
    lines = open(sample_path(name), "rb").read().split(b"\n")
    if fault == "truncated":
        lines = lines[: line_no - 1] + [lines[line_no - 1][: len(lines[line_no - 1]) // 2]]
        data = b"\n".join(lines)
    else:
        lines[line_no - 1] = FAULTS[fault][0](lines[line_no - 1])
        data = b"\n".join(lines)
    path = tmp_path / f"bad_{name}.csv"
    path.write_bytes(data)
    return str(path)


def _label_first_fault(name):
    # The "number" fault needs a numeric column first: Criteo's label; others' label is not first.
    return name == "criteo_sample"


@pytest.mark.parametrize("fault", ["column_count", "number", "utf8", "truncated"])
@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_corrupted_samples_name_file_line_and_reason(name, fault, tmp_path):
    spec = {k: v for k, v in SAMPLES[name].items() if k != "file"}
    if fault == "number" and not _label_first_fault(name):
        # Put the bad number into the label column by rewriting that field.
        lines = open(sample_path(name), "rb").read().split(b"\n")
        cols = lines[0].decode().split(",")
        fields = lines[40 - 1].decode().split(",")
        fields[cols.index(spec["label"])] = "x1x"
        lines[40 - 1] = ",".join(fields).encode()
        path = tmp_path / "bad.csv"
        path.write_bytes(b"\n".join(lines))
        path = str(path)
    elif fault == "utf8":
        # Corrupt a categorical field (the last column holds one in every sample).
        path = _corrupt_copy(name, tmp_path, 40, fault)
    else:
        path = _corrupt_copy(name, tmp_path, 40, fault)
    if fault == "utf8" and name == "movielens_sample":
        lines = open(sample_path(name), "rb").read().split(b"\n")
        lines[40 - 1] = lines[40 - 1] + b"\xff"  # inside `zip`, a categorical column
        path = tmp_path / "bad_utf8.csv"
        path.write_bytes(b"\n".join(lines))
        path = str(path)
    reason = "truncated" if fault == "truncated" else FAULTS[fault][1]
    with pytest.raises(MalformedRecordError, match=rf"bad.*, line 40: .*{reason}") as info:
        read_all(CsvSource(path, **spec))
    assert info.value.row == 40 and info.value.path == path

    # With on_error="skip" the line is counted and reported; the other rows are read.
    source = CsvSource(path, **spec, on_error="skip")
    rows = read_all(source)
    n_good = 40 - 2 if fault == "truncated" else len(_python_rows(name)) - 1
    assert len(rows[spec["label"]]) == n_good
    report = source.error_report()
    assert report["count"] == 1
    assert report["examples"][0]["line"] == 40 and reason in report["examples"][0]["reason"]


def test_skipped_records_are_reported_once_and_survive_checkpoints(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("label,a\n1,2\n1,oops\n0,3\n1,2,3\n0,4\n")
    source = CsvSource(str(path), label="label", dense=("a",), on_error="skip")
    first = source.next_minibatch(2)
    state = json.loads(json.dumps(source.get_checkpoint_state()))
    fresh = CsvSource(str(path), label="label", dense=("a",), on_error="skip")
    fresh.restore_from_checkpoint(state)
    rest = fresh.next_minibatch(10)
    values = [d.data.tolist() for s, d in first.items() if s.name == "a"][0]
    values += [d.data.tolist() for s, d in rest.items() if s.name == "a"][0]
    assert values == [2.0, 3.0, 4.0]
    report = fresh.error_report()
    assert report["count"] == 2
    assert [e["line"] for e in report["examples"]] == [3, 5]
    fresh.next_minibatch(10)  # a second sweep meets the same lines: not counted again
    assert fresh.error_report()["count"] == 2


def test_empty_label_and_blank_lines(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("label,a\n1,2\n\n,5\n0,3\n")
    with pytest.raises(MalformedRecordError, match=r"x\.csv, line 4: empty label"):
        read_csv(str(path), label="label", dense=("a",))


def test_only_a_header_is_an_empty_source(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("label,a\n")
    with pytest.raises(ValueError, match=r"no records.*x\.csv"):
        read_csv(str(path), label="label", dense=("a",))


def test_small_blocks_and_many_files_read_the_same_rows(tmp_path):
    whole = load_sample("criteo_sample")
    lines = open(sample_path("criteo_sample")).read().splitlines()
    for j in range(3):
        part = [lines[0]] + lines[1 + 70 * j : 1 + 70 * (j + 1)]
        (tmp_path / f"p{j}.csv").write_text("\n".join(part) + "\n")
    source = CsvSource.criteo(str(tmp_path / "p*.csv"), header=True, delimiter=",", block_bytes=999)
    rows = read_all(source)
    for k in ("label", "I3", "C1", "C26"):
        np.testing.assert_array_equal(rows[k], whole[k])


def test_criteo_tsv_without_header(tmp_path):
    fields = ["1", "5"] + [""] * 12 + ["abc"] + [""] * 25
    path = tmp_path / "day_0"
    path.write_text("\t".join(fields) + "\n")
    source = CsvSource.criteo(str(path))
    assert [s.name for s in source.stream_infos()][:3] == ["label", "I1", "I2"]
    rows = read_all(source)
    assert rows["I1"].tolist() == [5.0] and rows["C2"].tolist() == [MISSING_ID]
    assert rows["C1"][0] == hash_strings(["abc"])[0]


def test_csv_arguments_are_checked(tmp_path):
    with pytest.raises(FileNotFoundError, match="paths.*nothing-here"):
        CsvSource(str(tmp_path / "nothing-here*.csv"), label="y")
    path = tmp_path / "x.csv"
    path.write_text("label,a\n1,2\n")
    with pytest.raises(ValueError, match="on_error.*'ignore'"):
        CsvSource(str(path), label="label", on_error="ignore")
    with pytest.raises(ValueError, match="Column 'a' is given twice"):
        CsvSource(str(path), label="label", dense=("a",), categorical=("a",))


def test_files_may_order_columns_differently_and_bad_header_is_named(tmp_path):
    (tmp_path / "a.csv").write_text("label,a,c\n1,2,x\n")
    (tmp_path / "b.csv").write_text("c,label,a\ny,0,3\n")
    rows = read_csv(str(tmp_path / "*.csv"), label="label", dense=("a",), categorical=("c",))
    assert rows["a"].tolist() == [2.0, 3.0] and rows["label"].tolist() == [1.0, 0.0]
    np.testing.assert_array_equal(rows["c"], hash_strings(["x", "y"]))
    (tmp_path / "b.csv").write_bytes(b"c,lab\xffel,a\ny,0,3\n")
    with pytest.raises(MalformedRecordError, match=r"b\.csv, line 1: invalid UTF-8 in the header"):
        read_csv(str(tmp_path / "*.csv"), label="label", dense=("a",))


def test_restore_after_the_files_moved(tmp_path):
    for d in ("old", "new"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "x.csv").write_text("label,a\n" + "".join(f"1,{i}\n" for i in range(10)))
    old = CsvSource(str(tmp_path / "old" / "x.csv"), label="label", dense=("a",))
    old.next_minibatch(4)
    new = CsvSource(str(tmp_path / "new" / "x.csv"), label="label", dense=("a",))
    new.restore_from_checkpoint(old.get_checkpoint_state())
    mb = {s.name: d.data.tolist() for s, d in new.next_minibatch(3).items()}
    assert mb["a"] == [4.0, 5.0, 6.0]
