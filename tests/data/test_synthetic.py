import numpy as np
import pytest

from npu_rec.data import CATEGORICAL_NAMES, DENSE_NAMES, SyntheticCriteo
from npu_rec.data._synthetic import BLOCK_ROWS
from tests.helpers import auc


def test_columns_shapes_and_dtypes():
    rows = SyntheticCriteo(seed=3).rows(0, 1000)
    assert set(rows) == {"label", *DENSE_NAMES, *CATEGORICAL_NAMES}
    assert len(DENSE_NAMES) == 13 and len(CATEGORICAL_NAMES) == 26
    assert rows["label"].dtype == np.int32 and set(np.unique(rows["label"])) <= {0, 1}
    for name in DENSE_NAMES:
        assert rows[name].dtype == np.float32 and rows[name].shape == (1000,)
        assert (rows[name] >= 0).all()
    for name in CATEGORICAL_NAMES:
        assert rows[name].dtype == np.int64 and rows[name].shape == (1000,)


def test_same_seed_same_rows_other_seed_other_rows():
    a = SyntheticCriteo(seed=5).rows(0, 500)
    b = SyntheticCriteo(seed=5).rows(0, 500)
    c = SyntheticCriteo(seed=6).rows(0, 500)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert not np.array_equal(a["C3"], c["C3"])


@pytest.mark.parametrize("start, stop", [(0, 1), (10, 4000), (4000, 9000), (8191, 8193)])
def test_any_row_range_equals_the_slice_of_a_whole_read(start, stop):
    gen = SyntheticCriteo(seed=11)
    whole = gen.rows(0, 3 * BLOCK_ROWS)
    part = gen.rows(start, stop)
    for name in whole:
        np.testing.assert_array_equal(part[name], whole[name][start:stop])


def test_empty_range_and_bad_arguments():
    gen = SyntheticCriteo()
    assert gen.rows(7, 7)["C1"].shape == (0,)
    with pytest.raises(ValueError, match="start=5, stop=2"):
        gen.rows(5, 2)
    with pytest.raises(ValueError, match="vocab_sizes"):
        SyntheticCriteo(vocab_sizes=(10,) * 3)
    with pytest.raises(ValueError, match="alpha=1"):
        SyntheticCriteo(alpha=1)
    with pytest.raises(TypeError, match="seed=True"):
        SyntheticCriteo(seed=True)


def test_ids_are_raw_64_bit_zipf_like_and_distinct_across_features():
    gen = SyntheticCriteo(seed=2)
    rows = gen.rows(0, 20_000)
    ids = rows["C3"]  # vocabulary of 100k
    # Raw hashed ids: spread far beyond any 32-bit vocabulary index.
    assert np.abs(ids).max() > 2**40
    _, counts = np.unique(ids, return_counts=True)
    counts = np.sort(counts)[::-1]
    # Heavy head: the top 1% of distinct ids carry a large share of the rows.
    top = counts[: max(1, len(counts) // 100)].sum() / counts.sum()
    assert top > 0.2
    assert len(counts) > 2000  # and a long tail
    assert not set(rows["C1"]).intersection(rows["C2"])


def test_vocabulary_is_respected():
    gen = SyntheticCriteo(seed=0)
    rows = gen.rows(0, 20_000)
    assert len(np.unique(rows["C9"])) <= gen.vocab_sizes[8] == 3


def test_planted_signal_is_learnable():
    gen = SyntheticCriteo(seed=4)
    rows = gen.rows(0, 60_000, probabilities=True)
    labels = rows["label"]
    assert 0.1 < labels.mean() < 0.5
    # The true probabilities separate clicks well ...
    assert auc(labels, rows["probability"]) > 0.75
    # ... and per-id click rates learned on the first 40k rows predict the rest.
    train, test = slice(0, 40_000), slice(40_000, 60_000)
    prior = labels[train].mean()
    score = np.zeros(20_000)
    for name in CATEGORICAL_NAMES:
        keys, inverse = np.unique(rows[name][train], return_inverse=True)
        clicks = np.bincount(inverse, weights=labels[train])
        seen = np.bincount(inverse)
        rate = np.log((clicks + prior * 20) / (seen + 20) / prior)
        pos = np.searchsorted(keys, rows[name][test]).clip(0, len(keys) - 1)
        known = keys[pos] == rows[name][test]
        score += np.where(known, rate[pos], 0.0)
    assert auc(labels[test], score) > 0.65


def test_zero_signal_is_unlearnable():
    rows = SyntheticCriteo(seed=4, signal=0.0).rows(0, 20_000, probabilities=True)
    assert np.ptp(rows["probability"]) < 1e-12


def test_synthetic_source_sized_sharded_and_resumable():
    from npu_rec.data import SyntheticSource

    source = SyntheticSource(num_rows=10_000, seed=3)
    gen = SyntheticCriteo(seed=3)
    got = []
    for rank in range(3):
        src = SyntheticSource(num_rows=10_000, seed=3)
        while True:
            mb = {s.name: d for s, d in src.next_minibatch(1500, 3, rank).items()}
            got.append(mb["C1"].data)
            if mb["C1"].sweep_end:
                break
    np.testing.assert_array_equal(np.sort(np.concatenate(got)), np.sort(gen.rows(0, 10_000)["C1"]))
    source.next_minibatch(4000)
    state = source.get_checkpoint_state()
    fresh = SyntheticSource(num_rows=10_000, seed=3)
    fresh.restore_from_checkpoint(state)
    mb = {s.name: d for s, d in fresh.next_minibatch(100).items()}
    np.testing.assert_array_equal(mb["I1"].data, gen.rows(4000, 4100)["I1"])
    assert mb["label"].data.dtype == np.float32


def test_endless_synthetic_source_never_ends_a_sweep():
    from npu_rec.data import SyntheticSource

    source = SyntheticSource(seed=1)
    ends = [next(iter(source.next_minibatch(5000).values())).sweep_end for _ in range(3)]
    assert ends == [False, False, False]
    with pytest.raises(ValueError, match="num_rows=0"):
        SyntheticSource(num_rows=0)
