import csv
import os

import numpy as np
import pytest
import tensorflow as tf

from npu_rec.data import DENSE_FILL, MISSING_ID, SAMPLES, hash_strings, load_sample, read_csv
from npu_rec.data._samples import SAMPLES_DIR


def _python_rows(name):
    with open(os.path.join(SAMPLES_DIR, SAMPLES[name]["file"]), newline="") as f:
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
