"""sparse_lookup with combiners: every id value is an id; padding is structural (SparseTensor)."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import npu_rec
from npu_rec.table import _registry as _table_registry

COMBINERS = ["sum", "mean", "sqrtn"]
# Small id pools so rows repeat ids; -1 (the old pad value) and other negatives are ids.
_IDS = st.sampled_from([-1, -2, 0, 3, 7, -(2**63), 2**63 - 1])


def _reference(export: dict, ids: np.ndarray, mask: np.ndarray, combiner: str) -> np.ndarray:
    """NumPy combine of the table's rows over the entries of each row where `mask` is set."""
    rows = dict(zip(export["keys"].tolist(), export["values"], strict=True))
    dim = export["values"].shape[1]
    out = np.zeros((ids.shape[0], dim), np.float64)
    for i in range(ids.shape[0]):
        vecs = [rows[int(k)] for k, m in zip(ids[i], mask[i], strict=True) if m]
        if not vecs:
            continue
        total = np.sum(vecs, axis=0)
        n = len(vecs)
        out[i] = total if combiner == "sum" else total / (n if combiner == "mean" else np.sqrt(n))
    return out


@pytest.mark.parametrize("combiner", COMBINERS)
@settings(max_examples=15, deadline=None)
@given(
    ids=hnp.arrays(np.int64, hnp.array_shapes(min_dims=2, max_dims=2, max_side=5), elements=_IDS)
)
def test_dense_ids_with_a_combiner_look_up_every_entry_including_minus_one(combiner, ids):
    _table_registry.clear()
    table = npu_rec.create_table("dense_combined", 3)
    got = npu_rec.sparse_lookup(table, tf.constant(ids), combiner=combiner).numpy()
    export = table.export()
    assert sorted(export["keys"].tolist()) == sorted(set(ids.ravel().tolist()))
    assert int(table.size()) == len(set(ids.ravel().tolist()))
    want = _reference(export, ids, np.ones(ids.shape, bool), combiner)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("combiner", COMBINERS)
def test_a_trailing_minus_one_is_combined_like_any_id(combiner):
    table = npu_rec.create_table(f"trailing_{combiner}", 4)
    ids = tf.constant([[5, -1], [-1, -1]], tf.int64)
    got = npu_rec.sparse_lookup(table, ids, combiner=combiner).numpy()
    rows = npu_rec.sparse_lookup(table, tf.constant([5, -1], tf.int64), is_training=False).numpy()
    scale = {"sum": 1.0, "mean": 0.5, "sqrtn": 1 / np.sqrt(2)}[combiner]
    np.testing.assert_allclose(got[0], scale * (rows[0] + rows[1]), rtol=1e-6)
    np.testing.assert_allclose(got[1], 2 * scale * rows[1], rtol=1e-6)
    assert np.abs(rows[1]).sum() > 0  # -1 was admitted: it has a row of its own
    assert -1 in table.export()["keys"].tolist()


@pytest.mark.parametrize("combiner", COMBINERS)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_sparse_padded_ids_skip_only_the_absent_entries(combiner, data):
    """The fixed-shape path's SparseTensor [batch, k]: absent entries are padding, -1 is an id."""
    batch = data.draw(st.integers(1, 5))
    k = data.draw(st.integers(1, 4))
    ids = data.draw(hnp.arrays(np.int64, (batch, k), elements=_IDS))
    lengths = data.draw(hnp.arrays(np.int64, (batch,), elements=st.integers(0, k)))
    mask = np.arange(k)[None, :] < lengths[:, None]
    sparse = tf.SparseTensor(
        np.argwhere(mask).astype(np.int64).reshape(-1, 2), ids[mask], [batch, k]
    )
    _table_registry.clear()
    table = npu_rec.create_table("sparse_combined", 3)
    got = npu_rec.sparse_lookup(table, sparse, combiner=combiner).numpy()
    export = table.export()
    assert sorted(export["keys"].tolist()) == sorted(set(ids[mask].tolist()))
    np.testing.assert_allclose(got, _reference(export, ids, mask, combiner), rtol=1e-5, atol=1e-6)


def test_per_id_timestamps_of_sparse_ids_follow_their_entries():
    table = npu_rec.create_table("sparse_times", 2, access_threshold=0, eviction_threshold=100)
    ids = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant([4, 8, 8], tf.int64), [2, 3])
    times = tf.constant([[10, 5, 99], [20, 99, 99]], tf.int64)  # 99: padding positions
    npu_rec.sparse_lookup(table, ids, combiner="sum", timestamps=times)
    export = table.export()
    seen = dict(zip(export["keys"].tolist(), export["last_seen"].tolist(), strict=True))
    assert seen == {4: 10, 8: 20}
