"""as_dataset / as_input_fn: batches, shapes, and the consumed reading position."""

import json

import numpy as np
import pytest
import tensorflow as tf

from npu_rec.data import (
    PAD_ID,
    ReadingPosition,
    as_dataset,
    as_input_fn,
    sample_path,
    sample_source,
)
from tests.data.conftest import N_ROWS, make_source


def test_dynamic_dataset_yields_ragged_features_and_float_labels(tmp_path):
    source = make_source("csv", tmp_path)
    ds = as_dataset(source, 10, use_dynamic=True)
    batches = list(ds)
    assert [len(lbl) for _, lbl in batches] == [10, 10, 10, 10, 10, 3]
    feats, label = batches[0]
    assert set(feats) == {"rid", "x", "c", "tags"} and label.dtype == tf.float32
    assert isinstance(feats["tags"], tf.RaggedTensor) and feats["c"].dtype == tf.int64
    rid = np.concatenate([f["rid"].numpy() for f, _ in batches])
    assert rid.astype(int).tolist() == list(range(N_ROWS))


def test_static_dataset_has_fixed_shapes_and_structural_padding(tmp_path):
    source = make_source("csv", tmp_path)
    ds = as_dataset(source, 10, use_dynamic=False, pad_length=1)
    assert ds.element_spec[0]["tags"] == tf.SparseTensorSpec([10, 1], tf.int64)
    batches = list(ds)
    assert len(batches) == 5  # the short last batch is dropped
    tags = batches[0][0]["tags"]
    assert isinstance(tags, tf.SparseTensor) and tags.shape == (10, 1)
    # Row i has i % 3 tags: row 0 has no entry (padding is absent, not a value), row 2 is cut to 1.
    rows = tags.indices.numpy()[:, 0].tolist()
    assert 0 not in rows and rows.count(1) == 1 and rows.count(2) == 1
    assert tags.indices.numpy()[:, 1].tolist() == [0] * len(rows)
    dense = tf.sparse.to_dense(tags, default_value=PAD_ID).numpy()
    assert dense[0].tolist() == [PAD_ID] and dense[2][0] != PAD_ID


def test_static_multi_valued_batches_hold_the_same_ids_as_dynamic_ones(tmp_path):
    dynamic = list(as_dataset(make_source("csv", tmp_path), 10, use_dynamic=True))
    static = list(as_dataset(make_source("csv", tmp_path), 10, use_dynamic=False, pad_length=4))
    assert len(static) == len(dynamic) - 1  # the short last batch is dropped
    for (s, _), (d, _) in zip(static, dynamic, strict=False):
        assert tf.RaggedTensor.from_sparse(s["tags"]).to_list() == d["tags"].to_list()


def test_static_shapes_follow_the_global_config(tmp_path, monkeypatch):
    import npu_rec

    class _Config:
        use_dynamic = False

    monkeypatch.setattr(npu_rec, "get_config", lambda: _Config(), raising=False)
    ds = as_dataset(make_source("csv", tmp_path), 8)
    assert ds.element_spec[1].shape == (8,)


def test_consumed_position_resumes_exactly_despite_prefetch(tmp_path):
    source = make_source("csv", tmp_path)
    ds = as_dataset(source, 4, prefetch=8, num_sweeps=None)
    assert ds.reading_position.state_after(0) == source.get_checkpoint_state()  # before reading
    it = iter(ds)
    seen = [next(it)[0]["rid"].numpy().astype(int).tolist() for _ in range(3)]
    position = ds.reading_position
    assert position.produced >= 3  # read ahead of the model
    for _ in range(3):
        position.mark_consumed()
    state = json.loads(json.dumps(position.consumed_state()))
    assert state == position.state_after(3)
    fresh = make_source("csv", tmp_path)
    fresh.restore_from_checkpoint(state)
    after = [f["rid"].numpy().astype(int).tolist() for f, _ in as_dataset(fresh, 4)]
    assert [r for b in seen + after for r in b] == list(range(N_ROWS))
    with pytest.raises(ValueError, match="num_batches=999"):
        position.state_after(999)


def test_input_fn_shares_one_position_and_shards(tmp_path):
    make_source("csv", tmp_path)
    got = []
    for rank in range(2):
        source = make_source("csv", tmp_path)
        input_fn = as_input_fn(source, 5, number_of_workers=2, worker_rank=rank)
        assert isinstance(input_fn.reading_position, ReadingPosition)
        ds = input_fn()
        got += [r for f, _ in ds for r in f["rid"].numpy().astype(int).tolist()]
        assert input_fn.reading_position.produced > 0
    assert sorted(got) == list(range(N_ROWS))


def test_movielens_sample_as_dataset():
    source = sample_source("movielens_sample")
    feats, label = next(iter(as_dataset(source, 32, use_dynamic=True)))
    assert feats["genres"].shape[0] == 32 and label.shape == (32,)
    assert sample_path("movielens_sample").endswith("movielens_sample.txt")


def test_as_dataset_arguments_are_checked(tmp_path):
    source = make_source("csv", tmp_path)
    with pytest.raises(ValueError, match="label.*label='nope'"):
        as_dataset(source, 4, label="nope")
    with pytest.raises(ValueError, match="batch_size|num_samples"):
        as_dataset(source, 0)


# -- a source smaller than one batch ---------------------------------------------------


def test_source_smaller_than_a_batch_dynamic_yields_short_batches(tmp_path):
    source = make_source("csv", tmp_path, n=7)
    batches = list(as_dataset(source, 10, use_dynamic=True, num_sweeps=3))
    assert [f["rid"].numpy().astype(int).tolist() for f, _ in batches] == [list(range(7))] * 3


@pytest.mark.parametrize("num_sweeps", [1, 50])
def test_source_smaller_than_a_batch_static_fails_at_once_naming_rows_and_fix(tmp_path, num_sweeps):
    source = make_source("csv", tmp_path, n=7)
    ds = as_dataset(source, 10, use_dynamic=False, num_sweeps=num_sweeps)
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"CsvSource gives it 7 rows, fewer than batch_size=10.*batch_size <= 7 or "
        r"use_dynamic=True",
    ):
        list(ds)


def test_source_smaller_than_a_batch_static_checks_whole_sweeps_only(tmp_path):
    # Restored 30 rows into a 53-row sweep: the 23 rows left fill no batch of 25, but the
    # next (whole) sweep does, so batches come and nothing is raised.
    source = make_source("csv", tmp_path)
    source.next_minibatch(30)
    batches = list(as_dataset(source, 25, use_dynamic=False, num_sweeps=2))
    assert [f["rid"].numpy().astype(int).tolist() for f, _ in batches] == [
        list(range(25)),
        list(range(25, 50)),
    ]


def test_worker_without_rows_fails_at_once(tmp_path):
    source = make_source("csv", tmp_path, n=3)
    ds = as_dataset(source, 4, number_of_workers=7, worker_rank=5, use_dynamic=True, num_sweeps=50)
    with pytest.raises(tf.errors.InvalidArgumentError, match="worker 5 of 7 0 rows"):
        list(ds)
